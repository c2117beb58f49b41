#include "loader/model_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <type_traits>

#include "core/error.h"
#include "core/json_depth.h"

namespace tessera {

namespace fs = std::filesystem;

namespace {

nlohmann::json read_json(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) fail(ErrorKind::kNotFound, "{}: file not found", p.string());
  std::ostringstream text;
  text << f.rdbuf();
  check_json_file_depth(text.view(), p.string());
  try {
    return nlohmann::json::parse(text.view());
  } catch (const std::exception& e) {
    fail(ErrorKind::kCorrupt, "{}: does not parse as JSON ({})", p.string(), json_error_text(e));
  }
}

// The type checks are explicit: nlohmann's get<T>() converts between number kinds and
// would turn "hidden_size": 64.9 into 64 or a bool into 1.
template <typename T>
T get_or(const std::string& source, const nlohmann::json& j, const char* key, T fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  bool ok;
  if constexpr (std::is_same_v<T, bool>)
    ok = it->is_boolean();
  else if constexpr (std::is_integral_v<T>)
    ok = it->is_number_integer();
  else if constexpr (std::is_floating_point_v<T>)
    ok = it->is_number();
  else
    ok = it->is_string();
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    // Out-of-range integers would wrap.
    if (ok)
      ok = it->is_number_unsigned() ? it->get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max())
                                    : it->get<int64_t>() >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
                                          it->get<int64_t>() <= static_cast<int64_t>(std::numeric_limits<T>::max());
  }
  if (!ok) fail(ErrorKind::kCorrupt, "{}: field '{}' has the wrong type or range ({})", source, key, it->dump());
  return it->get<T>();
}

// A token id or a list of them (eos_token_id). Ids must be integers in 0 .. 2^31 - 1: a wrapped one would
// never match a token, so generation would not stop.
std::vector<int> int_or_list(const std::string& source, const nlohmann::json& j, const char* key) {
  std::vector<int> out;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return out;
  auto id = [&](const nlohmann::json& v) {
    bool ok =
        v.is_number_integer() && (v.is_number_unsigned() ? v.get<uint64_t>() <= INT32_MAX
                                                         : v.get<int64_t>() >= 0 && v.get<int64_t>() <= INT32_MAX);
    if (!ok)
      fail(ErrorKind::kCorrupt, "{}: '{}' must be a token id or a list of them (integers 0 .. 2^31 - 1); got {}",
           source, key, it->dump());
    out.push_back(v.get<int>());
  };
  if (it->is_array()) {
    for (const auto& v : *it) id(v);
  } else {
    id(*it);
  }
  return out;
}

// A size field: an integer in [min, max], named in the error. The bounds are far beyond real models; a
// value past them is a damaged file, and would overflow the arithmetic that sizes weights and caches.
void check_range(const std::string& source, const char* key, int64_t value, int64_t min, int64_t max) {
  if (value < min || value > max)
    fail(ErrorKind::kCorrupt, "{}: '{}' is {}; it must be between {} and {}", source, key, value, min, max);
}

// A real field that must be a finite number above zero (rope_theta, rms_norm_eps, rope factors).
void check_positive(const std::string& source, const char* key, double value) {
  if (!(value > 0) || !std::isfinite(value))
    fail(ErrorKind::kCorrupt, "{}: '{}' is {}; it must be a finite number above 0", source, key, value);
}

RopeScaling parse_rope(const nlohmann::json& r, const std::string& source) {
  RopeScaling s;
  std::string type = get_or<std::string>(source, r, "rope_type", get_or<std::string>(source, r, "type", "default"));
  if (type != "default" && type != "linear" && type != "dynamic" && type != "llama3" && type != "yarn")
    fail(ErrorKind::kUnsupported,
         "{}: rope type '{}' is not supported (supported: default, linear, dynamic, llama3, yarn)", source, type);
  s.type = type;
  s.factor = get_or<double>(source, r, "factor", 1.0);
  s.low_freq_factor = get_or<double>(source, r, "low_freq_factor", 1.0);
  s.high_freq_factor = get_or<double>(source, r, "high_freq_factor", 4.0);
  s.original_max_position_embeddings = get_or<int>(source, r, "original_max_position_embeddings", 0);
  s.beta_fast = get_or<double>(source, r, "beta_fast", 32.0);
  s.beta_slow = get_or<double>(source, r, "beta_slow", 1.0);
  s.mscale = get_or<double>(source, r, "mscale", 0.0);
  s.mscale_all_dim = get_or<double>(source, r, "mscale_all_dim", 0.0);
  if (r.contains("attention_factor") && !r["attention_factor"].is_null())
    s.attention_factor = get_or<double>(source, r, "attention_factor", 1.0);
  s.truncate = get_or<bool>(source, r, "truncate", true);
  check_positive(source, "rope_scaling.factor", s.factor);
  if (s.original_max_position_embeddings < 0)
    fail(ErrorKind::kCorrupt, "{}: 'original_max_position_embeddings' must not be negative", source);
  // mrope_section / mrope_interleaved (Qwen3.5's multimodal rope) need no handling: a text
  // token has the same position in every section, which is the plain rope.
  return s;
}

