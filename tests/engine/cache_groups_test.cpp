// Cache groups from per-layer specs, the sliding-window manager, and the coordinator over a
// synthetic two-group cache (full attention + a window of 8 tokens, 4 tokens a block, one pool):
// block accounting, freeing outside the window, prefix reuse, speculative rollback; and the
// engine's groups and sizing for a model whose layers are all windowed.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "engine/engine.h"
#include "engine/kv_cache_coordinator.h"
#include "engine/memory_plan.h"
#include "engine/scheduler.h"
#include "scheduler_util.h"

namespace tessera {
namespace {

constexpr int kBs = 4;      // tokens per block
constexpr int kWindow = 8;  // positions a windowed token sees, itself included

LayerCacheSpec paged(int window = 0) {
  LayerCacheSpec s;
  s.kind = CacheKind::kPagedKv;
  s.num_kv_heads = 2;
  s.head_dim = 8;
  s.sliding_window = window;
  return s;
}

LayerCacheSpec state() {
  LayerCacheSpec s;
  s.kind = CacheKind::kStateSlot;
  s.conv_state_shape = {3, 16};
  s.ssm_state_shape = {2, 4, 4};
  return s;
}

std::vector<CacheGroup> two_groups() {
  return {{{CacheGroupKind::kFullAttention, kBs, 0}, {0}}, {{CacheGroupKind::kSlidingWindow, kBs, kWindow}, {1}}};
}

Request request(const std::string& id, int len, int first = 1) {
  Request r;
  r.id = id;
  r.prompt.resize(static_cast<size_t>(len));
  std::iota(r.prompt.begin(), r.prompt.end(), first);
  return r;
}

int nulls(const std::vector<int32_t>& blocks) {
  return static_cast<int>(std::count(blocks.begin(), blocks.end(), kNullBlock));
}

// Allocates and "computes" r's uncomputed tokens in one step, as the scheduler and engine do.
void compute_all(KvCacheCoordinator& m, Request& r, const CacheHit& hit = {}) {
  ASSERT_TRUE(m.allocate(r, r.num_tokens() - r.num_computed_tokens - hit.num_tokens, hit));
  r.num_computed_tokens = r.num_tokens();
  m.commit_computed(r);
}

TEST(CacheGroups, LayersWithEqualSpecsShareAGroupStateLast) {
  const std::vector<LayerCacheSpec> layers{state(), paged(), paged(kWindow), paged(kWindow),
                                           state(), paged(), paged(16)};
  const auto groups = make_cache_groups(layers, kBs, /*window_groups=*/true);
  ASSERT_EQ(groups.size(), 4u);
  EXPECT_EQ(groups[0].spec, (CacheGroupSpec{CacheGroupKind::kFullAttention, kBs, 0}));
  EXPECT_EQ(groups[0].layers, (std::vector<int>{1, 5}));
  EXPECT_EQ(groups[1].spec, (CacheGroupSpec{CacheGroupKind::kSlidingWindow, kBs, kWindow}));
  EXPECT_EQ(groups[1].layers, (std::vector<int>{2, 3}));
  EXPECT_EQ(groups[2].spec.sliding_window, 16);
  EXPECT_EQ(groups[3].spec.kind, CacheGroupKind::kStateSlot);
  EXPECT_EQ(groups[3].layers, (std::vector<int>{0, 4}));
  EXPECT_EQ(describe_cache_groups(groups),
            "full attention (layers 1, 5), sliding window 8 (layers 2-3), sliding window 16 (layer 6), state slots "
            "(layers 0, 4)");
  // Without window groups, windowed layers are managed as full attention.
  const auto unified = make_cache_groups(layers, kBs, false);
  ASSERT_EQ(unified.size(), 2u);
  EXPECT_EQ(unified[0].layers, (std::vector<int>{1, 2, 3, 5, 6}));
  EXPECT_THROW(make_cache_groups({paged(-1)}, kBs, true), Error);
}

TEST(CacheGroups, TheEngineGivesEachKindGroupsOfOneSize) {
  // Every layer windowed, the whole model seen: one sliding-window group.
  auto g = engine_cache_groups({paged(kWindow), paged(kWindow)}, kBs, /*whole_model=*/true);
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].spec.kind, CacheGroupKind::kSlidingWindow);
  EXPECT_TRUE(cache_layer_groups(g, 2).empty()) << "one paged group: every layer reads the step's one table";
  // Only this pipeline stage's layers: another stage may hold full-attention layers.
  g = engine_cache_groups({paged(kWindow), paged(kWindow)}, kBs, false);
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].spec.kind, CacheGroupKind::kFullAttention);
  // Only linear-attention layers (a hybrid model cut to them, or such a pipeline stage): a layer-less
  // full-attention group before the state group, so the step still has its first paged group.
  for (bool whole : {true, false}) {
    g = engine_cache_groups({state(), state()}, kBs, whole);
    ASSERT_EQ(g.size(), 2u) << whole;
    EXPECT_EQ(g[0].spec.kind, CacheGroupKind::kFullAttention);
    EXPECT_TRUE(g[0].layers.empty());
    EXPECT_FALSE(g[1].spec.paged());
  }
  // Full and windowed layers mixed (Qwen2's max_window_layers): one layer of full attention, two
  // windowed: groups of one layer (the fewest of a kind; two is not under 1.25 x 1).
  const std::vector<LayerCacheSpec> qwen2{paged(), paged(kWindow), paged(kWindow)};
  g = engine_cache_groups(qwen2, kBs, true);
  ASSERT_EQ(g.size(), 3u);
  EXPECT_EQ(g[0].spec.kind, CacheGroupKind::kFullAttention);
  EXPECT_EQ(g[0].layers, (std::vector<int>{0}));
  EXPECT_EQ(g[1].spec.kind, CacheGroupKind::kSlidingWindow);
  EXPECT_EQ(g[1].layers, (std::vector<int>{1}));
  EXPECT_EQ(g[2].layers, (std::vector<int>{2}));
  EXPECT_EQ(cache_layer_groups(g, 3), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(kv_tensor_of_layers(qwen2, cache_layer_groups(g, 3)), (std::vector<int>{0, 0, 0}))
      << "the three groups' layers share one KV tensor";
  EXPECT_EQ(kv_tensor_of_layers(qwen2, {}), (std::vector<int>{0, 1, 2}));
  // Two full, six windowed (Gemma-style 1:3): groups of two; layer i of each group shares tensor i.
  std::vector<LayerCacheSpec> layers;
  for (int i = 0; i < 8; ++i) layers.push_back(paged(i % 4 == 0 ? 0 : kWindow));
  g = engine_cache_groups(layers, kBs, true);
  ASSERT_EQ(g.size(), 4u);
  EXPECT_EQ(g[0].layers, (std::vector<int>{0, 4}));
  EXPECT_EQ(g[1].layers, (std::vector<int>{1, 2}));
  EXPECT_EQ(g[3].layers, (std::vector<int>{6, 7}));
  const auto lg = cache_layer_groups(g, 8);
  EXPECT_EQ(lg, (std::vector<int>{0, 1, 1, 2, 0, 2, 3, 3}));
  EXPECT_EQ(kv_tensor_of_layers(layers, lg), (std::vector<int>{0, 0, 1, 0, 1, 1, 0, 1}));
  EXPECT_EQ(num_paged_groups(lg), 4);
  // Five full, six windowed: 6 < 1.25 x 5, so groups of six (the full group one layer short).
  layers.assign(5, paged());
  for (int i = 0; i < 6; ++i) layers.push_back(paged(kWindow));
  g = engine_cache_groups(layers, kBs, true);
  ASSERT_EQ(g.size(), 2u);
  EXPECT_EQ(g[0].layers.size(), 5u);
  EXPECT_EQ(g[1].layers.size(), 6u);
  // The cost of a block: one layer's page a tensor.
  const size_t page = 2ull * kBs * 2 * 8 * 4;  // K and V, 2 heads of 8, f32
  EXPECT_EQ(cache_footprint(qwen2, DType::kF32, kBs).kv_bytes_per_block, 3 * page);
  EXPECT_EQ(cache_footprint(qwen2, DType::kF32, kBs, DType::kF32, DType::kF32, {0, 1, 2}).kv_bytes_per_block, page);
  // Pages that differ cannot share tensors: one full-attention group, as without the hybrid manager.
  LayerCacheSpec wide = paged(kWindow);
  wide.head_dim = 16;
  g = engine_cache_groups({paged(), wide, state()}, kBs, true);
  ASSERT_EQ(g.size(), 2u);
  EXPECT_EQ(g[0].spec.kind, CacheGroupKind::kFullAttention);
  EXPECT_EQ(g[0].layers, (std::vector<int>{0, 1}));
  EXPECT_EQ(g[1].spec.kind, CacheGroupKind::kStateSlot);
  g = engine_cache_groups(qwen2, kBs, true, /*hybrid=*/false);
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].layers, (std::vector<int>{0, 1, 2}));
  // Every model before sliding windows: its groups are unchanged.
  g = engine_cache_groups({paged(), paged()}, kBs, true);
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].spec.kind, CacheGroupKind::kFullAttention);
}

