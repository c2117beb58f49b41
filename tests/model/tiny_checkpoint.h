// Writes a small random Hugging Face model directory (config.json + model.safetensors, bf16)
// for tests that need a shape no fixture has: a vocabulary that TP does not divide, or one
// set of expert weights in both checkpoint layouts (per-expert tensors, and the fused 3-D
// tensors transformers 5 keeps), or block-scaled FP8 projections whose tensor-parallel shards
// stay whole 128 x 128 scale blocks. Values depend only on the seed and the tensor's name (per
// expert), so the two layouts hold the same numbers.
#pragma once
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace tessera::testing {

struct TinyModel {
  // Qwen3ForCausalLM | Qwen3MoeForCausalLM | Qwen2MoeForCausalLM | Qwen3_5MoeForCausalLM (hybrid:
  // every fourth layer gated full attention, the others Gated DeltaNet; MoE with a shared expert)
  std::string architecture = "Qwen3ForCausalLM";
  int hidden = 64, layers = 2, heads = 4, kv_heads = 2, head_dim = 16, vocab = 777, intermediate = 96;
  bool tie_word_embeddings = false;
  // Mixture of experts (the MoE architectures)
  int experts = 0, top_k = 0, moe_intermediate = 0, shared_intermediate = 0, decoder_sparse_step = 1;
  bool norm_topk_prob = true;
  std::vector<int> mlp_only_layers;
  bool fused_experts = false;  // mlp.experts.gate_up_proj [E, 2I, H] / down_proj [E, H, I]
  // Block-scaled FP8 (quant_method fp8, weight_block_size [128, 128]) like the released FP8
  // checkpoints: every attention, MLP and expert projection is e4m3 with a weight_scale_inv
  // per 128 x 128 block; embeddings, norms, the router and lm_head stay bf16.
  bool fp8 = false;
  // Gated DeltaNet (Qwen3_5MoeForCausalLM): key and value heads, one head size for both.
  int linear_key_heads = 2, linear_value_heads = 4, linear_head_dim = 16;
  bool is_hybrid() const { return architecture == "Qwen3_5MoeForCausalLM"; }
  bool is_linear_layer(int i) const { return is_hybrid() && (i + 1) % 4 != 0; }
  bool is_moe_layer(int i) const {
    for (int l : mlp_only_layers)
      if (l == i) return false;
    return experts > 0 && (i + 1) % decoder_sparse_step == 0;
  }
};

// Values in [center - spread, center + spread], a function of (seed, name) alone.
inline std::vector<float> tiny_values(uint32_t seed, const std::string& name, size_t n, float spread,
                                      float center = 0.0f) {
  std::seed_seq s{seed, static_cast<uint32_t>(std::hash<std::string>{}(name))};
  std::mt19937 g(s);
  std::uniform_real_distribution<float> d(center - spread, center + spread);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

inline uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

// A fresh directory under the system's temporary one, removed with its contents at scope end.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string t = (std::filesystem::temp_directory_path() / "tessera-test-XXXXXX").string();
    if (!::mkdtemp(t.data())) throw std::runtime_error("mkdtemp failed");
    path = t;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

class SafetensorsWriter {
 public:
  void add(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& values) {
    size_t n = 1;
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    if (n != values.size()) throw std::runtime_error("SafetensorsWriter: " + name + " size mismatch");
    const size_t begin = data_.size();
    data_.resize(begin + 2 * n);
    for (size_t i = 0; i < n; ++i) {
      uint16_t b = to_bf16(values[i]);
      std::memcpy(data_.data() + begin + 2 * i, &b, 2);
    }
    header_[name] = {{"dtype", "BF16"}, {"shape", shape}, {"data_offsets", {begin, data_.size()}}};
  }
  // `values` [R, C] quantised as an FP8 checkpoint holds them: e4m3 bytes and `name`_scale_inv,
  // the f32 scale of each 128 x 128 block (its largest magnitude over 448).
  void add_fp8(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& values) {
    if (shape.size() != 2 || static_cast<size_t>(shape[0] * shape[1]) != values.size())
      throw std::runtime_error("SafetensorsWriter: " + name + " is not a 2-D weight");
    const int64_t R = shape[0], C = shape[1], rb = (R + 127) / 128, cb = (C + 127) / 128;
    std::vector<float> scale(static_cast<size_t>(rb * cb), 0.0f);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c) {
        float& s = scale[static_cast<size_t>((r / 128) * cb + c / 128)];
        s = std::max(s, std::fabs(values[static_cast<size_t>(r * C + c)]) / 448.0f);
      }
    for (float& s : scale) s = s > 0.0f ? s : 1.0f;
    std::vector<uint8_t> q(values.size());
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c) {
        const size_t i = static_cast<size_t>(r * C + c);
        q[i] = f32_to_fp8e4m3(values[i] / scale[static_cast<size_t>((r / 128) * cb + c / 128)]);
      }
    add_raw(name, "F8_E4M3", shape, q.data(), q.size());
    add_raw(name + "_scale_inv", "F32", {rb, cb}, scale.data(), scale.size() * sizeof(float));
  }
  // A tensor of any safetensors dtype ("F8_E4M3", "F32") from its raw little-endian bytes.
  void add_raw(const std::string& name, const std::string& dtype, std::vector<int64_t> shape, const void* bytes,
               size_t n) {
    const size_t begin = data_.size();
    data_.append(static_cast<const char*>(bytes), n);
    header_[name] = {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {begin, data_.size()}}};
  }
  void write(const std::filesystem::path& p) const {
    std::string h = header_.dump();
    uint64_t len = h.size();
    std::ofstream f(p, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(&len), 8);
    f.write(h.data(), static_cast<std::streamsize>(h.size()));
    f.write(data_.data(), static_cast<std::streamsize>(data_.size()));
    if (!f) throw std::runtime_error("cannot write " + p.string());
  }

 private:
  nlohmann::json header_ = nlohmann::json::object();
  std::string data_;
};

