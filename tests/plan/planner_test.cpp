// The planner's arithmetic: weights as the loader places them (counted on a meta backend and
// checked against the parameter count worked out here from config.json), KV bytes from the
// model's cache declarations (GQA, TP split and replication, fp8), the shared KV budget, the
// verdict's advice (the numbers it gives must themselves fit), and agreement with what the
// engine allocates from the same memory.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "backend/op_workspace.h"
#include "engine/engine.h"
#include "engine/memory_plan.h"
#include "loader/model_config.h"
#include "model/registry.h"
#include "plan/meta_backend.h"
#include "plan/planner.h"

namespace tessera::plan {
namespace {

const std::string kQwen8b = std::string(TESSERA_SOURCE_DIR) + "/configs/qwen3-8b";
constexpr size_t kGiB = size_t{1} << 30;

PlanInputs inputs(const std::string& dir, size_t memory, int tp = 1) {
  PlanInputs in;
  in.model_dir = dir;
  in.tensor_parallel_size = tp;
  in.target.description = "test";
  in.target.device = DeviceType::kCUDA;
  in.target.memory_bytes = memory;
  in.target.baseline_used = size_t{512} << 20;
  in.target.gpus_per_node = 8;
  return in;
}

// Qwen3-8B's parameters from its config: embed + lm_head (untied), per layer q/k/v/o, q/k
// norms, gate/up/down, two RMSNorms; the final norm.
int64_t qwen3_8b_params() {
  const int64_t H = 4096, I = 12288, L = 36, V = 151936, D = 128, Hq = 32, Hk = 8;
  const int64_t per_layer = H * Hq * D + 2 * H * Hk * D + Hq * D * H + 2 * D + 3 * H * I + 2 * H;
  return 2 * V * H + L * per_layer + H;
}

TEST(Planner, WeightsAreTheDeclaredParametersInTheComputeDtype) {
  Plan p = make_plan(inputs(kQwen8b, 141 * kGiB));
  ASSERT_EQ(p.stages.size(), 1u);
  const size_t want = static_cast<size_t>(qwen3_8b_params()) * 2;  // bf16 on CUDA
  // Each allocation is rounded up to 256 bytes, as the CUDA backend does.
  EXPECT_GE(p.stages[0].weight_bytes, want);
  EXPECT_LE(p.stages[0].weight_bytes, want + p.stages[0].weight_tensors * 256);
  // The rotary table ([max_positions, head_dim] f32) is the other model buffer.
  EXPECT_GE(p.stages[0].other_bytes, size_t{40960} * 128 * 4);
  EXPECT_EQ(p.checkpoint_bytes, 0u);  // config only: nothing read
}

TEST(Planner, TensorParallelSplitsTheWeights) {
  Plan one = make_plan(inputs(kQwen8b, 141 * kGiB, 1));
  Plan two = make_plan(inputs(kQwen8b, 141 * kGiB, 2));
  // Everything is split except the norms (a few KB).
  EXPECT_NEAR(static_cast<double>(two.stages[0].weight_bytes), one.stages[0].weight_bytes / 2.0, 2e6);
}

TEST(Planner, KvBytesFollowGqaTpAndDtype) {
  // 2 (K, V) x 36 layers x 8 KV heads x 128 x 2 bytes.
  const size_t bf16 = 2 * 36 * 8 * 128 * 2;
  Plan p = make_plan(inputs(kQwen8b, 141 * kGiB));
  EXPECT_EQ(p.stages[0].cache.kv_bytes_per_token(16), bf16);
  EXPECT_EQ(p.stages[0].cache.kv_bytes_per_block, bf16 * 16);
  PlanInputs f = inputs(kQwen8b, 141 * kGiB);
  f.kv_cache_dtype = "fp8";
  EXPECT_EQ(make_plan(f).stages[0].cache.kv_bytes_per_token(16), bf16 / 2);
  EXPECT_EQ(make_plan(inputs(kQwen8b, 141 * kGiB, 4)).stages[0].cache.kv_bytes_per_token(16), bf16 / 4);
  // TP 16 > 8 KV heads: each rank keeps the one head its query heads read.
  EXPECT_EQ(make_plan(inputs(kQwen8b, 141 * kGiB, 16)).stages[0].cache.kv_bytes_per_token(16), bf16 / 8);
}

TEST(Planner, PipelineStagesSplitTheLayers) {
  PlanInputs in = inputs(kQwen8b, 80 * kGiB);
  in.pipeline_parallel_size = 2;
  Plan p = make_plan(in);
  ASSERT_EQ(p.stages.size(), 2u);
  EXPECT_EQ(p.stages[0].layers.size() + p.stages[1].layers.size(), 36);
  EXPECT_EQ(p.stages[0].cache.paged_layers, p.stages[0].layers.size());
  // Stage 0 has the embedding, stage 1 the lm_head: the same size here (untied, same shape).
  EXPECT_EQ(p.stages[0].weight_bytes + p.stages[1].weight_bytes,
            make_plan(inputs(kQwen8b, 80 * kGiB)).stages[0].weight_bytes);
}

TEST(KvBudget, BlocksFromMemoryCappedBySequencesAndCpu) {
  CacheFootprint fp;
  fp.kv_bytes_per_block = 1 << 20;
  KvBudgetInputs in;
  in.total = 100ull << 20;
  in.used = 20ull << 20;
  in.reserved = 10ull << 20;
  in.utilization = 0.9;
  in.block_size = 16;
  in.max_num_seqs = 1000;
  in.max_model_len = 4096;
  KvBudget b = plan_kv_budget(in, fp);
  EXPECT_EQ(b.num_blocks, 60);  // 90 - 20 - 10 MiB
  EXPECT_FALSE(b.capped_by_seqs);
  in.max_num_seqs = 2;
  in.max_model_len = 100;  // 200 tokens: 13 blocks
  b = plan_kv_budget(in, fp);
  EXPECT_EQ(b.num_blocks, 13);
  EXPECT_TRUE(b.capped_by_seqs);
  in.max_num_seqs = 1000;
  in.max_model_len = 4096;
  fp.state_bytes_per_seq = 10 << 10;  // 1000 slots x 10 KiB come off the top
  b = plan_kv_budget(in, fp);
  EXPECT_EQ(b.state_bytes, 1000u * (10 << 10));
  EXPECT_EQ(b.num_blocks, 50);
  in.cpu = true;
  in.total = 100ull << 30;
  in.used = 0;
  in.reserved = 0;
  fp.state_bytes_per_seq = 0;
  EXPECT_EQ(plan_kv_budget(in, fp).budget, kCpuKvCacheCap);
}

TEST(KvBudget, StateSlotsComeOffTheTopAndMaxNumSeqsIsClampedWhenTheyDoNotFit) {
  CacheFootprint fp;
  fp.kv_bytes_per_block = 1 << 20;
  fp.state_bytes_per_seq = 1 << 20;  // 1 MiB of linear-attention state per sequence
  fp.state_layers = 3;
  KvBudgetInputs in;
  in.total = 1000ull << 20;
  in.utilization = 1.0;
  in.block_size = 16;
  in.max_num_seqs = 100;
  in.max_model_len = 160;  // 10 blocks per sequence
  in.extra_state_slots = 25;
  KvBudget b = plan_kv_budget(in, fp);
  EXPECT_EQ(b.num_state_slots, 125);
  EXPECT_EQ(b.max_num_seqs, 100);
  EXPECT_EQ(b.state_bytes, 125u << 20);
  EXPECT_EQ(b.num_blocks, 875);
  // 60 MiB: one sequence's KV (10 blocks) leaves 50 slots; sequences get all but the
  // checkpoints' one.
  in.total = 60ull << 20;
  b = plan_kv_budget(in, fp);
  EXPECT_EQ(b.num_state_slots, 50);
  EXPECT_EQ(b.max_num_seqs, 49);
  EXPECT_EQ(b.num_blocks, 10);
  in.extra_state_slots = 0;
  b = plan_kv_budget(in, fp);
  EXPECT_EQ(b.max_num_seqs, 50);
  // --num-gpu-blocks-override: every slot asked for.
  in.num_blocks_override = 7;
  b = plan_kv_budget(in, fp);
  EXPECT_EQ(b.num_state_slots, 100);
  EXPECT_EQ(b.num_blocks, 7);
  // No paged layer on this rank: blocks cost nothing here; 60 slots fit.
  in.num_blocks_override = 0;
  fp.kv_bytes_per_block = 0;
  b = plan_kv_budget(in, fp);
  EXPECT_EQ(b.max_num_seqs, 60);
  EXPECT_EQ(b.num_blocks, 600);  // max_num_seqs x max_model_len
}

TEST(KvBudget, MambaCacheDtypeFlags) {
  StateDtypes d = parse_mamba_cache_dtypes("auto", "auto", DType::kBF16);
  EXPECT_EQ(d.conv, DType::kBF16);
  EXPECT_EQ(d.ssm, DType::kF32) << "the recurrent state is float32 by default";
  d = parse_mamba_cache_dtypes("auto", "bfloat16", DType::kBF16);
  EXPECT_EQ(d.ssm, DType::kBF16);
  d = parse_mamba_cache_dtypes("float32", "auto", DType::kBF16);
  EXPECT_EQ(d.conv, DType::kF32);
  EXPECT_EQ(d.ssm, DType::kF32);
  d = parse_mamba_cache_dtypes("bfloat16", "auto", DType::kF32);
  EXPECT_EQ(d.ssm, DType::kBF16) << "auto follows --mamba-cache-dtype when it is set";
  EXPECT_THROW(parse_mamba_cache_dtypes("fp8", "auto", DType::kBF16), Error);
  EXPECT_THROW(parse_mamba_cache_dtypes("auto", "float16", DType::kBF16), Error);
  EXPECT_EQ(checkpoint_state_slots(256, true), 64);
  EXPECT_EQ(checkpoint_state_slots(2, true), 1);
  EXPECT_EQ(checkpoint_state_slots(256, false), 0);
}

// Qwen3.5-35B-A3B: 30 Gated DeltaNet layers of 16 key / 32 value heads of 128, conv kernel 4.
// Per sequence: a conv state [3, 8192] in bf16 and a recurrent state [32, 128, 128] in f32
// per layer; max_num_seqs slots plus a quarter for prefix-cache checkpoints.
TEST(Planner, HybridModelsReserveStateSlotsAndLowerMaxNumSeqsWhenTheyDoNotFit) {
  const std::string dir = std::string(TESSERA_SOURCE_DIR) + "/configs/qwen3.5-35b-a3b";
  PlanInputs in = inputs(dir, 141 * kGiB);
  in.max_model_len = 32768;
  Plan p = make_plan(in);
  const size_t per_layer = 3 * 8192 * 2 + 32 * 128 * 128 * 4;
  EXPECT_EQ(p.stages[0].cache.state_layers, 30);
  EXPECT_EQ(p.stages[0].cache.paged_layers, 10);
  EXPECT_EQ(p.stages[0].cache.state_bytes_per_seq, 30 * per_layer);
  EXPECT_EQ(p.num_state_slots, 256 + 64);
  EXPECT_EQ(p.max_num_seqs, 256);
  EXPECT_EQ(p.stages[0].kv.state_bytes, 320 * 30 * per_layer);
  EXPECT_TRUE(p.fits) << p.verdict;
  // The recurrent state in bf16 halves most of it.
  in.mamba_ssm_cache_dtype = "bfloat16";
  EXPECT_EQ(make_plan(in).stages[0].cache.state_bytes_per_seq, 30 * (3 * 8192 * 2 + 32 * 128 * 128 * 2));
  in.mamba_ssm_cache_dtype = "auto";
  // 4096 sequences' states (about 250 GiB) cannot fit: fewer, and the report says so.
  in.max_num_seqs = 4096;
  p = make_plan(in);
  EXPECT_TRUE(p.fits) << p.verdict;
  EXPECT_LT(p.max_num_seqs, 4096);
  EXPECT_GT(p.max_num_seqs, 256);
  EXPECT_NE(render_text(p).find("--max-num-seqs 4096 is lowered to"), std::string::npos) << render_text(p);
  in.enable_prefix_caching = false;
  EXPECT_EQ(make_plan(inputs(dir, 141 * kGiB)).num_state_slots, 320);
  in.max_num_seqs = 8;
  EXPECT_EQ(make_plan(in).num_state_slots, 8) << "no checkpoint slots without prefix caching";
}

// --speculative-config method mtp: the plan counts the MTP layer's weights and its attention's own
// paged KV (one more paged layer per block); a model family without an MTP layer is refused.
TEST(Planner, MtpCountsItsLayerAndItsKv) {
  PlanInputs in = inputs(std::string(TESSERA_SOURCE_DIR) + "/configs/qwen3.5-35b-a3b", 141 * kGiB);
  const Plan base = make_plan(in);
  in.mtp = true;
  in.state_slots_per_seq = 3;
  const Plan mtp = make_plan(in);
  EXPECT_EQ(base.stages[0].cache.paged_layers, 10);
  EXPECT_EQ(mtp.stages[0].cache.paged_layers, 11);
  EXPECT_EQ(mtp.stages[0].cache.kv_bytes_per_block * 10, base.stages[0].cache.kv_bytes_per_block * 11);
  // fc [H, 2H] alone is 2 x 2048^2 bf16 parameters; the layer's 256 experts far more.
  EXPECT_GT(mtp.stages[0].weight_bytes, base.stages[0].weight_bytes + size_t{2} * 2048 * 2048 * 2);
  EXPECT_LT(mtp.num_blocks, base.num_blocks);
  PlanInputs dense = inputs(kQwen8b, 141 * kGiB);
  dense.mtp = true;
  try {
    (void)make_plan(dense);
    FAIL() << "planned MTP for a model without an MTP layer";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ngram"), std::string::npos) << e.what();
  }
}

// MTP under TP and PP, per rank as serve places it: at TP 2 the layer's attention and experts are
// split as the other layers' (its share per rank about half of TP 1's; fc is replicated), its KV
// one more paged layer of the rank's KV heads; at PP 2 the layer and its KV are on the last stage
// only, with a copy of the embedding there (the first stage's stays where it is).
TEST(Planner, MtpUnderTensorAndPipelineParallelCountsItsShareOnEachRank) {
  const std::string dir = std::string(TESSERA_SOURCE_DIR) + "/configs/qwen3.5-35b-a3b";
  auto plan = [&](int tp, int pp, bool mtp) {
    PlanInputs in = inputs(dir, 141 * kGiB, tp);
    in.pipeline_parallel_size = pp;
    in.max_model_len = 4096;  // (short steps keep the planning quick; the weights do not depend on them)
    in.max_num_batched_tokens = 2048;
    in.max_num_seqs = 16;
    in.mtp = mtp;
    in.state_slots_per_seq = mtp ? 3 : 1;
    return make_plan(in);
  };
  const int64_t H = 2048, V = 248320;
  const size_t fc = static_cast<size_t>(2 * H * H) * 2;  // bf16, replicated
  const Plan b1 = plan(1, 1, false), m1 = plan(1, 1, true);
  const size_t layer1 = m1.stages[0].weight_bytes - b1.stages[0].weight_bytes;
  const Plan b2 = plan(2, 1, false), m2 = plan(2, 1, true);
  const size_t layer2 = m2.stages[0].weight_bytes - b2.stages[0].weight_bytes;
  EXPECT_NEAR(static_cast<double>(layer2 - fc), static_cast<double>(layer1 - fc) / 2, 0.01 * (layer1 - fc));
  EXPECT_EQ(m2.stages[0].cache.paged_layers, 11);
  EXPECT_EQ(m2.stages[0].cache.kv_bytes_per_block * 2, m1.stages[0].cache.kv_bytes_per_block);

  const Plan bp = plan(1, 2, false), mp = plan(1, 2, true);
  ASSERT_EQ(mp.stages.size(), 2u);
  EXPECT_EQ(mp.stages[0].weight_bytes, bp.stages[0].weight_bytes);
  EXPECT_EQ(mp.stages[0].cache.paged_layers, bp.stages[0].cache.paged_layers);
  EXPECT_EQ(mp.stages[1].cache.paged_layers, bp.stages[1].cache.paged_layers + 1);
  const size_t embedding = static_cast<size_t>(V * H) * 2;
  EXPECT_EQ(mp.stages[1].weight_bytes - bp.stages[1].weight_bytes, layer1 + embedding);
  // TP 2 x PP 2: the last stage's share of both.
  const Plan bb = plan(2, 2, false), mb = plan(2, 2, true);
  EXPECT_EQ(mb.stages[0].weight_bytes, bb.stages[0].weight_bytes);
  EXPECT_EQ(mb.stages[1].weight_bytes - bb.stages[1].weight_bytes, layer2 + embedding / 2);
}

TEST(Planner, TooLongContextNamesMaxModelLenWithAFittingValue) {
  PlanInputs in = inputs(kQwen8b, 32607ull << 20);  // an RTX 5090
  in.max_model_len = 40960;
  in.max_num_seqs = 8;
  Plan p = make_plan(in);
  ASSERT_TRUE(p.fits);  // one sequence fits, eight do not
  EXPECT_FALSE(p.full_concurrency);
  EXPECT_NE(p.verdict.find("--max-model-len 40960 needs"), std::string::npos) << p.verdict;
  // The advice's length must itself give the eight sequences.
  auto pos = p.verdict.find("lower it to ");
  ASSERT_NE(pos, std::string::npos) << p.verdict;
  PlanInputs lower = in;
  lower.max_model_len = std::stoi(p.verdict.substr(pos + 12));
  EXPECT_LT(lower.max_model_len, 40960);
  EXPECT_TRUE(make_plan(lower).full_concurrency) << make_plan(lower).verdict;
  EXPECT_NE(p.verdict.find("--kv-cache-dtype fp8"), std::string::npos) << p.verdict;
}

TEST(Planner, ModelTooLargeNamesTensorParallelSize) {
  PlanInputs in = inputs(kQwen8b, 8ull << 30);  // 16.4 GB of bf16 weights on 8 GiB
  in.max_model_len = 4096;
  Plan p = make_plan(in);
  EXPECT_FALSE(p.fits);
  EXPECT_EQ(p.flag_to_change, "--tensor-parallel-size");
  auto pos = p.verdict.find("--tensor-parallel-size ");
  ASSERT_NE(pos, std::string::npos) << p.verdict;
  PlanInputs more = in;
  more.tensor_parallel_size = std::stoi(p.verdict.substr(pos + 23));
  EXPECT_TRUE(make_plan(more).fits);
  // And --suggest lists only layouts that fit, the smallest first.
  auto layouts = suggest_layouts(in);
  ASSERT_FALSE(layouts.empty());
  for (const auto& l : layouts) EXPECT_TRUE(l.fits);
  EXPECT_EQ(layouts.front().in.tensor_parallel_size * layouts.front().in.pipeline_parallel_size,
            more.tensor_parallel_size);
}

// On the CPU backend the ranks of a node share its memory: TP 4 on one 23.5 GiB host gives each rank a
// quarter of it. Qwen3-8B in float32 (about 30.5 GiB of weights) fits that host at no TP, and the advice
// offers no layout whose ranks together would need more than the host has.
TEST(Planner, CpuRanksOnOneHostShareItsMemory) {
  PlanInputs in = inputs(kQwen8b, static_cast<size_t>(23.5 * kGiB));
  in.target.device = DeviceType::kCPU;
  in.target.baseline_used = size_t{2} << 30;
  in.target.gpus_per_node = 0;
  in.max_model_len = 4096;
  in.max_num_seqs = 4;
  EXPECT_EQ(ranks_sharing_memory(in), 1);
  EXPECT_EQ(rank_memory_bytes(in), in.target.memory_bytes);
  PlanInputs four = in;
  four.tensor_parallel_size = 4;
  EXPECT_EQ(ranks_sharing_memory(four), 4);
  EXPECT_EQ(rank_memory_bytes(four), in.target.memory_bytes / 4);
  const Plan p4 = make_plan(four);
  // Every rank's weights, runtime share and cache fit in its quarter; all four together fit the host.
  for (const StagePlan& s : p4.stages) EXPECT_LE(s.kv.usable, rank_memory_bytes(four));
  EXPECT_FALSE(p4.fits) << p4.verdict;
  EXPECT_NE(render_text(p4).find("4 ranks per node"), std::string::npos) << render_text(p4);
  const Plan p1 = make_plan(in);
  EXPECT_FALSE(p1.fits);
  EXPECT_EQ(p1.verdict.find("use --tensor-parallel-size"), std::string::npos) << p1.verdict;
  // Two nodes of the same size: TP 4 puts two ranks on each.
  PlanInputs two_nodes = four;
  two_nodes.target.nodes = 2;
  EXPECT_EQ(ranks_sharing_memory(two_nodes), 2);
  // GPUs are not shared.
  PlanInputs gpu = four;
  gpu.target.device = DeviceType::kCUDA;
  EXPECT_EQ(rank_memory_bytes(gpu), gpu.target.memory_bytes);
}

TEST(Planner, GpuTableAndSizes) {
  ASSERT_TRUE(find_gpu("H200"));
  EXPECT_GT(find_gpu("rtx-5090d")->memory_bytes, 31 * kGiB);
  EXPECT_TRUE(find_gpu("gb10")->unified);
  EXPECT_EQ(find_gpu("dgx-spark")->name, "gb10");
  EXPECT_DOUBLE_EQ(find_gpu("gb10")->bandwidth, 273e9);
  EXPECT_DOUBLE_EQ(find_gpu("h200")->bandwidth, 4.8e12);
  EXPECT_DOUBLE_EQ(find_gpu("rtx5090d")->bandwidth, 1.792e12);
  for (const auto& g : gpu_table()) EXPECT_GT(g.bandwidth, 0) << g.name;
  EXPECT_FALSE(find_gpu("voodoo2"));
  EXPECT_EQ(parse_memory_size("32GiB"), 32 * kGiB);
  EXPECT_EQ(parse_memory_size("24 GB"), 24000000000ull);
  EXPECT_EQ(parse_memory_size("512M"), size_t{512} << 20);
  EXPECT_THROW(parse_memory_size("lots"), Error);
  EXPECT_THROW(parse_memory_size("3 parsecs"), Error);
}

// What the engine allocates from the same memory: the engine runs on a meta backend that
// reports `total` bytes, with the weights loaded on it, and must get the planned block count.
// The seeds' model, Qwen3.5-122B-A10B-FP8 (configs/qwen3.5-122b-a10b-fp8): the projections and
// experts are FP8 (one byte per weight plus an f32 scale per 128 x 128 block), so a rank holds
// about half the bf16 release's bytes, and the report says the weights are FP8.
const std::string kFlagshipFp8 = std::string(TESSERA_SOURCE_DIR) + "/configs/qwen3.5-122b-a10b-fp8";

TEST(Planner, Fp8CheckpointConfigCountsItsProjectionsAtOneByte) {
  PlanInputs in = inputs(kFlagshipFp8, 32607ull << 20, 8);  // seed 000: TP 8 over RTX 5090 D
  in.target.baseline_used = std::nullopt;
  in.target.nodes = 2;
  in.target.gpus_per_node = 4;
  in.max_model_len = 262144;
  in.max_num_seqs = 8;
  in.gpu_memory_utilization = 0.85;
  in.kv_cache_dtype = "fp8";
  Plan p = make_plan(in);
  const StagePlan& s = p.stages[0];
  PlanInputs bf16 = in;
  bf16.model_dir = std::string(TESSERA_SOURCE_DIR) + "/configs/qwen3.5-122b-a10b";
  bf16.target.memory_bytes = size_t{1} << 40;  // only its weights are compared
  bf16.max_model_len = 4096;
  const size_t wide = make_plan(bf16).stages[0].weight_bytes;
  EXPECT_GT(s.fp8_weight_bytes, s.weight_bytes * 9 / 10) << "experts and projections are FP8";
  EXPECT_LT(s.weight_bytes, wide * 55 / 100);
  EXPECT_GT(s.weight_bytes, wide * 45 / 100);
  // 12 full-attention layers, 2 KV heads replicated over TP 8 (one per rank) of 256, fp8.
  EXPECT_EQ(s.cache.kv_bytes_per_token(in.block_size), 12u * 2 * 1 * 256 * 1);
  EXPECT_EQ(s.cache.state_layers, 36);
  EXPECT_EQ(p.num_state_slots, 8 + 2);
  EXPECT_NE(render_text(p).find("weights in fp8_e4m3"), std::string::npos) << render_text(p);
}

// A hybrid model's state slots come off the cache first, so at a long --max-model-len the lever
// is --max-num-seqs: the advice names the largest value whose sequences all fit, re-planned,
// and never a --max-model-len that the re-plan does not confirm.
TEST(Planner, HybridAdviceLowersMaxNumSeqsAndEveryOfferedLengthFits) {
  PlanInputs in = inputs(kFlagshipFp8, 143771ull << 20);  // the flagship on one H200
  in.target.baseline_used = std::nullopt;
  in.max_model_len = 262144;
  in.gpu_memory_utilization = 0.95;
  in.kv_cache_dtype = "fp8";
  Plan p = make_plan(in);
  ASSERT_TRUE(p.fits) << p.verdict;
  ASSERT_FALSE(p.full_concurrency);
  auto pos = p.verdict.find("lower --max-num-seqs to ");
  ASSERT_NE(pos, std::string::npos) << p.verdict;
  const int seqs = std::stoi(p.verdict.substr(pos + 24));
  PlanInputs fewer = in;
  fewer.max_num_seqs = seqs;
  EXPECT_TRUE(make_plan(fewer).full_concurrency) << make_plan(fewer).verdict;
  fewer.max_num_seqs = seqs + 1;
  EXPECT_FALSE(make_plan(fewer).full_concurrency) << "the largest such --max-num-seqs";
  if (auto l = p.verdict.find("lower it to "); l != std::string::npos) {
    PlanInputs shorter = in;
    shorter.max_model_len = std::stoi(p.verdict.substr(l + 12));
    EXPECT_TRUE(make_plan(shorter).full_concurrency) << p.verdict;
  }
}

// The advice never names more GPUs than the target has (seed 003: two GB10, one GPU each).
TEST(Planner, AdviceStaysWithinTheTargetsGpus) {
  PlanInputs in = inputs(kFlagshipFp8, size_t{128} * 1000 * 1000 * 1000, 2);
  in.target.baseline_used = std::nullopt;
  in.target.unified = true;
  in.target.nodes = 2;
  in.target.gpus_per_node = 1;
  in.max_model_len = 2048;
  in.gpu_memory_utilization = 0.60;
  in.enforce_eager = true;
  Plan p = make_plan(in);
  ASSERT_TRUE(p.fits) << p.verdict;
  EXPECT_FALSE(p.full_concurrency);
  EXPECT_EQ(p.verdict.find("--tensor-parallel-size 4"), std::string::npos) << p.verdict;
  EXPECT_NE(p.verdict.find("lower --max-num-seqs to "), std::string::npos) << p.verdict;
}

TEST(Planner, AgreesWithTheEngineOnTheSameMemory) {
  const std::string dir = std::string(TESSERA_SOURCE_DIR) + "/tests/fixtures/models/qwen3_gqa4_hd32";
  const size_t total = 300ull << 20;  // 270 MiB usable: 256 MiB of activation arena, ~14 MiB of cache
  PlanInputs in = inputs(dir, total);
  in.target.baseline_used = 0;
  in.max_model_len = 512;
  in.max_num_seqs = 64;
  in.enforce_eager = true;
  Plan p = make_plan(in);
  ASSERT_TRUE(p.fits) << p.verdict;
  ASSERT_FALSE(p.stages[0].kv.capped_by_seqs);

  MetaBackend be({DeviceType::kCUDA, DType::kBF16, 256, total});
  ModelConfig config = load_model_config(dir);
  ModelOptions mo;
  mo.max_positions = 512;
  auto model = create_model(config, mo, be);
  model->weights().load_dummy(be, 0);
  EngineConfig ec;
  ec.scheduler.max_model_len = 512;
  ec.scheduler.max_num_seqs = 64;
  ec.scheduler.max_num_batched_tokens = 8192;
  ec.enforce_eager = true;
  ec.reserved_bytes = p.stages[0].activation_bytes;
  LLMEngine engine(std::move(model), be, ec);
  EXPECT_EQ(engine.num_blocks(), p.num_blocks);
  EXPECT_EQ(engine.kv_capacity_tokens(), p.kv_tokens);
}

}  // namespace
}  // namespace tessera::plan