TEST(CacheGroups, CapacityCountsTheBlocksOneSequenceHolds) {
  // Unchanged for full attention: tokens / max_model_len.
  const std::vector<CacheGroup> full{{{CacheGroupKind::kFullAttention, kBs, 0}, {0}}};
  KvCapacity c = kv_capacity(full, 40, 64, 8);
  EXPECT_EQ(c.tokens, 160);
  EXPECT_DOUBLE_EQ(c.max_concurrency, 2.5);
  // Full + window: 16 + 5 blocks a 64-token sequence; tokens counted per group.
  c = kv_capacity(two_groups(), 42, 64, 8);
  EXPECT_EQ(c.tokens, 21 * kBs);
  EXPECT_DOUBLE_EQ(c.max_concurrency, 2.0);
  EXPECT_EQ(max_blocks_per_seq(two_groups(), 64, 8), 21);
}

TEST(SlidingWindowManager, AHitNeedsOnlyTheBlocksOfTheWindowBeforeIt) {
  KvBlockPool pool(16, /*prefix=*/true);
  SlidingWindowManager m(1, {CacheGroupKind::kSlidingWindow, kBs, kWindow}, pool);
  // The token at position p sees [p - 7, p]: from block (p - 7) / 4 on.
  EXPECT_EQ(m.first_needed_block(0), 0);
  EXPECT_EQ(m.first_needed_block(8), 0);
  EXPECT_EQ(m.first_needed_block(11), 1);
  EXPECT_EQ(m.first_needed_block(20), 3);
  const std::vector<uint64_t> hashes{101, 102, 103, 104, 105};
  // Blocks 0-2 cached in this group, 3-4 not (evicted): a hit can end at block 3 (it needs
  // blocks 1 and 2), not later.
  for (int b = 0; b < 3; ++b) pool.register_full_block(b, hashes[static_cast<size_t>(b)], 1);
  EXPECT_EQ(m.longest_hit(hashes, 5), 3);
  EXPECT_EQ(m.hit_blocks(hashes, 3), (std::vector<int32_t>{kNullBlock, 1, 2}));
  // Only blocks 3 and 4 cached: enough for a hit of all five, not for one of four (it needs block 2).
  KvBlockPool pool2(16, true);
  SlidingWindowManager m2(1, {CacheGroupKind::kSlidingWindow, kBs, kWindow}, pool2);
  pool2.register_full_block(7, hashes[3], 1);
  pool2.register_full_block(9, hashes[4], 1);
  EXPECT_EQ(m2.longest_hit(hashes, 5), 5);
  EXPECT_EQ(m2.hit_blocks(hashes, 5), (std::vector<int32_t>{kNullBlock, kNullBlock, kNullBlock, 7, 9}));
  EXPECT_EQ(m2.longest_hit(hashes, 4), 0);
  // The same hashes cached by group 0 are not this group's.
  KvBlockPool pool3(16, true);
  SlidingWindowManager m3(1, {CacheGroupKind::kSlidingWindow, kBs, kWindow}, pool3);
  for (int b = 0; b < 5; ++b) pool3.register_full_block(b, hashes[static_cast<size_t>(b)], 0);
  EXPECT_EQ(m3.longest_hit(hashes, 5), 0);
}

