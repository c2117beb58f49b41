// config.json and generation_config.json of a Hugging Face model directory, parsed
// into plain structs. Fields that would change the maths and that we do not
// implement fail loudly here rather than produce gibberish later.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/weight_format.h"

namespace tessera {

struct RopeScaling {
  std::string type = "default";  // default | linear | dynamic | llama3 | yarn
  double factor = 1.0;
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // llama3
  int original_max_position_embeddings = 0;              // llama3, yarn, dynamic
  double beta_fast = 32.0, beta_slow = 1.0;              // yarn
  double mscale = 0.0, mscale_all_dim = 0.0;             // yarn (DeepSeek style)
  std::optional<double> attention_factor;                // yarn
  bool truncate = true;                                  // yarn
};

// What a model's generation_config.json sets (vLLM's --generation-config): sampling defaults
// (max_new_tokens is the default max_tokens) and end-of-sequence ids. Fields of the wrong type
// are ignored, as absent ones.
struct GenerationDefaults {
  std::optional<double> temperature, top_p, min_p, repetition_penalty;
  std::optional<int> top_k, max_new_tokens;
  std::vector<int> eos_token_ids;
  // Whether it changes any sampling parameter (what vLLM logs at startup).
  bool sets_sampling() const { return temperature || top_p || top_k || min_p || repetition_penalty; }
};

// Mixture-of-experts fields (Qwen2-MoE / Qwen3-MoE names). num_experts == 0: a dense model.
struct MoeConfig {
  int num_experts = 0;
  int num_experts_per_tok = 0;  // k
  int moe_intermediate_size = 0;
  int shared_expert_intermediate_size = 0;  // 0: no shared expert
  int decoder_sparse_step = 1;
  bool norm_topk_prob = false;  // renormalise the top-k probabilities to sum to 1
  std::vector<int> mlp_only_layers;
  // transformers' rule: layer i is sparse iff i is not in mlp_only_layers, num_experts > 0 and
  // (i + 1) % decoder_sparse_step == 0; the other layers have a dense MLP of intermediate_size.
  bool is_moe_layer(int layer) const;
};

// Hybrid models (Qwen3-Next, Qwen3.5): which layers are Gated DeltaNet (linear attention)
// and the shape of those layers. Empty layer_types: every layer is full attention.
enum class LayerType { kFullAttention, kLinearAttention };
struct LinearAttnConfig {
  int conv_kernel = 0;                       // linear_conv_kernel_dim
  int key_head_dim = 0, value_head_dim = 0;  // linear_key_head_dim, linear_value_head_dim
  int num_key_heads = 0, num_value_heads = 0;
};

// A checkpoint's quantised weights (config.json's quantization_config) as a WeightFormat
// (core/weight_format.h), which the weight store and the backends dispatch on. Supported:
// block-scaled FP8 (quant_method "fp8", as transformers' fine-grained FP8, DeepSeek-V3 and the
// Qwen FP8 releases write it): every quantised linear weight W [N, K] is stored as e4m3 with a
// float32 `weight_scale_inv` [ceil(N/128), ceil(K/128)], W[n, k] = fp8[n, k] *
// scale_inv[n / 128, k / 128]; activations are quantised dynamically (per token, per 128
// columns) by the kernels that want FP8 inputs. Other methods are recognised (AWQ / GPTQ int4
// groups, NVFP4, MXFP4) only to name their format when they are refused.
struct QuantConfig {
  WeightFormat format;  // plain: no quantisation
  // modules_to_not_convert / ignored_layers: module paths ("lm_head", "model.layers.0.mlp.gate")
  // whose weights stay unquantised; a name matches a parameter equal to it or a prefix of it
  // ending at a '.'.
  std::vector<std::string> modules_to_not_convert;
  // True when the checkpoint itself holds quantised weights (its config has the block); false
  // when --quantization fp8 quantises a bf16 checkpoint while loading.
  bool from_checkpoint = false;
  bool quantized() const { return format.quantized(); }
  bool fp8() const { return format.kind == WeightFormatKind::kFp8Block; }
  // Whether the parameter `name` ("model.layers.0.mlp.gate.weight") is left unquantised.
  bool excluded(const std::string& name) const;
};

// Parses a config.json quantization_config; anything but block-scaled dynamic e4m3 FP8 fails
// with kUnsupported naming the field (a known other method: its weight format too).
QuantConfig parse_quantization_config(const nlohmann::json& q, const std::string& source);

struct ModelConfig {
  std::string model_dir;
  std::string architecture;  // "Qwen3ForCausalLM"
  std::string model_type;    // "qwen3"
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int vocab_size = 0;
  int max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  double partial_rotary_factor = 1.0;
  RopeScaling rope;
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  DType dtype = DType::kBF16;  // checkpoint dtype
  std::optional<int> bos_token_id;
  std::vector<int> eos_token_ids;  // config's, then generation_config's
  MoeConfig moe;
  // One entry per layer when the config has layer_types or full_attention_interval.
  std::vector<LayerType> layer_types;
  LinearAttnConfig linear;
  // Multi-token-prediction layers the checkpoint holds under "mtp." (Qwen3.5's
  // mtp_num_hidden_layers, Qwen3-Next's num_nextn_predict_layers; 1 when a config of those
  // families does not say, as vLLM assumes; 0: none). Whether the tensors exist is checked when
  // the layer is loaded.
  int num_mtp_layers = 0;
  bool is_linear_layer(int layer) const {
    return !layer_types.empty() && layer_types[static_cast<size_t>(layer)] == LayerType::kLinearAttention;
  }
  bool is_hybrid() const;
  // Sliding-window attention (transformers' mask): a layer with window W > 0 lets the query at
  // position q attend only the keys at positions q - W < k <= q, the last W positions itself
  // included; 0 attends the whole context. One entry per layer when some layer is windowed
  // (parse_model_config's rules: Qwen2's use_sliding_window / max_window_layers / layer_types
  // "sliding_attention", Mistral's sliding_window), empty otherwise.
  std::vector<int> layer_windows;
  int sliding_window = 0;  // the window of the windowed layers (0: none is)
  int layer_window(int layer) const;
  // Multimodal wrappers (Qwen3_5MoeForConditionalGeneration) hold the language model under
  // text_config and its weights under "model.language_model."; the others under "model.".
  bool nested_text_config = false;
  QuantConfig quant;
  nlohmann::json raw;  // the whole config.json, for architectures with extra fields
};

// vLLM's --disable-sliding-window: every layer attends the whole context (the caller caps
// max_model_len at the window, as vLLM does, so that full attention computes what the window would).
void disable_sliding_window(ModelConfig& c);

// Reads DIR/config.json (and the eos ids of generation_config.json when present), with vLLM's
// --hf-overrides (a JSON object, apply_hf_overrides) over it. Throws Error.
ModelConfig load_model_config(const std::string& model_dir, const nlohmann::json& hf_overrides = nlohmann::json());
// vLLM's --hf-overrides: `overrides`' fields over `config`'s, objects merged field by field. For a multimodal
// wrapper (a text_config object) a field goes to text_config unless the wrapper has it and text_config
// does not. Where the target keeps its rope in transformers 5's rope_parameters, a rope_scaling or
// rope_theta override goes there too. Fails (kInvalidArgument, naming `flag`) unless `overrides` is an
// object.
nlohmann::json apply_hf_overrides(nlohmann::json config, const nlohmann::json& overrides, const std::string& flag);
// Reads DIR/generation_config.json; no file gives empty defaults. Throws Error (kCorrupt) on bad JSON.
GenerationDefaults load_generation_config(const std::string& dir);
ModelConfig parse_model_config(const nlohmann::json& config, const std::string& source);

}  // namespace tessera
