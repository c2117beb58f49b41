#include "distributed/placement.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "distributed/rank_gpus.h"

namespace tessera::dist {

RankPlacement2D place_ranks(int tp, int pp, const std::vector<NodeSlots>& nodes) {
  if (tp < 1 || pp < 1) fail(ErrorKind::kInvalidArgument, "tensor and pipeline parallel sizes must be at least 1");
  const int world = tp * pp;
  const NodeSlots* head = nullptr;
  std::vector<const NodeSlots*> others;
  for (const NodeSlots& n : nodes) {
    if (n.node_rank == 0)
      head = &n;
    else if (n.alive)
      others.push_back(&n);
  }
  if (!head) fail(ErrorKind::kInvalidArgument, "the cluster has no head node");
  for (int count = 1; count <= static_cast<int>(others.size()) + 1; ++count) {
    if (world % count != 0) continue;
    const int per_node = world / count;
    if (head->slots < per_node) continue;
    RankPlacement2D p;
    p.nodes.push_back(0);
    std::vector<const NodeSlots*> chosen{head};
    for (const NodeSlots* n : others)
      if (static_cast<int>(p.nodes.size()) < count && n->slots >= per_node) {
        p.nodes.push_back(n->node_rank);
        chosen.push_back(n);
      }
    if (static_cast<int>(p.nodes.size()) < count) continue;
    p.ranks_per_node = per_node;
    p.tp_crosses_nodes = count > 1 && per_node % tp != 0;
    if (p.tp_crosses_nodes) {
      std::string link;
      for (const NodeSlots* n : chosen) link += fmt::format("{}{} on {}", link.empty() ? "" : " <-> ", n->ip, n->nic);
      p.warning = fmt::format(
          "--tensor-parallel-size {} is more than the {} rank(s) a node runs here, so tensor parallel groups span "
          "nodes: every layer's all-reduce crosses the network link {}; --tensor-parallel-size {} "
          "--pipeline-parallel-size {} keeps TP inside a node and only pipeline stages cross it",
          tp, per_node, link, per_node, world / per_node);
    }
    return p;
  }
  std::string have;
  for (const NodeSlots& n : nodes)
    have += fmt::format("{}node {} ({}): {} slot(s){}", have.empty() ? "" : ", ", n.node_rank, n.ip, n.slots,
                        n.alive ? "" : " (dead)");
  fail(ErrorKind::kInvalidArgument,
       "--tensor-parallel-size {} x --pipeline-parallel-size {} = {} ranks do not fit the cluster's nodes in equal "
       "shares (the head among them): {}; join more nodes with `tessera node start --address`, or lower the sizes",
       tp, pp, world, have);
}

std::vector<std::string> local_gpu_names(const std::string& proc_root) {
  namespace fs = std::filesystem;
  std::vector<std::pair<std::string, std::string>> found;  // (bus id, name): the driver's order
  std::error_code ec;
  for (const fs::directory_entry& d : fs::directory_iterator(proc_root, ec)) {
    std::ifstream in(d.path() / "information");
    std::string line, name = "GPU";
    while (std::getline(in, line))
      if (line.rfind("Model:", 0) == 0) {
        name = line.substr(6);
        name.erase(0, name.find_first_not_of(" \t"));
      }
    found.emplace_back(d.path().filename().string(), name);
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> names;
  for (auto& [_, n] : found) names.push_back(n);
  if (std::optional<std::vector<std::string>> visible = parse_cuda_visible_devices(std::getenv("CUDA_VISIBLE_DEVICES")))
    if (visible->size() < names.size()) names.resize(visible->size());
  return names;
}

}  // namespace tessera::dist