// Writes `m` into `dir` (created): config.json and model.safetensors.
inline void write_tiny_model(const TinyModel& m, const std::filesystem::path& dir, uint32_t seed = 1) {
  std::filesystem::create_directories(dir);
  const bool moe = m.architecture != "Qwen3ForCausalLM", qwen2 = m.architecture == "Qwen2MoeForCausalLM",
             hybrid = m.is_hybrid();
  nlohmann::json c = {{"architectures", {m.architecture}},
                      {"model_type", hybrid  ? "qwen3_5_moe_text"
                                     : qwen2 ? "qwen2_moe"
                                     : moe   ? "qwen3_moe"
                                             : "qwen3"},
                      {"hidden_size", m.hidden},
                      {"intermediate_size", m.intermediate},
                      {"num_hidden_layers", m.layers},
                      {"num_attention_heads", m.heads},
                      {"num_key_value_heads", m.kv_heads},
                      {"head_dim", m.head_dim},
                      {"vocab_size", m.vocab},
                      {"max_position_embeddings", 512},
                      {"rms_norm_eps", 1e-6},
                      {"rope_theta", 10000.0},
                      {"hidden_act", "silu"},
                      {"tie_word_embeddings", m.tie_word_embeddings},
                      {"torch_dtype", "bfloat16"},
                      {"bos_token_id", 1},
                      {"eos_token_id", 2}};
  if (moe) {
    c["num_experts"] = m.experts;
    c["num_experts_per_tok"] = m.top_k;
    c["moe_intermediate_size"] = m.moe_intermediate;
    c["norm_topk_prob"] = m.norm_topk_prob;
    c["decoder_sparse_step"] = m.decoder_sparse_step;
    c["mlp_only_layers"] = m.mlp_only_layers;
    if (qwen2 || hybrid) c["shared_expert_intermediate_size"] = m.shared_intermediate;
  }
  if (hybrid) {
    nlohmann::json types = nlohmann::json::array();
    for (int i = 0; i < m.layers; ++i) types.push_back(m.is_linear_layer(i) ? "linear_attention" : "full_attention");
    c["layer_types"] = types;
    c["linear_conv_kernel_dim"] = 4;
    c["linear_num_key_heads"] = m.linear_key_heads;
    c["linear_num_value_heads"] = m.linear_value_heads;
    c["linear_key_head_dim"] = m.linear_head_dim;
    c["linear_value_head_dim"] = m.linear_head_dim;
    c["partial_rotary_factor"] = 0.25;
    c["rope_parameters"] = {{"partial_rotary_factor", 0.25}, {"rope_theta", 10000.0}, {"rope_type", "default"}};
  }
  if (m.fp8) {
    if (m.fused_experts) throw std::runtime_error("write_tiny_model: FP8 is written for per-expert tensors only");
    nlohmann::json keep = {"lm_head", "model.embed_tokens"};
    for (int i = 0; i < m.layers; ++i) {
      const std::string p = "model.layers." + std::to_string(i) + ".";
      if (m.is_moe_layer(i)) keep.push_back(p + "mlp.gate");
      if (m.is_moe_layer(i) && m.shared_intermediate > 0) keep.push_back(p + "mlp.shared_expert_gate");
      if (m.is_linear_layer(i))
        for (const char* n : {"conv1d", "in_proj_a", "in_proj_b"}) keep.push_back(p + "linear_attn." + n);
    }
    c["quantization_config"] = {{"quant_method", "fp8"},
                                {"activation_scheme", "dynamic"},
                                {"weight_block_size", {128, 128}},
                                {"modules_to_not_convert", keep}};
  }
  std::ofstream(dir / "config.json") << c.dump(2);

  SafetensorsWriter w;
  const int64_t H = m.hidden, D = m.head_dim, V = m.vocab;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, float spread, float center = 0.0f) {
    size_t n = 1;
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    w.add(name, shape, tiny_values(seed, name, n, spread, center));
  };
  auto add_proj = [&](const std::string& name, std::vector<int64_t> shape, float spread) {
    if (!m.fp8) return add(name, shape, spread);
    w.add_fp8(name, shape, tiny_values(seed, name, static_cast<size_t>(shape[0] * shape[1]), spread));
  };
  auto add_mlp = [&](const std::string& p, int64_t I) {
    add_proj(p + "gate_proj.weight", {I, H}, 0.25f);
    add_proj(p + "up_proj.weight", {I, H}, 0.25f);
    add_proj(p + "down_proj.weight", {H, I}, 0.25f);
  };
  add("model.embed_tokens.weight", {V, H}, 1.0f);
  for (int i = 0; i < m.layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    add(p + "input_layernorm.weight", {H}, 0.2f, 1.0f);
    add(p + "post_attention_layernorm.weight", {H}, 0.2f, 1.0f);
    if (m.is_linear_layer(i)) {  // Gated DeltaNet: q | k | v and z projections, conv, decay, gated norm
      const int64_t Hk = m.linear_key_heads, Hv = m.linear_value_heads, Dl = m.linear_head_dim;
      const std::string a = p + "linear_attn.";
      add_proj(a + "in_proj_qkv.weight", {2 * Hk * Dl + Hv * Dl, H}, 0.25f);
      add_proj(a + "in_proj_z.weight", {Hv * Dl, H}, 0.25f);
      add(a + "in_proj_b.weight", {Hv, H}, 0.25f);
      add(a + "in_proj_a.weight", {Hv, H}, 0.25f);
      add(a + "conv1d.weight", {2 * Hk * Dl + Hv * Dl, 1, 4}, 0.5f);
      add(a + "A_log", {Hv}, 0.5f);
      add(a + "dt_bias", {Hv}, 0.5f);
      add(a + "norm.weight", {Dl}, 0.2f, 1.0f);
      add_proj(a + "out_proj.weight", {H, Hv * Dl}, 0.25f);
    } else {
      // Gated attention (hybrid): q_proj rows are [heads, 2, D], each head's query then its gate.
      add_proj(p + "self_attn.q_proj.weight", {(hybrid ? 2 : 1) * m.heads * D, H}, 0.25f);
      add_proj(p + "self_attn.k_proj.weight", {m.kv_heads * D, H}, 0.25f);
      add_proj(p + "self_attn.v_proj.weight", {m.kv_heads * D, H}, 0.25f);
      add_proj(p + "self_attn.o_proj.weight", {H, m.heads * D}, 0.25f);
    }
    if (m.is_linear_layer(i)) {
      // no q / k norms or biases
    } else if (qwen2) {
      add(p + "self_attn.q_proj.bias", {m.heads * D}, 0.1f);
      add(p + "self_attn.k_proj.bias", {m.kv_heads * D}, 0.1f);
      add(p + "self_attn.v_proj.bias", {m.kv_heads * D}, 0.1f);
    } else {
      add(p + "self_attn.q_norm.weight", {D}, 0.2f, 1.0f);
      add(p + "self_attn.k_norm.weight", {D}, 0.2f, 1.0f);
    }
    if (!m.is_moe_layer(i)) {
      add_mlp(p + "mlp.", m.intermediate);
      continue;
    }
    const int64_t E = m.experts, I = m.moe_intermediate;
    add(p + "mlp.gate.weight", {E, H}, 0.5f);
    if (!m.fused_experts) {
      for (int64_t e = 0; e < E; ++e) add_mlp(p + "mlp.experts." + std::to_string(e) + ".", I);
    } else {  // the same per-expert numbers, stacked
      std::vector<float> gate_up, down;
      for (int64_t e = 0; e < E; ++e) {
        const std::string q = p + "mlp.experts." + std::to_string(e) + ".";
        auto g = tiny_values(seed, q + "gate_proj.weight", static_cast<size_t>(I * H), 0.25f);
        auto u = tiny_values(seed, q + "up_proj.weight", static_cast<size_t>(I * H), 0.25f);
        auto d = tiny_values(seed, q + "down_proj.weight", static_cast<size_t>(H * I), 0.25f);
        gate_up.insert(gate_up.end(), g.begin(), g.end());
        gate_up.insert(gate_up.end(), u.begin(), u.end());
        down.insert(down.end(), d.begin(), d.end());
      }
      w.add(p + "mlp.experts.gate_up_proj", {E, 2 * I, H}, gate_up);
      w.add(p + "mlp.experts.down_proj", {E, H, I}, down);
    }
    if (m.shared_intermediate > 0) {
      add_mlp(p + "mlp.shared_expert.", m.shared_intermediate);
      add(p + "mlp.shared_expert_gate.weight", {1, H}, 0.5f);
    }
  }
  add("model.norm.weight", {H}, 0.2f, 1.0f);
  if (!m.tie_word_embeddings) add("lm_head.weight", {V, H}, 0.3f);
  w.write(dir / "model.safetensors");
}

}  // namespace tessera::testing

