#include "distributed/gloo_communicator.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/gather.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <cstdlib>
#include <optional>
#include <thread>

#include "core/dtype.h"
#include "core/error.h"
#include "core/logging.h"
#include "distributed/socket.h"

namespace tessera::dist {

namespace {

std::string default_name(int world_rank) { return fmt::format("rank {}", world_rank); }

// Gloo's rendezvous talks to a gloo::rendezvous::Store; this one forwards to ours with a
// per-group key prefix and our timeout, and names the rank it is waiting for.
class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(KeyValueStore& store, const GroupInfo& group, std::chrono::milliseconds timeout, RankNamer namer)
      : store_(store), group_(group), timeout_(timeout), namer_(std::move(namer)) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_.set(prefixed(key), std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(data.data()), data.size()));
  }
  std::vector<char> get(const std::string& key) override {
    std::vector<uint8_t> v = store_.wait_get(prefixed(key), timeout_, describe(key));
    return {v.begin(), v.end()};
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    Deadline deadline = deadline_after(timeout.count() > 0 ? timeout : timeout_);
    for (const std::string& key : keys) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      store_.wait_get(prefixed(key), std::max(left, std::chrono::milliseconds(1)), describe(key));
    }
  }

 private:
  std::string prefixed(const std::string& key) const { return "gloo/" + group_.name + "/" + key; }
  // Gloo's full-mesh keys are the group ranks ("0", "1", ...); say whose address is missing.
  std::string describe(const std::string& key) const {
    char* end = nullptr;
    long r = std::strtol(key.c_str(), &end, 10);
    if (!key.empty() && end && *end == '\0' && r >= 0 && r < group_.size())
      return fmt::format("{} to join group {} (it never published its Gloo address)",
                         namer_(group_.world_ranks[static_cast<size_t>(r)]), group_.name);
    return fmt::format("key {} of group {}", key, group_.name);
  }

  KeyValueStore& store_;
  GroupInfo group_;
  std::chrono::milliseconds timeout_;
  RankNamer namer_;
};

void bf16_sum(void* c, const void* a, const void* b, size_t n) {
  auto* out = static_cast<uint16_t*>(c);
  auto* x = static_cast<const uint16_t*>(a);
  auto* y = static_cast<const uint16_t*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = f32_to_bf16(bf16_to_f32(x[i]) + bf16_to_f32(y[i]));
}

class GlooCommunicator : public Communicator {
 public:
  GlooCommunicator(const GroupInfo& group, std::shared_ptr<gloo::Context> context, const GlooOptions& options)
      : group_(group), context_(std::move(context)), options_(options) {
    send_seq_.assign(static_cast<size_t>(group.size()), 0);
    recv_seq_.assign(static_cast<size_t>(group.size()), 0);
  }

  const GroupInfo& group() const override { return group_; }
  std::string backend() const override { return "gloo"; }

  void all_reduce(const Tensor& t, ReduceOp op) override {
    check_host(t, "all_reduce");
    run("all_reduce", all_peers(), [&] {
      gloo::AllreduceOptions opts(context_);
      opts.setTimeout(options_.timeout);
      opts.setTag(next_tag());
      if (t.dtype() == DType::kF32) {
        opts.setOutput(t.data<float>(), static_cast<size_t>(t.numel()));
        opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      } else if (t.dtype() == DType::kBF16) {
        opts.setOutput(t.data<uint16_t>(), static_cast<size_t>(t.numel()));
        opts.setReduceFunction(&bf16_sum);
      } else {
        fail(ErrorKind::kUnsupported, "all_reduce takes f32 or bf16 tensors, not {}", dtype_name(t.dtype()));
      }
      gloo::allreduce(opts);
    });
  }

  void all_gather(const Tensor& input, const Tensor& output) override {
    check_host(input, "all_gather");
    check_host(output, "all_gather");
    check_gathered(input, output, "all_gather");
    run("all_gather", all_peers(), [&] {
      gloo::AllgatherOptions opts(context_);
      opts.setTimeout(options_.timeout);
      opts.setTag(next_tag());
      opts.setInput(static_cast<uint8_t*>(input.raw()), input.nbytes());
      opts.setOutput(static_cast<uint8_t*>(output.raw()), output.nbytes());
      gloo::allgather(opts);
    });
  }

