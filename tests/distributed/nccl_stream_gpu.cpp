// Stream-ordered NCCL (NcclOptions::stream set, as CUDA rank processes use it) between two
// rank processes, one GPU each: calls return before the data has moved and later work on
// the stream sees the result; many calls in a row (the watchdog recycles its events);
// send/recv, gather, broadcast, barrier; calls captured into a CUDA graph and replayed while
// the watchdog runs; a stuck peer and a dead peer end in the watchdog's abort (the stream
// drains, raise_if_failed and the next call throw, naming op, group and peers); with
// exit_after_failure a rank that never looks is ended with status 1; watch_stream puts a
// graph replay under the timeout.
//
// Needs two GPUs: registered only in CUDA builds with the label "gpu" (not "dist"), so CPU
// CI never runs it. On the GPU machine: ./nccl_stream_test (also with NCCL_P2P_DISABLE=1
// NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo to imitate two hosts).
#include <cuda_runtime.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
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

Tensor cuda_tensor(int device, Shape shape, DType dtype) {
  size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  void* p = nullptr;
  if (cudaMalloc(&p, bytes) != cudaSuccess) fail(ErrorKind::kOutOfMemory, "cudaMalloc {}", bytes);
  auto storage = std::make_shared<Storage>(p, bytes, Device{DeviceType::kCUDA, device}, [](void* q) { cudaFree(q); });
  return Tensor(storage, 0, shape, dtype);
}

// Host <-> device on the stream (ordered with the NCCL calls), then wait for the stream.
std::vector<float> read(const Tensor& t, cudaStream_t s) {
  std::vector<float> h(static_cast<size_t>(t.numel()));
  cudaMemcpyAsync(h.data(), t.raw(), t.nbytes(), cudaMemcpyDeviceToHost, s);
  cudaStreamSynchronize(s);
  return h;
}
void fill(const Tensor& t, float v, cudaStream_t s) {
  std::vector<float> h(static_cast<size_t>(t.numel()), v);
  cudaMemcpyAsync(t.raw(), h.data(), t.nbytes(), cudaMemcpyHostToDevice, s);
  cudaStreamSynchronize(s);  // h dies here
}
// Holds the stream for `ms` (stands in for a long kernel queued before a collective).
void hold_stream(cudaStream_t s, int ms) {
  static int hold_ms;
  hold_ms = ms;
  cudaLaunchHostFunc(
      s, [](void*) { std::this_thread::sleep_for(milliseconds(hold_ms)); }, nullptr);
}

struct Ranks {
  std::vector<int> codes;
  std::vector<std::string> errs;  // each rank's stderr
};

using Body = std::function<int(int rank, Communicator& comm, cudaStream_t stream)>;

// Two forked ranks, each with its GPU, a stream of its own passed as the "backend's stream",
// and a world communicator on it.
Ranks run_two(const Body& body, milliseconds timeout, milliseconds exit_after_failure = milliseconds(0)) {
  Socket probe = listen_tcp("127.0.0.1", 0);
  uint16_t port = local_port(probe);
  probe.close();
  std::vector<std::string> err_files;
  std::fflush(nullptr);
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r) {
    err_files.push_back((std::filesystem::temp_directory_path() /
                         ("tessera_nccl_stream_" + std::to_string(getpid()) + "_" + std::to_string(r)))
                            .string());
    pid_t pid = fork();
    if (pid == 0) {
      FILE* e = std::freopen(err_files.back().c_str(), "w", stderr);
      (void)e;
      int code = 1;
      try {
        if (cudaSetDevice(r) != cudaSuccess) fail(ErrorKind::kInternal, "cudaSetDevice {}", r);
        cudaStream_t stream = nullptr;
        if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess)
          fail(ErrorKind::kInternal, "cudaStreamCreate");
        auto store =
            std::make_shared<ControlStoreClient>(HeadAddress{"127.0.0.1", port, "t", ""}, r, milliseconds(10000));
        NcclOptions o;
        o.store = store;
        o.device_index = r;
        o.timeout = timeout;
        o.stream = stream;
        o.exit_after_failure = exit_after_failure;
        NcclCommunicatorFactory factory(o);
        auto comm = factory.create(ParallelLayout{2, 1}.world_group(r));
        code = body(r, *comm, stream);
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
  Ranks run;
  auto deadline = Clock::now() + std::chrono::seconds(120);
  for (size_t i = 0; i < pids.size(); ++i) {
    int status = 0;
    while (waitpid(pids[i], &status, WNOHANG) == 0) {
      if (Clock::now() > deadline) {
        kill(pids[i], SIGKILL);
        waitpid(pids[i], &status, 0);
        break;
      }
      std::this_thread::sleep_for(milliseconds(10));
    }
    run.codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status));
    std::ifstream f(err_files[i]);
    std::stringstream ss;
    ss << f.rdbuf();
    run.errs.push_back(ss.str());
    std::filesystem::remove(err_files[i]);
  }
  return run;
}