namespace tessera::plan {
namespace {

// The decode ceiling's arithmetic by hand: a rank that holds 1,000 bytes every token reads and
// 8,000 bytes of routed experts (E = 8, k = 2), 10 KV bytes per context token and a 50-byte
// state per sequence, at 100 tokens of context.
TEST(DecodeCeiling, BytesPerStepByHand) {
  DecodeReads r;
  r.dense_bytes = 1000;
  r.expert_bytes = 8000;
  r.kv_bytes_per_token = 10;
  r.state_bytes_per_seq = 50;
  // One token: 2 of 8 experts, so a quarter of the experts' bytes, and one sequence's KV + state.
  EXPECT_DOUBLE_EQ(decode_step_bytes(r, 8, 2, 1, 100), 1000 + 2000 + 1050);
  // Four tokens reach 8 x (1 - (6/8)^4) = 5.46875 distinct experts on average: 68.359375%.
  EXPECT_DOUBLE_EQ(decode_step_bytes(r, 8, 2, 4, 100), 1000 + 5468.75 + 4 * 1050);
  // Many tokens reach every expert.
  EXPECT_NEAR(decode_step_bytes(r, 8, 2, 1000, 0), 1000 + 8000 + 1000 * 50, 1e-6);
  // A dense model (E = 0) reads no expert bytes.
  EXPECT_DOUBLE_EQ(decode_step_bytes(r, 0, 0, 1, 100), 1000 + 1050);
  // Two pipeline stages of that rank one after another at 10,000 B/s.
  const DecodeCeiling one = decode_ceiling({r, r}, 8, 2, 1, 100, 1e4);
  ASSERT_EQ(one.stage_bytes.size(), 2u);
  EXPECT_DOUBLE_EQ(one.step_seconds, 2 * 4050 / 1e4);
  EXPECT_DOUBLE_EQ(one.steps_per_second, 1e4 / 8100);
  EXPECT_DOUBLE_EQ(one.tokens_per_second, 1e4 / 8100);
  const DecodeCeiling four = decode_ceiling({r, r}, 8, 2, 4, 100, 1e4);
  EXPECT_DOUBLE_EQ(four.step_seconds, 2 * 10668.75 / 1e4);
  EXPECT_DOUBLE_EQ(four.tokens_per_second, 4 * 1e4 / 21337.5);
  EXPECT_THROW(decode_ceiling({r}, 8, 2, 1, 100, 0), Error);
}

// In a plan: a dense model reads all its weights but the gathered embedding table; a MoE model's
// reads split into the dense part and the routed experts, which grow with the batch.
TEST(DecodeCeiling, PlanReadsWeightsKvAndTheActiveExperts) {
  PlanInputs in = inputs(kQwen8b, 141 * kGiB);
  in.max_model_len = 4096;
  in.max_num_seqs = 4;
  in.target.bandwidth = 4.8e12;
  const Plan p = make_plan(in);
  const StagePlan& s = p.stages[0];
  const size_t embed = size_t{151936} * 4096 * 2;  // untied: the lm_head is read, the table gathered
  EXPECT_EQ(s.reads.expert_bytes, 0u);
  EXPECT_EQ(s.reads.dense_bytes, s.weight_bytes - embed);
  EXPECT_EQ(s.reads.kv_bytes_per_token, s.cache.kv_bytes_per_token(in.block_size));
  ASSERT_TRUE(p.ceiling_one && p.ceiling_batch);
  const double b1 = static_cast<double>(s.weight_bytes - embed) + 4096.0 * s.reads.kv_bytes_per_token;
  EXPECT_DOUBLE_EQ(p.ceiling_one->stage_bytes[0], b1);
  EXPECT_DOUBLE_EQ(p.ceiling_one->tokens_per_second, 4.8e12 / b1);
  EXPECT_EQ(p.ceiling_batch->batch, 4);
  EXPECT_NE(render_text(p).find("ceiling from memory bandwidth alone (4.80 TB/s per GPU"), std::string::npos)
      << render_text(p);

  PlanInputs m = inputs(kFlagshipFp8, 141 * kGiB);
  m.max_model_len = 2048;
  m.max_num_seqs = 8;
  m.target.bandwidth = 4.8e12;
  const Plan q = make_plan(m);
  const DecodeReads& r = q.stages[0].reads;
  EXPECT_GT(r.expert_bytes, q.stages[0].weight_bytes * 8 / 10) << "the routed experts are most of the model";
  EXPECT_GT(r.dense_bytes, 0u);
  EXPECT_DOUBLE_EQ(q.ceiling_one->stage_bytes[0], decode_step_bytes(r, 256, 8, 1, 2048));
  EXPECT_LT(q.ceiling_one->stage_bytes[0], 0.2 * q.stages[0].weight_bytes) << "8 + 1 of 256 experts per token";
  EXPECT_GT(q.ceiling_batch->tokens_per_second, q.ceiling_one->tokens_per_second);
  m.target.bandwidth = 0;
  EXPECT_FALSE(make_plan(m).ceiling_one.has_value()) << "no bandwidth, no ceiling";
}

// GB10: the utilization that leaves the OS 8 GiB of the 128 GB, and the lowest that fits; an ask
// above the highest or below the lowest does not fit and the verdict names the number.
TEST(Planner, UnifiedMemorySaysWhichUtilizationFits) {
  const GpuSpec g = *find_gpu("dgx-spark");
  PlanInputs in = inputs(kFlagshipFp8, g.memory_bytes, 2);
  in.target.baseline_used = std::nullopt;
  in.target.unified = true;
  in.target.bandwidth = g.bandwidth;
  in.target.nodes = 2;
  in.target.gpus_per_node = 1;
  in.max_model_len = 2048;
  const Plan p = make_plan(in);
  EXPECT_DOUBLE_EQ(p.max_utilization, 0.93);  // (128e9 - 8 GiB) / 128e9 = 0.9329
  EXPECT_TRUE(p.fits) << p.verdict;
  ASSERT_GT(p.min_utilization, 0.0);
  EXPECT_LT(p.min_utilization, 0.9);
  EXPECT_NE(render_text(p).find(fmt::format("--gpu-memory-utilization {:.2f} to 0.93 fits", p.min_utilization)),
            std::string::npos)
      << render_text(p);
  PlanInputs below = in;
  below.gpu_memory_utilization = p.min_utilization - 0.01;
  const Plan lo = make_plan(below);
  EXPECT_FALSE(lo.fits);
  EXPECT_NE(lo.verdict.find(fmt::format("--gpu-memory-utilization {:.2f} to 0.93 fits", p.min_utilization)),
            std::string::npos)
      << lo.verdict;
  PlanInputs over = in;
  over.gpu_memory_utilization = 0.95;
  const Plan hi = make_plan(over);
  EXPECT_FALSE(hi.fits);
  EXPECT_EQ(hi.flag_to_change, "--gpu-memory-utilization");
  EXPECT_NE(hi.verdict.find("use --gpu-memory-utilization 0.93"), std::string::npos) << hi.verdict;
  in.target.unified = false;
  EXPECT_EQ(make_plan(in).max_utilization, 0.0) << "only unified memory";
}

// The meta backend takes the scratch the backends' kernels take inside ops (backend/op_workspace.h),
// so the plan counts it: 8,192 batched tokens through Qwen3.5-35B-A3B's experts (k = 8, H = 2,048,
// I = 512) take 320 MiB of activations and down outputs.
TEST(MetaBackend, CountsTheMoeAndFp8Workspaces) {
  MetaBackend be({DeviceType::kCUDA, DType::kBF16, 256, size_t{80} << 30});
  const int64_t T = 8192, k = 8, H = 2048, I = 512, E = 256;
  Tensor x = be.alloc({T, H}, DType::kBF16), out = be.alloc({T, H}, DType::kBF16);
  Tensor gate_up = be.alloc({E, 2 * I, H}, DType::kBF16), down = be.alloc({E, H, I}, DType::kBF16);
  Tensor ids = be.alloc({T, k}, DType::kI32), w = be.alloc({T, k}, DType::kF32);
  be.reset_peak();
  be.moe_experts(x, gate_up, down, ids, w, 0, out);
  EXPECT_GE(be.scratch_peak(), size_t{320} << 20);
  const auto want = static_cast<size_t>(moe_experts_workspace_bytes(T, k, H, I, E));
  EXPECT_GE(be.scratch_peak(), want);
  EXPECT_LT(be.scratch_peak(), want + 256) << "the workspace, rounded to the arena's alignment";
  EXPECT_EQ(be.scratch_in_use(), 0u) << "the workspace is taken and given back within the op";

  be.reset_peak();
  Tensor wq = be.alloc({4096, 2048}, DType::kF8E4M3);
  Tensor sc = be.alloc({32, 16}, DType::kF32);
  Tensor y = be.alloc({T, 4096}, DType::kBF16);
  be.linear(x, wq.with_block_scale(sc), nullptr, y);
  EXPECT_GE(be.scratch_peak(), static_cast<size_t>(T * 2048));  // the quantised activations at least
  be.reset_peak();
  be.linear(x, be.alloc({4096, 2048}, DType::kBF16), nullptr, y);
  EXPECT_EQ(be.scratch_peak(), 0u) << "a bf16 linear takes none";
}

}  // namespace
}  // namespace tessera::plan
