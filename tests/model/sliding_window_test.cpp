// Sliding-window attention end to end on a model: tiny Qwen2-style (windowed layers from
// max_window_layers on, or named by layer_types) and Mistral-style (every layer) checkpoints written
// here, run through the model in chunked prefill and decode steps, against a plain reference forward
// written below (transformers' maths in double: RMSNorm, rotate-half RoPE, GQA attention whose query at
// position p sees the keys at p - W < k <= p, SwiGLU).
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "backend/cpu/cpu_backend.h"
#include "fixture_util.h"
#include "loader/checkpoint.h"
#include "model/registry.h"
#include "tiny_checkpoint.h"

namespace tessera {
namespace {

using testing::SafetensorsWriter;
using testing::TempDir;

struct Tiny {
  std::string architecture;  // MistralForCausalLM | Qwen2ForCausalLM
  int layers = 2, window = 8;
  nlohmann::json window_fields;  // the config's sliding-window fields
  std::vector<int> windows;      // the window each layer should get (0: full attention)
  int hidden = 64, heads = 4, kv_heads = 2, head_dim = 16, inter = 96, vocab = 97;
  double theta = 10000.0, eps = 1e-6;
  bool bias() const { return architecture == "Qwen2ForCausalLM"; }
};

using Mat = std::vector<double>;  // row-major

// The checkpoint's tensors as the model sees them (bf16 values), by name.
struct Weights {
  std::map<std::string, Mat> w;
  const Mat& operator[](const std::string& n) const { return w.at(n); }
};

Weights write_tiny(const Tiny& m, const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  nlohmann::json c = {{"architectures", {m.architecture}},
                      {"model_type", m.bias() ? "qwen2" : "mistral"},
                      {"hidden_size", m.hidden},
                      {"intermediate_size", m.inter},
                      {"num_hidden_layers", m.layers},
                      {"num_attention_heads", m.heads},
                      {"num_key_value_heads", m.kv_heads},
                      {"head_dim", m.head_dim},
                      {"vocab_size", m.vocab},
                      {"max_position_embeddings", 256},
                      {"rms_norm_eps", m.eps},
                      {"rope_theta", m.theta},
                      {"hidden_act", "silu"},
                      {"tie_word_embeddings", false},
                      {"torch_dtype", "bfloat16"}};
  c.update(m.window_fields);
  std::ofstream(dir / "config.json") << c.dump(2);
  SafetensorsWriter st;
  Weights out;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, float spread, float center = 0.0f) {
    size_t n = 1;
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    std::vector<float> v = testing::tiny_values(7, name, n, spread, center);
    st.add(name, shape, v);
    Mat& dst = out.w[name];
    for (float x : v) {  // as stored: bf16
      const uint32_t u = static_cast<uint32_t>(testing::to_bf16(x)) << 16;
      float f;
      std::memcpy(&f, &u, 4);
      dst.push_back(f);
    }
  };
  const int64_t H = m.hidden, D = m.head_dim;
  add("model.embed_tokens.weight", {m.vocab, H}, 1.0f);
  for (int i = 0; i < m.layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    add(p + "input_layernorm.weight", {H}, 0.2f, 1.0f);
    add(p + "post_attention_layernorm.weight", {H}, 0.2f, 1.0f);
    add(p + "self_attn.q_proj.weight", {m.heads * D, H}, 0.3f);
    add(p + "self_attn.k_proj.weight", {m.kv_heads * D, H}, 0.3f);
    add(p + "self_attn.v_proj.weight", {m.kv_heads * D, H}, 0.3f);
    add(p + "self_attn.o_proj.weight", {H, m.heads * D}, 0.3f);
    if (m.bias()) {
      add(p + "self_attn.q_proj.bias", {m.heads * D}, 0.2f);
      add(p + "self_attn.k_proj.bias", {m.kv_heads * D}, 0.2f);
      add(p + "self_attn.v_proj.bias", {m.kv_heads * D}, 0.2f);
    }
    add(p + "mlp.gate_proj.weight", {m.inter, H}, 0.25f);
    add(p + "mlp.up_proj.weight", {m.inter, H}, 0.25f);
    add(p + "mlp.down_proj.weight", {H, m.inter}, 0.25f);
  }
  add("model.norm.weight", {H}, 0.2f, 1.0f);
  add("lm_head.weight", {m.vocab, H}, 0.3f);
  st.write(dir / "model.safetensors");
  return out;
}

// x [T, K] @ w[N, K]^T (+ b)
Mat linear(const Mat& x, const Mat& w, int64_t K, const Mat* b = nullptr) {
  const int64_t T = static_cast<int64_t>(x.size()) / K, N = static_cast<int64_t>(w.size()) / K;
  Mat y(static_cast<size_t>(T * N));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      double acc = b ? (*b)[n] : 0.0;
      for (int64_t k = 0; k < K; ++k) acc += x[t * K + k] * w[n * K + k];
      y[t * N + n] = acc;
    }
  return y;
}