TEST(KvCacheCoordinatorGroups, EachGroupTakesItsBlocksFromTheOnePoolAllOrNothing) {
  KvCacheCoordinator m(two_groups(), 12, /*prefix=*/false);
  Request a = request("a", 20);
  ASSERT_TRUE(m.allocate(a, 20));
  ASSERT_EQ(a.cache_tables.size(), 2u);
  EXPECT_EQ(a.cache_tables[0].blocks.size(), 5u);
  EXPECT_EQ(a.cache_tables[1].blocks.size(), 5u);
  EXPECT_EQ(a.block_ids(), a.cache_tables[0].blocks) << "the step's attention table is the first group's";
  EXPECT_EQ(m.pool().num_free(), 2);
  // b needs two blocks in each group: four, with two free.
  Request b = request("b", 6, 100);
  EXPECT_FALSE(m.allocate(b, 6));
  EXPECT_FALSE(m.holds_cache(b));
  EXPECT_EQ(m.pool().num_free(), 2);
  // One block in each group fits.
  Request c = request("c", 3, 200);
  ASSERT_TRUE(m.allocate(c, 3));
  EXPECT_EQ(m.pool().num_free(), 0);
  m.free(a);
  m.free(c);
  EXPECT_TRUE(m.pool().all_free());
  EXPECT_TRUE(a.cache_tables.empty());
}

