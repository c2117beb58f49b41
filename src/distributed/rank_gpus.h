// Which GPU each rank process of a node uses, as vLLM does: local rank r takes visible
// device r (every rank sees every GPU of CUDA_VISIBLE_DEVICES, so NCCL and CUDA IPC can
// reach the peers). Pure functions, so that the rule is unit-tested without a GPU.
#pragma once
#include <cctype>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"

namespace tessera::dist {

// CUDA_VISIBLE_DEVICES as the CUDA runtime reads it: comma-separated entries, each a device
// index or a GPU-/MIG- UUID; the list ends at the first entry that is neither (CUDA ignores
// that entry and every later one). nullopt: the variable is unset (every GPU is visible);
// an empty list: no GPU is visible.
inline std::optional<std::vector<std::string>> parse_cuda_visible_devices(const char* value) {
  if (!value) return std::nullopt;
  std::vector<std::string> out;
  std::string s(value);
  size_t begin = 0;
  while (begin <= s.size()) {
    size_t end = s.find(',', begin);
    if (end == std::string::npos) end = s.size();
    std::string e = s.substr(begin, end - begin);
    while (!e.empty() && std::isspace(static_cast<unsigned char>(e.front()))) e.erase(e.begin());
    while (!e.empty() && std::isspace(static_cast<unsigned char>(e.back()))) e.pop_back();
    bool index = !e.empty() && e.size() <= 9;
    for (char c : e) index = index && std::isdigit(static_cast<unsigned char>(c));
    bool uuid = e.size() > 4 && (e.rfind("GPU-", 0) == 0 || e.rfind("MIG-", 0) == 0);
    if (!index && !uuid) break;
    out.push_back(e);
    begin = end + 1;
  }
  return out;
}

struct RankGpus {
  std::vector<int> device_index;   // per local rank: the index to cudaSetDevice
  std::vector<std::string> names;  // per local rank: its CUDA_VISIBLE_DEVICES entry, else the index
  // "0,1" (for the launch log line)
  std::string list() const {
    std::string s;
    for (const auto& n : names) s += (s.empty() ? "" : ",") + n;
    return s;
  }
};

// The GPUs of `local_ranks` rank processes on a node whose CUDA runtime reports
// `visible_gpus` devices (`cuda_visible_devices`: the environment variable, or null).
// `layout` names the request in the error ("tensor parallel 4 x pipeline parallel 2").
// Throws Error(kInvalidArgument) when there are more rank processes than GPUs.
inline RankGpus assign_rank_gpus(int local_ranks, int visible_gpus, const char* cuda_visible_devices,
                                 const std::string& layout) {
  if (local_ranks < 1) fail(ErrorKind::kInvalidArgument, "{}: no rank processes on this node", layout);
  std::optional<std::vector<std::string>> listed = parse_cuda_visible_devices(cuda_visible_devices);
  std::string visible_note =
      cuda_visible_devices ? fmt::format(" (CUDA_VISIBLE_DEVICES={})", cuda_visible_devices) : std::string();
  if (visible_gpus < local_ranks) {
    if (visible_gpus <= 0)
      fail(ErrorKind::kInvalidArgument,
           "{} needs {} GPUs on this node (one per rank process), but no GPU is visible{}; make GPUs visible, or run "
           "CPU ranks with --device cpu",
           layout, local_ranks, visible_note);
    fail(ErrorKind::kInvalidArgument,
         "{} needs {} GPUs on this node (one per rank process), but only {} {} visible{}; use a smaller "
         "--tensor-parallel-size / --pipeline-parallel-size (TP x PP at most {} per node), spread the ranks over "
         "more nodes (--nnodes), or make more GPUs visible",
         layout, local_ranks, visible_gpus, visible_gpus == 1 ? "is" : "are", visible_note, visible_gpus);
  }
  RankGpus g;
  for (int r = 0; r < local_ranks; ++r) {
    g.device_index.push_back(r);
    g.names.push_back(listed && static_cast<size_t>(r) < listed->size() ? (*listed)[static_cast<size_t>(r)]
                                                                        : std::to_string(r));
  }
  return g;
}

}  // namespace tessera::dist