MoeConfig parse_moe(const nlohmann::json& t, int num_layers, const std::string& source) {
  MoeConfig m;
  // transformers 5 writes Qwen3-MoE's expert count as num_local_experts.
  m.num_experts = get_or<int>(source, t, "num_experts", 0);
  const int local = get_or<int>(source, t, "num_local_experts", 0);
  if (m.num_experts > 0 && local > 0 && local != m.num_experts)
    fail(ErrorKind::kCorrupt, "{}: num_experts ({}) and num_local_experts ({}) disagree", source, m.num_experts, local);
  if (m.num_experts == 0) m.num_experts = local;
  if (m.num_experts < 0) fail(ErrorKind::kCorrupt, "{}: num_experts must not be negative", source);
  check_range(source, "num_experts", m.num_experts, 0, 1 << 16);
  if (m.num_experts == 0) return m;
  m.num_experts_per_tok = get_or<int>(source, t, "num_experts_per_tok", 0);
  m.moe_intermediate_size = get_or<int>(source, t, "moe_intermediate_size", 0);
  m.shared_expert_intermediate_size = get_or<int>(source, t, "shared_expert_intermediate_size", 0);
  m.decoder_sparse_step = get_or<int>(source, t, "decoder_sparse_step", 1);
  m.norm_topk_prob = get_or<bool>(source, t, "norm_topk_prob", false);
  if (m.num_experts_per_tok < 1 || m.num_experts_per_tok > m.num_experts)
    fail(ErrorKind::kCorrupt, "{}: num_experts_per_tok ({}) must be between 1 and num_experts ({})", source,
         m.num_experts_per_tok, m.num_experts);
  if (m.moe_intermediate_size <= 0)
    fail(ErrorKind::kCorrupt, "{}: moe_intermediate_size must be positive for a model with {} experts", source,
         m.num_experts);
  if (m.decoder_sparse_step < 1)
    fail(ErrorKind::kCorrupt, "{}: decoder_sparse_step must be at least 1 (got {})", source, m.decoder_sparse_step);
  if (m.shared_expert_intermediate_size < 0)
    fail(ErrorKind::kCorrupt, "{}: shared_expert_intermediate_size must not be negative", source);
  check_range(source, "moe_intermediate_size", m.moe_intermediate_size, 1, 1 << 22);
  check_range(source, "shared_expert_intermediate_size", m.shared_expert_intermediate_size, 0, 1 << 22);
  if (auto it = t.find("mlp_only_layers"); it != t.end() && !it->is_null()) {
    if (!it->is_array()) fail(ErrorKind::kCorrupt, "{}: mlp_only_layers must be a list ({})", source, it->dump());
    for (const auto& v : *it) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= num_layers)
        fail(ErrorKind::kCorrupt, "{}: mlp_only_layers entry {} is not a layer index below {}", source, v.dump(),
             num_layers);
      m.mlp_only_layers.push_back(v.get<int>());
    }
  }
  // Routing variants of other MoE families: they change the maths, and we do not run them.
  for (const char* key : {"scoring_func", "topk_method", "n_group", "topk_group", "n_shared_experts",
                          "first_k_dense_replace", "moe_layer_freq"}) {
    auto it = t.find(key);
    if (it != t.end() && !it->is_null())
      fail(ErrorKind::kUnsupported, "{}: MoE field '{}' ({}) is not supported (tessera routes as Qwen2/Qwen3-MoE do)",
           source, key, it->dump());
  }
  if (auto it = t.find("routed_scaling_factor");
      it != t.end() && !it->is_null() && !(it->is_number() && it->get<double>() == 1.0))
    fail(ErrorKind::kUnsupported, "{}: routed_scaling_factor {} is not supported (only 1.0)", source, it->dump());
  return m;
}

