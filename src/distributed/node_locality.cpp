#include "distributed/node_locality.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <mutex>

#include "core/logging.h"

namespace tessera::dist {

namespace {

std::string trimmed(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  return s.substr(i);
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

}  // namespace

NcclHostId nccl_host_id(const std::string& hostname, const std::string& boot_id, int node_rank, const char* existing) {
  if (existing && *existing) return {existing, true};
  return {fmt::format("{}:{}/node{}", hostname, boot_id, node_rank), false};
}

NcclHostId apply_nccl_host_id(int node_rank) {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) host[0] = 0;
  std::string boot_id;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, boot_id);
  NcclHostId id = nccl_host_id(trimmed(host), trimmed(boot_id), node_rank, std::getenv("NCCL_HOSTID"));
  if (!id.from_user) setenv("NCCL_HOSTID", id.value.c_str(), 1);
  static std::once_flag logged;
  std::call_once(logged, [&] {
    if (id.from_user)
      TLOG_INFO(
          "NCCL_HOSTID={} kept from the environment: NCCL takes the ranks that share it for one host (two nodes "
          "with the same value on one GPU are refused as a duplicate GPU)",
          id.value);
    else
      TLOG_INFO("NCCL_HOSTID={}: NCCL's host is this job node (node {})", id.value, node_rank);
  });
  return id;
}

bool nccl_env_true(const char* value) {
  if (!value) return false;
  const std::string v = lower(trimmed(value));
  if (v == "true" || v == "yes") return true;
  if (v.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(v.c_str(), &end, 0);
  return errno == 0 && end && *end == 0 && n != 0;
}

int node_of_rank(int world_rank, int ranks_per_node) { return ranks_per_node > 0 ? world_rank / ranks_per_node : 0; }

std::optional<std::string> custom_all_reduce_off_reason(const GroupInfo& group, int ranks_per_node,
                                                        const char* nccl_p2p_disable) {
  if (!group.world_ranks.empty()) {
    const int node = node_of_rank(group.world_ranks.front(), ranks_per_node);
    for (int w : group.world_ranks)
      if (node_of_rank(w, ranks_per_node) != node) return std::string("its ranks span nodes");
  }
  if (nccl_env_true(nccl_p2p_disable)) return fmt::format("NCCL_P2P_DISABLE={}", nccl_p2p_disable);
  return std::nullopt;
}

}  // namespace tessera::dist