Mat rms_norm(const Mat& x, const Mat& w, double eps) {
  const int64_t H = static_cast<int64_t>(w.size()), T = static_cast<int64_t>(x.size()) / H;
  Mat y(x.size());
  for (int64_t t = 0; t < T; ++t) {
    double ss = 0;
    for (int64_t i = 0; i < H; ++i) ss += x[t * H + i] * x[t * H + i];
    const double r = 1.0 / std::sqrt(ss / static_cast<double>(H) + eps);
    for (int64_t i = 0; i < H; ++i) y[t * H + i] = x[t * H + i] * r * w[i];
  }
  return y;
}

// Rotate-half RoPE on [T, heads, D] at positions 0..T-1.
void rope(Mat& x, int heads, int D, double theta) {
  const int T = static_cast<int>(x.size()) / (heads * D), half = D / 2;
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < heads; ++h) {
      double* v = x.data() + (static_cast<size_t>(t) * heads + h) * D;
      for (int i = 0; i < half; ++i) {
        const double a = t * std::pow(theta, -2.0 * i / D), c = std::cos(a), s = std::sin(a);
        const double x1 = v[i], x2 = v[i + half];
        v[i] = x1 * c - x2 * s;
        v[i + half] = x2 * c + x1 * s;
      }
    }
}

// Logits [T, vocab] of every position of `ids`, with each layer's window (`windows`; empty: none).
Mat reference_logits(const Tiny& m, const Weights& w, const std::vector<int32_t>& ids,
                     const std::vector<int>& windows) {
  const int T = static_cast<int>(ids.size()), H = m.hidden, D = m.head_dim, Hq = m.heads, Hk = m.kv_heads;
  Mat x(static_cast<size_t>(T) * H);
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < H; ++i) x[static_cast<size_t>(t) * H + i] = w["model.embed_tokens.weight"][ids[t] * H + i];
  for (int l = 0; l < m.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const int W = windows.empty() ? 0 : windows[static_cast<size_t>(l)];
    const Mat h = rms_norm(x, w[p + "input_layernorm.weight"], m.eps);
    auto bias = [&](const char* n) { return m.bias() ? &w[p + "self_attn." + n + ".bias"] : nullptr; };
    Mat q = linear(h, w[p + "self_attn.q_proj.weight"], H, bias("q_proj"));
    Mat k = linear(h, w[p + "self_attn.k_proj.weight"], H, bias("k_proj"));
    const Mat v = linear(h, w[p + "self_attn.v_proj.weight"], H, bias("v_proj"));
    rope(q, Hq, D, m.theta);
    rope(k, Hk, D, m.theta);
    Mat attn(static_cast<size_t>(T) * Hq * D, 0.0);
    for (int t = 0; t < T; ++t)
      for (int hd = 0; hd < Hq; ++hd) {
        const int kh = hd / (Hq / Hk), first = W > 0 ? std::max(0, t - W + 1) : 0;
        std::vector<double> sc;
        for (int j = first; j <= t; ++j) {
          double dot = 0;
          for (int d = 0; d < D; ++d)
            dot += q[(static_cast<size_t>(t) * Hq + hd) * D + d] * k[(static_cast<size_t>(j) * Hk + kh) * D + d];
          sc.push_back(dot / std::sqrt(static_cast<double>(D)));
        }
        const double mx = *std::max_element(sc.begin(), sc.end());
        double sum = 0;
        for (double& s : sc) sum += (s = std::exp(s - mx));
        for (int j = first; j <= t; ++j)
          for (int d = 0; d < D; ++d)
            attn[(static_cast<size_t>(t) * Hq + hd) * D + d] +=
                sc[static_cast<size_t>(j - first)] / sum * v[(static_cast<size_t>(j) * Hk + kh) * D + d];
      }
    const Mat o = linear(attn, w[p + "self_attn.o_proj.weight"], static_cast<int64_t>(Hq) * D);
    for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
    const Mat h2 = rms_norm(x, w[p + "post_attention_layernorm.weight"], m.eps);
    const Mat g = linear(h2, w[p + "mlp.gate_proj.weight"], H), u = linear(h2, w[p + "mlp.up_proj.weight"], H);
    Mat act(g.size());
    for (size_t i = 0; i < g.size(); ++i) act[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
    const Mat down = linear(act, w[p + "mlp.down_proj.weight"], m.inter);
    for (size_t i = 0; i < x.size(); ++i) x[i] += down[i];
  }
  return linear(rms_norm(x, w["model.norm.weight"], m.eps), w["lm_head.weight"], H);
}