// layer_types (or the older full_attention_interval) and the Gated DeltaNet shape of the
// hybrid families; nothing for the other models.
void parse_hybrid(const nlohmann::json& t, const std::string& source, ModelConfig& c) {
  if (auto it = t.find("layer_types"); it != t.end() && !it->is_null()) {
    if (!it->is_array() || static_cast<int>(it->size()) != c.num_layers)
      fail(ErrorKind::kCorrupt, "{}: layer_types must list one type per layer ({} layers): {}", source, c.num_layers,
           it->dump());
    for (const auto& v : *it) {
      const std::string type = v.is_string() ? v.get<std::string>() : v.dump();
      if (type == "full_attention" || type == "sliding_attention")  // (the window: parse_sliding_window)
        c.layer_types.push_back(LayerType::kFullAttention);
      else if (type == "linear_attention")
        c.layer_types.push_back(LayerType::kLinearAttention);
      else
        fail(ErrorKind::kUnsupported,
             "{}: layer_types entry '{}' is not supported (supported: full_attention, sliding_attention, "
             "linear_attention)",
             source, type);
    }
  } else if (const int interval = get_or<int>(source, t, "full_attention_interval", 0); interval != 0) {
    if (interval < 1) fail(ErrorKind::kCorrupt, "{}: full_attention_interval must be positive", source);
    for (int i = 0; i < c.num_layers; ++i)
      c.layer_types.push_back((i + 1) % interval == 0 ? LayerType::kFullAttention : LayerType::kLinearAttention);
  }
  if (!c.is_hybrid()) return;
  LinearAttnConfig& l = c.linear;
  l.conv_kernel = get_or<int>(source, t, "linear_conv_kernel_dim", 0);
  l.key_head_dim = get_or<int>(source, t, "linear_key_head_dim", 0);
  l.value_head_dim = get_or<int>(source, t, "linear_value_head_dim", 0);
  l.num_key_heads = get_or<int>(source, t, "linear_num_key_heads", 0);
  l.num_value_heads = get_or<int>(source, t, "linear_num_value_heads", 0);
  if (l.conv_kernel < 2 || l.key_head_dim <= 0 || l.value_head_dim <= 0 || l.num_key_heads <= 0 ||
      l.num_value_heads <= 0)
    fail(ErrorKind::kCorrupt,
         "{}: linear-attention layers need linear_conv_kernel_dim >= 2 and positive linear_key_head_dim, "
         "linear_value_head_dim, linear_num_key_heads and linear_num_value_heads",
         source);
  check_range(source, "linear_conv_kernel_dim", l.conv_kernel, 2, 1 << 10);
  check_range(source, "linear_key_head_dim", l.key_head_dim, 1, 1 << 14);
  check_range(source, "linear_value_head_dim", l.value_head_dim, 1, 1 << 14);
  check_range(source, "linear_num_key_heads", l.num_key_heads, 1, 1 << 12);
  check_range(source, "linear_num_value_heads", l.num_value_heads, 1, 1 << 12);
  if (l.num_value_heads % l.num_key_heads != 0)
    fail(ErrorKind::kCorrupt, "{}: linear_num_value_heads ({}) is not a multiple of linear_num_key_heads ({})", source,
         l.num_value_heads, l.num_key_heads);
  // Qwen3-Next / Qwen3.5 attention always gates its output; a config that turns it off
  // describes other maths.
  if (!get_or<bool>(source, t, "attn_output_gate", true))
    fail(ErrorKind::kUnsupported, "{}: attn_output_gate=false is not supported (hybrid models gate attention)", source);
}