std::string dump(const Ranks& r) { return "rank 0 stderr:\n" + r.errs[0] + "\nrank 1 stderr:\n" + r.errs[1]; }

TEST(NcclStreamOrdered, CollectivesReturnBeforeTheDataMovesAndLaterWorkSeesIt) {
  if (visible_gpus() < 2) GTEST_SKIP() << "needs two GPUs";
  Ranks run = run_two(
      [](int rank, Communicator& comm, cudaStream_t s) {
        RANK_CHECK(comm.stream_ordered(), "stream_ordered() is false with NcclOptions::stream");
        Tensor t = cuda_tensor(rank, {1 << 20}, DType::kF32);
        comm.all_reduce(t);  // connections are made on the first call
        cudaStreamSynchronize(s);
        fill(t, rank + 1.0f, s);
        // The stream is held for 1.5 s: a call that waited for its result would take that long.
        hold_stream(s, 1500);
        auto start = Clock::now();
        comm.all_reduce(t);
        auto ms = std::chrono::duration_cast<milliseconds>(Clock::now() - start).count();
        RANK_CHECK(ms < 500, "all_reduce took {} ms to return: it waited for the stream", ms);
        RANK_CHECK(read(t, s)[12345] == 3.0f, "all_reduce gave {}", read(t, s)[12345]);

        // 500 calls in a row without a host wait: every one is watched and its event reused.
        Tensor x = cuda_tensor(rank, {256}, DType::kF32);
        fill(x, 0.0f, s);
        for (int i = 0; i < 500; ++i) comm.all_reduce(x);
        RANK_CHECK(read(x, s)[7] == 0.0f, "500 all_reduces of zeros gave {}", read(x, s)[7]);
        // Ordering: each call sees the previous one's result (2^20 after 20 doublings).
        Tensor y = cuda_tensor(rank, {256}, DType::kF32);
        fill(y, 1.0f, s);
        for (int i = 0; i < 20; ++i) comm.all_reduce(y);
        RANK_CHECK(read(y, s)[255] == 1048576.0f, "20 all_reduces in a row gave {}", read(y, s)[255]);

        // bf16
        Tensor b = cuda_tensor(rank, {64}, DType::kBF16);
        std::vector<uint16_t> hb(64, 0x3f80);  // 1.0
        cudaMemcpyAsync(b.raw(), hb.data(), 128, cudaMemcpyHostToDevice, s);
        comm.all_reduce(b);
        cudaMemcpyAsync(hb.data(), b.raw(), 128, cudaMemcpyDeviceToHost, s);
        cudaStreamSynchronize(s);
        RANK_CHECK(hb[63] == 0x4000, "bf16 all_reduce gave 0x{:04x}", hb[63]);  // 2.0

        // Pipeline stages: send/recv in both directions, results read on the same stream.
        Tensor act = cuda_tensor(rank, {4096}, DType::kF32);
        if (rank == 0) {
          fill(act, 5.0f, s);
          hold_stream(s, 300);
          comm.send(act, 1);
          comm.recv(act, 1);
          RANK_CHECK(read(act, s)[4095] == 7.0f, "recv gave {}", read(act, s)[4095]);
        } else {
          comm.recv(act, 0);
          RANK_CHECK(read(act, s)[0] == 5.0f, "recv gave {}", read(act, s)[0]);
          fill(act, 7.0f, s);
          comm.send(act, 0);
        }

        // gather (vocab-parallel lm_head), all_gather, broadcast.
        Tensor in = cuda_tensor(rank, {4}, DType::kF32), out = cuda_tensor(rank, {8}, DType::kF32);
        fill(in, static_cast<float>(rank + 10), s);
        comm.gather(in, rank == 0 ? out : Tensor(), 0);
        if (rank == 0) {
          auto g = read(out, s);
          RANK_CHECK(g[0] == 10.0f && g[7] == 11.0f, "gather gave {} {}", g[0], g[7]);
        }
        fill(out, 0.0f, s);
        comm.all_gather(in, out);
        RANK_CHECK(read(out, s)[0] == 10.0f && read(out, s)[4] == 11.0f, "all_gather");
        fill(in, rank == 1 ? 9.0f : 0.0f, s);
        comm.broadcast(in, 1);
        RANK_CHECK(read(in, s)[3] == 9.0f, "broadcast");

        // A barrier waits for completion even in stream-ordered mode.
        hold_stream(s, 400);
        start = Clock::now();
        comm.barrier();
        ms = std::chrono::duration_cast<milliseconds>(Clock::now() - start).count();
        RANK_CHECK(ms >= 350, "barrier returned after {} ms, before the held stream ran", ms);
        comm.raise_if_failed();

        // Decode-sized all-reduce latency, stream-ordered (for the closing note).
        Tensor small = cuda_tensor(rank, {4096}, DType::kBF16);
        for (int i = 0; i < 50; ++i) comm.all_reduce(small);
        cudaStreamSynchronize(s);
        start = Clock::now();
        for (int i = 0; i < 1000; ++i) comm.all_reduce(small);
        cudaStreamSynchronize(s);
        double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count() / 1000;
        if (rank == 0) std::fprintf(stderr, "stream-ordered NCCL all_reduce 8 KiB bf16: %.1f us per call\n", us);
        comm.raise_if_failed();
        return 0;
      },
      milliseconds(30000));
  EXPECT_EQ(run.codes, (std::vector<int>{0, 0})) << dump(run);
  std::printf("%s", run.errs[0].c_str());
}