namespace tessera::testing {

// The generated models tests name as "gen:<key>", written once per process under $TMPDIR
// (write before forking rank processes):
//   vocab777   Qwen3, vocabulary 777 (TP 2 pads it to 778), 3 layers, untied
//   qwen3_moe  Qwen3-MoE, 8 experts top-2 renormalised, layer 0 dense (mlp_only_layers), 3 layers
//   qwen2_moe  Qwen2-MoE, 8 experts top-2, a shared expert with its sigmoid gate, 3 layers
//   qwen3_fp8      Qwen3, block-scaled FP8, 3 layers: hidden 256, 4 query heads and 2 KV heads
//                  of 128, intermediate 512 (every TP 2 shard is whole 128 x 128 blocks)
//   qwen3_moe_fp8  Qwen3-MoE, block-scaled FP8 like qwen3_fp8, 8 experts top-2 of
//                  intermediate 256 (TP 2: 128 rows per rank), layer 0 dense
//   qwen3_5_moe_fp8  Qwen3.5-MoE (hybrid), block-scaled FP8, 4 layers (3 Gated DeltaNet of 2
//                  key / 4 value heads of 128, then gated attention as qwen3_fp8), 8 experts
//                  top-2 and a shared expert, both of intermediate 256
//   qwen3_5_moe_kh4  Qwen3.5-MoE (hybrid), bf16, small: 4 Gated DeltaNet key heads (TP 4
//                  splits them) and 2 KV heads (TP 4 replicates them), 8 experts top-2
inline bool is_generated_model(const std::string& name) { return name.rfind("gen:", 0) == 0; }

inline TinyModel generated_model_spec(const std::string& key) {
  TinyModel m;
  m.layers = 3;
  if (key == "vocab777") return m;
  m.vocab = 300;
  if (key == "qwen3_fp8" || key == "qwen3_moe_fp8" || key == "qwen3_5_moe_fp8") {
    // Every TP 2 shard whole 128 x 128 blocks: 4 query and 2 KV heads of 128, experts of 256.
    m.fp8 = true;
    m.hidden = 256;
    m.heads = 4;
    m.kv_heads = 2;
    m.head_dim = 128;
    m.intermediate = 512;
    if (key == "qwen3_fp8") return m;
    m.experts = 8;
    m.top_k = 2;
    m.moe_intermediate = 256;
    if (key == "qwen3_moe_fp8") {
      m.architecture = "Qwen3MoeForCausalLM";
      m.mlp_only_layers = {0};
      return m;
    }
    m.architecture = "Qwen3_5MoeForCausalLM";
    m.layers = 4;
    m.linear_head_dim = 128;  // 2 key and 4 value heads
    m.shared_intermediate = 256;
    return m;
  }
  m.experts = 8;
  m.top_k = 2;
  m.moe_intermediate = 32;
  if (key == "qwen3_5_moe_kh4") {
    m.architecture = "Qwen3_5MoeForCausalLM";
    m.layers = 4;
    m.linear_key_heads = 4;
    m.linear_value_heads = 8;
    m.linear_head_dim = 16;
    m.shared_intermediate = 48;
    return m;
  }
  if (key == "qwen3_moe") {
    m.architecture = "Qwen3MoeForCausalLM";
    m.mlp_only_layers = {0};
    m.tie_word_embeddings = true;
    return m;
  }
  if (key == "qwen2_moe") {
    m.architecture = "Qwen2MoeForCausalLM";
    m.norm_topk_prob = false;
    m.shared_intermediate = 48;
    return m;
  }
  throw std::runtime_error("unknown generated model " + key);
}

inline std::string generated_model_dir(const std::string& name) {
  // Removed when the process that wrote it exits (forked ranks leave through _exit).
  struct Root {
    pid_t owner = ::getpid();
    std::filesystem::path path = std::filesystem::temp_directory_path() / ("tessera-gen-" + std::to_string(::getpid()));
    ~Root() {
      std::error_code ec;
      if (::getpid() == owner) std::filesystem::remove_all(path, ec);
    }
  };
  static Root root;
  const std::string key = name.substr(4);
  const std::filesystem::path dir = root.path / key;
  if (!std::filesystem::exists(dir / "model.safetensors")) write_tiny_model(generated_model_spec(key), dir, 11);
  return dir.string();
}

}  // namespace tessera::testing