// Sliding-window attention, as transformers configures it. Qwen2-style configs (they have
// use_sliding_window; Qwen2, Qwen3 and their MoE variants): the window is sliding_window when
// use_sliding_window is true, none otherwise; layer_types, when present, names the windowed layers
// ("sliding_attention"), else the layers from max_window_layers on are. Mistral (model_type
// "mistral"): a sliding_window value windows every layer, null none (MistralModel reads no
// layer_types). Other families (Llama) ignore sliding_window and sliding_attention layer types, as
// their transformers models do.
void parse_sliding_window(const nlohmann::json& t, const std::string& source, ModelConfig& c) {
  const bool qwen2_style = t.contains("use_sliding_window") && !t["use_sliding_window"].is_null();
  const bool mistral = !qwen2_style && c.model_type == "mistral";
  const bool use = get_or<bool>(source, t, "use_sliding_window", false);
  // transformers' Qwen2 default is 4096 when the field is absent; null is no window. (Qwen2-MoE
  // configs write sliding_window 0 beside use_sliding_window false: no window either.)
  const bool set = t.contains("sliding_window") && !t["sliding_window"].is_null();
  int window = get_or<int>(source, t, "sliding_window", qwen2_style && !t.contains("sliding_window") ? 4096 : 0);
  if (qwen2_style && !use) window = 0;
  if (window < 0 || (set && window == 0 && (use || mistral)))
    fail(ErrorKind::kCorrupt, "{}: sliding_window is {}; a windowed model needs a window of at least 1 token", source,
         t["sliding_window"].dump());
  if (window > 0) check_range(source, "sliding_window", window, 1, 1 << 30);
  std::vector<bool> windowed(static_cast<size_t>(c.num_layers), false);
  const auto types = t.find("layer_types");  // (its shape: parse_hybrid)
  const bool has_types = types != t.end() && types->is_array();
  if (has_types && c.is_hybrid())
    for (const auto& v : *types)
      if (v == "sliding_attention")
        fail(ErrorKind::kUnsupported,
             "{}: layer_types mixes linear_attention and sliding_attention layers; this is not supported", source);
  if (qwen2_style && has_types) {
    for (int i = 0; i < c.num_layers; ++i) {
      if ((*types)[static_cast<size_t>(i)] != "sliding_attention") continue;
      if (window == 0)
        fail(ErrorKind::kCorrupt,
             "{}: layer_types marks layer {} sliding_attention, but the config sets no window (sliding_window {}, "
             "use_sliding_window {})",
             source, i, t.value("sliding_window", nlohmann::json()).dump(),
             t.value("use_sliding_window", nlohmann::json()).dump());
      windowed[static_cast<size_t>(i)] = true;
    }
  } else if (window > 0 && (qwen2_style || mistral)) {                                    // (Mistral: every layer)
    const int first = qwen2_style ? get_or<int>(source, t, "max_window_layers", 28) : 0;  // (transformers' default)
    if (first < 0) fail(ErrorKind::kCorrupt, "{}: max_window_layers must not be negative (got {})", source, first);
    for (int i = first; i < c.num_layers; ++i) windowed[static_cast<size_t>(i)] = true;
  }
  if (std::find(windowed.begin(), windowed.end(), true) == windowed.end()) return;
  c.sliding_window = window;
  for (bool w : windowed) c.layer_windows.push_back(w ? window : 0);
}

// The sizes every model has, each named when it is out of range.
void check_sizes(const std::string& source, const ModelConfig& c) {
  check_range(source, "hidden_size", c.hidden_size, 1, 1 << 20);
  check_range(source, "intermediate_size", c.intermediate_size, 0, 1 << 22);
  check_range(source, "num_hidden_layers", c.num_layers, 1, 1 << 12);
  check_range(source, "num_attention_heads", c.num_heads, 1, 1 << 12);
  check_range(source, "num_key_value_heads", c.num_kv_heads, 1, 1 << 12);
  check_range(source, "vocab_size", c.vocab_size, 1, 1 << 24);
}

}  // namespace

bool ModelConfig::is_hybrid() const {
  return std::find(layer_types.begin(), layer_types.end(), LayerType::kLinearAttention) != layer_types.end();
}

int ModelConfig::layer_window(int layer) const {
  return layer_windows.empty() ? 0 : layer_windows[static_cast<size_t>(layer)];
}

void disable_sliding_window(ModelConfig& c) {
  c.layer_windows.clear();
  c.sliding_window = 0;
}

bool MoeConfig::is_moe_layer(int layer) const {
  if (num_experts <= 0) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) return false;
  return (layer + 1) % decoder_sparse_step == 0;
}