TEST(KvCacheCoordinatorGroups, BlocksOutsideTheWindowGoBackToThePool) {
  KvCacheCoordinator m(two_groups(), 16, /*prefix=*/false);
  Request r = request("r", 20);
  compute_all(m, r);
  EXPECT_EQ(m.pool().num_free(), 6);
  // Decoding position 20 reads [13, 20]: the window group gives back blocks 0-2 (positions 0-11)
  // and takes block 5 for position 20; full attention keeps everything and takes its block 5.
  r.output = {21};
  ASSERT_TRUE(m.allocate(r, 1));
  EXPECT_EQ(r.cache_tables[1].blocks.size(), 6u);
  EXPECT_EQ(nulls(r.cache_tables[1].blocks), 3);
  EXPECT_NE(r.cache_tables[1].blocks[3], kNullBlock);
  EXPECT_EQ(nulls(r.cache_tables[0].blocks), 0);
  EXPECT_EQ(m.pool().num_free(), 6 + 3 - 2);
  r.num_computed_tokens = 21;
  m.commit_computed(r);
  // Nothing more to give back until the window passes position 15.
  r.output.push_back(22);
  ASSERT_TRUE(m.allocate(r, 1));
  EXPECT_EQ(nulls(r.cache_tables[1].blocks), 3);
  m.free(r);
  EXPECT_TRUE(m.pool().all_free()) << "freed entries are not given back twice";
}

