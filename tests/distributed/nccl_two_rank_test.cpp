// NCCL between two rank processes, one GPU each (forked before the parent touches CUDA).
// Runs where two GPUs are visible; skipped elsewhere and in builds without TESSERA_CUDA.
// Also run over sockets (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1) to imitate two hosts.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#ifdef TESSERA_HAVE_NCCL
#include <cuda_runtime.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <thread>

#include "core/dtype.h"
#include "core/error.h"
#include "distributed/control_store.h"
#include "distributed/nccl_communicator.h"
#include "distributed/rendezvous_server.h"
#include "test_util.h"

namespace tessera::dist {
namespace {

using std::chrono::milliseconds;

// Counted from /dev, so the parent never initialises CUDA before forking.
int visible_gpus() {
  int n = 0;
  for (int i = 0; i < 16; ++i) n += std::filesystem::exists("/dev/nvidia" + std::to_string(i));
  return n;
}

Tensor cuda_tensor(Shape shape, DType dtype) {
  size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  void* p = nullptr;
  if (cudaMalloc(&p, bytes) != cudaSuccess) fail(ErrorKind::kOutOfMemory, "cudaMalloc {}", bytes);
  auto storage = std::make_shared<Storage>(p, bytes, Device{DeviceType::kCUDA, 0}, [](void* q) { cudaFree(q); });
  return Tensor(storage, 0, shape, dtype);
}

std::vector<float> to_host(const Tensor& t) {
  std::vector<float> h(static_cast<size_t>(t.numel()));
  cudaMemcpy(h.data(), t.raw(), t.nbytes(), cudaMemcpyDeviceToHost);
  return h;
}

void fill(const Tensor& t, float v) {
  std::vector<float> h(static_cast<size_t>(t.numel()), v);
  cudaMemcpy(t.raw(), h.data(), t.nbytes(), cudaMemcpyHostToDevice);
}

std::vector<int> run_two(const std::function<int(int, Communicator&)>& body, milliseconds timeout) {
  Socket probe = listen_tcp("127.0.0.1", 0);
  uint16_t port = local_port(probe);
  probe.close();
  std::fflush(nullptr);
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      int code = 1;
      try {
        auto store =
            std::make_shared<ControlStoreClient>(HeadAddress{"127.0.0.1", port, "t", ""}, r, milliseconds(10000));
        NcclOptions o;
        o.store = store;
        o.device_index = r;
        o.timeout = timeout;
        NcclCommunicatorFactory factory(o);
        auto comm = factory.create(ParallelLayout{2, 1}.world_group(r));
        code = body(r, *comm);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
        code = 2;
      }
      std::fflush(nullptr);
      _exit(code);
    }
    pids.push_back(pid);
  }
  RendezvousServerOptions so;
  so.port = port;
  so.token = "t";
  RendezvousServer server(so);
  std::vector<int> codes;
  auto deadline = Clock::now() + std::chrono::seconds(120);
  for (pid_t pid : pids) {
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (Clock::now() > deadline) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        break;
      }
      std::this_thread::sleep_for(milliseconds(10));
    }
    codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status));
  }
  return codes;
}

TEST(NcclTwoRanks, Collectives) {
  if (visible_gpus() < 2) GTEST_SKIP() << "needs two GPUs";
  std::vector<int> codes = run_two(
      [](int rank, Communicator& comm) {
        cudaSetDevice(rank);
        Tensor t = cuda_tensor({1 << 20}, DType::kF32);
        fill(t, rank + 1.0f);
        comm.all_reduce(t);
        RANK_CHECK(to_host(t)[12345] == 3.0f, "all_reduce gave {}", to_host(t)[12345]);
        Tensor in = cuda_tensor({4}, DType::kF32), out = cuda_tensor({8}, DType::kF32);
        fill(in, static_cast<float>(rank));
        comm.all_gather(in, out);
        RANK_CHECK(to_host(out)[0] == 0.0f && to_host(out)[7] == 1.0f, "all_gather");
        comm.gather(in, rank == 0 ? out : Tensor(), 0);
        fill(in, rank == 1 ? 9.0f : 0.0f);
        comm.broadcast(in, 1);
        RANK_CHECK(to_host(in)[3] == 9.0f, "broadcast");
        if (rank == 0) {
          fill(in, 5.0f);
          comm.send(in, 1);
        } else {
          comm.recv(in, 0);
          RANK_CHECK(to_host(in)[0] == 5.0f, "recv");
        }
        comm.barrier();
        // Timing for the note: 64 MiB f32 all-reduce.
        Tensor big = cuda_tensor({16 << 20}, DType::kF32);
        for (int w = 0; w < 3; ++w) comm.all_reduce(big);
        auto start = Clock::now();
        for (int i = 0; i < 20; ++i) comm.all_reduce(big);
        double s = std::chrono::duration<double>(Clock::now() - start).count() / 20;
        if (rank == 0)
          std::fprintf(stderr, "NCCL all_reduce 64 MiB: %.3f ms, algbw %.1f GB/s\n", s * 1e3, (64 << 20) / s / 1e9);
        return 0;
      },
      milliseconds(30000));
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

TEST(NcclTwoRanks, DeadPeerAbortsInsteadOfHanging) {
  if (visible_gpus() < 2) GTEST_SKIP() << "needs two GPUs";
  std::vector<int> codes = run_two(
      [](int rank, Communicator& comm) {
        cudaSetDevice(rank);
        Tensor t = cuda_tensor({1024}, DType::kF32);
        comm.all_reduce(t);  // both connected
        if (rank == 1) _exit(0);
        auto start = Clock::now();
        try {
          comm.all_reduce(t);
          comm.all_reduce(t);
          RANK_CHECK(false, "all_reduce with a dead peer returned");
        } catch (const Error& e) {
          auto ms = std::chrono::duration_cast<milliseconds>(Clock::now() - start).count();
          std::fprintf(stderr, "rank 0 after %lld ms: %s\n", static_cast<long long>(ms), e.what());
          RANK_CHECK(ms < 8000, "took {} ms", ms);
          RANK_CHECK(std::string(e.what()).find("rank 1 is gone") != std::string::npos, "{}", e.what());
        }
        return 0;
      },
      milliseconds(4000));
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

}  // namespace
}  // namespace tessera::dist

#else
TEST(NcclTwoRanks, NotBuilt) { GTEST_SKIP() << "built without TESSERA_CUDA"; }
#endif