ModelConfig parse_model_config(const nlohmann::json& j, const std::string& source) {
  ModelConfig c;
  if (!j.is_object()) fail(ErrorKind::kCorrupt, "{}: is not a JSON object", source);
  c.raw = j;
  // Multimodal wrappers (Qwen3.5) keep the language model under text_config.
  c.nested_text_config = j.contains("text_config") && j["text_config"].is_object();
  const nlohmann::json& t = c.nested_text_config ? j["text_config"] : j;
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty()) {
    if (!j["architectures"][0].is_string())
      fail(ErrorKind::kCorrupt, "{}: 'architectures' must list class names ({})", source, j["architectures"].dump());
    c.architecture = j["architectures"][0].get<std::string>();
  }
  c.model_type = get_or<std::string>(source, t, "model_type", get_or<std::string>(source, j, "model_type", ""));
  if (c.architecture.empty())
    fail(ErrorKind::kCorrupt, "{}: no 'architectures' entry; cannot tell which model this is", source);
  c.hidden_size = get_or<int>(source, t, "hidden_size", 0);
  c.intermediate_size = get_or<int>(source, t, "intermediate_size", 0);
  c.num_layers = get_or<int>(source, t, "num_hidden_layers", 0);
  c.num_heads = get_or<int>(source, t, "num_attention_heads", 0);
  c.num_kv_heads = get_or<int>(source, t, "num_key_value_heads", c.num_heads);
  c.vocab_size = get_or<int>(source, t, "vocab_size", 0);
  check_sizes(source, c);
  c.head_dim = get_or<int>(source, t, "head_dim", c.hidden_size / c.num_heads);
  if (c.head_dim <= 0) fail(ErrorKind::kCorrupt, "{}: head_dim must be positive (got {})", source, c.head_dim);
  check_range(source, "head_dim", c.head_dim, 1, 1 << 14);
  if (c.num_heads % c.num_kv_heads != 0)
    fail(ErrorKind::kCorrupt, "{}: num_attention_heads ({}) is not a multiple of num_key_value_heads ({})", source,
         c.num_heads, c.num_kv_heads);
  c.max_position_embeddings = get_or<int>(source, t, "max_position_embeddings", 4096);
  check_range(source, "max_position_embeddings", c.max_position_embeddings, 1, 1 << 30);
  c.rms_norm_eps = get_or<double>(source, t, "rms_norm_eps", 1e-6);
  check_positive(source, "rms_norm_eps", c.rms_norm_eps);
  c.tie_word_embeddings =
      get_or<bool>(source, t, "tie_word_embeddings", get_or<bool>(source, j, "tie_word_embeddings", false));
  c.attention_bias = get_or<bool>(source, t, "attention_bias", false);
  c.partial_rotary_factor = get_or<double>(source, t, "partial_rotary_factor", 1.0);
  // transformers >= 5 writes rope_parameters {rope_type, rope_theta, ...}; older files
  // write rope_theta and rope_scaling separately.
  if (t.contains("rope_parameters") && t["rope_parameters"].is_object()) {
    const auto& rp = t["rope_parameters"];
    c.rope_theta = get_or<double>(source, rp, "rope_theta", get_or<double>(source, t, "rope_theta", 10000.0));
    c.rope = parse_rope(rp, source);
    c.partial_rotary_factor = get_or<double>(source, rp, "partial_rotary_factor", c.partial_rotary_factor);
  } else {
    c.rope_theta = get_or<double>(source, t, "rope_theta", 10000.0);
    if (t.contains("rope_scaling") && t["rope_scaling"].is_object()) c.rope = parse_rope(t["rope_scaling"], source);
  }
  check_positive(source, "rope_theta", c.rope_theta);
  // As vLLM: linear and yarn scaling serve factor x the original length (yarn's original_max_position_embeddings,
  // else max_position_embeddings); the rotary table and the --max-model-len cap follow.
  if ((c.rope.type == "linear" || c.rope.type == "yarn") && c.rope.factor > 1) {
    const int base = c.rope.type == "yarn" && c.rope.original_max_position_embeddings > 0
                         ? c.rope.original_max_position_embeddings
                         : c.max_position_embeddings;
    const double scaled = std::floor(static_cast<double>(base) * c.rope.factor);
    if (scaled > c.max_position_embeddings && scaled <= double(1 << 30)) {
      if (c.rope.type == "yarn" && c.rope.original_max_position_embeddings == 0)
        c.rope.original_max_position_embeddings = c.max_position_embeddings;  // the rope keeps its base length
      c.max_position_embeddings = static_cast<int>(scaled);
    }
  }
  if (!(c.partial_rotary_factor > 0 && c.partial_rotary_factor <= 1))
    fail(ErrorKind::kCorrupt, "{}: 'partial_rotary_factor' is {}; it must be in (0, 1]", source,
         c.partial_rotary_factor);
  // A wrapper's own dtype is the checkpoint's (its text_config may say float32).
  std::string dt = get_or<std::string>(source, t, "torch_dtype", get_or<std::string>(source, t, "dtype", "bfloat16"));
  if (c.nested_text_config)
    dt = get_or<std::string>(source, j, "torch_dtype", get_or<std::string>(source, j, "dtype", dt));
  if (auto d = dtype_from_name(dt)) c.dtype = *d;
  std::string act = get_or<std::string>(source, t, "hidden_act", "silu");
  if (act != "silu")
    fail(ErrorKind::kUnsupported, "{}: hidden_act '{}' is not supported (supported: silu)", source, act);
  if (get_or<bool>(source, t, "mlp_bias", false))
    fail(ErrorKind::kUnsupported, "{}: mlp_bias=true is not supported", source);
  if (j.contains("quantization_config") && !j["quantization_config"].is_null())
    c.quant = parse_quantization_config(j["quantization_config"], source);
  c.moe = parse_moe(t, c.num_layers, source);
  parse_hybrid(t, source, c);
  parse_sliding_window(t, source, c);
  // Qwen3-Next / Qwen3.5 without the field: one, as vLLM's MTP models assume.
  const bool mtp_family = c.model_type.rfind("qwen3_next", 0) == 0 || c.model_type.rfind("qwen3_5", 0) == 0;
  c.num_mtp_layers = get_or<int>(source, t, "mtp_num_hidden_layers",
                                 get_or<int>(source, t, "num_nextn_predict_layers", mtp_family ? 1 : 0));
  if (c.num_mtp_layers < 0) fail(ErrorKind::kCorrupt, "{}: mtp_num_hidden_layers must not be negative", source);
  check_range(source, "mtp_num_hidden_layers", c.num_mtp_layers, 0, 64);
  if (auto b = get_or<int>(source, t, "bos_token_id", -1); b >= 0) c.bos_token_id = b;
  c.eos_token_ids = int_or_list(source, t, "eos_token_id");
  return c;
}

