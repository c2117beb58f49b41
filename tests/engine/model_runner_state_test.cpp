// The ModelRunner's side of hybrid models: the state tensors it allocates for kStateSlot
// layers (per the LayerCacheSpec contract), the state copies it applies before a forward,
// and the linear-attention layout reaching the model's StepInputs.
#include <gtest/gtest.h>

#include <vector>

#include "engine/executor.h"
#include "engine/model_runner.h"

namespace tessera {
namespace {

// One attention layer and one linear-attention layer; forward() reports what it was given.
class FakeHybridModel : public Model {
 public:
  explicit FakeHybridModel(Backend& be) : be_(be), weights_(ParallelContext{}) { config_.vocab_size = 8; }
  const ModelConfig& config() const override { return config_; }
  std::vector<LayerCacheSpec> cache_specs() const override {
    LayerCacheSpec attn{CacheKind::kPagedKv, 2, 4, {}, {}};
    LayerCacheSpec linear{CacheKind::kStateSlot, 0, 0, Shape{3, 8}, Shape{2, 4, 4}};
    return {attn, linear};
  }
  WeightStore& weights() override { return weights_; }
  Tensor forward(const ModelInput& in, KvCache& cache) override {
    StepInputs si = upload_step_inputs(be_, in, config_.vocab_size, 1 << 20);
    seen_slots = si.linear.host_state_slots;
    seen_initial = si.linear.host_has_initial_state;
    seen_linear_seqs = si.linear.num_seqs;
    // What slot 3 of the conv state holds when the forward starts.
    slot3.resize(24);
    be_.copy_to_host(slot3.data(), cache.conv_state[1].rows(3, 4));
    Tensor logits = be_.scratch({static_cast<int64_t>(in.logits_indices.size()), config_.vocab_size}, DType::kF32);
    std::vector<float> zeros(static_cast<size_t>(logits.numel()), 0.0f);
    be_.copy_from_host(logits, zeros.data());
    return logits;
  }
  Tensor run(const StepInputs&, KvCache&) override { return Tensor(); }

  std::vector<int32_t> seen_slots, seen_initial;
  int seen_linear_seqs = -1;
  std::vector<float> slot3;

 private:
  Backend& be_;
  ModelConfig config_;
  WeightStore weights_;
};

TEST(ModelRunnerState, AllocatesStateSlotsAndAppliesStateCopiesBeforeTheForward) {
  BackendOptions o;
  auto be = make_backend(o);
  FakeHybridModel model(*be);
  ModelRunner runner(model, *be);
  CacheInit init;
  init.num_blocks = 4;
  init.block_size = 4;
  init.max_model_len = 16;
  init.num_state_slots = 5;
  init.conv_dtype = DType::kF32;
  init.ssm_dtype = DType::kBF16;
  runner.init_cache(init);
  const KvCache& kv = runner.cache();
  ASSERT_EQ(kv.k.size(), 2u);
  ASSERT_EQ(kv.conv_state.size(), 2u);
  EXPECT_TRUE(kv.k[0].defined());
  EXPECT_FALSE(kv.k[1].defined()) << "no K/V for the linear-attention layer";
  EXPECT_FALSE(kv.conv_state[0].defined()) << "no state for the attention layer";
  EXPECT_EQ(kv.num_state_slots, 5);
  EXPECT_EQ(kv.conv_state[1].shape(), (Shape{5, 3, 8}));
  EXPECT_EQ(kv.ssm_state[1].shape(), (Shape{5, 2, 4, 4}));
  EXPECT_EQ(kv.conv_state[1].dtype(), DType::kF32);
  EXPECT_EQ(kv.ssm_state[1].dtype(), DType::kBF16);

  // Slot 1 holds a known state; the step copies it into slot 3 before its forward.
  std::vector<float> state(24);
  for (size_t i = 0; i < state.size(); ++i) state[i] = 0.5f + static_cast<float>(i);
  be->copy_from_host(kv.conv_state[1].rows(1, 2), state.data());
  ModelInput in;
  in.token_ids = {1, 2, 3};
  in.positions = {0, 1, 0};
  in.attention.block_size = 4;
  in.attention.max_blocks_per_seq = 1;
  in.attention.query_start_loc = {0, 2, 3};
  in.attention.seq_lens = {2, 1};
  in.attention.block_tables = {0, 1};
  in.attention.slot_mapping = {0, 1, 4};
  in.logits_indices = {1, 2};
  in.linear.query_start_loc = in.attention.query_start_loc;
  in.linear.state_slots = {3, 0};
  in.linear.has_initial_state = {1, 0};
  in.state_copies = {1, 3};
  runner.run(in);
  EXPECT_EQ(model.slot3, state);
  EXPECT_EQ(model.seen_linear_seqs, 2);
  EXPECT_EQ(model.seen_slots, (std::vector<int32_t>{3, 0}));
  EXPECT_EQ(model.seen_initial, (std::vector<int32_t>{1, 0}));

  in.state_copies = {1, 5};  // beyond the slots
  EXPECT_THROW(runner.run(in), Error);
}

TEST(ModelRunnerState, StateLayersNeedStateSlots) {
  BackendOptions o;
  auto be = make_backend(o);
  FakeHybridModel model(*be);
  CacheInit init;
  init.num_blocks = 4;
  EXPECT_THROW(allocate_kv_cache(*be, model.cache_specs(), init), Error);
}

}  // namespace
}  // namespace tessera
