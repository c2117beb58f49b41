// Hybrid models (Qwen3-Next, Qwen3.5) beyond the fixture checks: tensor parallelism of the
// Gated DeltaNet and gated attention layers (two ranks in two threads of this process, over a
// host communicator, give transformers' logits), and the released models' configs (declared
// from config.json alone: per-rank state shapes, parameter counts; nothing allocated).
#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "distributed/communicator.h"
#include "fixture_util.h"
#include "loader/checkpoint.h"
#include "model/registry.h"
#include "thread_comm.h"

namespace tessera {
namespace {

using testing::fixtures_dir;

using testing::Rendezvous;
using testing::ThreadComm;

// A 300-token prompt prefilled in steps of 128 tokens on TP rank `rank` of `tp`; rank 0
// returns the last position's logits.
std::vector<float> tp_prefill_logits(const std::string& name, const std::vector<int32_t>& tokens, int rank, int tp,
                                     dist::Communicator* comm) {
  auto be = make_backend({});
  ModelConfig cfg = load_model_config(fixtures_dir() + "/" + name);
  ModelOptions mo;
  mo.parallel.tp_rank = rank;
  mo.parallel.tp_size = tp;
  mo.runtime.tp = comm;
  auto model = create_model(cfg, mo, *be);
  Checkpoint ckpt(cfg.model_dir);
  model->weights().load(ckpt, *be);
  const int blocks = 24;
  KvCache cache = testing::alloc_test_cache(*be, model->cache_specs(), blocks, be->compute_dtype(), 1);
  const int n = static_cast<int>(tokens.size());
  Tensor logits;
  for (int start = 0; start < n; start += 128) {
    const int len = std::min(128, n - start);
    ModelInput in;
    for (int i = start; i < start + len; ++i) {
      in.token_ids.push_back(tokens[static_cast<size_t>(i)]);
      in.positions.push_back(i);
      in.attention.slot_mapping.push_back(i);
    }
    in.attention.query_start_loc = {0, len};
    in.attention.seq_lens = {start + len};
    in.attention.max_blocks_per_seq = blocks;
    for (int b = 0; b < blocks; ++b) in.attention.block_tables.push_back(b);
    in.linear = {{0, len}, {0}, {start > 0 ? 1 : 0}};
    in.logits_indices = {len - 1};
    be->reset_scratch();
    logits = model->forward(in, cache);
  }
  if (!model->returns_logits()) return {};
  std::vector<float> v(static_cast<size_t>(logits.numel()));
  be->copy_to_host(v.data(), logits);
  be->synchronize();
  return v;
}

class HybridTensorParallel : public ::testing::TestWithParam<std::string> {};

// TP 2: each rank holds one of the two key heads and two of the four value heads of every
// Gated DeltaNet layer (its slice of q, k, v, z, b, a, of the conv channels and of the
// states), half the attention heads, half of every MLP / expert; the logits are
// transformers'.
TEST_P(HybridTensorParallel, TwoRanksGiveTheReferenceLogits) {
  const std::string name = GetParam();
  auto ref = testing::load_reference(name);
  const auto& c = ref["cases"][3];
  const auto tokens = c["prompt_ids"].get<std::vector<int32_t>>();
  Rendezvous rv(2);
  ThreadComm c0(rv, 0), c1(rv, 1);
  std::vector<float> got;
  std::string err1;
  std::thread t1([&] {
    try {
      tp_prefill_logits(name, tokens, 1, 2, &c1);
    } catch (const std::exception& e) {
      err1 = e.what();
    }
  });
  got = tp_prefill_logits(name, tokens, 0, 2, &c0);
  t1.join();
  ASSERT_TRUE(err1.empty()) << err1;
  const auto want = c["last_logits"].get<std::vector<float>>();
  ASSERT_EQ(got.size(), want.size());
  float max_err = 0;
  for (size_t i = 0; i < got.size(); ++i) max_err = std::max(max_err, std::fabs(got[i] - want[i]));
  EXPECT_LT(max_err, 2e-3) << name;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HybridTensorParallel,
                         ::testing::Values("qwen3_next_tiny", "qwen3_5_moe_vl_tiny", "qwen3_5_dense_tiny"),
                         [](const auto& i) { return std::string(i.param); });

// TP 4 over 2 key heads: a Gated DeltaNet is split by whole key heads (with their value
// heads, conv channels and states), so the model is refused before any weight is read,
// naming the flag, the sizes that work and pipeline parallelism as the way to more GPUs.
TEST(HybridTensorParallelLimits, MoreRanksThanKeyHeadsNamesTheSizesThatWork) {
  auto be = make_backend({});
  ModelConfig cfg = load_model_config(fixtures_dir() + "/qwen3_next_tiny");
  Rendezvous rv(4);
  ThreadComm comm(rv, 0);
  ModelOptions mo;
  mo.parallel.tp_size = 4;
  mo.runtime.tp = &comm;
  try {
    create_model(cfg, mo, *be);
    FAIL() << "TP 4 over 2 key heads was accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported) << m;
    EXPECT_NE(m.find("--tensor-parallel-size 4"), std::string::npos) << m;
    EXPECT_NE(m.find("sizes that work for this model: 1, 2 "), std::string::npos) << m;
    EXPECT_NE(m.find("--pipeline-parallel-size"), std::string::npos) << m;
  }
}

// --load-format dummy: a hybrid model from its config.json alone (the GDN weights, the f32
// A_log / dt_bias and the 1 + w norms get dummy values) runs and gives finite, varied logits.
TEST(HybridDummyWeights, RunFromTheConfigAlone) {
  auto be = make_backend({});
  ModelConfig cfg = load_model_config(fixtures_dir() + "/qwen3_5_moe_vl_tiny");
  auto model = create_model(cfg, ModelOptions{}, *be);
  model->weights().load_dummy(*be, 5);
  KvCache cache = testing::alloc_test_cache(*be, model->cache_specs(), 1, be->compute_dtype(), 1);
  ModelInput in;
  for (int i = 0; i < 7; ++i) {
    in.token_ids.push_back(3 + 11 * i);
    in.positions.push_back(i);
    in.attention.slot_mapping.push_back(i);
  }
  in.attention.query_start_loc = {0, 7};
  in.attention.seq_lens = {7};
  in.attention.max_blocks_per_seq = 1;
  in.attention.block_tables = {0};
  in.linear = {{0, 7}, {0}, {0}};
  in.logits_indices = {6};
  Tensor logits = model->forward(in, cache);
  std::vector<float> v(static_cast<size_t>(logits.numel()));
  be->copy_to_host(v.data(), logits);
  be->synchronize();
  ASSERT_EQ(v.size(), 256u);
  for (float x : v) ASSERT_TRUE(std::isfinite(x));
  EXPECT_GT(*std::max_element(v.begin(), v.end()), *std::min_element(v.begin(), v.end()));
}

// A hybrid step without state caches or linear-attention metadata is refused with a message.
TEST(HybridDummyWeights, StepWithoutStateCachesIsRefused) {
  auto be = make_backend({});
  ModelConfig cfg = load_model_config(fixtures_dir() + "/qwen3_next_tiny");
  auto model = create_model(cfg, ModelOptions{}, *be);
  model->weights().load_dummy(*be, 5);
  KvCache cache;
  cache.num_blocks = 1;
  for (const auto& s : model->cache_specs()) {
    cache.k.push_back(be->alloc({1, 16, std::max(1, s.num_kv_heads), std::max(1, s.head_dim)}, be->compute_dtype()));
    cache.v.push_back(cache.k.back());
  }
  ModelInput in;
  in.token_ids = {5};
  in.positions = {0};
  in.attention = {{0, 1}, {1}, {0}, {0}, 1, 16};
  in.logits_indices = {0};
  try {
    model->forward(in, cache);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("state caches"), std::string::npos) << e.what();
  }
}

// The released models' configs (configs/), declared at TP 1 and TP 2: which layers hold state
// slots and their per-rank shapes, and the parameter count of the checkpoint.
struct Released {
  const char* dir;
  int layers, linear_layers;
  int64_t conv_channels, value_heads;  // at TP 1
  double params_b;                     // billions, from the model's name
};

class ReleasedConfig : public ::testing::TestWithParam<Released> {};

TEST_P(ReleasedConfig, DeclaresStateSlotsAndShapesPerRank) {
  const Released r = GetParam();
  ModelConfig cfg = load_model_config(std::string(TESSERA_SOURCE_DIR) + "/configs/" + r.dir);
  for (int tp : {1, 2}) {
    auto be = make_backend({});
    Rendezvous rv(tp);
    ThreadComm comm(rv, 0);
    ModelOptions mo;
    mo.parallel.tp_size = tp;
    mo.runtime.tp = tp > 1 ? &comm : nullptr;
    auto model = create_model(cfg, mo, *be);
    const auto specs = model->cache_specs();
    ASSERT_EQ(static_cast<int>(specs.size()), r.layers);
    int linear = 0;
    for (int i = 0; i < r.layers; ++i) {
      const auto& s = specs[static_cast<size_t>(i)];
      if ((i + 1) % 4 == 0) {
        EXPECT_EQ(s.kind, CacheKind::kPagedKv) << r.dir << " layer " << i;
        EXPECT_EQ(s.head_dim, 256);
        EXPECT_EQ(s.num_kv_heads, 2 / tp);
        continue;
      }
      ++linear;
      ASSERT_EQ(s.kind, CacheKind::kStateSlot) << r.dir << " layer " << i;
      EXPECT_EQ(s.conv_state_shape, (Shape{3, r.conv_channels / tp}));
      EXPECT_EQ(s.ssm_state_shape, (Shape{r.value_heads / tp, 128, 128}));
    }
    EXPECT_EQ(linear, r.linear_layers);
    if (tp == 1) {
      const double params = static_cast<double>(model->weights().param_bytes(DType::kBF16)) / 2 / 1e9;
      EXPECT_NEAR(params, r.params_b, 0.05 * r.params_b) << r.dir;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, ReleasedConfig,
                         ::testing::Values(Released{"qwen3-next-80b-a3b", 48, 36, 2 * 16 * 128 + 32 * 128, 32, 80},
                                           Released{"qwen3.5-35b-a3b", 40, 30, 2 * 16 * 128 + 32 * 128, 32, 35},
                                           Released{"qwen3.5-122b-a10b", 48, 36, 2 * 16 * 128 + 64 * 128, 64, 122}),
                         [](const auto& i) {
                           std::string n = i.param.dir;
                           for (char& ch : n)
                             if (ch == '-' || ch == '.') ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace tessera