bool QuantConfig::excluded(const std::string& name) const {
  for (const auto& m : modules_to_not_convert)
    if (!m.empty() && name.compare(0, m.size(), m) == 0 && (name.size() == m.size() || name[m.size()] == '.'))
      return true;
  return false;
}

namespace {

// Quantisation methods of transformers / vLLM checkpoints other than FP8 blocks: their weight
// format, so that the refusal names what the checkpoint holds (tessera has no kernels for them).
struct OtherMethod {
  const char* quant_method;
  const char* origin;
  WeightFormat (*format)(const nlohmann::json& q);
};

WeightFormat int4_groups(const nlohmann::json& q) {
  auto g = q.find("group_size");
  return int4_group_format(g != q.end() && g->is_number_integer() && g->get<int64_t>() > 0 ? g->get<int64_t>() : 128);
}
WeightFormat nvfp4(const nlohmann::json&) { return nvfp4_format(); }
WeightFormat mxfp4(const nlohmann::json&) { return mxfp4_format(); }

constexpr OtherMethod kOtherMethods[] = {
    {"awq", "AWQ", int4_groups},         {"gptq", "GPTQ", int4_groups},
    {"awq_marlin", "AWQ", int4_groups},  {"gptq_marlin", "GPTQ", int4_groups},
    {"modelopt_fp4", "ModelOpt", nvfp4}, {"nvfp4", "NVFP4", nvfp4},
    {"mxfp4", "MXFP4", mxfp4},
};

}  // namespace

