#include "dist/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>

#include "core/error.h"
#include "core/logging.h"
#include "dist/socket.h"

namespace tessera::dist {

namespace {

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail(ErrorKind::kInternal, "{}: {}", what, cudaGetErrorString(e));
}

std::optional<ncclDataType_t> nccl_type(DType t) {
  switch (t) {
    case DType::kF32: return ncclFloat32;
    case DType::kBF16: return ncclBfloat16;
    case DType::kF16: return ncclFloat16;
    case DType::kI32: return ncclInt32;
    case DType::kI64: return ncclInt64;
    case DType::kU8: return ncclUint8;
    default: return std::nullopt;
  }
}

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(const GroupInfo& group, ncclComm_t comm, const NcclOptions& options)
      : group_(group), comm_(comm), options_(options) {
    if (options_.stream) {
      stream_ = static_cast<cudaStream_t>(options_.stream);
    } else {
      check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
      own_stream_ = true;
    }
    check_cuda(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(cudaMalloc(&barrier_buffer_, sizeof(float)), "cudaMalloc");
  }

  ~NcclCommunicator() override {
    if (comm_) {
      // Finalize is non-blocking on this communicator; if it does not finish in time, abort.
      ncclCommFinalize(comm_);
      bool clean = true;
      Deadline deadline = Clock::now() + options_.timeout;
      ncclResult_t state = ncclInProgress;
      while (clean && Clock::now() < deadline) {
        if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess || state != ncclInProgress) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      if (state == ncclSuccess) ncclCommDestroy(comm_);
      else ncclCommAbort(comm_);
    }
    cudaFree(barrier_buffer_);
    cudaEventDestroy(done_);
    if (own_stream_) cudaStreamDestroy(stream_);
  }

  const GroupInfo& group() const override { return group_; }
  std::string backend() const override { return "nccl"; }

  void all_reduce(const Tensor& t, ReduceOp) override {
    check_device(t, "all_reduce");
    ncclDataType_t type = float_type(t, "all_reduce");
    run("all_reduce", [&] { return ncclAllReduce(t.raw(), t.raw(), t.numel(), type, ncclSum, comm_, stream_); });
  }

  void all_gather(const Tensor& input, const Tensor& output) override {
    check_device(input, "all_gather");
    check_device(output, "all_gather");
    check_gathered(input, output, "all_gather");
    run("all_gather",
        [&] { return ncclAllGather(input.raw(), output.raw(), input.nbytes(), ncclUint8, comm_, stream_); });
  }

  void gather(const Tensor& input, const Tensor& output, int root) override {
    check_device(input, "gather");
    check_rank(root, "gather root");
    if (rank() == root) check_gathered(input, output, "gather");
    // NCCL has no gather: the root receives every rank's piece in one group call.
    run("gather", [&] {
      ncclResult_t r = ncclGroupStart();
      if (r != ncclSuccess) return r;
      if (rank() == root) {
        for (int p = 0; p < size(); ++p) {
          char* dst = static_cast<char*>(output.raw()) + static_cast<size_t>(p) * input.nbytes();
          if (p == root) {
            cudaMemcpyAsync(dst, input.raw(), input.nbytes(), cudaMemcpyDeviceToDevice, stream_);
          } else {
            ncclRecv(dst, input.nbytes(), ncclUint8, p, comm_, stream_);
          }
        }
      } else {
        ncclSend(input.raw(), input.nbytes(), ncclUint8, root, comm_, stream_);
      }
      return ncclGroupEnd();
    });
  }

  void broadcast(const Tensor& t, int root) override {
    check_device(t, "broadcast");
    check_rank(root, "broadcast root");
    run("broadcast", [&] { return ncclBroadcast(t.raw(), t.raw(), t.nbytes(), ncclUint8, root, comm_, stream_); });
  }

  void send(const Tensor& t, int peer) override {
    check_device(t, "send");
    check_rank(peer, "send peer");
    run("send", [&] { return ncclSend(t.raw(), t.nbytes(), ncclUint8, peer, comm_, stream_); });
  }

  void recv(const Tensor& t, int peer) override {
    check_device(t, "recv");
    check_rank(peer, "recv peer");
    run("recv", [&] { return ncclRecv(t.raw(), t.nbytes(), ncclUint8, peer, comm_, stream_); });
  }

  void barrier() override {
    run("barrier", [&] { return ncclAllReduce(barrier_buffer_, barrier_buffer_, 1, ncclFloat32, ncclSum, comm_, stream_); });
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
    if (r < 0 || r >= size()) fail(ErrorKind::kInvalidArgument, "{} {} outside group {} of {}", what, r, group_.name, size());
  }
  void check_gathered(const Tensor& input, const Tensor& output, const char* op) const {
    if (!output.defined() || output.nbytes() != input.nbytes() * static_cast<size_t>(size()))
      fail(ErrorKind::kInvalidArgument, "{}: output must hold {} x input {}", op, size(), input.str());
  }

  // Enqueues, then waits for the stream with a deadline while watching NCCL's async error.
  template <typename F>
  void run(const char* op, F&& enqueue) {
    if (broken_) fail(ErrorKind::kNetwork, "{} on group {}: communicator aborted after an earlier failure: {}", op,
                      group_.name, *broken_);
    Clock::time_point start = Clock::now();
    Deadline deadline = start + options_.timeout;
    ncclResult_t r = enqueue();
    std::string what;
    if (r != ncclSuccess && r != ncclInProgress) what = ncclGetErrorString(r);
    // A non-blocking communicator may still be enqueueing.
    while (what.empty()) {
      ncclResult_t state;
      ncclCommGetAsyncError(comm_, &state);
      if (state == ncclSuccess) break;
      if (state != ncclInProgress) what = ncclGetErrorString(state);
      else if (Clock::now() >= deadline) what = "timed out enqueueing";
      else std::this_thread::yield();
    }
    if (what.empty()) {
      check_cuda(cudaEventRecord(done_, stream_), "cudaEventRecord");
      for (;;) {
        cudaError_t q = cudaEventQuery(done_);
        if (q == cudaSuccess) return;
        if (q != cudaErrorNotReady) {
          what = cudaGetErrorString(q);
          break;
        }
        ncclResult_t state;
        ncclCommGetAsyncError(comm_, &state);
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
    broken_ = describe_failure(op, start, what);
    ncclCommAbort(comm_);  // frees the GPU from the stuck kernel; never a blocking destroy
    comm_ = nullptr;
    TLOG_ERROR("{}", *broken_);
    fail(ErrorKind::kNetwork, "{}", *broken_);
  }

  std::string describe_failure(const char* op, Clock::time_point start, const std::string& what) {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
    std::vector<int> peers;
    for (int r = 0; r < size(); ++r)
      if (r != rank()) peers.push_back(group_.world_ranks[static_cast<size_t>(r)]);
    std::string culprit = describe_gone_ranks(options_.store.get(), peers, options_.namer);
    if (!culprit.empty()) culprit = "; " + culprit;
    if (culprit.empty()) culprit = "; every peer is still connected to the head (a peer is stuck or a link is cut)";
    return fmt::format("{} on group {} (rank {} of {}) failed after {} ms (timeout {} ms): {}{}", op, group_.name,
                       rank(), size(), ms, options_.timeout.count(), what, culprit);
  }

  GroupInfo group_;
  ncclComm_t comm_;
  NcclOptions options_;
  cudaStream_t stream_ = nullptr;
  bool own_stream_ = false;
  cudaEvent_t done_ = nullptr;
  void* barrier_buffer_ = nullptr;
  std::optional<std::string> broken_;
};

}  // namespace

NcclCommunicatorFactory::NcclCommunicatorFactory(NcclOptions options) : options_(std::move(options)) {
  if (!options_.store) fail(ErrorKind::kInvalidArgument, "the NCCL communicator needs a bootstrap store");
  if (!options_.namer) options_.namer = [](int r) { return fmt::format("rank {}", r); };
  setenv("NCCL_NVLS_ENABLE", "0", 1);  // no NVLink multicast, whatever the environment says
}

std::unique_ptr<Communicator> NcclCommunicatorFactory::create(const GroupInfo& group) {
  check_cuda(cudaSetDevice(options_.device_index), "cudaSetDevice");
  std::string key = "nccl/" + group.name + "/unique_id";
  ncclUniqueId id;
  if (group.rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) fail(ErrorKind::kNetwork, "ncclGetUniqueId failed: {}", ncclGetErrorString(r));
    options_.store->set(key, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(&id), sizeof id));
  } else {
    std::vector<uint8_t> bytes =
        options_.store->wait_get(key, options_.timeout, fmt::format("{} to publish the NCCL id of group {}",
                                                                    options_.namer(group.world_ranks[0]), group.name));
    if (bytes.size() != sizeof id) fail(ErrorKind::kCorrupt, "NCCL id of group {} has {} bytes", group.name, bytes.size());
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
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (comm) ncclCommAbort(comm);
  fail(ErrorKind::kNetwork, "NCCL group {} (rank {} of {}) failed to initialise: {}", group.name, group.rank,
       group.size(), ncclGetErrorString(r));
}

}  // namespace tessera::dist
