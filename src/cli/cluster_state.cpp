#include "cli/cluster_state.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "core/error.h"

namespace tessera::cli {

namespace {
std::string state_dir() {
  if (const char* d = std::getenv("TESSERA_STATE_DIR"); d && *d) return d;
  return "/tmp/tessera-" + std::to_string(getuid());
}
}  // namespace

std::string cluster_state_path() { return state_dir() + "/cluster"; }

void write_cluster_state(const ClusterState& s) {
  const std::string dir = state_dir();
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
    fail(ErrorKind::kInvalidArgument, "cannot create {}: {}; set TESSERA_STATE_DIR to a writable directory", dir,
         std::strerror(errno));
  const std::string path = cluster_state_path(), tmp = path + ".tmp";
  {
    mode_t old = umask(077);
    std::ofstream out(tmp, std::ios::trunc);
    umask(old);
    out << "host=" << s.host << "\nport=" << s.port << "\ntoken=" << s.token << "\nnic=" << s.nic << "\npid=" << s.pid
        << "\n";
    if (!out) fail(ErrorKind::kInvalidArgument, "cannot write {}; set TESSERA_STATE_DIR to a writable directory", tmp);
  }
  chmod(tmp.c_str(), 0600);
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    fail(ErrorKind::kInvalidArgument, "cannot write {}: {}", path, std::strerror(errno));
}

std::optional<ClusterState> read_cluster_state() {
  std::ifstream in(cluster_state_path());
  if (!in) return std::nullopt;
  ClusterState s;
  std::string line;
  while (std::getline(in, line)) {
    size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    std::string k = line.substr(0, eq), v = line.substr(eq + 1);
    if (k == "host") s.host = v;
    if (k == "port") s.port = static_cast<uint16_t>(std::atoi(v.c_str()));
    if (k == "token") s.token = v;
    if (k == "nic") s.nic = v;
    if (k == "pid") s.pid = std::atol(v.c_str());
  }
  if (s.host.empty() || s.port == 0) return std::nullopt;
  if (s.pid > 0 && kill(static_cast<pid_t>(s.pid), 0) != 0 && errno == ESRCH) return std::nullopt;  // stale
  return s;
}

void remove_cluster_state() { std::remove(cluster_state_path().c_str()); }

}  // namespace tessera::cli