QuantConfig parse_quantization_config(const nlohmann::json& q, const std::string& source) {
  if (!q.is_object())
    fail(ErrorKind::kUnsupported,
         "{}: quantization_config {} is not supported (supported: an object with quant_method fp8)", source, q.dump());
  const std::string method = get_or<std::string>(source, q, "quant_method", "");
  for (const auto& m : kOtherMethods)
    if (method == m.quant_method)
      fail(ErrorKind::kUnsupported,
           "{}: quantization_config.quant_method '{}' ({} weights: {}) is not supported (supported: fp8 with "
           "weight_block_size [128, 128]); serve the model's bf16 or FP8 checkpoint",
           source, method, m.origin, m.format(q).describe());
  if (method != "fp8")
    fail(ErrorKind::kUnsupported,
         "{}: quantization_config.quant_method '{}' is not supported (supported: fp8 with weight_block_size [128, "
         "128])",
         source, method.empty() ? "(missing)" : method);
  QuantConfig qc;
  qc.from_checkpoint = true;
  int64_t block_n = 0, block_k = 0;
  auto names = [&](const char* key) {
    auto it = q.find(key);
    if (it == q.end() || it->is_null()) return;
    if (!it->is_array())
      fail(ErrorKind::kCorrupt, "{}: quantization_config.{} must be a list of module names (got {})", source, key,
           it->dump());
    for (const auto& v : *it) {
      if (!v.is_string())
        fail(ErrorKind::kCorrupt, "{}: quantization_config.{} must be a list of module names (got {})", source, key,
             v.dump());
      qc.modules_to_not_convert.push_back(v.get<std::string>());
    }
  };
  for (const auto& [key, v] : q.items()) {
    if (key == "quant_method") continue;
    if (key == "fmt") {
      const std::string fmt = get_or<std::string>(source, q, "fmt", "e4m3");
      if (fmt != "e4m3")
        fail(ErrorKind::kUnsupported, "{}: quantization_config.fmt '{}' is not supported (supported: e4m3)", source,
             fmt);
    } else if (key == "activation_scheme") {
      const std::string a = get_or<std::string>(source, q, "activation_scheme", "dynamic");
      if (a != "dynamic")
        fail(ErrorKind::kUnsupported,
             "{}: quantization_config.activation_scheme '{}' is not supported (supported: dynamic; static "
             "activation scales are not implemented)",
             source, a);
    } else if (key == "weight_block_size") {
      if (v.is_null()) continue;  // checked below
      if (!v.is_array() || v.size() != 2 || !v[0].is_number_integer() || !v[1].is_number_integer())
        fail(ErrorKind::kCorrupt, "{}: quantization_config.weight_block_size must be [rows, cols] (got {})", source,
             v.dump());
      block_n = v[0].get<int64_t>();
      block_k = v[1].get<int64_t>();
    } else if (key == "modules_to_not_convert" || key == "ignored_layers") {
      names(key.c_str());
    } else if (key == "scale_fmt") {
      const std::string f = get_or<std::string>(source, q, "scale_fmt", "float");
      if (f != "float")
        fail(ErrorKind::kUnsupported,
             "{}: quantization_config.scale_fmt '{}' is not supported (supported: float32 scales)", source, f);
    } else if (key == "dequantize") {
      if (get_or<bool>(source, q, "dequantize", false))
        fail(ErrorKind::kUnsupported,
             "{}: quantization_config.dequantize=true is not supported (tessera keeps FP8 weights as FP8)", source);
    } else if (key == "modules_to_convert") {
      if (!v.is_null())
        fail(ErrorKind::kUnsupported,
             "{}: quantization_config.modules_to_convert is not supported (list the unquantised modules in "
             "modules_to_not_convert instead)",
             source);
    } else {
      fail(ErrorKind::kUnsupported,
           "{}: quantization_config.{} is not supported (known fields: quant_method, fmt, activation_scheme, "
           "weight_block_size, modules_to_not_convert, ignored_layers, scale_fmt)",
           source, key);
    }
  }
  if (!q.contains("weight_block_size") || q["weight_block_size"].is_null())
    fail(ErrorKind::kUnsupported,
         "{}: quantization_config without weight_block_size (per-tensor FP8) is not supported (supported: "
         "weight_block_size [128, 128])",
         source);
  qc.format = fp8_block_format();
  if (block_n != qc.format.block_rows || block_k != qc.format.block_cols)
    fail(ErrorKind::kUnsupported,
         "{}: quantization_config.weight_block_size [{}, {}] is not supported (supported: [128, 128])", source, block_n,
         block_k);
  return qc;
}

