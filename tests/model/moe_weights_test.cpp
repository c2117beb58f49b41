// WeightStore: experts from per-expert and fused 3-D checkpoint tensors into one stacked
// layout, split by TP (each expert's intermediate slice) or by expert parallelism (whole
// experts); the vocab-parallel table padded to a multiple of the TP size; and loading that
// does not wait for the device once per tensor.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "core/error.h"
#include "fixture_util.h"
#include "loader/checkpoint.h"
#include "model/registry.h"
#include "tiny_checkpoint.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using testing::TinyModel;

using TempDir = testing::TempDir;

constexpr int64_t kE = 4, kI = 8, kH = 16;

TinyModel tiny_moe(bool fused) {
  TinyModel m;
  m.architecture = "Qwen3MoeForCausalLM";
  m.hidden = kH;
  m.heads = 2;
  m.kv_heads = 1;
  m.head_dim = 8;
  m.vocab = 32;
  m.layers = 1;
  m.experts = kE;
  m.top_k = 2;
  m.moe_intermediate = kI;
  m.fused_experts = fused;
  return m;
}

float bf16_round(float f) {
  uint32_t u = static_cast<uint32_t>(testing::to_bf16(f)) << 16;
  float r;
  std::memcpy(&r, &u, 4);
  return r;
}

std::vector<float> host(Backend& be, const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  be.copy_to_host(v.data(), t);
  return v;
}

struct Layout {
  bool fused;
  ParallelContext pc;
  std::string name;
};

class ExpertLoad : public ::testing::TestWithParam<Layout> {};

TEST_P(ExpertLoad, StackedSliceHoldsTheCheckpointsNumbers) {
  const Layout c = GetParam();
  TempDir dir;
  testing::write_tiny_model(tiny_moe(c.fused), dir.path, 7);
  auto be = make_backend({});
  WeightStore w(c.pc);
  auto ex = w.declare_experts("model.layers.0.mlp.experts", kE, kI, kH);
  Checkpoint ckpt(dir.path.string());
  w.load(ckpt, *be);
  const ExpertShard& s = ex.shard;
  const int64_t El = s.local_experts, Il = s.local_intermediate;
  ASSERT_EQ(ex.gate_up->shape(), (Shape{El, 2 * Il, kH}));
  ASSERT_EQ(ex.down->shape(), (Shape{El, kH, Il}));
  if (c.pc.expert_parallel) {
    EXPECT_EQ(El, kE / c.pc.tp_size);
    EXPECT_EQ(s.expert_begin, c.pc.tp_rank * El);
    EXPECT_EQ(Il, kI);
  } else {
    EXPECT_EQ(El, kE);
    EXPECT_EQ(Il, kI / c.pc.tp_size);
    EXPECT_EQ(s.inter_begin, c.pc.tp_rank * Il);
  }
  auto gu = host(*be, *ex.gate_up), dn = host(*be, *ex.down);
  for (int64_t j = 0; j < El; ++j) {
    const int64_t e = s.expert_begin + j;
    const std::string p = "model.layers.0.mlp.experts." + std::to_string(e) + ".";
    auto g = testing::tiny_values(7, p + "gate_proj.weight", kI * kH, 0.25f);
    auto u = testing::tiny_values(7, p + "up_proj.weight", kI * kH, 0.25f);
    auto d = testing::tiny_values(7, p + "down_proj.weight", kH * kI, 0.25f);
    for (int64_t r = 0; r < 2 * Il; ++r)
      for (int64_t h = 0; h < kH; ++h) {
        const bool gate = r < Il;
        const int64_t src_row = s.inter_begin + (gate ? r : r - Il);
        const float want = bf16_round((gate ? g : u)[static_cast<size_t>(src_row * kH + h)]);
        ASSERT_EQ(gu[static_cast<size_t>((j * 2 * Il + r) * kH + h)], want)
            << c.name << " expert " << e << " gate_up row " << r << " col " << h;
      }
    for (int64_t h = 0; h < kH; ++h)
      for (int64_t i = 0; i < Il; ++i)
        ASSERT_EQ(dn[static_cast<size_t>((j * kH + h) * Il + i)],
                  bf16_round(d[static_cast<size_t>(h * kI + s.inter_begin + i)]))
            << c.name << " expert " << e << " down row " << h << " col " << i;
  }
}

