#include "distributed/launch_env.h"

#include <charconv>
#include <cstdlib>
#include <initializer_list>

#include "core/error.h"

namespace tessera::dist {

namespace {

constexpr size_t kMaxHosts = 65536;

std::optional<std::string> get(const EnvLookup& env, const char* name) {
  const char* v = env(name);
  if (!v || !*v) return std::nullopt;
  return std::string(v);
}

std::optional<int> parse_int(const std::string& s) {
  int value = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end != s.data() + s.size() || value < 0) return std::nullopt;
  return value;
}

std::optional<int> get_int(const EnvLookup& env, const char* name) {
  std::optional<std::string> s = get(env, name);
  if (!s) return std::nullopt;
  std::optional<int> v = parse_int(*s);
  if (!v) fail(ErrorKind::kInvalidArgument, "environment variable {}='{}' is not a non-negative integer", name, *s);
  return v;
}

// The first of `names` that is set (get or get_int), its name into `var`.
template <class Get>
auto first_set(const EnvLookup& env, std::initializer_list<const char*> names, std::string& var, Get get_one)
    -> decltype(get_one(env, "")) {
  for (const char* name : names)
    if (auto v = get_one(env, name)) {
      var = name;
      return v;
    }
  return std::nullopt;
}

// "2(x3),1" (SLURM_STEP_TASKS_PER_NODE): the count of every node, in order.
std::vector<int> parse_tasks_per_node(const char* name, const std::string& s) {
  std::vector<int> out;
  size_t i = 0;
  while (i <= s.size()) {
    size_t end = s.find(',', i);
    if (end == std::string::npos) end = s.size();
    std::string item = s.substr(i, end - i);
    int repeat = 1;
    if (size_t p = item.find("(x"); p != std::string::npos && item.back() == ')') {
      std::optional<int> r = parse_int(item.substr(p + 2, item.size() - p - 3));
      if (!r || *r < 1) fail(ErrorKind::kInvalidArgument, "{}='{}': cannot read '{}'", name, s, item);
      repeat = *r;
      item = item.substr(0, p);
    }
    std::optional<int> n = parse_int(item);
    if (!n || out.size() + static_cast<size_t>(repeat) > kMaxHosts)
      fail(ErrorKind::kInvalidArgument, "{}='{}': cannot read '{}'", name, s, item);
    out.insert(out.end(), static_cast<size_t>(repeat), *n);
    i = end + 1;
  }
  return out;
}

// What one launcher's variables say. Node-level sources (LeaderWorkerSet) have no rank.
struct View {
  LaunchSource source = LaunchSource::kSingleNode;
  std::optional<int> rank, world, local_rank, local_world;
  std::string rank_var, world_var, local_world_var;
  std::optional<int> node_rank, nnodes;
  std::string node_rank_var, nnodes_var;
  std::optional<std::string> master;  // the launcher's own master (LWS_LEADER_ADDRESS)
  std::string master_var;
  std::optional<std::string> nodelist;  // Slurm: the master when no address is given
  std::string nodelist_var;
};

std::optional<View> leader_worker_set(const EnvLookup& env) {
  if (!get(env, "LWS_LEADER_ADDRESS") && !get(env, "LWS_GROUP_SIZE") && !get(env, "LWS_WORKER_INDEX"))
    return std::nullopt;
  View v;
  v.source = LaunchSource::kLeaderWorkerSet;
  v.master = get(env, "LWS_LEADER_ADDRESS");
  v.nnodes = get_int(env, "LWS_GROUP_SIZE");
  v.node_rank = get_int(env, "LWS_WORKER_INDEX");
  if (!v.master || !v.nnodes || !v.node_rank)
    fail(ErrorKind::kInvalidArgument,
         "a LeaderWorkerSet sets LWS_LEADER_ADDRESS, LWS_GROUP_SIZE and LWS_WORKER_INDEX together; this pod has "
         "LWS_LEADER_ADDRESS={}, LWS_GROUP_SIZE={}, LWS_WORKER_INDEX={}",
         v.master.value_or("(unset)"), v.nnodes ? std::to_string(*v.nnodes) : "(unset)",
         v.node_rank ? std::to_string(*v.node_rank) : "(unset)");
  v.master_var = "LWS_LEADER_ADDRESS";
  v.nnodes_var = "LWS_GROUP_SIZE";
  v.node_rank_var = "LWS_WORKER_INDEX";
  return v;
}

std::optional<View> torchrun(const EnvLookup& env) {
  if (!get(env, "RANK") && !get(env, "WORLD_SIZE")) return std::nullopt;
  View v;
  v.source = LaunchSource::kTorchrun;
  v.rank = get_int(env, "RANK");
  v.world = get_int(env, "WORLD_SIZE");
  if (!v.rank || !v.world)
    fail(ErrorKind::kInvalidArgument, "torchrun's RANK and WORLD_SIZE go together; only {} is set",
         v.rank ? "RANK" : "WORLD_SIZE");
  v.rank_var = "RANK";
  v.world_var = "WORLD_SIZE";
  v.local_rank = get_int(env, "LOCAL_RANK");
  v.local_world = get_int(env, "LOCAL_WORLD_SIZE");
  v.local_world_var = "LOCAL_WORLD_SIZE";
  v.node_rank = get_int(env, "GROUP_RANK");
  v.node_rank_var = "GROUP_RANK";
  return v;
}

std::optional<View> open_mpi(const EnvLookup& env) {
  View v;
  v.source = LaunchSource::kOpenMpi;
  v.rank = first_set(env, {"OMPI_COMM_WORLD_RANK", "PMIX_RANK"}, v.rank_var, get_int);
  if (!v.rank) return std::nullopt;
  v.world = first_set(env, {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "OMPI_UNIVERSE_SIZE"}, v.world_var, get_int);
  if (!v.world)
    fail(ErrorKind::kInvalidArgument, "{} is set but no world size (OMPI_COMM_WORLD_SIZE or PMIX_SIZE)", v.rank_var);
  v.local_rank = get_int(env, "OMPI_COMM_WORLD_LOCAL_RANK");
  v.local_world = get_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE");
  v.local_world_var = "OMPI_COMM_WORLD_LOCAL_SIZE";
  return v;
}

std::optional<View> slurm(const EnvLookup& env) {
  std::optional<int> procid = get_int(env, "SLURM_PROCID");
  if (!procid) return std::nullopt;
  View v;
  v.source = LaunchSource::kSlurm;
  v.rank = procid;
  v.rank_var = "SLURM_PROCID";
  v.world = first_set(env, {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"}, v.world_var, get_int);
  if (!v.world) fail(ErrorKind::kInvalidArgument, "SLURM_PROCID is set but SLURM_NTASKS is not");
  v.local_rank = get_int(env, "SLURM_LOCALID");
  v.node_rank = get_int(env, "SLURM_NODEID");
  v.node_rank_var = "SLURM_NODEID";
  v.local_world_var = "SLURM_NTASKS_PER_NODE";
  v.nnodes = first_set(env, {"SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"}, v.nnodes_var, get_int);
  if (!v.node_rank || !v.nnodes)
    fail(ErrorKind::kInvalidArgument, "SLURM_PROCID is set but SLURM_NODEID or SLURM_NNODES is not");
  for (const char* name : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"})
    if (std::optional<std::string> tpn = get(env, name)) {
      std::vector<int> counts = parse_tasks_per_node(name, *tpn);
      for (int c : counts)
        if (c != counts.front())
          fail(ErrorKind::kInvalidArgument,
               "{}={}: Slurm put a different number of tasks on each node; start the same number on every node "
               "(srun --ntasks-per-node=1, or one per GPU with --ntasks-per-node=GPUS)",
               name, *tpn);
      v.local_world = counts.front();
      v.local_world_var = name;
      break;
    }
  v.nodelist = first_set(env, {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}, v.nodelist_var, get);
  return v;
}

std::optional<View> pmi(const EnvLookup& env) {
  std::optional<int> rank = get_int(env, "PMI_RANK");
  if (!rank) return std::nullopt;
  View v;
  v.source = LaunchSource::kPmi;
  v.rank = rank;
  v.rank_var = "PMI_RANK";
  v.world = get_int(env, "PMI_SIZE");
  v.world_var = "PMI_SIZE";
  if (!v.world) fail(ErrorKind::kInvalidArgument, "PMI_RANK is set but PMI_SIZE is not");
  v.local_rank = get_int(env, "MPI_LOCALRANKID");
  v.local_world = get_int(env, "MPI_LOCALNRANKS");
  v.local_world_var = "MPI_LOCALNRANKS";
  return v;
}

const char* one_per_node_hint(LaunchSource s) {
  switch (s) {
    case LaunchSource::kSlurm:
      return "srun --ntasks-per-node=1";
    case LaunchSource::kOpenMpi:
      return "mpirun --map-by ppr:1:node";
    case LaunchSource::kTorchrun:
      return "torchrun --nproc-per-node 1";
    case LaunchSource::kPmi:
      return "mpiexec -ppn 1";
    default:
      return "one process per node";
  }
}

// A launcher that started the processes: nodes, node rank, local rank, layout.
void resolve_processes(const View& v, const LaunchFlags& flags, LaunchFacts& f) {
  const std::string who = launch_source_name(v.source);
  f.rank = *v.rank;
  f.world_size = *v.world;
  f.local_world_size = v.local_world.value_or(1);
  if (!v.local_world && v.nnodes) {  // no per-node count given: the node count says it
    if (*v.nnodes < 1 || f.world_size % *v.nnodes != 0)
      fail(ErrorKind::kInvalidArgument,
           "{}: {}={} processes do not divide into {}={} nodes (every node runs the same number)", who, v.world_var,
           f.world_size, v.nnodes_var, *v.nnodes);
    f.local_world_size = f.world_size / *v.nnodes;
  }
  const int L = f.local_world_size;
  if (f.world_size < 1) fail(ErrorKind::kInvalidArgument, "{}={}: the world needs a process", v.world_var, *v.world);
  if (f.rank >= f.world_size)
    fail(ErrorKind::kInvalidArgument, "{}={} is outside the world of {}={}", v.rank_var, f.rank, v.world_var,
         f.world_size);
  if (L < 1 || f.world_size % L != 0)
    fail(ErrorKind::kInvalidArgument,
         "{}: {}={} processes do not divide into nodes of {}={} (every node runs the same number)", who, v.world_var,
         f.world_size, v.local_world_var, L);
  const int nodes = f.world_size / L;
  if (v.nnodes && *v.nnodes != nodes)
    fail(ErrorKind::kInvalidArgument,
         "{}: {}={} processes at {}={} per node make {} node(s), but {}={}; start the same number of tasks on every "
         "node",
         who, v.world_var, f.world_size, v.local_world_var, L, nodes, v.nnodes_var, *v.nnodes);
  f.local_rank = v.local_rank.value_or(f.rank % L);
  const int node = v.node_rank.value_or(f.rank / L);
  if (f.rank / L != node || f.rank % L != f.local_rank)
    fail(ErrorKind::kInvalidArgument,
         "{}: {}={} is local rank {} on node {}, but with {} process(es) per node ranks must be numbered node by node "
         "(node k runs ranks k x {} ..); use a block distribution (srun --distribution=block, mpirun --map-by slot)",
         who, v.rank_var, f.rank, f.local_rank, node, L, L);
  f.nnodes = nodes;
  f.node_rank = node;
  if (L > 1) {
    if (flags.parallel_ranks > 0 && flags.parallel_ranks != f.world_size)
      fail(ErrorKind::kInvalidArgument,
           "{} started {} processes, {} per node ({}={}), but --tensor-parallel-size x --pipeline-parallel-size = {} "
           "rank(s): start one process per node ({}; tessera starts the node's ranks) or one per rank ({} in all, "
           "the same number on every node)",
           who, f.world_size, L, v.local_world_var, L, flags.parallel_ranks, one_per_node_hint(v.source),
           flags.parallel_ranks);
    if (nodes == 1)
      fail(ErrorKind::kInvalidArgument,
           "{} started {} processes on one node; on one node start a single process ({}), which starts its {} "
           "rank(s) itself",
           who, L, one_per_node_hint(v.source), L);
    f.one_process_per_rank = true;
  }
}

[[noreturn]] void bad_hostlist(const std::string& list, const std::string& why) {
  fail(ErrorKind::kInvalidArgument, "node list '{}': {} (Slurm's syntax: n[01-04,7],gpu[1-2])", list, why);
}

// A flag given together with a launcher variable must agree with it.
void reconcile(std::optional<int> flag, const char* flag_name, int env_value, const std::string& env_what,
               const char* hint) {
  if (flag && *flag != env_value)
    fail(ErrorKind::kInvalidArgument, "{} {} contradicts {} (from the launcher's environment); {}", flag_name, *flag,
         env_what, hint);
}

}  // namespace

const char* launch_source_name(LaunchSource s) {
  switch (s) {
    case LaunchSource::kFlags:
      return "flags";
    case LaunchSource::kLeaderWorkerSet:
      return "LeaderWorkerSet";
    case LaunchSource::kTorchrun:
      return "torchrun";
    case LaunchSource::kOpenMpi:
      return "Open MPI";
    case LaunchSource::kSlurm:
      return "Slurm";
    case LaunchSource::kPmi:
      return "MPICH/PMI";
    case LaunchSource::kSingleNode:
      return "single node";
  }
  return "?";
}

const std::vector<const char*>& launcher_variable_names() {
  static const std::vector<const char*> kNames = {"LWS_LEADER_ADDRESS",
                                                  "LWS_GROUP_SIZE",
                                                  "LWS_WORKER_INDEX",
                                                  "RANK",
                                                  "WORLD_SIZE",
                                                  "LOCAL_RANK",
                                                  "LOCAL_WORLD_SIZE",
                                                  "GROUP_RANK",
                                                  "MASTER_ADDR",
                                                  "MASTER_PORT",
                                                  "OMPI_COMM_WORLD_RANK",
                                                  "OMPI_COMM_WORLD_SIZE",
                                                  "OMPI_COMM_WORLD_LOCAL_RANK",
                                                  "OMPI_COMM_WORLD_LOCAL_SIZE",
                                                  "OMPI_UNIVERSE_SIZE",
                                                  "PMIX_RANK",
                                                  "PMIX_SIZE",
                                                  "SLURM_PROCID",
                                                  "PMI_RANK",
                                                  "PMI_SIZE",
                                                  "MPI_LOCALRANKID",
                                                  "MPI_LOCALNRANKS"};
  return kNames;
}

std::vector<std::string> expand_hostlist(const std::string& list) {
  auto bad = [&](const std::string& why) { bad_hostlist(list, why); };
  // Split at the commas outside brackets.
  std::vector<std::string> items;
  int depth = 0;
  std::string cur;
  for (char c : list) {
    if (c == '[') {
      if (depth++ > 0) bad("nested '['");
    } else if (c == ']') {
      if (--depth < 0) bad("']' without '['");
    }
    if (c == ',' && depth == 0) {
      items.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(c);
    }
  }
  if (depth != 0) bad("'[' without ']'");
  items.push_back(cur);

  std::vector<std::string> hosts;
  for (const std::string& item : items) {
    if (item.empty()) bad("an empty host name");
    std::vector<std::string> names{""};
    size_t i = 0;
    while (i < item.size()) {
      if (item[i] != '[') {
        size_t end = item.find('[', i);
        if (end == std::string::npos) end = item.size();
        for (std::string& n : names) n += item.substr(i, end - i);
        i = end;
        continue;
      }
      size_t close = item.find(']', i);
      std::string ranges = item.substr(i + 1, close - i - 1);
      if (ranges.empty()) bad("empty brackets");
      std::vector<std::string> values;
      size_t j = 0;
      while (j <= ranges.size()) {
        size_t end = ranges.find(',', j);
        if (end == std::string::npos) end = ranges.size();
        std::string r = ranges.substr(j, end - j);
        size_t dash = r.find('-');
        std::string lo = r.substr(0, dash), hi = dash == std::string::npos ? lo : r.substr(dash + 1);
        const int first = lo.empty() || lo.size() > 9 ? -1 : parse_int(lo).value_or(-1);
        const int last = hi.empty() || hi.size() > 9 ? -1 : parse_int(hi).value_or(-1);
        if (first < 0 || last < first) bad_hostlist(list, fmt::format("cannot read the range '{}'", r));
        if (values.size() + static_cast<size_t>(last - first) + 1 > kMaxHosts) bad("more than 65536 hosts");
        for (int n = first; n <= last; ++n) values.push_back(fmt::format("{:0{}}", n, lo.size()));
        j = end + 1;
      }
      if (names.size() * values.size() > kMaxHosts) bad("more than 65536 hosts");
      std::vector<std::string> next;
      for (const std::string& n : names)
        for (const std::string& value : values) next.push_back(n + value);
      names = std::move(next);
      i = close + 1;
    }
    hosts.insert(hosts.end(), names.begin(), names.end());
    if (hosts.size() > kMaxHosts) bad("more than 65536 hosts");
  }
  return hosts;
}

std::string LaunchFacts::describe() const {
  std::string s = fmt::format("launch from {}: node {} of {}", launch_source_name(source), node_rank, nnodes);
  if (rank >= 0)
    s += fmt::format(", rank {} of {} (local {} of {}), {}", rank, world_size, local_rank, local_world_size,
                     one_process_per_rank ? "one process per rank" : "one process per node");
  if (!master_addr.empty())
    s += fmt::format(", master {}:{}{}", master_addr, master_port,
                     master_from.empty() ? "" : fmt::format(" (from {})", master_from));
  return s;
}

LaunchFacts resolve_launch(const LaunchFlags& flags, const EnvLookup& env) {
  LaunchFacts f;
  std::optional<View> view;
  // Highest first; the first one set wins, the others are noted.
  using Detect = std::optional<View> (*)(const EnvLookup&);
  for (Detect detect :
       {Detect(&leader_worker_set), Detect(&torchrun), Detect(&open_mpi), Detect(&slurm), Detect(&pmi)}) {
    std::optional<View> v;
    try {
      v = detect(env);
    } catch (const Error&) {
      if (!view) throw;  // a lower source's stray variables do not matter
      continue;
    }
    if (!v) continue;
    if (!view) {
      view = std::move(v);
    } else {
      f.notes.push_back(fmt::format("{}'s variables are set too and ignored: {} comes first{}",
                                    launch_source_name(v->source), launch_source_name(view->source),
                                    v->source == LaunchSource::kSlurm ? " (inside an allocation they describe the job, "
                                                                        "not this process)"
                                                                      : ""));
    }
  }

  if (view && view->rank) {
    f.source = view->source;
    resolve_processes(*view, flags, f);
    reconcile(flags.nnodes, "--nnodes", f.nnodes,
              view->nnodes ? fmt::format("{}={}", view->nnodes_var, *view->nnodes)
                           : fmt::format("{}={} / {}={}", view->world_var, f.world_size, view->local_world_var,
                                         f.local_world_size),
              "drop the flag or fix the job");
    reconcile(flags.node_rank, "--node-rank", f.node_rank,
              view->node_rank ? fmt::format("{}={}", view->node_rank_var, *view->node_rank)
                              : fmt::format("{}={}", view->rank_var, f.rank),
              "drop the flag (tessera reads the launcher's rank itself); a batch script that writes the rank into the "
              "command line (--node-rank $SLURM_NODEID inside double quotes) expands it once in the batch shell and "
              "gives every node the same rank");
  } else if (view) {  // LeaderWorkerSet: one pod per node
    f.source = view->source;
    f.nnodes = *view->nnodes;
    f.node_rank = *view->node_rank;
    reconcile(flags.nnodes, "--nnodes", f.nnodes, fmt::format("{}={}", view->nnodes_var, f.nnodes),
              "drop the flag or fix the manifest");
    reconcile(flags.node_rank, "--node-rank", f.node_rank, fmt::format("{}={}", view->node_rank_var, f.node_rank),
              "drop the flag (tessera reads the worker index itself)");
  } else {
    f.source = flags.nnodes || flags.node_rank ? LaunchSource::kFlags : LaunchSource::kSingleNode;
    f.nnodes = flags.nnodes.value_or(1);
    f.node_rank = flags.node_rank.value_or(0);
  }

  // The master: --master-addr, the launcher's (LWS_LEADER_ADDRESS, MASTER_ADDR), then Slurm's first node.
  std::optional<std::string> env_master;
  std::string env_master_var;
  if (view && view->master) {
    env_master = view->master;
    env_master_var = view->master_var;
  } else if ((env_master = get(env, "MASTER_ADDR"))) {
    env_master_var = "MASTER_ADDR";
  }
  if (flags.master_addr) {
    if (env_master && *env_master != *flags.master_addr)
      fail(ErrorKind::kInvalidArgument,
           "--master-addr {} contradicts {}={} (from the environment); drop the flag or unset the variable",
           *flags.master_addr, env_master_var, *env_master);
    f.master_addr = *flags.master_addr;
    f.master_from = "--master-addr";
  } else if (env_master) {
    f.master_addr = *env_master;
    f.master_from = env_master_var;
  } else if (view && view->nodelist && f.nnodes > 1) {
    std::vector<std::string> hosts = expand_hostlist(*view->nodelist);
    if (static_cast<int>(hosts.size()) < f.nnodes)
      fail(ErrorKind::kInvalidArgument, "{}={} names {} host(s) but the job has {} nodes", view->nodelist_var,
           *view->nodelist, hosts.size(), f.nnodes);
    f.master_addr = hosts.front();
    f.master_from = fmt::format("the first node of {}={}", view->nodelist_var, *view->nodelist);
  }
  std::optional<int> env_port = get_int(env, "MASTER_PORT");
  if (view && view->source == LaunchSource::kTorchrun && env_port &&
      get(env, "TORCHELASTIC_USE_AGENT_STORE") == "True") {
    // torchrun's agent on node 0 serves its own store on MASTER_PORT: the control channel takes the next port.
    f.notes.push_back(fmt::format(
        "torchrun's agent serves its store on MASTER_PORT={} (TORCHELASTIC_USE_AGENT_STORE=True): the control channel "
        "uses {}",
        *env_port, *env_port + 1));
    env_port = *env_port + 1;
  }
  if (flags.master_port && env_port && *flags.master_port != *env_port)
    fail(ErrorKind::kInvalidArgument,
         "--master-port {} contradicts MASTER_PORT={} (from the environment); drop the flag or unset the variable",
         *flags.master_port, *env_port);
  if (flags.master_port) {
    f.master_port = *flags.master_port;
  } else if (env_port) {
    f.master_port = *env_port;
  }

  if (f.nnodes < 1) fail(ErrorKind::kInvalidArgument, "--nnodes must be at least 1 (got {})", f.nnodes);
  if (f.node_rank < 0 || f.node_rank >= f.nnodes)
    fail(ErrorKind::kInvalidArgument, "--node-rank {} must be in [0, {}) for --nnodes {}", f.node_rank, f.nnodes,
         f.nnodes);
  if (f.master_port < 1 || f.master_port > 65535)
    fail(ErrorKind::kInvalidArgument, "--master-port {} outside 1..65535", f.master_port);
  if (f.nnodes > 1 && f.master_addr.empty())
    fail(ErrorKind::kInvalidArgument,
         "{} nodes but no master address; pass --master-addr (the head's IP on the network the nodes share) or set "
         "MASTER_ADDR{}",
         f.nnodes, f.source == LaunchSource::kOpenMpi ? " (mpirun -x MASTER_ADDR=...)" : "");
  return f;
}

LaunchFacts resolve_launch(const LaunchFlags& flags) {
  return resolve_launch(flags, [](const char* n) { return std::getenv(n); });
}

}  // namespace tessera::dist