GenerationDefaults load_generation_config(const std::string& dir) {
  GenerationDefaults d;
  const fs::path file = fs::path(dir) / "generation_config.json";
  if (!fs::exists(file)) return d;
  const nlohmann::json g = read_json(file);
  if (!g.is_object()) fail(ErrorKind::kCorrupt, "{}: not a JSON object", file.string());
  // These become the defaults of every request that sets none: a value the engine would refuse (temperature
  // -1) fails here, naming the file, instead of as a 400 that blames each client. Ranges as validate_request's.
  // A field of another type is ignored, as vLLM ignores it.
  const std::string source = file.string();
  auto real = [&](const char* key, std::optional<double>& out, double min, double max, bool min_open) {
    auto it = g.find(key);
    if (it == g.end() || !it->is_number()) return;
    double v = it->get<double>();
    if (!(min_open ? v > min : v >= min) || !(v <= max))
      fail(ErrorKind::kCorrupt,
           "{}: '{}' is {}; it must be in {}{}, {}] (it is the default of every request that sets none: fix the "
           "file, or start with --generation-config vllm to ignore it)",
           source, key, it->dump(), min_open ? "(" : "[", min, max);
    out = v;
  };
  auto integer = [&](const char* key, std::optional<int>& out, int64_t min) {
    auto it = g.find(key);
    if (it == g.end() || !it->is_number_integer()) return;
    int64_t v =
        it->is_number_unsigned() && it->get<uint64_t>() > INT32_MAX ? int64_t{INT32_MAX} + 1 : it->get<int64_t>();
    check_range(source, key, v, min, INT32_MAX);
    out = static_cast<int>(v);
  };
  real("temperature", d.temperature, 0, 100, false);
  real("top_p", d.top_p, 0, 1, true);
  real("min_p", d.min_p, 0, 1, false);
  real("repetition_penalty", d.repetition_penalty, 0, 10, true);
  integer("top_k", d.top_k, -1);
  integer("max_new_tokens", d.max_new_tokens, 1);
  d.eos_token_ids = int_or_list(source, g, "eos_token_id");
  return d;
}

namespace {

void merge_fields(nlohmann::json& into, const nlohmann::json& from) {
  for (const auto& item : from.items()) {
    nlohmann::json& slot = into[item.key()];
    if (slot.is_object() && item.value().is_object())
      merge_fields(slot, item.value());
    else
      slot = item.value();
  }
}

}  // namespace

nlohmann::json apply_hf_overrides(nlohmann::json config, const nlohmann::json& overrides, const std::string& flag) {
  if (overrides.is_null() || (overrides.is_object() && overrides.empty())) return config;
  if (!overrides.is_object())
    fail(ErrorKind::kInvalidArgument, "{} must be a JSON object of config.json fields, e.g. '{{\"rope_theta\": 1e6}}'",
         flag);
  if (!config.is_object()) return config;
  const bool wrapper = config.contains("text_config") && config["text_config"].is_object();
  for (const auto& item : overrides.items()) {
    const std::string& key = item.key();
    const bool to_text =
        wrapper && key != "text_config" && !(config.contains(key) && !config["text_config"].contains(key));
    nlohmann::json& target = to_text ? config["text_config"] : config;
    merge_fields(target, nlohmann::json{{key, item.value()}});
    // transformers 5 keeps rope_theta and the scaling in rope_parameters, which the reader prefers.
    if ((key == "rope_scaling" || key == "rope_theta") && target.contains("rope_parameters") &&
        target["rope_parameters"].is_object()) {
      if (key == "rope_theta")
        target["rope_parameters"]["rope_theta"] = item.value();
      else if (item.value().is_object())
        merge_fields(target["rope_parameters"], item.value());
    }
  }
  return config;
}

ModelConfig load_model_config(const std::string& model_dir, const nlohmann::json& hf_overrides) {
  fs::path dir(model_dir);
  if (!fs::is_directory(dir)) fail(ErrorKind::kNotFound, "{}: model directory not found", model_dir);
  const bool overridden = hf_overrides.is_object() && !hf_overrides.empty();
  ModelConfig c = parse_model_config(apply_hf_overrides(read_json(dir / "config.json"), hf_overrides, "--hf-overrides"),
                                     (dir / "config.json").string() + (overridden ? " with --hf-overrides" : ""));
  c.model_dir = model_dir;
  for (int e : load_generation_config(model_dir).eos_token_ids)
    if (std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), e) == c.eos_token_ids.end())
      c.eos_token_ids.push_back(e);
  return c;
}

}  // namespace tessera
