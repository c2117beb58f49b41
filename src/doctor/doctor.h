// `tessera doctor`: the preflight of a node, or of a cluster from its head, before anything
// heavy is loaded. Each node measures itself (versions, GPUs, /dev/shm, memlock, NICs, model
// files); with several nodes they meet through the same authenticated rendezvous as serve
// (dist/), probe each other (TCP connect to an ephemeral port, latency, a stream test, a Gloo
// all-reduce over the data plane) and the head compares everything. Every check is a line
// with a status and, when it fails, the fix.
//
// The library (src/doctor/, tessera_doctor; the verb is src/cli/cmd_doctor.cpp):
//   facts.cpp    this node's facts and their wire form
//   gpus.cpp     GPUs, driver and CUDA version (nvml.cpp: NVML loaded at run time), with the
//                kernel module's /proc/driver/nvidia/version as the fallback
//   checks.cpp   the checks of one node, the comparison of nodes, the report
//   probes.cpp   the cluster probes: pair latency and bandwidth, the Gloo all-reduce
//   cluster.cpp  run_doctor: the rendezvous and the exchange of facts and results
#pragma once
#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "distributed/fingerprint.h"

namespace tessera::doctor {

enum class Status { kOk, kWarn, kFail, kInfo };
const char* status_mark(Status s);  // ✓ ! ✗ ·

struct Check {
  std::string node;  // "node 1 (10.0.0.2)" or "" for the cluster
  std::string name;  // "/dev/shm", "MTU", "port 10.0.0.2:41234"
  Status status = Status::kInfo;
  std::string detail;
  std::string fix;  // what to do (failed and warned checks)
};

struct InterfaceFacts {
  std::string name, ip;
  int mtu = 0;
  int64_t speed_mbps = -1;  // -1: unknown
};

// What a node learns about itself (sent to the head in cluster mode).
struct NodeFacts {
  int node_rank = 0;
  std::string hostname, version;
  std::string nic, ip;          // the chosen NIC (cluster mode)
  std::string route_interface;  // the interface the kernel routes to the head through
  std::vector<InterfaceFacts> interfaces;
  std::vector<std::string> gpus;                  // "NVIDIA H200, 143771 MiB"
  std::vector<std::pair<int, int>> compute_caps;  // each GPU's, this node's only (not sent to the head)
  std::string driver, cuda, nccl, p2p;
  // This node's only (not sent to the head): what the GPU query tried when it found no GPU
  // ("NVML: ...; /proc/driver/nvidia/version: ..."), and each NVML call that failed, by name.
  std::string gpu_query;
  std::vector<std::string> nvml_errors;
  uint64_t shm_bytes = 0;
  int64_t memlock_bytes = -1;  // -1: unlimited
  bool has_model = false;
  dist::NodeFingerprint model;
  std::vector<std::pair<std::string, std::string>> content_sha256;  // --verify-weights: file, hash
  // --verify-weights: the safetensors tensors holding NaN or Inf ("file: tensor", the first
  // kNamedNonFinite of them), how many do, and how many tensors were read.
  static constexpr size_t kNamedNonFinite = 5;
  std::vector<std::string> nonfinite_tensors;
  uint64_t nonfinite_count = 0, tensors_scanned = 0;
  std::string model_error;
  std::string probe_ip;
  uint16_t probe_port = 0;
};
std::vector<uint8_t> encode_facts(const NodeFacts& f);
NodeFacts decode_facts(std::span<const uint8_t> bytes);

struct DoctorOptions {
  std::string model_dir;        // optional
  bool verify_weights = false;  // read every tensor: hash the files, find NaN/Inf values
  // Cluster mode when nnodes > 1.
  int nnodes = 1, node_rank = 0;
  std::string master_addr;
  uint16_t master_port = 29500;
  std::string nic, node_ip_address, token;
  std::chrono::milliseconds join_timeout{std::chrono::seconds(60)};
  std::chrono::milliseconds probe_timeout{std::chrono::seconds(3)};
  // The seeds' rules: latency below 1 ms, bandwidth at least 10 Gb/s between nodes.
  double max_latency_ms = 1.0;
  double min_bandwidth_gbps = 10.0;
  size_t stream_bytes = size_t{256} << 20;     // per pair, the TCP stream test
  size_t all_reduce_bytes = size_t{64} << 20;  // the Gloo all-reduce test
  uint64_t min_shm_bytes = uint64_t{1} << 30;
};

// This node's facts (no network).
NodeFacts collect_local_facts(const DoctorOptions& o);
// The checks one node's facts allow by themselves.
std::vector<Check> local_checks(const NodeFacts& f, const DoctorOptions& o);
// The head's comparison of every node (versions, model files, MTU).
std::vector<Check> compare_nodes(const std::vector<NodeFacts>& nodes);

struct Report {
  std::vector<Check> checks;
  bool ok() const;
  bool is_head = true;  // false: a worker node (the head prints the cluster's report)
};
// One node, or the whole cluster (this process is node_rank of nnodes). Never throws for a
// failed check: failures are lines of the report.
Report run_doctor(const DoctorOptions& o);

std::string render_report(const Report& r);

}  // namespace tessera::doctor
