// How a rank process joins its job's process groups, and which communicator each group gets:
// the distributed layer's choice, so the engine asks for groups and never names NCCL, Gloo or
// a CUDA type (TurboMind's split of host and device communicators).
//
//   world  host bytes (step plans) over Gloo, on every kind of rank;
//   tp, pp the data plane: Gloo on host tensors (CPU ranks), or NCCL on the rank's device
//          stream (CUDA ranks) with small TP all-reduces through the custom all-reduce where
//          every rank of the group is on this job node with peer access and NCCL_P2P_DISABLE
//          is not set (with_custom_all_reduce).
//
// A CUDA rank sets NCCL_HOSTID for its job node before NCCL starts (dist/node_locality.h), so
// that NCCL's hosts are tessera's nodes: two nodes that share a machine, even a GPU, are joined
// over the network like two machines.
//
// Every rank of the job calls join_process_groups at the same point; groups are created in
// the same order everywhere (world, tp, pp) so their bootstraps pair up through the head's
// control store.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "distributed/communicator.h"
#include "distributed/process_groups.h"

namespace tessera::dist {

struct JoinGroupsOptions {
  int rank = 0;  // world rank
  ParallelLayout layout;
  // This rank's job node and how many ranks each node runs (world ranks node by node; 0: every
  // rank on this node): NCCL_HOSTID and where the custom all-reduce may run.
  int node_rank = 0;
  int ranks_per_node = 0;
  // The bootstrap store: the head's control channel with the job's token. Gloo binds `bind_ip`
  // (this node's NIC address; 127.0.0.1 on one node, where the store connection picks its own).
  std::string store_host = "127.0.0.1";
  uint16_t store_port = 0;
  std::string token;
  std::string bind_ip = "127.0.0.1";
  RankNamer namer;  // "rank 1 (node 1, 10.0.0.2)" in errors
  // The data plane. Device tensors: the groups enqueue on `stream` (a cudaStream_t) of GPU
  // `device_index`; otherwise they carry host tensors.
  bool device_tensors = false;
  int device_index = 0;
  void* stream = nullptr;
  bool disable_custom_all_reduce = false;  // --disable-custom-all-reduce
  // A data-plane collective's limit; the world group waits for plans as long as the head is idle.
  std::chrono::milliseconds collective_timeout{std::chrono::seconds(30)};
  std::chrono::milliseconds plan_wait_timeout{std::chrono::hours(24 * 30)};
  // A device rank whose data plane failed ends this long after the abort if its thread waits
  // elsewhere (the next step plan) and never sees the error.
  std::chrono::milliseconds exit_after_failure{std::chrono::seconds(3)};
};

// Joins world, tp and pp. Throws Error(kUnsupported) for device tensors in a build without
// NCCL, and the communicators' errors (a peer that never arrives names it).
std::unique_ptr<ProcessGroups> join_process_groups(const JoinGroupsOptions& options);

}  // namespace tessera::dist
