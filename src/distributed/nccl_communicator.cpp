#include "distributed/nccl_communicator.h"

#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "backend/cuda/cuda_stream.h"
#include "core/error.h"
#include "core/logging.h"
#include "distributed/socket.h"

namespace tessera::dist {

namespace {

using std::chrono::milliseconds;

// How often the watchdog looks at the queued calls while some are in flight.
constexpr std::chrono::microseconds kWatchInterval{1000};
// After an abort, how long the stream may take to drain before the watchdog ends the process.
constexpr std::chrono::seconds kDrainGrace{10};

std::optional<ncclDataType_t> nccl_type(DType t) {
  switch (t) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kF16:
      return ncclFloat16;
    case DType::kI32:
      return ncclInt32;
    case DType::kI64:
      return ncclInt64;
    case DType::kU8:
      return ncclUint8;
    default:
      return std::nullopt;
  }
}

// A call queued on the stream, watched until its event completes.
struct Pending {
  uint64_t seq = 0;
  std::string op;  // short names fit the small-string buffer: no allocation per call
  cuda::EventHandle event = nullptr;
  Clock::time_point enqueued;
};

// What a communicator and the watchdog share. `mu` guards everything; the watchdog never
// holds it while it takes its own lock (lock order: never both at once).
struct CommState {
  std::mutex mu;
  std::condition_variable done_cv;  // done_seq advanced or the communicator failed
  ncclComm_t comm = nullptr;        // null once aborted (or closed)
  bool closed = false;              // the communicator is being destroyed
  GroupInfo group;
  NcclOptions options;
  std::deque<Pending> pending;           // oldest first
  std::vector<cuda::EventHandle> spare;  // recorded-and-completed events to reuse
  uint64_t next_seq = 1, done_seq = 0;
  Clock::time_point last_done{};  // when the watchdog saw the latest call complete
  std::optional<std::string> broken;
};

std::string describe_failure(const CommState& s, const std::string& op, Clock::time_point start,
                             const std::string& what) {
  auto ms = std::chrono::duration_cast<milliseconds>(Clock::now() - start).count();
  std::vector<int> peers;
  for (int r = 0; r < s.group.size(); ++r)
    if (r != s.group.rank) peers.push_back(s.group.world_ranks[static_cast<size_t>(r)]);
  std::string peer_names;
  for (int w : peers) peer_names += (peer_names.empty() ? "" : ", ") + s.options.namer(w);
  std::string culprit = describe_gone_ranks(s.options.store.get(), peers, s.options.namer);
  if (!culprit.empty()) culprit = "; " + culprit;
  if (culprit.empty() && !peers.empty())
    culprit = "; every peer is still connected to the head (a peer is stuck or a link is cut)";
  return fmt::format("NCCL {} on group {} (rank {} of {}, peers {}) failed after {} ms (timeout {} ms): {}{}", op,
                     s.group.name, s.group.rank, s.group.size(), peer_names.empty() ? "none" : peer_names, ms,
                     s.options.timeout.count(), what, culprit);
}

// Ends the process from any thread without touching locks another thread may hold.
[[noreturn]] void die(const std::string& message) {
  std::string line = "error: " + message + "\n";
  ssize_t n = ::write(2, line.data(), line.size());
  (void)n;
  ::_exit(1);
}

// One thread per process watching every stream-ordered communicator (shared by them; it
// stops when the last one is destroyed).
class Watchdog {
 public:
  static std::shared_ptr<Watchdog> get() {
    static std::mutex mu;
    static std::weak_ptr<Watchdog> current;
    std::lock_guard<std::mutex> lk(mu);
    std::shared_ptr<Watchdog> w = current.lock();
    if (!w) {
      w = std::shared_ptr<Watchdog>(new Watchdog());
      current = w;
    }
    return w;
  }

  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  void add(std::shared_ptr<CommState> s) {
    std::lock_guard<std::mutex> lk(mu_);
    comms_.push_back(std::move(s));
  }
  void remove(const CommState* s) {
    std::lock_guard<std::mutex> lk(mu_);
    comms_.erase(std::remove_if(comms_.begin(), comms_.end(), [&](const auto& p) { return p.get() == s; }),
                 comms_.end());
  }
  // A call was queued (the caller holds no CommState lock).
  void wake() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      work_ = true;
    }
    cv_.notify_one();
  }

  // Aborts every stream-ordered communicator of the process: `origin` fails with `message`,
  // the others cite it. Logged once. The caller holds no CommState lock.
  void fail_all(CommState& origin, const std::string& message) {
    std::vector<std::shared_ptr<CommState>> comms;
    bool first = false;
    {
      std::lock_guard<std::mutex> lk(mu_);
      comms = comms_;
      if (!failure_) {
        failure_ = message;
        failed_at_ = Clock::now();
        exit_after_ = origin.options.exit_after_failure;
        first = true;
      }
    }
    abort_one(origin, message);
    for (auto& s : comms)
      if (s.get() != &origin)
        abort_one(*s, fmt::format("aborted because group {} failed: {}", origin.group.name, message));
    if (first) TLOG_ERROR("{}", message);
    cv_.notify_one();
  }

 private:
  Watchdog() : thread_([this] { loop(); }) {}

  static void abort_one(CommState& s, const std::string& message) {
    std::lock_guard<std::mutex> lk(s.mu);
    if (s.closed || s.broken) return;
    s.broken = message;
    if (s.comm) ncclCommAbort(s.comm);  // the NCCL kernels exit; never a blocking destroy
    s.comm = nullptr;
    s.done_cv.notify_all();
  }

  void loop() {
    // Never prohibited from event queries while another thread captures a graph (a thread
    // in the default global mode would be, and its query would invalidate that capture).
    cuda::relax_capture_mode_for_this_thread();
    int current_device = -1;
    bool busy = false;
    for (;;) {
      std::vector<std::shared_ptr<CommState>> comms;
      std::optional<std::string> failure;
      std::optional<Clock::time_point> failed_at;
      milliseconds exit_after{0};
      {
        std::unique_lock<std::mutex> lk(mu_);
        if (busy || failure_)
          cv_.wait_for(lk, kWatchInterval, [&] { return stop_; });
        else
          cv_.wait(lk, [&] { return stop_ || work_; });
        if (stop_) return;
        work_ = false;
        comms = comms_;
        failure = failure_;
        failed_at = failed_at_;
        exit_after = exit_after_;
      }
      busy = false;
      bool undrained = false;
      for (auto& s : comms) {
        std::unique_lock<std::mutex> lk(s->mu, std::try_to_lock);
        if (!lk) {  // its owner is enqueueing (and enforces its own deadline meanwhile)
          busy = true;
          continue;
        }
        if (s->closed) continue;
        if (s->options.device_index != current_device && cuda::try_set_device(s->options.device_index))
          current_device = s->options.device_index;
        std::optional<std::string> what;
        std::string op;
        Clock::time_point started{};
        const Clock::time_point now = Clock::now();
        bool advanced = false;
        while (!s->pending.empty()) {
          Pending& p = s->pending.front();
          cuda::EventQuery q = cuda::query_event(p.event);
          if (q.state == cuda::EventState::kDone) {
            s->done_seq = p.seq;
            s->last_done = now;
            stream_progress_[s->options.stream] = now;
            s->spare.push_back(p.event);
            s->pending.pop_front();
            advanced = true;
            continue;
          }
          if (s->broken) {  // aborted: only waiting for the stream to drain
            undrained = true;
            break;
          }
          op = p.op;
          // A call starts once the work queued before it is done: counted from the latest
          // completion seen on its stream (any communicator's call), at least its enqueue.
          started = std::max({p.enqueued, s->last_done, stream_progress_[s->options.stream]});
          if (q.state == cuda::EventState::kFailed)
            what = fmt::format("CUDA reports {}", q.error);
          else if (now - started >= s->options.timeout)
            what = "timed out";
          break;
        }
        if (advanced) s->done_cv.notify_all();
        if (!what && s->comm && !s->broken) {
          ncclResult_t state = ncclSuccess;
          ncclResult_t r = ncclCommGetAsyncError(s->comm, &state);
          if (r != ncclSuccess) state = r;
          if (state != ncclSuccess && state != ncclInProgress) {
            what = fmt::format("NCCL reports {}", ncclGetErrorString(state));
            if (s->pending.empty()) {
              op = "(between calls)";
              started = now;
            }
          }
        }
        busy |= !s->pending.empty();
        if (what) {
          lk.unlock();
          fail_all(*s, describe_failure(*s, op, started, *what));
          busy = true;
        }
      }
      if (failure && failed_at) {
        auto since = Clock::now() - *failed_at;
        if (undrained && since >= kDrainGrace)
          die(fmt::format("{} (the GPU stream did not drain within {} s of ncclCommAbort)", *failure,
                          kDrainGrace.count()));
        if (exit_after.count() > 0 && since >= exit_after) die(*failure);
      }
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false, work_ = false;
  std::vector<std::shared_ptr<CommState>> comms_;
  std::optional<std::string> failure_;
  std::optional<Clock::time_point> failed_at_;
  milliseconds exit_after_{0};
  std::map<void*, Clock::time_point> stream_progress_;  // the watchdog thread's own
  std::thread thread_;                                  // last: started once the members above exist
};

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(const GroupInfo& group, ncclComm_t comm, const NcclOptions& options)
      : st_(std::make_shared<CommState>()), ordered_(options.stream != nullptr) {
    st_->comm = comm;
    st_->group = group;
    st_->options = options;
    try {
      if (ordered_) {
        stream_ = static_cast<cuda::StreamHandle>(options.stream);
      } else {
        stream_ = cuda::create_stream();
        own_stream_ = true;
      }
      done_ = cuda::create_event();
      barrier_buffer_ = cuda::device_alloc(sizeof(float));
    } catch (...) {
      ncclCommAbort(comm);
      cuda::device_free(barrier_buffer_);
      cuda::destroy_event(done_);
      if (own_stream_) cuda::destroy_stream(stream_);
      throw;
    }
    if (ordered_) {
      watchdog_ = Watchdog::get();
      watchdog_->add(st_);
    }
  }

  ~NcclCommunicator() override {
    if (watchdog_) watchdog_->remove(st_.get());
    ncclComm_t comm = nullptr;
    std::vector<cuda::EventHandle> events;
    {
      std::lock_guard<std::mutex> lk(st_->mu);
      st_->closed = true;
      comm = st_->comm;
      st_->comm = nullptr;
      for (const Pending& p : st_->pending) events.push_back(p.event);
      events.insert(events.end(), st_->spare.begin(), st_->spare.end());
      st_->pending.clear();
      st_->spare.clear();
    }
    if (comm && std::uncaught_exceptions() > 0) {
      ncclCommAbort(comm);  // unwinding from a failure: peers may be gone; never a blocking destroy
    } else if (comm) {
      // Finalize is non-blocking on this communicator; if it does not finish in time, abort.
      ncclCommFinalize(comm);
      Deadline deadline = Clock::now() + st_->options.timeout;
      ncclResult_t state = ncclInProgress;
      while (Clock::now() < deadline) {
        if (ncclCommGetAsyncError(comm, &state) != ncclSuccess || state != ncclInProgress) break;
        std::this_thread::sleep_for(milliseconds(1));
      }
      if (state == ncclSuccess)
        ncclCommDestroy(comm);
      else
        ncclCommAbort(comm);
    }
    for (cuda::EventHandle e : events) cuda::destroy_event(e);
    cuda::device_free(barrier_buffer_);
    cuda::destroy_event(done_);
    if (own_stream_) cuda::destroy_stream(stream_);
  }

  const GroupInfo& group() const override { return st_->group; }
  std::string backend() const override { return "nccl"; }
  bool stream_ordered() const override { return ordered_; }
  void raise_if_failed() const override {
    std::lock_guard<std::mutex> lk(st_->mu);
    if (st_->broken) fail(ErrorKind::kNetwork, "{}", *st_->broken);
  }
  void watch_stream(const char* what) override {
    if (!ordered_) return;
    run(what, [](ncclComm_t) { return ncclSuccess; });  // nothing enqueued: only the event
  }

  void all_reduce(const Tensor& t, ReduceOp) override {
    check_device(t, "all_reduce");
    ncclDataType_t type = float_type(t, "all_reduce");
    run("all_reduce",
        [&](ncclComm_t c) { return ncclAllReduce(t.raw(), t.raw(), t.numel(), type, ncclSum, c, stream_); });
  }

  void all_gather(const Tensor& input, const Tensor& output) override {
    check_device(input, "all_gather");
    check_device(output, "all_gather");
    check_gathered(input, output, "all_gather");
    run("all_gather",
        [&](ncclComm_t c) { return ncclAllGather(input.raw(), output.raw(), input.nbytes(), ncclUint8, c, stream_); });
  }

  void gather(const Tensor& input, const Tensor& output, int root) override {
    check_device(input, "gather");
    check_rank(root, "gather root");
    if (rank() == root) {
      check_device(output, "gather");
      check_gathered(input, output, "gather");
    }
    // NCCL has no gather: the root receives every rank's piece in one group call.
    run("gather", [&](ncclComm_t c) {
      ncclResult_t r = ncclGroupStart();
      if (r != ncclSuccess) return r;
      ncclResult_t first = ncclSuccess;
      auto keep = [&](ncclResult_t x) {
        if (first == ncclSuccess && x != ncclSuccess && x != ncclInProgress) first = x;
      };
      if (rank() == root) {
        for (int p = 0; p < size(); ++p) {
          char* dst = static_cast<char*>(output.raw()) + static_cast<size_t>(p) * input.nbytes();
          if (p == root) {
            if (!cuda::copy_device_async(dst, input.raw(), input.nbytes(), stream_)) first = ncclUnhandledCudaError;
          } else {
            keep(ncclRecv(dst, input.nbytes(), ncclUint8, p, c, stream_));
          }
        }
      } else {
        keep(ncclSend(input.raw(), input.nbytes(), ncclUint8, root, c, stream_));
      }
      ncclResult_t end = ncclGroupEnd();
      return first != ncclSuccess ? first : end;
    });
  }

  void broadcast(const Tensor& t, int root) override {
    check_device(t, "broadcast");
    check_rank(root, "broadcast root");
    run("broadcast",
        [&](ncclComm_t c) { return ncclBroadcast(t.raw(), t.raw(), t.nbytes(), ncclUint8, root, c, stream_); });
  }

  void send(const Tensor& t, int peer) override {
    check_device(t, "send");
    check_rank(peer, "send peer");
    run("send", [&](ncclComm_t c) { return ncclSend(t.raw(), t.nbytes(), ncclUint8, peer, c, stream_); });
  }

  void recv(const Tensor& t, int peer) override {
    check_device(t, "recv");
    check_rank(peer, "recv peer");
    run("recv", [&](ncclComm_t c) { return ncclRecv(t.raw(), t.nbytes(), ncclUint8, peer, c, stream_); });
  }

  // Waits for completion in both modes (a barrier that returned early would be no barrier),
  // except while the stream is captured into a graph.
  void barrier() override {
    uint64_t seq = run("barrier", [&](ncclComm_t c) {
      return ncclAllReduce(barrier_buffer_, barrier_buffer_, 1, ncclFloat32, ncclSum, c, stream_);
    });
    if (!ordered_ || seq == 0) return;
    std::unique_lock<std::mutex> lk(st_->mu);
    // The watchdog enforces the timeout and sets `broken`; the limit here is a backstop.
    bool done = st_->done_cv.wait_for(lk, st_->options.timeout + kDrainGrace,
                                      [&] { return st_->done_seq >= seq || st_->broken.has_value(); });
    if (st_->broken) fail(ErrorKind::kNetwork, "{}", *st_->broken);
    if (!done)
      fail(ErrorKind::kNetwork, "NCCL barrier on group {}: not complete after {} ms and no failure seen",
           st_->group.name, (st_->options.timeout + kDrainGrace).count());
  }

 private:
  void check_device(const Tensor& t, const char* op) const {
    if (!t.defined() || t.device().type != DeviceType::kCUDA)
      fail(ErrorKind::kInvalidArgument, "{}: the NCCL communicator takes CUDA tensors", op);
  }
  ncclDataType_t float_type(const Tensor& t, const char* op) const {
    if (t.dtype() != DType::kF32 && t.dtype() != DType::kBF16 && t.dtype() != DType::kF16)
      fail(ErrorKind::kUnsupported, "{} takes f32, bf16 or f16 tensors, not {}", op, dtype_name(t.dtype()));
    return *nccl_type(t.dtype());
  }
  void check_rank(int r, const char* what) const {
    if (r < 0 || r >= size())
      fail(ErrorKind::kInvalidArgument, "{} {} outside group {} of {}", what, r, st_->group.name, size());
  }
  void check_gathered(const Tensor& input, const Tensor& output, const char* op) const {
    if (!output.defined() || output.nbytes() != input.nbytes() * static_cast<size_t>(size()))
      fail(ErrorKind::kInvalidArgument, "{}: output must hold {} x input {}", op, size(), input.str());
  }

  // Enqueues under the state lock (the watchdog never aborts the communicator in the middle
  // of an NCCL call). Blocking mode: then waits for the stream with the deadline while
  // watching NCCL's async error. Stream-ordered mode: records an event for the watchdog and
  // returns. Returns the call's sequence number (0: not watched, e.g. during graph capture).
  template <typename F>
  uint64_t run(const char* op, F&& enqueue) {
    std::unique_lock<std::mutex> lk(st_->mu);
    if (st_->broken)
      fail(ErrorKind::kNetwork, "{} on group {}: the NCCL communicator was aborted after a failure: {}", op,
           st_->group.name, *st_->broken);
    const Clock::time_point start = Clock::now();
    const Deadline deadline = start + st_->options.timeout;
    ncclComm_t comm = st_->comm;
    std::string what;
    ncclResult_t r = enqueue(comm);
    if (r != ncclSuccess && r != ncclInProgress) what = ncclGetErrorString(r);
    // A non-blocking communicator may still be enqueueing.
    while (what.empty()) {
      ncclResult_t state = ncclSuccess;
      ncclResult_t q = ncclCommGetAsyncError(comm, &state);
      if (q != ncclSuccess) state = q;
      if (state == ncclSuccess) break;
      if (state != ncclInProgress)
        what = ncclGetErrorString(state);
      else if (Clock::now() >= deadline)
        what = "timed out enqueueing";
      else
        std::this_thread::yield();
    }
    if (what.empty() && ordered_) {
      if (cuda::stream_is_capturing(stream_)) return 0;  // captured into a graph, not run now: nothing to watch
      cuda::EventHandle event = nullptr;
      if (!st_->spare.empty()) {
        event = st_->spare.back();
        st_->spare.pop_back();
      } else {
        try {
          event = cuda::create_event();
        } catch (const Error& e) {
          what = e.what();
        }
      }
      if (what.empty()) {
        what = cuda::record_event(event, stream_);
        if (!what.empty()) st_->spare.push_back(event);
      }
      if (what.empty()) {
        const uint64_t seq = st_->next_seq++;
        st_->pending.push_back(Pending{seq, op, event, start});
        lk.unlock();
        watchdog_->wake();
        return seq;
      }
    } else if (what.empty()) {
      if (std::string r = cuda::record_event(done_, stream_); !r.empty()) fail(ErrorKind::kInternal, "{}", r);
      for (;;) {
        cuda::EventQuery q = cuda::query_event(done_);
        if (q.state == cuda::EventState::kDone) return st_->next_seq++;
        if (q.state == cuda::EventState::kFailed) {
          what = q.error;
          break;
        }
        ncclResult_t state = ncclSuccess;
        ncclCommGetAsyncError(comm, &state);
        if (state != ncclSuccess && state != ncclInProgress) {
          what = ncclGetErrorString(state);
          break;
        }
        if (Clock::now() >= deadline) {
          what = "timed out";
          break;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
    lk.unlock();
    std::string message = describe_failure(*st_, op, start, what);
    if (watchdog_) {
      watchdog_->fail_all(*st_, message);
    } else {
      std::lock_guard<std::mutex> g(st_->mu);
      st_->broken = message;
      ncclCommAbort(comm);  // frees the GPU from the stuck kernel; never a blocking destroy
      st_->comm = nullptr;
      TLOG_ERROR("{}", message);
    }
    fail(ErrorKind::kNetwork, "{}", message);
  }

  std::shared_ptr<CommState> st_;
  const bool ordered_;
  std::shared_ptr<Watchdog> watchdog_;
  cuda::StreamHandle stream_ = nullptr;
  bool own_stream_ = false;
  cuda::EventHandle done_ = nullptr;
  void* barrier_buffer_ = nullptr;
};

}  // namespace

NcclCommunicatorFactory::NcclCommunicatorFactory(NcclOptions options) : options_(std::move(options)) {
  if (!options_.store) fail(ErrorKind::kInvalidArgument, "the NCCL communicator needs a bootstrap store");
  if (!options_.namer) options_.namer = [](int r) { return fmt::format("rank {}", r); };
  setenv("NCCL_NVLS_ENABLE", "0", 1);  // no NVLink multicast, whatever the environment says
}

std::unique_ptr<Communicator> NcclCommunicatorFactory::create(const GroupInfo& group) {
  cuda::set_device(options_.device_index);
  std::string key = "nccl/" + group.name + "/unique_id";
  ncclUniqueId id;
  if (group.rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) fail(ErrorKind::kNetwork, "ncclGetUniqueId failed: {}", ncclGetErrorString(r));
    options_.store->set(key, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(&id), sizeof id));
  } else {
    std::vector<uint8_t> bytes = options_.store->wait_get(
        key, options_.timeout,
        fmt::format("{} to publish the NCCL id of group {}", options_.namer(group.world_ranks[0]), group.name));
    if (bytes.size() != sizeof id)
      fail(ErrorKind::kCorrupt, "NCCL id of group {} has {} bytes", group.name, bytes.size());
    std::memcpy(&id, bytes.data(), sizeof id);
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, group.size(), id, group.rank, &config);
  Deadline deadline = Clock::now() + options_.timeout;
  while (r == ncclInProgress || r == ncclSuccess) {
    ncclResult_t state;
    ncclCommGetAsyncError(comm, &state);
    if (state == ncclSuccess) return std::make_unique<NcclCommunicator>(group, comm, options_);
    if (state != ncclInProgress) {
      r = state;
      break;
    }
    if (Clock::now() >= deadline) {
      ncclCommAbort(comm);
      fail(ErrorKind::kNetwork,
           "NCCL group {} (rank {} of {}) did not initialise within {} ms; a peer is missing or NCCL cannot reach it "
           "over NCCL_SOCKET_IFNAME={}",
           group.name, group.rank, group.size(), options_.timeout.count(),
           std::getenv("NCCL_SOCKET_IFNAME") ? std::getenv("NCCL_SOCKET_IFNAME") : "(unset)");
    }
    std::this_thread::sleep_for(milliseconds(1));
  }
  if (comm) ncclCommAbort(comm);
  fail(ErrorKind::kNetwork, "NCCL group {} (rank {} of {}) failed to initialise: {}", group.name, group.rank,
       group.size(), ncclGetErrorString(r));
}

}  // namespace tessera::dist
