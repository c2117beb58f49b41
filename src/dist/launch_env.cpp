#include "dist/launch_env.h"

#include <charconv>
#include <cstdlib>

#include "core/error.h"

namespace tessera::dist {

namespace {

std::optional<std::string> get(const EnvLookup& env, const char* name) {
  const char* v = env(name);
  if (!v || !*v) return std::nullopt;
  return std::string(v);
}

std::optional<int> get_int(const EnvLookup& env, const char* name) {
  std::optional<std::string> s = get(env, name);
  if (!s) return std::nullopt;
  int value = 0;
  auto [end, ec] = std::from_chars(s->data(), s->data() + s->size(), value);
  if (ec != std::errc() || end != s->data() + s->size() || value < 0)
    fail(ErrorKind::kInvalidArgument, "environment variable {}='{}' is not a non-negative integer", name, *s);
  return value;
}

// A flag given together with a launcher variable must agree with it.
void reconcile(std::optional<int> flag, const char* flag_name, int env_value, const char* env_name, int* out) {
  if (flag && *flag != env_value)
    fail(ErrorKind::kInvalidArgument, "{} {} disagrees with {}={} set by the launcher; drop the flag or fix the job",
         flag_name, *flag, env_name, env_value);
  *out = env_value;
}

}  // namespace

const char* launch_source_name(LaunchSource s) {
  switch (s) {
    case LaunchSource::kFlags:
      return "flags";
    case LaunchSource::kMpi:
      return "mpirun";
    case LaunchSource::kSlurm:
      return "slurm";
    case LaunchSource::kLeaderWorkerSet:
      return "leaderworkerset";
    case LaunchSource::kSingleNode:
      return "single node";
  }
  return "?";
}

std::string LaunchFacts::describe() const {
  std::string s = fmt::format("launch from {}: node {} of {}", launch_source_name(source), node_rank, nnodes);
  if (rank >= 0) s += fmt::format(", rank {} of {} (local {} of {})", rank, world_size, local_rank, local_world_size);
  if (!master_addr.empty()) s += fmt::format(", master {}:{}", master_addr, master_port);
  return s;
}

LaunchFacts resolve_launch(const LaunchFlags& flags, const EnvLookup& env) {
  LaunchFacts f;
  std::optional<int> mpi_rank = get_int(env, "OMPI_COMM_WORLD_RANK");
  const char* mpi_rank_name = "OMPI_COMM_WORLD_RANK";
  if (!mpi_rank) {
    mpi_rank = get_int(env, "PMIX_RANK");
    mpi_rank_name = "PMIX_RANK";
  }
  std::optional<int> slurm_rank = get_int(env, "SLURM_PROCID");
  std::optional<std::string> lws_leader = get(env, "LWS_LEADER_ADDRESS");

  if (mpi_rank) {
    f.source = LaunchSource::kMpi;
    std::optional<int> size = get_int(env, "OMPI_COMM_WORLD_SIZE");
    if (!size) size = get_int(env, "PMIX_SIZE");
    if (!size) size = get_int(env, "OMPI_UNIVERSE_SIZE");
    if (!size) fail(ErrorKind::kInvalidArgument, "{} is set but no world size (OMPI_COMM_WORLD_SIZE)", mpi_rank_name);
    f.rank = *mpi_rank;
    f.world_size = *size;
    f.local_rank = get_int(env, "OMPI_COMM_WORLD_LOCAL_RANK").value_or(0);
    f.local_world_size = get_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE").value_or(1);
    if (f.world_size % f.local_world_size != 0)
      fail(ErrorKind::kInvalidArgument, "{} ranks do not split into nodes of {} (OMPI_COMM_WORLD_LOCAL_SIZE)",
           f.world_size, f.local_world_size);
    reconcile(flags.nnodes, "--nnodes", f.world_size / f.local_world_size, "OMPI_COMM_WORLD_SIZE/LOCAL_SIZE",
              &f.nnodes);
    reconcile(flags.node_rank, "--node-rank", f.rank / f.local_world_size, mpi_rank_name, &f.node_rank);
  } else if (slurm_rank) {
    f.source = LaunchSource::kSlurm;
    std::optional<int> ntasks = get_int(env, "SLURM_NTASKS");
    if (!ntasks) fail(ErrorKind::kInvalidArgument, "SLURM_PROCID is set but SLURM_NTASKS is not");
    f.rank = *slurm_rank;
    f.world_size = *ntasks;
    f.local_rank = get_int(env, "SLURM_LOCALID").value_or(0);
    std::optional<int> node_id = get_int(env, "SLURM_NODEID");
    std::optional<int> nnodes = get_int(env, "SLURM_NNODES");
    if (!node_id || !nnodes)
      fail(ErrorKind::kInvalidArgument, "SLURM_PROCID is set but SLURM_NODEID/SLURM_NNODES are not");
    f.local_world_size = *nnodes > 0 ? *ntasks / *nnodes : 1;
    reconcile(flags.nnodes, "--nnodes", *nnodes, "SLURM_NNODES", &f.nnodes);
    reconcile(flags.node_rank, "--node-rank", *node_id, "SLURM_NODEID", &f.node_rank);
    if (std::optional<std::string> launch_ip = get(env, "SLURM_LAUNCH_NODE_IPADDR"); launch_ip && f.node_rank == 0)
      f.master_addr = *launch_ip;
  } else if (lws_leader) {
    f.source = LaunchSource::kLeaderWorkerSet;
    std::optional<int> group = get_int(env, "LWS_GROUP_SIZE");
    std::optional<int> index = get_int(env, "LWS_WORKER_INDEX");
    if (!group || !index)
      fail(ErrorKind::kInvalidArgument, "LWS_LEADER_ADDRESS is set but LWS_GROUP_SIZE/LWS_WORKER_INDEX are not");
    reconcile(flags.nnodes, "--nnodes", *group, "LWS_GROUP_SIZE", &f.nnodes);
    reconcile(flags.node_rank, "--node-rank", *index, "LWS_WORKER_INDEX", &f.node_rank);
    f.master_addr = *lws_leader;
  } else {
    f.source = flags.nnodes || flags.node_rank ? LaunchSource::kFlags : LaunchSource::kSingleNode;
    f.nnodes = flags.nnodes.value_or(1);
    f.node_rank = flags.node_rank.value_or(0);
  }

  // The master: flag, then the launcher's, then MASTER_ADDR.
  if (flags.master_addr) {
    if (f.source == LaunchSource::kLeaderWorkerSet && *flags.master_addr != f.master_addr)
      fail(ErrorKind::kInvalidArgument, "--master-addr {} disagrees with LWS_LEADER_ADDRESS={}", *flags.master_addr,
           f.master_addr);
    f.master_addr = *flags.master_addr;
  } else if (f.master_addr.empty()) {
    if (std::optional<std::string> m = get(env, "MASTER_ADDR")) f.master_addr = *m;
  }
  if (flags.master_port) {
    f.master_port = *flags.master_port;
  } else if (std::optional<int> p = get_int(env, "MASTER_PORT")) {
    f.master_port = *p;
  }

  if (f.nnodes < 1) fail(ErrorKind::kInvalidArgument, "--nnodes must be at least 1 (got {})", f.nnodes);
  if (f.node_rank < 0 || f.node_rank >= f.nnodes)
    fail(ErrorKind::kInvalidArgument, "--node-rank {} must be in [0, {}) for --nnodes {}", f.node_rank, f.nnodes,
         f.nnodes);
  if (f.rank >= 0 && f.rank >= f.world_size)
    fail(ErrorKind::kInvalidArgument, "rank {} outside a world of {}", f.rank, f.world_size);
  if (f.master_port < 1 || f.master_port > 65535)
    fail(ErrorKind::kInvalidArgument, "--master-port {} outside 1..65535", f.master_port);
  if (f.nnodes > 1 && f.master_addr.empty())
    fail(ErrorKind::kInvalidArgument,
         "{} nodes but no master address; pass --master-addr (the head's IP on the network the nodes share) or set "
         "MASTER_ADDR",
         f.nnodes);
  return f;
}

LaunchFacts resolve_launch(const LaunchFlags& flags) {
  return resolve_launch(flags, [](const char* n) { return std::getenv(n); });
}

}  // namespace tessera::dist
