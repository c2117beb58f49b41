// What a decode step sends over the link between nodes, and what that costs on a given link:
// the collectives and sends of tessera's data plane (docs/distributed.md, "A step") for a TP x PP
// layout placed as the launcher places it (world rank r = pp_rank x TP + tp_rank, consecutive
// ranks on a node), priced with the alpha-beta model (a message of S bytes costs latency + S /
// bandwidth; an all-reduce over n nodes 2 (n - 1) latencies and 2 (n - 1) / n x S bytes; inside
// a node nothing is charged).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "loader/model_config.h"

namespace tessera::plan {

// The link between two nodes: `tessera plan --link GBIT[,LATENCY_US]` (tessera doctor measures
// both between every pair of nodes).
struct LinkSpec {
  double bytes_per_second = 0;  // one direction
  double latency_seconds = 0;   // one way, for a small message
};
// "50" (Gb/s, 25 µs), "50,20", "200,5.5": fails naming the flag on anything else.
LinkSpec parse_link(const std::string& text);
inline constexpr double kDefaultLinkLatencySeconds = 25e-6;  // TCP between two hosts on one Ethernet switch

// Where the ranks sit and what a step carries.
struct TrafficLayout {
  int tensor_parallel = 1;
  int pipeline_parallel = 1;
  int gpus_per_node = 0;     // 0: TP x PP on one node
  int batch = 1;             // sequences in the decode step
  int draft_tokens = 0;      // speculative decoding: drafts verified per sequence (the step's rows: batch x (1 + k))
  bool mtp = false;          // the MTP layer's passes after the step (draft_tokens of them) run on the last stage
  int activation_bytes = 2;  // bytes of one activation value (bf16)
  std::vector<int> stage_layers;  // layers of each pipeline stage (empty: as even as the planner splits them)
  int64_t context = 0;            // tokens each sequence holds (its block table travels in the step plan)
  int block_size = 16;
  // Logits rows of the step that need their whole distribution (sampling at a temperature,
  // logprobs, penalties, structured output): each rank's slice of them is gathered. The other
  // rows (greedy, and the MTP drafts always) travel as one (max, id) pair a rank (8 bytes).
  int whole_rows = 0;
};

// One decode step's traffic over the link, on the critical path (the messages are sent one after
// another: a layer waits for its all-reduce).
struct CrossNodeTraffic {
  int all_reduces = 0;         // TP all-reduces whose group spans nodes
  int gathers = 0;             // logits gathers to TP rank 0 from other nodes
  int stage_sends = 0;         // pipeline sends between stages on different nodes
  int broadcasts = 0;          // world broadcasts (the step plan, the MTP drafting plan) and token returns
  double bytes = 0;            // over the link, on the critical path
  double latencies = 0;        // one-way latencies on the critical path
  double whole_row_bytes = 0;  // what the step's gather adds when one greedy row needs its whole logits
  int messages() const { return all_reduces + gathers + stage_sends + broadcasts; }
  double seconds(const LinkSpec& link) const;
};

// The step's traffic; all zero when every rank is on one node.
CrossNodeTraffic decode_step_traffic(const ModelConfig& config, const TrafficLayout& layout);

// Whether any collective or send of the layout crosses nodes.
bool crosses_nodes(const TrafficLayout& layout);

}  // namespace tessera::plan
