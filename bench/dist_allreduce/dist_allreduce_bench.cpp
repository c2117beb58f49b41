// Gloo all-reduce bandwidth among N rank processes on 127.0.0.1, bootstrapped through an
// in-process rendezvous head exactly as a cluster would be.
//   dist_allreduce_bench [--ranks 2] [--sizes 1048576,67108864] [--iters 20] [--dtype f32|bf16]
// Prints one line per size: time per all-reduce, algorithm bandwidth (bytes / time) and
// bus bandwidth (algbw * 2(n-1)/n, the nccl-tests convention).
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "core/logging.h"
#include "distributed/control_store.h"
#include "distributed/gloo_communicator.h"
#include "distributed/rendezvous_server.h"

using namespace tessera;
using namespace tessera::dist;

namespace {

std::vector<size_t> parse_sizes(const std::string& list) {
  std::vector<size_t> out;
  for (size_t pos = 0; pos < list.size();) {
    size_t comma = list.find(',', pos);
    if (comma == std::string::npos) comma = list.size();
    out.push_back(std::stoull(list.substr(pos, comma - pos)));
    pos = comma + 1;
  }
  return out;
}

int rank_main(int rank, int ranks, uint16_t port, const std::vector<size_t>& sizes, int iters, DType dtype) {
  auto store =
      std::make_shared<ControlStoreClient>(HeadAddress{"127.0.0.1", port, "bench", ""}, rank, std::chrono::seconds(10));
  GlooOptions o;
  o.store = store;
  o.ip = "127.0.0.1";
  o.timeout = std::chrono::seconds(60);
  GlooCommunicatorFactory factory(o);
  auto comm = factory.create(ParallelLayout{ranks, 1}.world_group(rank));
  for (size_t bytes : sizes) {
    Tensor t = host_empty({static_cast<int64_t>(bytes / dtype_size(dtype))}, dtype);
    std::vector<float> ones(static_cast<size_t>(t.numel()), 1.0f);
    convert_host(ones.data(), DType::kF32, t.raw(), dtype, ones.size());
    for (int w = 0; w < 3; ++w) comm->all_reduce(t);
    comm->barrier();
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) comm->all_reduce(t);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iters;
    if (rank == 0) {
      double algbw = bytes / s / 1e9;
      std::printf("allreduce %s ranks=%d bytes=%-10zu time=%9.3f ms  algbw=%7.3f GB/s  busbw=%7.3f GB/s\n",
                  std::string(dtype_name(dtype)).c_str(), ranks, bytes, s * 1e3, algbw,
                  algbw * 2.0 * (ranks - 1) / ranks);
      std::fflush(stdout);
    }
  }
  comm->barrier();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  init_logging("warning");
  int ranks = 2, iters = 20;
  std::vector<size_t> sizes = {1 << 20, 64 << 20};
  DType dtype = DType::kF32;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--ranks")
      ranks = std::stoi(v);
    else if (k == "--iters")
      iters = std::stoi(v);
    else if (k == "--sizes")
      sizes = parse_sizes(v);
    else if (k == "--dtype")
      dtype = v == "bf16" ? DType::kBF16 : DType::kF32;
    else {
      std::fprintf(stderr, "unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  uint16_t port;
  {
    Socket probe = listen_tcp("127.0.0.1", 0);
    port = local_port(probe);
  }
  std::fflush(nullptr);
  std::vector<pid_t> pids;
  for (int r = 0; r < ranks; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      int code = 1;
      try {
        code = rank_main(r, ranks, port, sizes, iters, dtype);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
      }
      std::fflush(nullptr);
      _exit(code);
    }
    pids.push_back(pid);
  }
  RendezvousServerOptions so;
  so.port = port;
  so.token = "bench";
  RendezvousServer head(so);
  int failed = 0;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  return failed ? 1 : 0;
}