// Calls captured into a graph are enqueued but not watched (no event is recorded into a
// capturing stream, so the watchdog never queries one); a watched call is still in flight
// when the capture starts, so the watchdog polls during the capture.
int capture_and_replay(int rank, Communicator& comm, cudaStream_t s, cudaStreamCaptureMode mode) {
  Tensor t = cuda_tensor(rank, {1024}, DType::kF32);
  fill(t, 1.0f, s);
  hold_stream(s, 300);
  comm.all_reduce(t);  // 2
  cudaStreamSynchronize(s);
  hold_stream(s, 200);
  Tensor u = cuda_tensor(rank, {1024}, DType::kF32);
  comm.all_reduce(u);  // in flight during the capture (u's contents do not matter)
  RANK_CHECK(cudaStreamBeginCapture(s, mode) == cudaSuccess, "begin capture");
  comm.all_reduce(t);  // captured, not run
  cudaGraph_t graph = nullptr;
  cudaError_t e = cudaStreamEndCapture(s, &graph);
  RANK_CHECK(e == cudaSuccess, "capture failed: {}", cudaGetErrorString(e));
  cudaGraphExec_t exec = nullptr;
  RANK_CHECK(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess, "instantiate");
  for (int i = 0; i < 3; ++i) RANK_CHECK(cudaGraphLaunch(exec, s) == cudaSuccess, "launch");
  RANK_CHECK(read(t, s)[1023] == 16.0f, "2 then 3 replays gave {}", read(t, s)[1023]);
  comm.all_reduce(t);  // watched again after the capture
  RANK_CHECK(read(t, s)[0] == 32.0f, "after replay {}", read(t, s)[0]);
  comm.barrier();
  comm.raise_if_failed();
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return 0;
}

// The backend captures in relaxed mode.
TEST(NcclStreamOrdered, GraphCaptureRelaxedAndReplayWhileTheWatchdogRuns) {
  if (visible_gpus() < 2) GTEST_SKIP() << "needs two GPUs";
  Ranks run = run_two([](int rank, Communicator& comm,
                         cudaStream_t s) { return capture_and_replay(rank, comm, s, cudaStreamCaptureModeRelaxed); },
                      milliseconds(30000));
  EXPECT_EQ(run.codes, (std::vector<int>{0, 0})) << dump(run);
}

