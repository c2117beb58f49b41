#include "cli/rank_launcher.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backend/devices.h"
#include "core/error.h"
#include "core/logging.h"
#include "distributed/crypto.h"
#include "distributed/rank_gpus.h"
#include "distributed/rendezvous_server.h"
#include "engine/model_loader.h"
#include "engine/worker.h"

extern char** environ;

namespace tessera::cli {

namespace {

constexpr const char* kTokenEnv = "TESSERA_RANK_TOKEN";

std::string hex(const std::array<uint8_t, 32>& b) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (uint8_t c : b) {
    s.push_back(d[c >> 4]);
    s.push_back(d[c & 15]);
  }
  return s;
}

std::string describe_exit(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return fmt::format("was killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return fmt::format("stopped (wait status {})", status);
}

dist::ParallelLayout layout_of(const EngineFlags& f) { return {f.tensor_parallel_size, f.pipeline_parallel_size}; }

std::string layout_name(const EngineFlags& f) {
  return fmt::format("tensor parallel {} x pipeline parallel {}", f.tensor_parallel_size, f.pipeline_parallel_size);
}

// --device for rank processes (auto: CUDA when this build has it and a GPU is visible).
DeviceType rank_device_type(const EngineFlags& f) {
  if (f.device == "cpu") return DeviceType::kCPU;
  if (f.device == "cuda") return DeviceType::kCUDA;
  if (f.device == "auto") return cuda_backend_available() ? DeviceType::kCUDA : DeviceType::kCPU;
  fail(ErrorKind::kInvalidArgument, "--device {} is not one of auto, cpu, cuda", f.device);
}

// The GPUs of this node's `local_ranks` rank processes (local rank r: visible device r).
dist::RankGpus rank_gpus(const EngineFlags& f, int local_ranks) {
#ifdef TESSERA_HAVE_CUDA
  return dist::assign_rank_gpus(local_ranks, cuda_device_count(), std::getenv("CUDA_VISIBLE_DEVICES"), layout_name(f));
#else
  (void)local_ranks;
  fail(ErrorKind::kUnsupported,
       "{} with --device cuda: this tessera build has no CUDA backend; rebuild with -DTESSERA_CUDA=ON (cmake --preset "
       "cuda) or run CPU ranks with --device cpu",
       layout_name(f));
#endif
}

// For the launch line: "2 CUDA rank processes over NCCL (GPUs 0,1 on this node)".
std::string describe_rank_processes(const EngineFlags& f, int world, int local_ranks) {
  if (rank_device_type(f) == DeviceType::kCPU) return fmt::format("{} CPU rank processes over Gloo", world);
  return fmt::format("{} CUDA rank processes over NCCL (GPUs {} on this node; step plans over Gloo)", world,
                     rank_gpus(f, local_ranks).list());
}

// Where a rank runs: its world rank, its job node and the ranks every node runs (0: one node).
struct RankSite {
  int rank = 0, node_rank = 0, ranks_per_node = 0;
};

// What a rank's Worker needs from the flags: the layout, the model, the groups' store.
WorkerOptions worker_options(const EngineFlags& f, const RankSite& site, const std::string& store_host, uint16_t port,
                             const std::string& token, const std::string& bind_ip, const dist::RankNamer& namer = {}) {
  WorkerOptions o;
  o.rank = site.rank;
  o.node_rank = site.node_rank;
  o.ranks_per_node = site.ranks_per_node;
  o.layout = layout_of(f);
  o.enable_expert_parallel = f.enable_expert_parallel;
  o.disable_custom_all_reduce = f.disable_custom_all_reduce;
  o.load = load_options(f);
  o.store_host = store_host;
  o.store_port = port;
  o.token = token;
  o.bind_ip = bind_ip;
  o.namer = namer;
  return o;
}

}  // namespace

void add_worker_flags(CLI::App& app, WorkerFlags& w) {
  // Internal: set by the head when it spawns its rank processes.
  app.add_option("--worker-rank", w.worker_rank)->group("");
  app.add_option("--worker-port", w.worker_port)->group("");
  app.add_option("--worker-master-addr", w.worker_master_addr)->group("");
  app.add_option("--worker-bind-ip", w.worker_bind_ip)->group("");
  app.add_option("--worker-first-rank", w.worker_first_rank)->group("");
  app.add_option("--worker-local-ranks", w.worker_local_ranks)->group("");
  app.add_option("--worker-node-rank", w.worker_node_rank)->group("");
}

std::unique_ptr<Backend> make_rank_backend(const EngineFlags& f, int local_ranks, int local_rank) {
  BackendOptions o;
  o.type = rank_device_type(f);
  if (local_rank < 0 || local_rank >= std::max(1, local_ranks))
    fail(ErrorKind::kInternal, "local rank {} of {} rank processes on this node", local_rank, local_ranks);
  if (o.type == DeviceType::kCUDA) {
    o.device_index = rank_gpus(f, local_ranks).device_index[static_cast<size_t>(local_rank)];
    auto backend = make_backend(o);
    check_start_memory(f, *backend);  // before any weight: other processes may share this GPU
    return backend;
  }
  unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  o.num_threads = static_cast<int>(std::max(1u, cores / static_cast<unsigned>(std::max(1, local_ranks))));
  return make_backend(o);
}

RankLauncher::RankLauncher(const EngineFlags& f, int argc, char** argv, RankPlacement placement)
    : flags_(f), placement_(std::move(placement)) {
  dist::ParallelLayout layout = layout_of(f);
  if (f.tensor_parallel_size < 1 || f.pipeline_parallel_size < 1)
    fail(ErrorKind::kInvalidArgument, "--tensor-parallel-size and --pipeline-parallel-size must be at least 1");
  world_ = layout.world_size();
  // A peer that died must surface as a failed collective, not as SIGPIPE on our next write to
  // its socket (Gloo's writes do not all pass MSG_NOSIGNAL).
  signal(SIGPIPE, SIG_IGN);
  if (placement_.store_host.empty()) {  // one node: our own control channel on loopback
    token_ = hex(dist::random_nonce());
    dist::RendezvousServerOptions so;
    so.bind_ip = "127.0.0.1";
    so.port = 0;
    so.token = token_;
    so.nnodes = 1;
    server_ = std::make_unique<dist::RendezvousServer>(so);
    placement_.store_host = placement_.bind_ip = "127.0.0.1";
    placement_.store_port = server_->port();
    placement_.first_rank = 0;
    placement_.local_ranks = world_;
  } else {  // several nodes: the head's control channel (dist::NodeSession) is up already
    token_ = placement_.token;
    if (placement_.local_ranks < 1 || placement_.first_rank < 0 ||
        placement_.first_rank + placement_.local_ranks > world_)
      fail(ErrorKind::kInvalidArgument, "ranks {}..{} of this node lie outside the world of {}", placement_.first_rank,
           placement_.first_rank + placement_.local_ranks - 1, world_);
    // Ranks are placed node by node: node k runs ranks [k x L, (k + 1) x L).
    if (placement_.node_rank * placement_.local_ranks != placement_.first_rank)
      fail(ErrorKind::kInternal, "node {} with {} ranks a node cannot start at world rank {}", placement_.node_rank,
           placement_.local_ranks, placement_.first_rank);
  }
  const uint16_t port = placement_.store_port;

  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) fail(ErrorKind::kInternal, "cannot find this binary (/proc/self/exe): {}", std::strerror(errno));
  exe[n] = 0;
  // Everything a child needs is built before fork (only exec-safe calls after it).
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e)
    if (std::strncmp(*e, kTokenEnv, std::strlen(kTokenEnv)) != 0) env_strings.emplace_back(*e);
  env_strings.push_back(std::string(kTokenEnv) + "=" + token_);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  const pid_t parent = getpid();
  std::fflush(nullptr);
  // On the head this process is rank 0; another node's process only supervises its ranks.
  const int spawn_end = placement_.first_rank + (placement_.launcher_started_ranks ? 1 : placement_.local_ranks);
  for (int r = std::max(1, placement_.first_rank); r < spawn_end; ++r) {
    std::vector<std::string> args{exe};
    for (int i = 0; i < argc; ++i) args.emplace_back(argv[i]);
    args.insert(args.end(),
                {"--worker-rank", std::to_string(r), "--worker-port", std::to_string(port), "--worker-master-addr",
                 placement_.store_host, "--worker-bind-ip", placement_.bind_ip, "--worker-first-rank",
                 std::to_string(placement_.first_rank), "--worker-local-ranks", std::to_string(placement_.local_ranks),
                 "--worker-node-rank", std::to_string(placement_.node_rank)});
    std::vector<char*> cargv;
    for (auto& s : args) cargv.push_back(s.data());
    cargv.push_back(nullptr);
    pid_t pid = fork();
    if (pid < 0) fail(ErrorKind::kInternal, "fork failed: {}", std::strerror(errno));
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);  // the head died before the line above
      dup2(2, 1);                         // stdout belongs to the head (results, --json)
      execve(exe, cargv.data(), envp.data());
      _exit(127);
    }
    pids_.push_back(pid);
    reaped_.push_back(false);
  }
  TLOG_INFO("tensor parallel {} x pipeline parallel {}: {}; this node runs ranks {}..{} on {}, control channel {}:{}{}",
            f.tensor_parallel_size, f.pipeline_parallel_size,
            describe_rank_processes(f, world_, placement_.local_ranks), placement_.first_rank,
            placement_.first_rank + placement_.local_ranks - 1, placement_.bind_ip, placement_.store_host, port,
            placement_.launcher_started_ranks && placement_.local_ranks > 1
                ? fmt::format(" (ranks {}..{} started by the launcher)", placement_.first_rank + 1,
                              placement_.first_rank + placement_.local_ranks - 1)
                : "");
  supervisor_ = std::thread([this] { supervise(); });
}