  void gather(const Tensor& input, const Tensor& output, int root) override {
    check_host(input, "gather");
    check_rank(root, "gather root");
    if (rank() == root) {
      check_host(output, "gather");
      check_gathered(input, output, "gather");
    }
    run("gather", rank() == root ? all_peers() : std::vector<int>{root}, [&] {
      gloo::GatherOptions opts(context_);
      opts.setTimeout(options_.timeout);
      opts.setTag(next_tag());
      opts.setRoot(root);
      opts.setInput(static_cast<uint8_t*>(input.raw()), input.nbytes());
      if (rank() == root) opts.setOutput(static_cast<uint8_t*>(output.raw()), output.nbytes());
      gloo::gather(opts);
    });
  }

  void broadcast(const Tensor& t, int root) override {
    check_host(t, "broadcast");
    check_rank(root, "broadcast root");
    run("broadcast", rank() == root ? all_peers() : std::vector<int>{root}, [&] {
      gloo::BroadcastOptions opts(context_);
      opts.setTimeout(options_.timeout);
      opts.setTag(next_tag());
      opts.setRoot(root);
      opts.setOutput(static_cast<uint8_t*>(t.raw()), t.nbytes());
      gloo::broadcast(opts);
    });
  }

  void send(const Tensor& t, int peer) override {
    check_host(t, "send");
    check_rank(peer, "send peer");
    run("send", {peer}, [&] {
      auto buf = context_->createUnboundBuffer(t.raw(), t.nbytes());
      buf->send(peer, p2p_slot(send_seq_[static_cast<size_t>(peer)]++));
      if (!buf->waitSend(options_.timeout)) fail(ErrorKind::kNetwork, "send aborted");
    });
  }

  void recv(const Tensor& t, int peer) override {
    check_host(t, "recv");
    check_rank(peer, "recv peer");
    run("recv", {peer}, [&] {
      auto buf = context_->createUnboundBuffer(t.raw(), t.nbytes());
      buf->recv(peer, p2p_slot(recv_seq_[static_cast<size_t>(peer)]++));
      if (!buf->waitRecv(options_.timeout)) fail(ErrorKind::kNetwork, "recv aborted");
    });
  }

  void barrier() override {
    run("barrier", all_peers(), [&] {
      gloo::BarrierOptions opts(context_);
      opts.setTimeout(options_.timeout);
      opts.setTag(next_tag());
      gloo::barrier(opts);
    });
  }

 private:
  // Point-to-point slots live in their own range (Gloo's collectives use small prefixes in
  // the top byte); matching is per (peer, slot), so a per-direction counter pairs sends with receives.
  static uint64_t p2p_slot(uint64_t seq) { return (uint64_t{0x7e} << 56) | (seq & ((uint64_t{1} << 48) - 1)); }
  uint32_t next_tag() { return tag_++; }

  std::vector<int> all_peers() const {
    std::vector<int> p;
    for (int r = 0; r < size(); ++r)
      if (r != rank()) p.push_back(r);
    return p;
  }

  void check_host(const Tensor& t, const char* op) const {
    if (!t.defined()) fail(ErrorKind::kInvalidArgument, "{}: undefined tensor", op);
    if (t.device().type != DeviceType::kCPU)
      fail(ErrorKind::kInvalidArgument,
           "{}: the Gloo communicator takes host tensors, got one on {}; use NCCL for "
           "CUDA tensors",
           op, t.device().str());
  }
  void check_rank(int r, const char* what) const {
    if (r < 0 || r >= size())
      fail(ErrorKind::kInvalidArgument, "{} {} outside group {} of {}", what, r, group_.name, size());
  }
  void check_gathered(const Tensor& input, const Tensor& output, const char* op) const {
    if (output.nbytes() != input.nbytes() * static_cast<size_t>(size()))
      fail(ErrorKind::kInvalidArgument, "{}: output {} must hold {} x input {}", op, output.str(), size(), input.str());
  }