// The strictest mode (PyTorch's default): the watchdog thread must not invalidate it.
TEST(NcclStreamOrdered, GraphCaptureGlobalAndReplayWhileTheWatchdogRuns) {
  if (visible_gpus() < 2) GTEST_SKIP() << "needs two GPUs";
  Ranks run = run_two([](int rank, Communicator& comm,
                         cudaStream_t s) { return capture_and_replay(rank, comm, s, cudaStreamCaptureModeGlobal); },
                      milliseconds(30000));
  EXPECT_EQ(run.codes, (std::vector<int>{0, 0})) << dump(run);
}

// Captured calls are not watched at capture; watch_stream after a replay puts the replay
// under the timeout: a peer stuck during a replay still ends in an abort naming it.
TEST(NcclStreamOrdered, StuckPeerDuringGraphReplayIsCaughtByWatchStream) {
  if (visible_gpus() < 2) GTEST_SKIP() << "needs two GPUs";
  Ranks run = run_two(
      [](int rank, Communicator& comm, cudaStream_t s) {
        Tensor t = cuda_tensor(rank, {1024}, DType::kF32);
        comm.all_reduce(t);
        cudaStreamSynchronize(s);
        RANK_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) == cudaSuccess, "begin capture");
        comm.all_reduce(t);
        comm.watch_stream("ignored while capturing");
        cudaGraph_t graph = nullptr;
        RANK_CHECK(cudaStreamEndCapture(s, &graph) == cudaSuccess, "end capture");
        cudaGraphExec_t exec = nullptr;
        RANK_CHECK(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess, "instantiate");
        RANK_CHECK(cudaGraphLaunch(exec, s) == cudaSuccess, "launch");  // both ranks: completes
        comm.watch_stream("decode graph replay");
        cudaStreamSynchronize(s);
        comm.raise_if_failed();
        if (rank == 1) {
          std::this_thread::sleep_for(std::chrono::seconds(10));
          return 0;
        }
        auto start = Clock::now();
        RANK_CHECK(cudaGraphLaunch(exec, s) == cudaSuccess, "launch");  // the peer never joins
        comm.watch_stream("decode graph replay");
        cudaStreamSynchronize(s);
        auto ms = std::chrono::duration_cast<milliseconds>(Clock::now() - start).count();
        RANK_CHECK(ms >= 2500 && ms < 9000, "drained after {} ms (timeout 3000)", ms);
        try {
          comm.raise_if_failed();
          RANK_CHECK(false, "raise_if_failed did not throw");
        } catch (const Error& err) {
          RANK_CHECK(std::string(err.what()).find("decode graph replay") != std::string::npos, "{}", err.what());
        }
        return 0;
      },
      milliseconds(3000));
  EXPECT_EQ(run.codes, (std::vector<int>{0, 0})) << dump(run);
}

