// The cross-node traffic of a decode step (plan/network_cost.h): what crosses the link for TP
// and PP layouts, its price on a link, and `tessera plan`'s use of it.
#include "plan/network_cost.h"

#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "plan/planner.h"

namespace tessera::plan {
namespace {

// hidden 1000, vocab 1000, 10 layers: byte counts easy to follow.
ModelConfig small_config() {
  ModelConfig c;
  c.hidden_size = 1000;
  c.vocab_size = 1000;
  c.num_layers = 10;
  return c;
}

TrafficLayout layout(int tp, int pp, int per_node) {
  TrafficLayout l;
  l.tensor_parallel = tp;
  l.pipeline_parallel = pp;
  l.gpus_per_node = per_node;
  l.context = 160;  // 10 blocks of 16
  return l;
}

TEST(NetworkCost, NothingCrossesWhenEveryRankIsOnOneNode) {
  for (auto [tp, pp] : {std::pair{8, 1}, {4, 2}, {1, 8}, {2, 2}}) {
    const TrafficLayout l = layout(tp, pp, 8);
    EXPECT_FALSE(crosses_nodes(l));
    const CrossNodeTraffic t = decode_step_traffic(small_config(), l);
    EXPECT_EQ(t.messages(), 0);
    EXPECT_EQ(t.bytes, 0);
    EXPECT_EQ(t.latencies, 0);
  }
}

TEST(NetworkCost, TensorParallelAcrossTwoNodesAllReducesEveryLayer) {
  // TP 2 over two one-GPU nodes: the embedding's all-reduce, two a layer, the logits gather, the plan.
  const CrossNodeTraffic t = decode_step_traffic(small_config(), layout(2, 1, 1));
  EXPECT_EQ(t.all_reduces, 1 + 2 * 10);
  EXPECT_EQ(t.gathers, 1);
  EXPECT_EQ(t.stage_sends, 0);
  EXPECT_EQ(t.broadcasts, 1);  // the step plan; the tokens are sampled on rank 0
  // An all-reduce of 2,000 bytes (one bf16 row) over two nodes: 2 latencies, 2 x 1/2 x 2,000 bytes.
  const double plan_bytes = 256 + 16 + 32 + 4 * (10 + 4);
  const double pair = 8;  // a greedy row: rank 1's (max, id)
  EXPECT_DOUBLE_EQ(t.bytes, 21 * 2000.0 + pair + plan_bytes);
  EXPECT_DOUBLE_EQ(t.latencies, 21 * 2 + 1 + 1);
  // A row that needs its whole distribution (sampled, logprobs): rank 1's half of the vocabulary, f32.
  TrafficLayout sampled = layout(2, 1, 1);
  sampled.whole_rows = 1;
  const CrossNodeTraffic w = decode_step_traffic(small_config(), sampled);
  const double logits = 500 * 4;
  EXPECT_DOUBLE_EQ(w.bytes, 21 * 2000.0 + logits + plan_bytes);
  EXPECT_EQ(w.gathers, 1);
  EXPECT_DOUBLE_EQ(w.latencies, t.latencies);
  EXPECT_DOUBLE_EQ(t.whole_row_bytes, logits - pair);
}

// The seeds' TP 8 with MTP k=2 over two nodes of 4 at batch 1: three logits gathers (the step's
// three rows, then one a pass), each from the four ranks of the other node. Greedy, every row is
// a (max, id) pair a rank; sampled, the step's rows are slices (the drafts stay greedy).
TEST(NetworkCost, GreedyAndDraftRowsGatherPairsInsteadOfSlices) {
  ModelConfig c = small_config();
  c.vocab_size = 248320;  // the flagship's: 31,040 columns a rank, 124,160 bytes of f32
  TrafficLayout l = layout(8, 1, 4);
  l.draft_tokens = 2;
  l.mtp = true;
  const CrossNodeTraffic greedy = decode_step_traffic(c, l);
  l.whole_rows = 3;
  const CrossNodeTraffic sampled = decode_step_traffic(c, l);
  EXPECT_EQ(greedy.gathers, 3);
  EXPECT_EQ(sampled.gathers, 3);
  EXPECT_EQ(greedy.latencies, sampled.latencies);
  const double slice = 31040 * 4.0, pair = 8;
  EXPECT_DOUBLE_EQ(sampled.bytes - greedy.bytes, 4 * 3 * (slice - pair));
  EXPECT_DOUBLE_EQ(greedy.whole_row_bytes, 4 * (slice - pair));
  // Before the cut every gather carried slices: 4 ranks x (3 + 1 + 1) rows.
  const double before = sampled.bytes + 4 * 2 * (slice - pair);
  EXPECT_NEAR(before - greedy.bytes, 4 * 5 * (slice - pair), 1e-6);
}

TEST(NetworkCost, PipelineAcrossTwoNodesSendsOneActivationPair) {
  const CrossNodeTraffic t = decode_step_traffic(small_config(), layout(1, 2, 1));
  EXPECT_EQ(t.all_reduces, 0);
  EXPECT_EQ(t.gathers, 0);
  EXPECT_EQ(t.stage_sends, 1);
  EXPECT_EQ(t.broadcasts, 2);  // the step plan out, the sampled token back to rank 0
  EXPECT_DOUBLE_EQ(t.latencies, 3);
  // The stage send carries the residual and the hidden state: 2 x 2,000 bytes at batch 1.
  EXPECT_DOUBLE_EQ(t.bytes, 4000 + (256 + 16 + 32 + 4 * 14) + 4);
}

TEST(NetworkCost, TensorParallelInsideNodesAndPipelineAcrossThem) {
  // TP 4 x PP 2 on two nodes of 4: only the stage boundary and the plan cross.
  const CrossNodeTraffic t = decode_step_traffic(small_config(), layout(4, 2, 4));
  EXPECT_EQ(t.all_reduces, 0);
  EXPECT_EQ(t.gathers, 0);
  EXPECT_EQ(t.stage_sends, 1);
  // TP 8 over the same nodes: every all-reduce crosses, and the logits of four ranks travel.
  const CrossNodeTraffic wide = decode_step_traffic(small_config(), layout(8, 1, 4));
  EXPECT_EQ(wide.all_reduces, 21);
  EXPECT_EQ(wide.gathers, 1);
  EXPECT_GT(wide.latencies, 10 * t.latencies);
}

TEST(NetworkCost, SpeculationMultipliesRowsAndMtpAddsItsPasses) {
  TrafficLayout l = layout(2, 1, 1);
  const CrossNodeTraffic plain = decode_step_traffic(small_config(), l);
  l.draft_tokens = 2;
  const CrossNodeTraffic ngram = decode_step_traffic(small_config(), l);
  EXPECT_EQ(ngram.all_reduces, plain.all_reduces);
  EXPECT_GT(ngram.bytes, 2.5 * plain.bytes);  // three rows a sequence
  l.mtp = true;
  const CrossNodeTraffic mtp = decode_step_traffic(small_config(), l);
  // Two MTP passes: three all-reduces, a gather and the picks' broadcast each; one more plan broadcast.
  EXPECT_EQ(mtp.all_reduces, plain.all_reduces + 2 * 3);
  EXPECT_EQ(mtp.gathers, 1 + 2);
  EXPECT_EQ(mtp.broadcasts, 1 + 1 + 2);
}

TEST(NetworkCost, LargerBatchesMoveMoreBytesOverTheSameLatencies) {
  TrafficLayout l = layout(2, 1, 1);
  const CrossNodeTraffic one = decode_step_traffic(small_config(), l);
  l.batch = 8;
  const CrossNodeTraffic eight = decode_step_traffic(small_config(), l);
  EXPECT_EQ(eight.latencies, one.latencies);
  EXPECT_GT(eight.bytes, 7 * one.bytes);
}

TEST(NetworkCost, PricedOnALink) {
  CrossNodeTraffic t;
  t.bytes = 6.25e6;
  t.latencies = 100;
  const LinkSpec link = parse_link("50,20");  // 6.25 GB/s, 20 µs
  EXPECT_DOUBLE_EQ(link.bytes_per_second, 6.25e9);
  EXPECT_DOUBLE_EQ(link.latency_seconds, 20e-6);
  EXPECT_NEAR(t.seconds(link), 1e-3 + 2e-3, 1e-12);
  EXPECT_DOUBLE_EQ(parse_link("200").latency_seconds, kDefaultLinkLatencySeconds);
  EXPECT_DOUBLE_EQ(parse_link("10,0").latency_seconds, 0);
}

TEST(NetworkCost, BadLinksNameTheFlag) {
  for (const char* bad : {"", "x", "50x", "0", "-5", "50,", "50,abc", "50,-1", "inf"}) {
    try {
      (void)parse_link(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--link"), std::string::npos) << e.what();
    }
  }
}

// The seeds' two-node shapes planned with a link: the plan carries each step's traffic, and for TP
// across the nodes the batch-1 step of TP inside them and PP across.
PlanInputs seed_inputs(int tp, int pp, int per_node, double gpu_bandwidth) {
  PlanInputs in;
  in.model_dir = std::string(TESSERA_SOURCE_DIR) + "/configs/qwen3.5-122b-a10b-fp8";
  in.tensor_parallel_size = tp;
  in.pipeline_parallel_size = pp;
  in.max_model_len = 2048;
  in.max_num_seqs = 8;
  in.target.memory_bytes = size_t{128} << 30;
  in.target.bandwidth = gpu_bandwidth;
  in.target.nodes = 2;
  in.target.gpus_per_node = per_node;
  in.target.link = parse_link("50,20");
  return in;
}

TEST(NetworkCost, PlanComparesTensorParallelAcrossNodesWithPipeline) {
  const Plan tp = make_plan(seed_inputs(2, 1, 1, 273e9));  // two GB10s
  ASSERT_TRUE(tp.network_one.has_value());
  EXPECT_EQ(tp.network_one->traffic.all_reduces, 1 + 2 * 48);
  EXPECT_GT(tp.network_one->seconds, 0);
  EXPECT_DOUBLE_EQ(tp.network_one->step_seconds, tp.ceiling_one->step_seconds + tp.network_one->seconds);
  ASSERT_TRUE(tp.network_alternative.has_value());
  EXPECT_EQ(tp.alternative_tp, 1);
  EXPECT_EQ(tp.alternative_pp, 2);
  EXPECT_EQ(tp.network_alternative->traffic.all_reduces, 0);
  EXPECT_LT(tp.network_alternative->seconds, tp.network_one->seconds);
  const std::string text = render_text(tp);
  EXPECT_NE(text.find("network    per decode step between the nodes (--link 50 Gb/s, 20 µs"), std::string::npos)
      << text;
  EXPECT_NE(text.find("97 all-reduces"), std::string::npos) << text;
  // On GB10's 273 GB/s the reads dominate: TP over the link still beats PP's stages one after another.
  EXPECT_NE(text.find("on this link TP across the nodes is the faster at batch 1"), std::string::npos) << text;

  const Plan pp = make_plan(seed_inputs(1, 2, 1, 273e9));
  ASSERT_TRUE(pp.network_one.has_value());
  EXPECT_FALSE(pp.network_alternative.has_value());
  EXPECT_EQ(pp.network_one->traffic.stage_sends, 1);

  const Plan one_node = make_plan(seed_inputs(2, 1, 2, 273e9));
  EXPECT_FALSE(one_node.network_one.has_value());
  EXPECT_EQ(render_text(one_node).find("network "), std::string::npos);
}

}  // namespace
}  // namespace tessera::plan
