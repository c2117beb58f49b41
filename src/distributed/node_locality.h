// Which ranks share a job node, as NCCL and the custom all-reduce must see it: tessera's job
// node is NCCL's host. Pure decisions (unit-tested without a GPU) and the one function that
// applies NCCL's to this process.
//
// NCCL tells hosts apart by a hash of NCCL_HOSTID when it is set, else of the hostname and the
// boot id, and refuses two ranks of one host on one GPU ("Duplicate GPU detected"). Two tessera
// nodes that share a machine (two network namespaces, two containers of one host) have the same
// hostname and boot id; each rank process therefore sets NCCL_HOSTID to a value of its own job
// node before its first NCCL call, unless the user set the variable. NCCL then takes the two
// nodes for two hosts and joins them over the network, as it would two machines.
//
// World ranks are placed node by node (rank = pp_rank x TP + tp_rank, `ranks_per_node`
// consecutive ranks a node: dist/placement.h), so a group's nodes follow from its world ranks.
#pragma once
#include <optional>
#include <string>

#include "distributed/communicator.h"

namespace tessera::dist {

struct NcclHostId {
  std::string value;
  bool from_user = false;  // the environment's NCCL_HOSTID, kept
};

// The NCCL_HOSTID a rank process of job node `node_rank` runs with: `existing` (the user's
// NCCL_HOSTID) when set and not empty, else "<hostname>:<boot id>/node<node_rank>", the same for
// every rank of a node and different per node and per machine (NCCL hashes the whole string).
NcclHostId nccl_host_id(const std::string& hostname, const std::string& boot_id, int node_rank, const char* existing);

// Sets this process's NCCL_HOSTID to nccl_host_id(its hostname, /proc/sys/kernel/random/boot_id,
// node_rank, $NCCL_HOSTID) and logs the choice once a process. Call before the first NCCL call.
NcclHostId apply_nccl_host_id(int node_rank);

// A boolean NCCL variable such as NCCL_P2P_DISABLE, as NCCL reads it: a non-zero integer, "true"
// or "yes" (any case) are true; null (unset), empty, 0, "false", "no" and anything else false.
bool nccl_env_true(const char* value);

// The job node of world rank `world_rank` when every node runs `ranks_per_node` ranks (<= 0: one
// node holds every rank).
int node_of_rank(int world_rank, int ranks_per_node);

// Why the custom all-reduce is not tried on `group`, or nullopt when it may be:
//   "its ranks span nodes": a rank of the group is on another job node. CUDA IPC reaches only
//     the processes of one machine, and two nodes that share one would otherwise exchange
//     through GPU memory behind the network NCCL uses between them;
//   "NCCL_P2P_DISABLE=<value>": the variable (`nccl_p2p_disable`, null when unset) is true:
//     the user asked for no peer-to-peer path between the GPUs.
// The group's world ranks give the same answer on every rank; NCCL_P2P_DISABLE must then be
// the same on every rank of a node (it is when tessera spawns them: they inherit its environment).
std::optional<std::string> custom_all_reduce_off_reason(const GroupInfo& group, int ranks_per_node,
                                                        const char* nccl_p2p_disable);

}  // namespace tessera::dist
