// One "host" of a small cluster, for the network-namespace test and the all-reduce
// benchmark: picks the NIC, joins the rendezvous (or runs it, as node 0), builds a Gloo
// world of one rank per node, checks an all-reduce and optionally times it.
//
//   dist_node --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 --master-port 29500 --token T
//             [--nic SPEC] [--model-dir DIR] [--expect-nic NAME] [--bench 1048576,67108864] [--iters 10]
//             [--hold-ms MS] [--heartbeat-timeout-ms MS] [--watch-failure-ms MS]
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/logging.h"
#include "distributed/control_store.h"
#include "distributed/gloo_communicator.h"
#include "distributed/launch_env.h"
#include "distributed/nic.h"
#include "distributed/node_session.h"
#include "distributed/rendezvous_client.h"
#include "distributed/rendezvous_server.h"

namespace {

using namespace tessera;
using namespace tessera::dist;
using std::chrono::milliseconds;

struct Args {
  int nnodes = 2, node_rank = 0, port = 29500, iters = 10, hold_ms = 0, heartbeat_timeout_ms = 10000,
      watch_failure_ms = 0;
  std::string master, token, nic, model_dir, expect_nic;
  std::vector<size_t> bench_sizes;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) fail(ErrorKind::kInvalidArgument, "{} needs a value", k);
      return argv[++i];
    };
    if (k == "--nnodes")
      a.nnodes = std::stoi(value());
    else if (k == "--node-rank")
      a.node_rank = std::stoi(value());
    else if (k == "--master-addr")
      a.master = value();
    else if (k == "--master-port")
      a.port = std::stoi(value());
    else if (k == "--token")
      a.token = value();
    else if (k == "--nic")
      a.nic = value();
    else if (k == "--model-dir")
      a.model_dir = value();
    else if (k == "--expect-nic")
      a.expect_nic = value();
    else if (k == "--iters")
      a.iters = std::stoi(value());
    else if (k == "--hold-ms")
      a.hold_ms = std::stoi(value());  // stay up so `cluster status` can look
    else if (k == "--heartbeat-timeout-ms")
      a.heartbeat_timeout_ms = std::stoi(value());
    else if (k == "--watch-failure-ms")
      a.watch_failure_ms = std::stoi(value());  // head: expect a node to fail
    else if (k == "--bench") {
      std::string list = value();
      for (size_t pos = 0; pos < list.size();) {
        size_t comma = list.find(',', pos);
        if (comma == std::string::npos) comma = list.size();
        a.bench_sizes.push_back(std::stoull(list.substr(pos, comma - pos)));
        pos = comma + 1;
      }
    } else
      fail(ErrorKind::kInvalidArgument, "unknown flag {}", k);
  }
  return a;
}

void bench(Communicator& comm, const std::vector<size_t>& sizes, int iters) {
  for (size_t bytes : sizes) {
    Tensor t = host_empty({static_cast<int64_t>(bytes / 4)}, DType::kF32);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = 1.0f;
    for (int w = 0; w < 2; ++w) comm.all_reduce(t);  // warm-up: connections, page faults
    comm.barrier();
    auto start = Clock::now();
    for (int i = 0; i < iters; ++i) comm.all_reduce(t);
    double s = std::chrono::duration<double>(Clock::now() - start).count() / iters;
    double algbw = bytes / s / 1e9;
    double busbw = algbw * 2.0 * (comm.size() - 1) / comm.size();  // NCCL-tests convention
    if (comm.rank() == 0)
      std::printf("BENCH allreduce ranks=%d bytes=%zu time_ms=%.3f algbw_GBps=%.3f busbw_GBps=%.3f\n", comm.size(),
                  bytes, s * 1e3, algbw, busbw);
  }
}