std::vector<Layout> layouts() {
  std::vector<Layout> v;
  for (bool fused : {false, true}) {
    const std::string f = fused ? "fused" : "per_expert";
    v.push_back({fused, {0, 1, 0, 1, false}, f + "_tp1"});
    v.push_back({fused, {0, 2, 0, 1, false}, f + "_tp2_rank0"});
    v.push_back({fused, {1, 2, 0, 1, false}, f + "_tp2_rank1"});
    v.push_back({fused, {0, 2, 0, 1, true}, f + "_ep2_rank0"});
    v.push_back({fused, {1, 2, 0, 1, true}, f + "_ep2_rank1"});
    v.push_back({fused, {3, 4, 0, 1, true}, f + "_ep4_rank3"});
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Layouts, ExpertLoad, ::testing::ValuesIn(layouts()),
                         [](const auto& i) { return i.param.name; });

TEST(ExpertLoad, UndividedExpertsOrIntermediateFailNamingTheFlag) {
  auto msg = [](ParallelContext pc, int64_t E, int64_t I) {
    try {
      WeightStore w(pc);
      w.declare_experts("model.layers.0.mlp.experts", E, I, kH);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(msg({0, 3, 0, 1, true}, 4, 8).find("--enable-expert-parallel"), std::string::npos);
  EXPECT_NE(msg({0, 3, 0, 1, false}, 4, 8).find("moe_intermediate_size"), std::string::npos);
  EXPECT_EQ(msg({0, 2, 0, 1, true}, 4, 8), "");
}

TEST(ExpertLoad, MissingExpertTensorNamesIt) {
  TempDir dir;
  testing::write_tiny_model(tiny_moe(false), dir.path, 7);
  auto be = make_backend({});
  WeightStore w(ParallelContext{});
  w.declare_experts("model.layers.0.mlp.experts", kE + 1, kI, kH);  // expert 4 is not in the file
  Checkpoint ckpt(dir.path.string());
  try {
    w.load(ckpt, *be);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.0.mlp.experts.4.gate_proj.weight"), std::string::npos)
        << e.what();
  }
}

// Vocabulary 777 at TP 2: 389 rows per rank; rank 1 holds rows 389..776 and one zero row.
TEST(VocabPadding, TablesPadToAMultipleOfTheTpSize) {
  TempDir dir;
  TinyModel m = tiny_moe(false);
  m.vocab = 777;
  testing::write_tiny_model(m, dir.path, 3);
  auto want = testing::tiny_values(3, "model.embed_tokens.weight", 777 * kH, 1.0f);
  auto be = make_backend({});
  Checkpoint ckpt(dir.path.string());
  EXPECT_EQ(vocab_rows_per_rank(777, 2), 389);
  EXPECT_EQ(vocab_rows_per_rank(777, 1), 777);
  EXPECT_EQ(vocab_rows_per_rank(6, 4), 2);
  for (int r = 0; r < 2; ++r) {
    WeightStore w(ParallelContext{r, 2, 0, 1});
    const Tensor& t = w.declare("model.embed_tokens.weight", {777, kH}, ParallelStyle::kVocab);
    w.load(ckpt, *be);
    ASSERT_EQ(t.shape(), (Shape{389, kH}));
    auto got = host(*be, t);
    for (int64_t row = 0; row < 389; ++row)
      for (int64_t h = 0; h < kH; ++h) {
        const int64_t global = r * 389 + row;
        const float expect = global < 777 ? bf16_round(want[static_cast<size_t>(global * kH + h)]) : 0.0f;
        ASSERT_EQ(got[static_cast<size_t>(row * kH + h)], expect) << "rank " << r << " row " << row;
      }
  }
}

// A backend that counts synchronize() calls and forwards everything to the CPU backend.
class CountingBackend : public Backend {
 public:
  int syncs = 0;
  Device device() const override { return be_->device(); }
  std::string name() const override { return "counting"; }
  DType compute_dtype() const override { return be_->compute_dtype(); }
  Tensor alloc(Shape s, DType d) override { return be_->alloc(s, d); }
  Tensor scratch(Shape s, DType d) override { return be_->scratch(s, d); }
  void reset_scratch() override { be_->reset_scratch(); }
  size_t free_memory() const override { return be_->free_memory(); }
  size_t total_memory() const override { return be_->total_memory(); }
  void copy_from_host(const Tensor& d, const void* s) override { be_->copy_from_host(d, s); }
  void copy_to_host(void* d, const Tensor& s) override { be_->copy_to_host(d, s); }
  void copy(const Tensor& d, const Tensor& s) override { be_->copy(d, s); }
  void fill_random(const Tensor& d, uint64_t seed, float lo, float hi) override { be_->fill_random(d, seed, lo, hi); }
  void fill(const Tensor& d, float v) override { be_->fill(d, v); }
  void synchronize() override { ++syncs; }
  void embedding(const Tensor&, const Tensor&, const Tensor&) override { unused(); }
  void rms_norm(const Tensor&, const Tensor&, float, const Tensor&) override { unused(); }
  void add_rms_norm(const Tensor&, const Tensor&, const Tensor&, float) override { unused(); }
  void linear(const Tensor&, const Tensor&, const Tensor*, const Tensor&) override { unused(); }
  void silu_mul(const Tensor&, const Tensor&) override { unused(); }
  void add(const Tensor&, const Tensor&, const Tensor&) override { unused(); }
  void rope(const Tensor&, const Tensor&, const Tensor&, const RopeTable&) override { unused(); }
  void write_kv(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const AttentionMetadata&, float,
                float) override {
    unused();
  }
  void qkv_prologue(const Tensor&, const Tensor*, const Tensor*, float, const Tensor&, const RopeTable&, const Tensor&,
                    const Tensor&, const AttentionMetadata&, float, float, const Tensor&) override {
    unused();
  }
  void paged_attention(const Tensor&, const Tensor&, const Tensor&, const AttentionMetadata&, float, float, float, int,
                       const Tensor&) override {
    unused();
  }
  void gather_rows(const Tensor&, const Tensor&, const Tensor&) override { unused(); }
  void cast(const Tensor&, const Tensor&) override { unused(); }
  void embedding_slice(const Tensor&, const Tensor&, int64_t, const Tensor&) override { unused(); }
  void sample(const Tensor&, const std::vector<SamplingRow>&, const Tensor&) override { unused(); }
  void moe_topk(const Tensor&, int, bool, const Tensor&, const Tensor&) override { unused(); }
  void moe_experts(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, int,
                   const Tensor&) override {
    unused();
  }
  void sigmoid_mul(const Tensor&, const Tensor&, const Tensor&) override { unused(); }

 private:
  [[noreturn]] static void unused() { throw std::logic_error("not used by weight loading"); }
  std::unique_ptr<Backend> be_ = make_backend({});
};

TEST(WeightLoading, SynchronisesOncePerStagingBufferNotPerTensor) {
  TempDir dir;
  TinyModel m = tiny_moe(false);
  m.experts = 16;
  m.layers = 3;
  testing::write_tiny_model(m, dir.path, 5);
  CountingBackend be;
  ModelConfig cfg = load_model_config(dir.path.string());
  auto model = create_model(cfg, ModelOptions{}, be);
  ASSERT_GT(model->weights().count(), 20u);
  Checkpoint ckpt(dir.path.string());
  be.syncs = 0;
  model->weights().load(ckpt, be);
  EXPECT_EQ(be.syncs, 1) << "a checkpoint far below the staging buffer's size needs one wait, at the end";
}

// One prefill of `n` tokens (ids (17 * i + 3) % 256) through a fresh cache; f32 logits of rows `rows`.
std::vector<float> prefill_logits(Model& model, Backend& be, int n, std::vector<int32_t> rows) {
  std::vector<int32_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back((17 * i + 3) % 256);
  return testing::prefill_logits(model, be, ids, std::move(rows));
}

// The same expert numbers in the two checkpoint layouts give the same model.
TEST(MoeModel, FusedAndPerExpertCheckpointsGiveTheSameLogits) {
  auto logits_of = [](bool fused) {
    TempDir dir;
    TinyModel m = testing::generated_model_spec("qwen3_moe");
    m.fused_experts = fused;
    testing::write_tiny_model(m, dir.path, 11);
    auto be = make_backend({});
    ModelConfig cfg = load_model_config(dir.path.string());
    auto model = create_model(cfg, ModelOptions{}, *be);
    Checkpoint ckpt(dir.path.string());
    model->weights().load(ckpt, *be);
    return prefill_logits(*model, *be, 20, {4, 19});
  };
  auto per_expert = logits_of(false), fused = logits_of(true);
  ASSERT_EQ(per_expert.size(), 2u * 300u);
  EXPECT_EQ(per_expert, fused);
  // Not a constant: the logits spread out.
  EXPECT_GT(*std::max_element(fused.begin(), fused.end()) - *std::min_element(fused.begin(), fused.end()), 1.0f);
}

// --load-format dummy needs only config.json: the stacked experts get their shapes from it.
TEST(MoeModel, DummyWeightsFromTheConfigAlone) {
  TempDir dir;
  testing::write_tiny_model(testing::generated_model_spec("qwen2_moe"), dir.path, 11);
  fs::remove(dir.path / "model.safetensors");
  auto be = make_backend({});
  ModelConfig cfg = load_model_config(dir.path.string());
  auto model = create_model(cfg, ModelOptions{}, *be);
  model->weights().load_dummy(*be, 3);
  auto logits = prefill_logits(*model, *be, 3, {2});
  ASSERT_EQ(logits.size(), 300u);
  for (float v : logits) ASSERT_TRUE(std::isfinite(v));
  EXPECT_GT(*std::max_element(logits.begin(), logits.end()), *std::min_element(logits.begin(), logits.end()));
}

TEST(MoeModel, Qwen2MoeWithoutSharedExpertSizeFails) {
  TempDir dir;
  TinyModel m = testing::generated_model_spec("qwen2_moe");
  m.shared_intermediate = 0;
  testing::write_tiny_model(m, dir.path, 11);
  auto be = make_backend({});
  ModelConfig cfg = load_model_config(dir.path.string());
  try {
    create_model(cfg, ModelOptions{}, *be);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("shared_expert_intermediate_size"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessera
