#include "plan/network_cost.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "core/error.h"

namespace tessera::plan {
namespace {

// Nodes the ranks [first, first + count) sit on (consecutive ranks fill a node).
int nodes_spanned(int first, int count, int per_node) { return (first + count - 1) / per_node - first / per_node + 1; }

int ceil_log2(int n) {
  int hops = 0;
  while ((1 << hops) < n) ++hops;
  return hops;
}

// Adds one all-reduce of `bytes` over a group spanning `nodes` nodes (ring or tree between the
// nodes, the ranks of a node reduced inside it first).
void add_all_reduce(CrossNodeTraffic& t, int nodes, double bytes) {
  if (nodes < 2) return;
  ++t.all_reduces;
  t.latencies += 2.0 * (nodes - 1);
  t.bytes += 2.0 * (nodes - 1) / nodes * bytes;
}

// Adds a broadcast of `bytes` from one rank to `nodes` nodes (a tree between the nodes).
void add_broadcast(CrossNodeTraffic& t, int nodes, double bytes) {
  if (nodes < 2) return;
  ++t.broadcasts;
  const int hops = ceil_log2(nodes);
  t.latencies += hops;
  t.bytes += hops * bytes;
}

// The layers of each stage, as the planner splits them when the layout gives none.
std::vector<int> stage_layers(const ModelConfig& c, const TrafficLayout& l) {
  if (!l.stage_layers.empty()) return l.stage_layers;
  std::vector<int> v(static_cast<size_t>(l.pipeline_parallel), c.num_layers / l.pipeline_parallel);
  for (int s = 0; s < c.num_layers % l.pipeline_parallel; ++s) ++v[static_cast<size_t>(s)];
  return v;
}

// The step plan rank 0 broadcasts (engine/step_plan.h): a header, four i32 per token (id,
// position, slot, logits index), a 32-byte sampling row per logits row, and every sequence's
// block table at the step's widest.
double step_plan_bytes(const TrafficLayout& l, int tokens) {
  const double blocks = std::ceil(static_cast<double>(std::max<int64_t>(1, l.context)) / std::max(1, l.block_size));
  return 256.0 + 16.0 * tokens + 32.0 * tokens + 4.0 * l.batch * (blocks + 4);
}

}  // namespace

LinkSpec parse_link(const std::string& text) {
  auto bad = [&] {
    fail(ErrorKind::kInvalidArgument,
         "--link {}: expected GBIT[,LATENCY_US], e.g. --link 50 (50 Gb/s) or --link 50,20 (50 Gb/s, 20 µs one way; "
         "tessera doctor measures both)",
         text);
  };
  const size_t comma = text.find(',');
  const std::string gbit = text.substr(0, comma);
  char* end = nullptr;
  const double g = std::strtod(gbit.c_str(), &end);
  if (gbit.empty() || *end != '\0' || !(g > 0) || !std::isfinite(g)) bad();
  LinkSpec link;
  link.bytes_per_second = g * 1e9 / 8;
  link.latency_seconds = kDefaultLinkLatencySeconds;
  if (comma != std::string::npos) {
    const std::string us = text.substr(comma + 1);
    const double v = std::strtod(us.c_str(), &end);
    if (us.empty() || *end != '\0' || !(v >= 0) || !std::isfinite(v)) bad();
    link.latency_seconds = v * 1e-6;
  }
  return link;
}

double CrossNodeTraffic::seconds(const LinkSpec& link) const {
  return latencies * link.latency_seconds + (link.bytes_per_second > 0 ? bytes / link.bytes_per_second : 0.0);
}

bool crosses_nodes(const TrafficLayout& l) {
  const int world = l.tensor_parallel * l.pipeline_parallel;
  return l.gpus_per_node > 0 && world > l.gpus_per_node;
}

CrossNodeTraffic decode_step_traffic(const ModelConfig& c, const TrafficLayout& l) {
  CrossNodeTraffic t;
  if (!crosses_nodes(l)) return t;
  const int tp = l.tensor_parallel, pp = l.pipeline_parallel, g = l.gpus_per_node;
  const int world = tp * pp, nodes = (world + g - 1) / g;
  const int rows = l.batch * (1 + l.draft_tokens);  // the step's tokens, each a logits row
  const double hidden = static_cast<double>(c.hidden_size) * l.activation_bytes;
  const double vocab_slice = std::ceil(static_cast<double>(c.vocab_size) / tp) * 4.0;  // f32 logits of one rank
  const std::vector<int> layers = stage_layers(c, l);
  // Rank 0 broadcasts the step plan to every rank; with MTP also the drafting plan.
  add_broadcast(t, nodes, step_plan_bytes(l, rows));
  if (l.mtp) add_broadcast(t, nodes, step_plan_bytes(l, rows));
  for (int s = 0; s < pp; ++s) {
    const int tp_nodes = nodes_spanned(s * tp, tp, g);
    if (s == 0) add_all_reduce(t, tp_nodes, rows * hidden);  // vocab-parallel embedding
    for (int i = 0; i < layers[static_cast<size_t>(s)]; ++i)
      for (int k = 0; k < 2; ++k) add_all_reduce(t, tp_nodes, rows * hidden);  // mixer and MLP outputs
    if (s + 1 < pp && (s * tp) / g != ((s + 1) * tp) / g) {  // TP rank r of stage s to rank r of stage s + 1
      ++t.stage_sends;
      t.latencies += 1;
      t.bytes += 2.0 * rows * hidden;  // residual and hidden state, [2T, H]
    }
  }
  // The last stage's logits, gathered on its TP rank 0 from the ranks on other nodes: each
  // rank's slice of the whole rows, a (max, id) pair of the greedy ones.
  const int last = (pp - 1) * tp;
  const int remote = tp - std::min(tp, g - last % g);
  constexpr double kPairBytes = 8;
  auto gather = [&](int whole, int greedy) {
    if (remote <= 0) return;
    ++t.gathers;
    t.latencies += 1;
    t.bytes += static_cast<double>(remote) * (whole * vocab_slice + greedy * kPairBytes);
  };
  const int whole = std::clamp(l.whole_rows, 0, rows);
  gather(whole, rows - whole);
  if (remote > 0) t.whole_row_bytes = remote * (vocab_slice - kPairBytes);
  const int last_nodes = nodes_spanned(last, tp, g);
  if (l.mtp) {  // k passes of the MTP layer: embedding, attention and MoE all-reduces, logits, the picks shared
    for (int pass = 0; pass < l.draft_tokens; ++pass) {
      const int pass_rows = pass == 0 ? rows : l.batch;
      for (int k = 0; k < 3; ++k) add_all_reduce(t, last_nodes, pass_rows * hidden);
      gather(0, l.batch);  // (the drafts are greedy)
      add_broadcast(t, last_nodes, 4.0 * l.batch);
    }
  }
  // The sampled tokens back to rank 0 when the last stage sits on another node.
  if (last / g != 0) {
    ++t.broadcasts;
    t.latencies += 1;
    t.bytes += 4.0 * (rows + l.batch * l.draft_tokens);
  }
  return t;
}

}  // namespace tessera::plan