// The model's logits at every position of `ids`, computed in steps: prefill chunks of 13, 16 and 8
// tokens (a cached prefix behind each), then one token a step. The KV blocks are given out of order.
Mat model_logits(Model& model, Backend& be, const std::vector<int32_t>& ids) {
  const int n = static_cast<int>(ids.size()), blocks = (n + 15) / 16;
  KvCache cache = testing::alloc_test_cache(be, model.cache_specs(), blocks + 2, DType::kF32, 1);
  std::vector<int32_t> table(static_cast<size_t>(blocks));
  for (int b = 0; b < blocks; ++b) table[static_cast<size_t>(b)] = blocks + 1 - b;  // backwards, from block 2
  Mat out;
  std::vector<int> lens = {13, 16, 8};
  for (int sum = 37; sum < n; ++sum) lens.push_back(1);
  for (int start = 0, step = 0; start < n; start += lens[static_cast<size_t>(step++)]) {
    const int len = std::min(lens[static_cast<size_t>(step)], n - start);
    ModelInput in;
    for (int i = start; i < start + len; ++i) {
      in.token_ids.push_back(ids[static_cast<size_t>(i)]);
      in.positions.push_back(i);
      in.attention.slot_mapping.push_back(table[static_cast<size_t>(i / 16)] * 16 + i % 16);
      in.logits_indices.push_back(i - start);
    }
    in.attention.query_start_loc = {0, len};
    in.attention.seq_lens = {start + len};
    in.attention.max_blocks_per_seq = blocks;
    in.attention.block_tables = table;
    be.reset_scratch();
    for (float v : testing::to_host(be, model.forward(in, cache))) out.push_back(v);
  }
  return out;
}

double max_diff(const Mat& a, const Mat& b, size_t from = 0) {
  double d = 0;
  for (size_t i = from; i < a.size() && i < b.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

class SlidingWindowModel : public ::testing::TestWithParam<Tiny> {};

TEST_P(SlidingWindowModel, MatchesTheReferenceForwardAndDiffersFromFullAttention) {
  const Tiny m = GetParam();
  TempDir dir;
  const Weights w = write_tiny(m, dir.path);
  const ModelConfig cfg = load_model_config(dir.path.string());
  EXPECT_EQ(cfg.layer_windows, m.windows);
  CpuBackend be;
  auto model = create_model(cfg, ModelOptions{}, be);
  model->weights().load(Checkpoint(cfg.model_dir), be);
  const auto specs = model->cache_specs();
  ASSERT_EQ(specs.size(), m.windows.size());
  for (size_t i = 0; i < specs.size(); ++i) EXPECT_EQ(specs[i].sliding_window, m.windows[i]) << "layer " << i;

  std::vector<int32_t> ids(48);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 37 + 11) % m.vocab);
  const Mat got = model_logits(*model, be, ids);
  const Mat want = reference_logits(m, w, ids, m.windows);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_LT(max_diff(got, want), 2e-3) << "against the windowed reference";
  // The oracle has teeth: past the window, full attention gives other logits (and before it, the same).
  const Mat full = reference_logits(m, w, ids, {});
  const size_t first_past = static_cast<size_t>(m.window) * m.vocab;
  EXPECT_LT(max_diff(std::vector<double>(full.begin(), full.begin() + static_cast<int64_t>(first_past)), want), 1e-9);
  EXPECT_GT(max_diff(full, want, first_past), 0.05) << "the window changes nothing: a useless check";

  // --disable-sliding-window: every layer attends the whole context.
  auto all_full = create_model(cfg, ModelOptions{.disable_sliding_window = true}, be);
  all_full->weights().load(Checkpoint(cfg.model_dir), be);
  for (const auto& s : all_full->cache_specs()) EXPECT_EQ(s.sliding_window, 0);
  EXPECT_LT(max_diff(model_logits(*all_full, be, ids), full), 2e-3) << "against the full-attention reference";
}

INSTANTIATE_TEST_SUITE_P(
    Configs, SlidingWindowModel,
    ::testing::Values(
        // Mistral: every layer, a window shorter than a KV block.
        Tiny{.architecture = "MistralForCausalLM",
             .layers = 2,
             .window = 5,
             .window_fields = {{"sliding_window", 5}},
             .windows = {5, 5}},
        // Qwen2: layers from max_window_layers on, a window across blocks.
        Tiny{.architecture = "Qwen2ForCausalLM",
             .layers = 3,
             .window = 20,
             .window_fields = {{"use_sliding_window", true}, {"sliding_window", 20}, {"max_window_layers", 1}},
             .windows = {0, 20, 20}},
        // Qwen2 with layer_types (the qwen2_sliding_window fixture's shape): they decide.
        Tiny{.architecture = "Qwen2ForCausalLM",
             .layers = 3,
             .window = 8,
             .window_fields = {{"use_sliding_window", true},
                               {"sliding_window", 8},
                               {"max_window_layers", 2},
                               {"layer_types", {"sliding_attention", "full_attention", "sliding_attention"}}},
             .windows = {8, 0, 8}}),
    [](const auto& info) {
      const std::string& a = info.param.architecture;
      return a.substr(0, a.find("For")) + "_W" + std::to_string(info.param.window);
    });

}  // namespace
}  // namespace tessera