TEST(KvCacheCoordinatorGroups, APrefixHitTakesFullBlocksAndTheWindowsLastBlocks) {
  KvCacheCoordinator m(two_groups(), 24, /*prefix=*/true);
  Request a = request("a", 20);
  compute_all(m, a);
  const auto full = a.cache_tables[0].blocks, window = a.cache_tables[1].blocks;
  a.output = {21};
  ASSERT_TRUE(m.allocate(a, 1));  // the window group gives back blocks 0-2 (still cached)
  EXPECT_EQ(nulls(a.cache_tables[1].blocks), 3);
  m.free(a);
  EXPECT_TRUE(m.pool().all_free());
  // The same 20 tokens and one more: five blocks hit. Full attention takes all five, the window
  // group the two that hold positions 13-19 before position 20.
  Request b = request("b", 21);
  const CacheHit hit = m.find_cached_prefix(b);
  EXPECT_EQ(hit.num_tokens, 20);
  EXPECT_EQ(hit.group_blocks(0), (std::vector<int32_t>(full.begin(), full.begin() + 5)));
  EXPECT_EQ(hit.group_blocks(1), (std::vector<int32_t>{kNullBlock, kNullBlock, kNullBlock, window[3], window[4]}));
  const int free_before = m.pool().num_free();
  ASSERT_TRUE(m.allocate(b, 1, hit));
  EXPECT_EQ(b.num_computed_tokens, 20);
  EXPECT_EQ(m.pool().num_free(), free_before - 7 - 2) << "the seven hit blocks and one new block per group";
  EXPECT_EQ(m.pool().ref_count(window[3]), 1);
  EXPECT_EQ(m.pool().ref_count(window[0]), 0) << "a block outside the window is not taken";
  b.num_computed_tokens = 21;
  m.commit_computed(b);  // re-registering the hit blocks, skipping the null ones
  m.free(b);
  EXPECT_TRUE(m.pool().all_free());

  // The window group's blocks 3 and 4 evicted, the full group's all cached: the hit ends where
  // the window group can serve it (a hit of 3 blocks needs its blocks 1 and 2).
  KvCacheCoordinator m2(two_groups(), 24, true);
  Request d = request("d", 21);
  std::vector<uint64_t> h;
  for (int blk = 0; blk < 5; ++blk) h.push_back(hash_block(blk ? h.back() : 0, d.prompt.data() + blk * kBs, kBs));
  for (int blk = 0; blk < 5; ++blk) m2.pool().register_full_block(blk, h[static_cast<size_t>(blk)], 0);
  for (int blk = 0; blk < 3; ++blk) m2.pool().register_full_block(10 + blk, h[static_cast<size_t>(blk)], 1);
  const CacheHit dh = m2.find_cached_prefix(d);
  EXPECT_EQ(dh.num_tokens, 12);
  EXPECT_EQ(dh.group_blocks(0), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(dh.group_blocks(1), (std::vector<int32_t>{kNullBlock, 11, 12}));
  ASSERT_TRUE(m2.allocate(d, 9, dh));
  EXPECT_EQ(d.num_computed_tokens, 12);
  EXPECT_EQ(d.cache_tables[1].blocks.size(), 6u);
  m2.free(d);
  EXPECT_TRUE(m2.pool().all_free());
}

TEST(KvCacheCoordinatorGroups, ARejectedDraftKeepsTheWindowOfTheLastAcceptedToken) {
  // Full + window + state (seven slots a sequence: six drafts).
  auto groups = two_groups();
  groups.push_back({{CacheGroupKind::kStateSlot, kBs, 0}, {2}});
  KvCacheCoordinator m(groups, 16, /*prefix=*/false, /*num_state_slots=*/7, /*slots_per_seq=*/7);
  Request r = request("r", 18);
  compute_all(m, r);
  const int32_t slot = r.state_slot();
  ASSERT_GE(slot, 0);
  EXPECT_EQ(m.draft_state_slot(r, 0), slot);
  const int32_t draft_slot = m.draft_state_slot(r, 1);
  // Verification of position 18 and six drafts (positions 19-24): KV is written up to position
  // 24. Position 18 reads from block 2 (positions 11 on): the window group gives back 0 and 1.
  r.output = {19};
  r.spec_tokens = {20, 21, 22, 23, 24, 25};
  ASSERT_TRUE(m.allocate(r, 7));
  EXPECT_EQ(r.cache_tables[0].blocks.size(), 7u);
  EXPECT_EQ(r.cache_tables[1].blocks.size(), 7u);
  EXPECT_EQ(nulls(r.cache_tables[1].blocks), 2);
  r.num_computed_tokens += 1;  // the step computed position 18; the drafts count once accepted
  m.commit_computed(r);
  // One draft accepted: position 19 computed, the other five rolled back.
  r.output.push_back(20);
  r.spec_tokens.clear();
  r.num_computed_tokens += 1;
  m.accept_drafts(r, 1);
  EXPECT_EQ(r.num_computed_tokens, 20);
  EXPECT_EQ(r.state_slot(), draft_slot) << "the state after the accepted draft is the sequence's";
  EXPECT_EQ(m.draft_state_slot(r, 1), slot);
  // The next token, at position 20, reads [13, 20]: block 3 on. Freeing follows the accepted
  // tokens, not the rejected drafts' KV (position 24's window starts at block 4).
  r.output.push_back(23);
  ASSERT_TRUE(m.allocate(r, 1));
  EXPECT_EQ(nulls(r.cache_tables[1].blocks), 3);
  EXPECT_NE(r.cache_tables[1].blocks[3], kNullBlock);
  EXPECT_EQ(m.pool().num_free(), 16 - 7 - 7 + 3);
  m.free(r);
  EXPECT_TRUE(m.pool().all_free());
  EXPECT_TRUE(m.state_slots().all_free());
}

TEST(KvCacheCoordinatorGroups, TheSchedulerRunsAWindowModelPastItsPool) {
  // Every layer windowed: one sliding-window group of 4 blocks (16 tokens) runs a sequence of
  // 40, since it holds at most the window's blocks and the ones being written.
  KvCacheCoordinator cache({{{CacheGroupKind::kSlidingWindow, kBs, kWindow}, {0, 1}}}, 4, /*prefix=*/false);
  Scheduler s(testing::scheduler_config(4, 4, true, 64), cache);
  auto r = testing::make_request("r", 12);
  s.add(r.get());
  for (int step = 0; step < 40; ++step) {
    SchedulerOutput out = s.schedule();
    ASSERT_EQ(out.scheduled.size(), 1u) << "step " << step;
    EXPECT_TRUE(out.preempted.empty());
    s.on_step_done(out);
    if (r->num_computed_tokens >= r->num_tokens()) r->output.push_back(7);
    const auto& blocks = r->block_ids();
    EXPECT_LE(static_cast<int>(blocks.size()) - nulls(blocks), 4);
  }
  EXPECT_GE(r->num_tokens(), 40);
  // The step's block table reads the freed entries as block 0 (the window never reaches them).
  const auto& blocks = r->block_ids();
  std::vector<int32_t> table;
  r->append_block_table(table, static_cast<int>(blocks.size()) + 1);
  for (size_t b = 0; b < blocks.size(); ++b) EXPECT_EQ(table[b], blocks[b] == kNullBlock ? 0 : blocks[b]);
  EXPECT_EQ(table.back(), 0);
  EXPECT_GT(nulls(blocks), 5);
  s.remove(r.get());
  EXPECT_TRUE(cache.pool().all_free());
}

TEST(CacheGroups, AWindowsBlocksFollowTheStepsItMayTake) {
  const CacheGroupSpec window{CacheGroupKind::kSlidingWindow, kBs, kWindow};
  // 7 positions before a step of at most 8: 15 positions, 4 blocks, one more off the block edge.
  EXPECT_EQ(max_blocks_per_seq(window, 64, 8), 5);
  EXPECT_EQ(max_blocks_per_seq(window, 12, 8), 3) << "never more than every block of max_model_len";
  EXPECT_EQ(max_blocks_per_seq({CacheGroupKind::kFullAttention, kBs, 0}, 64, 8), 16);
  EXPECT_EQ(max_blocks_per_seq({CacheGroupKind::kStateSlot, kBs, 0}, 64, 8), 0);
}

// Two attention layers with a window of 8; forward() returns zero logits.
class FakeWindowModel : public Model {
 public:
  FakeWindowModel(Backend& be, std::vector<LayerCacheSpec> specs)
      : be_(be), specs_(std::move(specs)), weights_(ParallelContext{}) {
    config_.vocab_size = 16;
    config_.num_layers = static_cast<int>(specs_.size());
    config_.max_position_embeddings = 64;
  }
  const ModelConfig& config() const override { return config_; }
  std::vector<LayerCacheSpec> cache_specs() const override { return specs_; }
  WeightStore& weights() override { return weights_; }
  Tensor forward(const ModelInput& in, KvCache&) override {
    ++steps;
    Tensor logits = be_.scratch({static_cast<int64_t>(in.logits_indices.size()), config_.vocab_size}, DType::kF32);
    std::vector<float> zeros(static_cast<size_t>(logits.numel()), 0.0f);
    be_.copy_from_host(logits, zeros.data());
    return logits;
  }
  Tensor run(const StepInputs&, KvCache&) override { return Tensor(); }
  int steps = 0;

 private:
  Backend& be_;
  std::vector<LayerCacheSpec> specs_;
  ModelConfig config_;
  WeightStore weights_;
};

EngineConfig window_engine_config(int num_blocks) {
  EngineConfig ec;
  ec.block_size = kBs;
  ec.num_blocks_override = num_blocks;
  ec.scheduler.max_model_len = 64;
  ec.scheduler.max_num_batched_tokens = 8;
  ec.scheduler.max_num_seqs = 2;
  return ec;
}

TEST(EngineCacheGroups, AWindowedModelRunsSequencesLongerThanItsCache) {
  BackendOptions o;
  auto be = make_backend(o);
  // Five blocks (20 tokens) hold a 64-token sequence's window and a step of 8.
  auto model = std::make_unique<FakeWindowModel>(*be, std::vector<LayerCacheSpec>{paged(kWindow), paged(kWindow)});
  FakeWindowModel* fake = model.get();
  LLMEngine engine(std::move(model), *be, window_engine_config(5));
  ASSERT_EQ(engine.cache_manager().groups().size(), 1u);
  EXPECT_EQ(engine.cache_manager().groups()[0].spec, (CacheGroupSpec{CacheGroupKind::kSlidingWindow, kBs, kWindow}));
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 40;
  std::vector<int32_t> prompt(12);
  std::iota(prompt.begin(), prompt.end(), 1);
  ASSERT_TRUE(engine.add_request("r", prompt, p).ok());
  size_t tokens = 0;
  while (engine.has_unfinished())
    for (const auto& out : engine.step()) tokens += out.new_token_ids.size();
  EXPECT_EQ(tokens, 40u);
  EXPECT_EQ(engine.stats().num_preemptions, 0u);
  EXPECT_EQ(fake->steps, 2 + 39) << "two prefill chunks, then one decode step a token";
  EXPECT_TRUE(engine.cache_manager().pool().all_free());

  // Four blocks do not hold it: the engine says so at startup.
  auto small = std::make_unique<FakeWindowModel>(*be, std::vector<LayerCacheSpec>{paged(kWindow), paged(kWindow)});
  try {
    LLMEngine e(std::move(small), *be, window_engine_config(4));
    ADD_FAILURE() << "four blocks accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kOutOfMemory);
    EXPECT_NE(std::string(e.what()).find("holds up to 5 KV cache blocks of 4 tokens"), std::string::npos) << e.what();
  }
  // Full and windowed layers mixed: one full-attention group, which needs every block of 64 tokens.
  auto mixed = std::make_unique<FakeWindowModel>(*be, std::vector<LayerCacheSpec>{paged(), paged(kWindow)});
  EXPECT_THROW(LLMEngine(std::move(mixed), *be, window_engine_config(5)), Error);
}

}  // namespace
}  // namespace tessera
