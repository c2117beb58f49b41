// tessera doctor [MODEL]: the preflight of this node, or of the cluster from its head (every
// node runs the same command with its --node-rank). Each line is ✓ / ! / ✗ with the fix; the
// exit status is 1 when any line is ✗.
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>

#include "cli/engine_flags.h"
#include "cli/flag_parsing.h"
#include "cli/verbs.h"
#include "core/error.h"
#include "distributed/launch_env.h"
#include "doctor/doctor.h"
#include "plan/planner.h"

namespace tessera::cli {

int run_doctor(int argc, char** argv) {
  CLI::App app{
      "Preflight of this node, or of a cluster (run it on every node with the serve command's cluster flags):\n"
      "GPUs, driver, CUDA, tessera version, P2P, /dev/shm, memlock, NICs and the route to the head, MTU, ports,\n"
      "latency and bandwidth between nodes, a Gloo all-reduce, identical model files (--verify-weights: their\n"
      "tensor data too, and no NaN or Inf in it).\n"
      "  tessera doctor /data/models/Qwen3-8B\n"
      "  tessera doctor MODEL --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 --cluster-token T   (head)\n"
      "  tessera doctor MODEL --nnodes 2 --node-rank 1 --master-addr 10.0.0.1 --cluster-token T   (node 1)",
      "tessera doctor"};
  use_vllm_conventions(app);
  std::string model;
  bool verify = false, json = false;
  ClusterFlags cf;
  cf.join_timeout_s = 60;
  doctor::DoctorOptions o;
  std::string min_shm = "1GiB";
  double stream_mib = 256, allreduce_mib = 64;
  app.add_option("model,--model", model, "model directory to check on every node (optional)");
  app.add_flag("--verify-weights", verify,
               "also read the tensor data of every safetensors file (all of it): hash it (compared across nodes) and "
               "fail naming the tensors that hold NaN or Inf");
  app.add_flag("--json", json, "print the checks as JSON");
  app.add_option("--max-latency-ms", o.max_latency_ms, "round trip allowed between nodes")->capture_default_str();
  app.add_option("--min-bandwidth-gbps", o.min_bandwidth_gbps, "bandwidth required between nodes (Gb/s)")
      ->capture_default_str();
  app.add_option("--stream-mib", stream_mib, "MiB sent per node pair in the TCP stream test")->capture_default_str();
  app.add_option("--all-reduce-mib", allreduce_mib, "MiB all-reduced in the Gloo test")->capture_default_str();
  app.add_option("--min-shm", min_shm, "smallest acceptable /dev/shm")->capture_default_str();
  add_cluster_flags(app, cf);
  if (int rc = parse_flags(app, argc, argv); rc >= 0) return rc;
  const dist::LaunchFacts facts = dist::resolve_launch({cf.nnodes, cf.node_rank, cf.master_addr, cf.master_port});
  o.model_dir = model;
  o.verify_weights = verify;
  o.nnodes = facts.nnodes;
  o.node_rank = facts.node_rank;
  o.master_addr = facts.master_addr;
  o.master_port = static_cast<uint16_t>(facts.master_port);
  o.nic = cf.nic;
  o.node_ip_address = cf.node_ip_address;
  o.token = o.nnodes > 1 ? required_cluster_token(cf.cluster_token, o.nnodes, "on every node")
                         : cluster_token_or_env(cf.cluster_token);
  o.join_timeout = std::chrono::milliseconds(static_cast<int64_t>(cf.join_timeout_s * 1000));
  o.stream_bytes = static_cast<size_t>(stream_mib * 1048576);
  o.all_reduce_bytes = static_cast<size_t>(allreduce_mib * 1048576) / 4 * 4;
  o.min_shm_bytes = plan::parse_memory_size(min_shm);
  const doctor::Report r = doctor::run_doctor(o);
  if (json) {
    nlohmann::json j;
    j["ok"] = r.ok();
    j["is_head"] = r.is_head;
    j["checks"] = nlohmann::json::array();
    for (const auto& c : r.checks) {
      const char* st = c.status == doctor::Status::kOk     ? "ok"
                       : c.status == doctor::Status::kFail ? "fail"
                       : c.status == doctor::Status::kWarn ? "warn"
                                                           : "info";
      j["checks"].push_back(
          {{"node", c.node}, {"check", c.name}, {"status", st}, {"detail", c.detail}, {"fix", c.fix}});
    }
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("%s", doctor::render_report(r).c_str());
  }
  return r.ok() ? 0 : 1;
}

}  // namespace tessera::cli