  std::string name_of(int group_rank) const {
    int world = group_.world_ranks[static_cast<size_t>(group_rank)];
    return options_.namer ? options_.namer(world) : default_name(world);
  }

  // Runs one Gloo call; any failure breaks the communicator and is reported with the peers
  // whose processes the head saw go.
  template <typename F>
  void run(const char* op, const std::vector<int>& peers, F&& call) {
    if (broken_)
      fail(ErrorKind::kNetwork, "{} on group {}: communicator unusable after an earlier failure: {}", op, group_.name,
           *broken_);
    Clock::time_point start = Clock::now();
    try {
      call();
      return;
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::kNetwork) throw;  // argument errors leave the communicator usable
      broken_ = describe_failure(op, peers, start, e.what());
    } catch (const std::exception& e) {
      broken_ = describe_failure(op, peers, start, e.what());
    }
    TLOG_ERROR("{}", *broken_);
    fail(ErrorKind::kNetwork, "{}", *broken_);
  }

  std::string describe_failure(const char* op, const std::vector<int>& peers, Clock::time_point start,
                               const std::string& what) {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
    std::vector<int> world_peers;
    for (int p : peers) world_peers.push_back(group_.world_ranks[static_cast<size_t>(p)]);
    std::string culprit = describe_gone_ranks(options_.store.get(), world_peers, options_.namer);
    if (!culprit.empty()) culprit = "; " + culprit;
    if (culprit.empty()) {
      std::string names;
      for (int p : peers) names += (names.empty() ? "" : ", ") + name_of(p);
      culprit = fmt::format(
          "; peer{} {} still connected to the head, so a peer is stuck or the link between "
          "ranks is cut",
          peers.size() == 1 ? "" : "s", names);
    }
    return fmt::format("{} on group {} (rank {} of {}) failed after {} ms (timeout {} ms): {}{}", op, group_.name,
                       rank(), size(), ms, options_.timeout.count(), what, culprit);
  }

  GroupInfo group_;
  std::shared_ptr<gloo::Context> context_;
  GlooOptions options_;
  uint32_t tag_ = 1;
  std::vector<uint64_t> send_seq_, recv_seq_;
  std::optional<std::string> broken_;
};

}  // namespace

GlooCommunicatorFactory::GlooCommunicatorFactory(GlooOptions options) : options_(std::move(options)) {
  if (!options_.store) fail(ErrorKind::kInvalidArgument, "the Gloo communicator needs a bootstrap store");
  if (!options_.namer) options_.namer = default_name;
}

std::unique_ptr<Communicator> GlooCommunicatorFactory::create(const GroupInfo& group) {
  gloo::transport::tcp::attr attr;
  attr.hostname = options_.ip;  // bind to the chosen NIC's address, never the wildcard
  std::shared_ptr<gloo::transport::Device> device;
  try {
    device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    fail(ErrorKind::kNetwork, "Gloo cannot use address {}: {}", options_.ip, e.what());
  }
  auto context = std::make_shared<gloo::rendezvous::Context>(group.rank, group.size());
  context->setTimeout(options_.timeout);
  GlooStoreAdapter store(*options_.store, group, options_.timeout, options_.namer);
  try {
    context->connectFullMesh(store, device);
  } catch (const Error& e) {
    fail(ErrorKind::kNetwork, "group {} (rank {} of {}) could not connect: {}", group.name, group.rank, group.size(),
         e.what());
  } catch (const std::exception& e) {
    std::vector<int> peers;
    for (int r = 0; r < group.size(); ++r)
      if (r != group.rank) peers.push_back(group.world_ranks[static_cast<size_t>(r)]);
    std::string gone = describe_gone_ranks(options_.store.get(), peers, options_.namer);
    fail(ErrorKind::kNetwork, "group {} (rank {} of {}) could not connect over Gloo on {}: {}{}", group.name,
         group.rank, group.size(), options_.ip, e.what(), gone.empty() ? "" : "; " + gone);
  }
  return std::make_unique<GlooCommunicator>(group, std::move(context), options_);
}

}  // namespace tessera::dist