// Rank 1 stops calling (stuck, still alive): rank 0's call returns at once, its stream drains
// once the watchdog aborts at the timeout, and the failure is raised by raise_if_failed and
// by every later call, naming the op, the group and the peer.
TEST(NcclStreamOrdered, StuckPeerTimesOutAbortsAndDrainsTheStream) {
  if (visible_gpus() < 2) GTEST_SKIP() << "needs two GPUs";
  Ranks run = run_two(
      [](int rank, Communicator& comm, cudaStream_t s) {
        Tensor t = cuda_tensor(rank, {1 << 16}, DType::kF32);
        comm.all_reduce(t);  // both connected
        cudaStreamSynchronize(s);
        if (rank == 1) {
          std::this_thread::sleep_for(std::chrono::seconds(12));
          return 0;
        }
        auto start = Clock::now();
        comm.all_reduce(t);
        auto enq = std::chrono::duration_cast<milliseconds>(Clock::now() - start).count();
        RANK_CHECK(enq < 500, "enqueue took {} ms", enq);
        cudaError_t e = cudaStreamSynchronize(s);  // must not hang: the abort ends the kernel
        auto ms = std::chrono::duration_cast<milliseconds>(Clock::now() - start).count();
        std::fprintf(stderr, "stream drained after %lld ms (%s)\n", static_cast<long long>(ms), cudaGetErrorString(e));
        RANK_CHECK(ms >= 2500 && ms < 9000, "drained after {} ms (timeout 3000)", ms);
        try {
          comm.raise_if_failed();
          RANK_CHECK(false, "raise_if_failed did not throw");
        } catch (const Error& err) {
          std::string m = err.what();
          std::fprintf(stderr, "raised: %s\n", m.c_str());
          RANK_CHECK(err.kind() == ErrorKind::kNetwork, "kind");
          RANK_CHECK(m.find("all_reduce") != std::string::npos, "{}", m);
          RANK_CHECK(m.find("group world") != std::string::npos, "{}", m);
          RANK_CHECK(m.find("peers rank 1") != std::string::npos, "{}", m);
          RANK_CHECK(m.find("timed out") != std::string::npos, "{}", m);
        }
        auto again = Clock::now();
        try {
          comm.all_reduce(t);
          RANK_CHECK(false, "a call after the abort did not throw");
        } catch (const Error& err) {
          auto ms2 = std::chrono::duration_cast<milliseconds>(Clock::now() - again).count();
          RANK_CHECK(ms2 < 100, "the next call took {} ms to throw", ms2);
          RANK_CHECK(std::string(err.what()).find("aborted") != std::string::npos, "{}", err.what());
        }
        return 0;
      },
      milliseconds(3000));
  EXPECT_EQ(run.codes, (std::vector<int>{0, 0})) << dump(run);
  EXPECT_THAT(run.errs[0], ::testing::HasSubstr("NCCL all_reduce on group world"));  // the log line
}

// Rank 1 dies: rank 0's stream-ordered send fails at the latest at the timeout, naming the
// gone rank (the head saw its control connection close).
TEST(NcclStreamOrdered, DeadPeerIsNamed) {
  if (visible_gpus() < 2) GTEST_SKIP() << "needs two GPUs";
  Ranks run = run_two(
      [](int rank, Communicator& comm, cudaStream_t s) {
        Tensor t = cuda_tensor(rank, {1 << 16}, DType::kF32);
        comm.all_reduce(t);
        cudaStreamSynchronize(s);
        if (rank == 1) _exit(0);
        std::this_thread::sleep_for(milliseconds(300));
        auto start = Clock::now();
        try {
          comm.all_reduce(t);
          comm.all_reduce(t);
          cudaStreamSynchronize(s);
          comm.raise_if_failed();
          RANK_CHECK(false, "raise_if_failed did not throw");
        } catch (const Error& err) {
          auto ms = std::chrono::duration_cast<milliseconds>(Clock::now() - start).count();
          std::fprintf(stderr, "after %lld ms: %s\n", static_cast<long long>(ms), err.what());
          RANK_CHECK(ms < 9000, "took {} ms", ms);
          RANK_CHECK(std::string(err.what()).find("rank 1 is gone") != std::string::npos, "{}", err.what());
        }
        return 0;
      },
      milliseconds(3000));
  EXPECT_EQ(run.codes, (std::vector<int>{0, 0})) << dump(run);
}

// A rank whose thread never looks at the communicator again (a worker waiting for the next
// step plan) is ended by the watchdog: status 1 and the failure on stderr.
TEST(NcclStreamOrdered, ExitAfterFailureEndsARankThatNeverLooks) {
  if (visible_gpus() < 2) GTEST_SKIP() << "needs two GPUs";
  auto start = Clock::now();
  Ranks run = run_two(
      [](int rank, Communicator& comm, cudaStream_t s) {
        Tensor t = cuda_tensor(rank, {1024}, DType::kF32);
        comm.all_reduce(t);
        cudaStreamSynchronize(s);
        if (rank == 1) {
          std::this_thread::sleep_for(std::chrono::seconds(10));
          return 0;
        }
        comm.all_reduce(t);
        std::this_thread::sleep_for(std::chrono::seconds(30));  // the watchdog must end us first
        return 0;
      },
      milliseconds(3000), milliseconds(1000));
  auto secs = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_EQ(run.codes[0], 1) << dump(run);
  EXPECT_EQ(run.codes[1], 0) << dump(run);
  EXPECT_THAT(run.errs[0], ::testing::HasSubstr("error: NCCL all_reduce on group world"));
  EXPECT_LT(secs, 25.0);
}

}  // namespace
}  // namespace tessera::dist