int run(const Args& a) {
  if (!a.expect_nic.empty()) {  // checked before the rendezvous so a wrong choice fails fast
    NicChoice nic = choose_nic({a.master, a.nic, ""});
    if (nic.interface_name != a.expect_nic) {
      std::fprintf(stderr, "expected NIC %s, chose %s\n", a.expect_nic.c_str(), nic.interface_name.c_str());
      return 3;
    }
  }
  NodeSessionOptions so;
  so.launch = resolve_launch({a.nnodes, a.node_rank, a.master, a.port});
  so.nic = a.nic;
  so.token = a.token;
  so.model_dir = a.model_dir;
  so.join_timeout = milliseconds(30000);
  so.heartbeat_timeout = milliseconds(a.heartbeat_timeout_ms);
  NodeSession session(so);
  std::promise<std::string> failure;
  auto reported = std::make_shared<std::once_flag>();
  if (RendezvousServer* server = session.server())
    server->set_on_node_failure([&failure, reported](const RankFailure& f) {
      std::call_once(*reported, [&] { failure.set_value(f.reason); });
    });
  const NicChoice& nic = session.nic();
  std::printf("NIC %s %s (%s)\n", nic.interface_name.c_str(), nic.ip.c_str(), nic.reason.c_str());
  const ClusterTable& table = session.cluster();
  const HeadAddress& head = session.head();
  std::printf("CLUSTER formed: %zu nodes, world %d\n", table.nodes.size(), table.world_size);
  std::fflush(stdout);

  // One rank per node here: world rank = node rank.
  auto store = std::make_shared<ControlStoreClient>(head, a.node_rank, milliseconds(10000));
  GlooOptions g;
  g.store = store;
  g.ip = nic.ip;
  g.timeout = milliseconds(30000);
  g.namer = session.rank_namer();
  GlooCommunicatorFactory factory(g);
  ParallelLayout layout{table.world_size, 1};
  auto world = factory.create(layout.world_group(a.node_rank));
  Tensor t = host_empty({1024}, DType::kF32);
  for (int i = 0; i < 1024; ++i) t.data<float>()[i] = static_cast<float>(a.node_rank + 1);
  world->all_reduce(t);
  float want = table.world_size * (table.world_size + 1) / 2.0f;
  for (int i = 0; i < 1024; ++i)
    if (t.data<float>()[i] != want) {
      std::fprintf(stderr, "all_reduce gave %f, want %f\n", t.data<float>()[i], want);
      return 4;
    }
  std::printf("ALLREDUCE OK sum=%g\n", want);
  if (!a.bench_sizes.empty()) bench(*world, a.bench_sizes, a.iters);
  world->barrier();
  std::printf("DONE\n");
  std::fflush(stdout);
  if (a.watch_failure_ms > 0 && session.server()) {
    auto start = Clock::now();
    auto future = failure.get_future();
    if (future.wait_for(milliseconds(a.watch_failure_ms)) != std::future_status::ready) {
      std::printf("NO FAILURE within %d ms\n", a.watch_failure_ms);
      return 5;
    }
    auto ms = std::chrono::duration_cast<milliseconds>(Clock::now() - start).count();
    std::printf("FAILURE after %lld ms: %s\n", static_cast<long long>(ms), future.get().c_str());
    std::fflush(stdout);
    session.server()->set_on_node_failure(nullptr);
    return 0;
  }
  std::this_thread::sleep_for(milliseconds(a.hold_ms));

  if (RendezvousServer* server = session.server()) {
    ClusterStatus s = query_cluster_status(head, milliseconds(5000));
    for (const NodeStatus& n : s.nodes)
      std::printf("STATUS node %d %s %s %s\n", n.node_rank, n.fingerprint.nic.c_str(), n.fingerprint.ip.c_str(),
                  n.alive ? "alive" : "dead");
    std::fflush(stdout);
    // Let the other nodes leave first so that none reports the head as lost.
    auto deadline = Clock::now() + std::chrono::seconds(5);
    while (Clock::now() < deadline) {
      ClusterStatus now = server->status();
      bool others_gone = true;
      for (const NodeStatus& n : now.nodes) others_gone &= n.node_rank == 0 || !n.alive;
      if (others_gone) break;
      std::this_thread::sleep_for(milliseconds(20));
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  tessera::init_logging("warning");
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