RankLauncher::~RankLauncher() {
  stopping_ = true;
  if (supervisor_.joinable()) supervisor_.join();
  // The executor's shutdown plan has been sent by now (or the world is broken): give the
  // workers a moment to exit by themselves, then make sure (SIGKILL: ranks ignore SIGTERM).
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  bool killed = false;
  for (;;) {
    bool all = true;
    for (size_t i = 0; i < pids_.size(); ++i) {
      if (reaped_[i]) continue;
      int status = 0;
      if (waitpid(pids_[i], &status, WNOHANG) == pids_[i])
        reaped_[i] = true;
      else
        all = false;
    }
    if (all) break;
    if (!failure().empty() && !killed) deadline = std::chrono::steady_clock::now();
    if (!killed && std::chrono::steady_clock::now() >= deadline) {
      for (size_t i = 0; i < pids_.size(); ++i)
        if (!reaped_[i]) kill(pids_[i], SIGKILL);
      killed = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::string RankLauncher::failure() const {
  std::lock_guard<std::mutex> lk(mu_);
  return failure_;
}

std::string RankLauncher::wait_failure(std::chrono::milliseconds timeout) const {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    std::string f = failure();
    if (!f.empty() || std::chrono::steady_clock::now() >= deadline) return f;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void RankLauncher::report_failure(const std::string& what) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!failure_.empty()) return;
    failure_ = what;
  }
  TLOG_ERROR("{}; ending the job", what);
}

void RankLauncher::supervise() {
  std::optional<std::chrono::steady_clock::time_point> failed_at;
  const int first_spawned = std::max(1, placement_.first_rank);
  while (!stopping_) {
    for (size_t i = 0; i < pids_.size(); ++i) {
      if (reaped_[i]) continue;
      int status = 0;
      if (waitpid(pids_[i], &status, WNOHANG) != pids_[i]) continue;
      reaped_[i] = true;
      if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {  // after the shutdown plan
        ++exited_ok_;
        continue;
      }
      std::string what =
          fmt::format("rank {} (pid {}) {}", first_spawned + static_cast<int>(i), pids_[i], describe_exit(status));
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (failure_.empty()) failure_ = what;
      }
      TLOG_ERROR("{}; ending the job", what);
      if (!failed_at) failed_at = std::chrono::steady_clock::now();
    }
    if (!failed_at && !failure().empty()) failed_at = std::chrono::steady_clock::now();  // report_failure
    if (failed_at && std::chrono::steady_clock::now() - *failed_at > std::chrono::seconds(5)) {
      // The engine did not end by itself (stuck in a wait): end the process.
      std::fprintf(stderr, "error: %s\n", failure().c_str());
      std::fflush(nullptr);
      for (size_t i = 0; i < pids_.size(); ++i)
        if (!reaped_[i]) kill(pids_[i], SIGKILL);
      std::_Exit(1);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

std::unique_ptr<Executor> RankLauncher::make_executor(Backend& backend) {
  if (placement_.first_rank != 0) fail(ErrorKind::kInternal, "make_executor: only the head node runs rank 0");
  return std::make_unique<MultiprocExecutor>(std::make_unique<Worker>(
      worker_options(flags_, RankSite{0, placement_.node_rank, placement_.local_ranks}, placement_.store_host,
                     placement_.store_port, token_, placement_.bind_ip, placement_.namer),
      backend));
}

void set_rank_token(const std::string& token) { setenv(kTokenEnv, token.c_str(), 1); }

int run_worker_rank(const EngineFlags& f, const WorkerFlags& w) {
  const int world = f.tensor_parallel_size * f.pipeline_parallel_size;
  if (w.worker_rank < 1 || w.worker_rank >= world || w.worker_port <= 0 || w.worker_port > 65535)
    fail(ErrorKind::kInvalidArgument, "--worker-rank {} / --worker-port {}: internal flags of the rank launcher",
         w.worker_rank, w.worker_port);
  const char* token = std::getenv(kTokenEnv);
  if (!token) fail(ErrorKind::kInvalidArgument, "a worker rank needs {} from the head", kTokenEnv);
  std::string tok = token;
  unsetenv(kTokenEnv);
  signal(SIGPIPE, SIG_IGN);  // see RankLauncher
  // Ctrl-C reaches the whole process group, a scheduler's cancel every process of the job: the
  // head drains and its shutdown plan ends the ranks.
  signal(SIGINT, SIG_IGN);
  signal(SIGTERM, SIG_IGN);
  spdlog::set_level(spdlog::level::warn);  // the head logs for the job
  // A failed rank says why and exits at once: tearing its communicators down politely
  // could block on GPU work that waits for peers (seen: ncclCommDestroy behind a captured
  // graph's collective), and the head notices the exit and ends the job.
  auto die = [&](const char* what) {
    std::fprintf(stderr, "error: rank %d: %s\n", w.worker_rank, what);
    std::fflush(stderr);
    std::_Exit(1);
  };
  try {
    const bool one_node = w.worker_local_ranks <= 0;  // local rank = world rank
    const int local_ranks = one_node ? world : w.worker_local_ranks;
    auto backend = make_rank_backend(f, local_ranks, one_node ? w.worker_rank : w.worker_rank - w.worker_first_rank);
    const RankSite site{w.worker_rank, one_node ? 0 : w.worker_node_rank, local_ranks};
    Worker worker(
        worker_options(f, site, w.worker_master_addr, static_cast<uint16_t>(w.worker_port), tok, w.worker_bind_ip),
        *backend);
    try {
      worker.run_step_loop();
    } catch (const std::exception& e) {
      die(e.what());  // before the destructors of the worker's groups and the backend run
    }
  } catch (const Error& e) {
    fail(e.kind(), "rank {}: {}", w.worker_rank, e.what());
  }
  return 0;
}

}  // namespace tessera::cli
