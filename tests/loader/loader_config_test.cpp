// config.json / generation_config.json parsing: both rope spellings, defaults, eos
// merging, and the fields we refuse rather than silently ignore.
#include <gtest/gtest.h>

#include "core/error.h"
#include "core/tensor.h"
#include "fault_util.h"
#include "loader/model_config.h"

namespace tessera {
namespace {

using nlohmann::json;

json base_config() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
    "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "hidden_act": "silu",
    "bos_token_id": 1, "eos_token_id": 2
  })");
}

ModelConfig parse(const json& j) { return parse_model_config(j, "/m/config.json"); }

std::string error_of(const json& j, ErrorKind want) {
  try {
    parse(j);
  } catch (const Error& e) {
    EXPECT_EQ(static_cast<int>(e.kind()), static_cast<int>(want)) << e.what();
    std::string m = e.what();
    EXPECT_NE(m.find("/m/config.json"), std::string::npos) << "file not named: " << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    return m;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "non-tessera exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected an error for " << j.dump();
  return "";
}

TEST(ModelConfig, BasicFieldsAndDefaults) {
  json j = base_config();
  j.erase("num_key_value_heads");
  ModelConfig c = parse(j);
  EXPECT_EQ(c.architecture, "LlamaForCausalLM");
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.num_layers, 2);
  EXPECT_EQ(c.num_kv_heads, 4) << "num_key_value_heads defaults to num_attention_heads (MHA)";
  EXPECT_EQ(c.head_dim, 16) << "head_dim defaults to hidden_size / num_attention_heads";
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.rope.type, "default");
  EXPECT_FALSE(c.tie_word_embeddings);
  ASSERT_TRUE(c.bos_token_id.has_value());
  EXPECT_EQ(*c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_ids, std::vector<int>({2}));
}

TEST(ModelConfig, ExplicitHeadDimWins) {
  json j = base_config();
  j["head_dim"] = 24;  // != 64 / 4
  EXPECT_EQ(parse(j).head_dim, 24);
  j["head_dim"] = nullptr;  // null means "not given"
  EXPECT_EQ(parse(j).head_dim, 16);
}

TEST(ModelConfig, TransformersFiveRopeParameters) {
  json j = base_config();
  j["rope_theta"] = 1.0;  // a stale top-level value must lose to rope_parameters
  j["rope_parameters"] = {
      {"rope_type", "llama3"},       {"rope_theta", 500000.0},  {"factor", 8.0},
      {"low_freq_factor", 1.0},      {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192},
      {"partial_rotary_factor", 0.5}};
  ModelConfig c = parse(j);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rope.type, "llama3");
  EXPECT_DOUBLE_EQ(c.rope.factor, 8.0);
  EXPECT_DOUBLE_EQ(c.rope.high_freq_factor, 4.0);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 8192);
  EXPECT_DOUBLE_EQ(c.partial_rotary_factor, 0.5);
}

TEST(ModelConfig, RopeParametersWithoutThetaFallsBackToTopLevel) {
  json j = base_config();
  j["rope_theta"] = 1000000.0;
  j["rope_parameters"] = {{"rope_type", "default"}};
  ModelConfig c = parse(j);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1000000.0);
  EXPECT_EQ(c.rope.type, "default");
}

TEST(ModelConfig, OldRopeThetaAndRopeScaling) {
  json j = base_config();
  j["rope_theta"] = 1000000.0;
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};  // pre-"rope_type" spelling
  ModelConfig c = parse(j);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1000000.0);
  EXPECT_EQ(c.rope.type, "linear");
  EXPECT_DOUBLE_EQ(c.rope.factor, 2.0);

  j["rope_scaling"] = {{"rope_type", "yarn"},
                       {"factor", 4.0},
                       {"original_max_position_embeddings", 32768},
                       {"beta_fast", 16.0},
                       {"attention_factor", 1.25}};
  c = parse(j);
  EXPECT_EQ(c.rope.type, "yarn");
  EXPECT_DOUBLE_EQ(c.rope.beta_fast, 16.0);
  EXPECT_DOUBLE_EQ(c.rope.beta_slow, 1.0);
  ASSERT_TRUE(c.rope.attention_factor.has_value());
  EXPECT_DOUBLE_EQ(*c.rope.attention_factor, 1.25);

  j["rope_scaling"] = nullptr;
  EXPECT_EQ(parse(j).rope.type, "default");
}

TEST(ModelConfig, UnsupportedRopeTypeFails) {
  json j = base_config();
  j["rope_scaling"] = {{"rope_type", "longrope"}, {"factor", 4.0}};
  EXPECT_NE(error_of(j, ErrorKind::kUnsupported).find("longrope"), std::string::npos);
  j.erase("rope_scaling");
  j["rope_parameters"] = {{"rope_type", "mrope"}, {"rope_theta", 1e6}};
  EXPECT_NE(error_of(j, ErrorKind::kUnsupported).find("mrope"), std::string::npos);
}

TEST(ModelConfig, TextConfigOfMultimodalWrapper) {
  json j = {{"architectures", {"Qwen3ForCausalLM"}}, {"model_type", "wrapper"}, {"text_config", base_config()}};
  j["text_config"]["model_type"] = "qwen3";
  j["text_config"]["hidden_size"] = 128;
  ModelConfig c = parse(j);
  EXPECT_EQ(c.architecture, "Qwen3ForCausalLM");
  EXPECT_EQ(c.model_type, "qwen3");
  EXPECT_EQ(c.hidden_size, 128);
  EXPECT_EQ(c.head_dim, 32);
}

// vLLM's --hf-overrides: fields over config.json's, objects merged field by field; a wrapper's text
// fields go to text_config; rope overrides reach transformers 5's rope_parameters.
TEST(HfOverrides, FieldsReplaceAndObjectsMerge) {
  json j = base_config();
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  const json o =
      apply_hf_overrides(j, {{"max_position_embeddings", 4096}, {"rope_scaling", {{"factor", 3.0}}}}, "--hf-overrides");
  EXPECT_EQ(o["max_position_embeddings"], 4096);
  EXPECT_EQ(o["rope_scaling"]["rope_type"], "linear");
  EXPECT_EQ(o["rope_scaling"]["factor"], 3.0);
  EXPECT_EQ(o["hidden_size"], 64);
  EXPECT_EQ(apply_hf_overrides(j, json(), "--hf-overrides"), j);
  EXPECT_THROW((void)apply_hf_overrides(j, json::array({1}), "--hf-overrides"), Error);
}

TEST(HfOverrides, WrapperTextFieldsAndRopeParameters) {
  json j = {{"architectures", {"Qwen3ForCausalLM"}}, {"model_type", "wrapper"}, {"text_config", base_config()}};
  j["text_config"]["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10000.0}};
  j["image_token_id"] = 5;
  const json o = apply_hf_overrides(
      j,
      {{"rope_theta", 1e6},
       {"model_type", "other"},
       {"image_token_id", 7},
       {"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 512}}}},
      "--hf-overrides");
  EXPECT_EQ(o["model_type"], "wrapper");  // both have it: the language model's
  EXPECT_EQ(o["text_config"]["model_type"], "other");
  EXPECT_EQ(o["image_token_id"], 7);  // only the wrapper has it
  EXPECT_FALSE(o["text_config"].contains("image_token_id"));
  EXPECT_EQ(o["text_config"]["rope_parameters"]["rope_theta"], 1e6);
  EXPECT_EQ(o["text_config"]["rope_parameters"]["rope_type"], "yarn");
  const ModelConfig c = parse(o);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.rope.type, "yarn");
  EXPECT_EQ(c.max_position_embeddings, 2048);  // vLLM's length: original x factor
}

// As vLLM, linear and yarn scaling serve factor x the original length; a yarn without
// original_max_position_embeddings keeps max_position_embeddings as its base.
TEST(ModelConfig, ScaledRopeExtendsTheMaxLength) {
  json j = base_config();
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  EXPECT_EQ(parse(j).max_position_embeddings, 1024);
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  ModelConfig c = parse(j);
  EXPECT_EQ(c.max_position_embeddings, 2048);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 512);
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 128}};
  EXPECT_EQ(parse(j).max_position_embeddings, 512);  // already original x factor
  j["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 4.0}};
  EXPECT_EQ(parse(j).max_position_embeddings, 512);
}

// Multi-token-prediction layers: Qwen3.5's mtp_num_hidden_layers, Qwen3-Next's
// num_nextn_predict_layers, 1 for those families when the config does not say (vLLM's default),
// none for other families; a negative count is refused.
TEST(ModelConfig, MtpLayers) {
  json j = base_config();
  EXPECT_EQ(parse(j).num_mtp_layers, 0);
  j["model_type"] = "qwen3_next";
  EXPECT_EQ(parse(j).num_mtp_layers, 1);
  j["num_nextn_predict_layers"] = 0;
  EXPECT_EQ(parse(j).num_mtp_layers, 0);
  j.erase("num_nextn_predict_layers");
  j["model_type"] = "qwen3_5_moe_text";
  EXPECT_EQ(parse(j).num_mtp_layers, 1);
  j["mtp_num_hidden_layers"] = 2;
  EXPECT_EQ(parse(j).num_mtp_layers, 2);
  j["mtp_num_hidden_layers"] = -1;
  EXPECT_NE(error_of(j, ErrorKind::kCorrupt).find("mtp_num_hidden_layers"), std::string::npos);
}

TEST(ModelConfig, EosListsMergeWithGenerationConfig) {
  testing::TempDir tmp;
  json j = base_config();
  j["eos_token_id"] = {3, 4};
  testing::write_file(tmp.path() / "config.json", j.dump());
  // generation_config repeats one id and adds one: merged without duplicates, config's first.
  testing::write_file(tmp.path() / "generation_config.json",
                      R"({"eos_token_id": [4, 7], "temperature": 0.6, "top_p": 0.95, "top_k": 20})");
  ModelConfig c = load_model_config(tmp.path().string());
  EXPECT_EQ(c.eos_token_ids, std::vector<int>({3, 4, 7}));
  const GenerationDefaults g = load_generation_config(tmp.path().string());
  EXPECT_EQ(g.eos_token_ids, std::vector<int>({4, 7}));
  ASSERT_TRUE(g.temperature && g.top_p && g.top_k);
  EXPECT_DOUBLE_EQ(*g.temperature, 0.6);
  EXPECT_DOUBLE_EQ(*g.top_p, 0.95);
  EXPECT_EQ(*g.top_k, 20);
  EXPECT_FALSE(g.repetition_penalty.has_value());
  EXPECT_TRUE(g.sets_sampling());
  EXPECT_EQ(c.model_dir, tmp.path().string());

  // A single int in generation_config, none in config.json.
  j.erase("eos_token_id");
  testing::write_file(tmp.path() / "config.json", j.dump());
  testing::write_file(tmp.path() / "generation_config.json", R"({"eos_token_id": 9})");
  EXPECT_EQ(load_model_config(tmp.path().string()).eos_token_ids, std::vector<int>({9}));

  // No generation_config.json at all.
  std::filesystem::remove(tmp.path() / "generation_config.json");
  ModelConfig none = load_model_config(tmp.path().string());
  EXPECT_TRUE(none.eos_token_ids.empty());
  EXPECT_FALSE(load_generation_config(tmp.path().string()).temperature.has_value());
}

TEST(ModelConfig, GenerationConfigDefaultsAreReadOnceWithTheirTypes) {
  testing::TempDir tmp;
  // vLLM's --generation-config reads these; a field of the wrong type is ignored.
  testing::write_file(tmp.path() / "generation_config.json",
                      R"({"temperature": 0.7, "top_p": "0.9", "min_p": 0.05, "repetition_penalty": 1.05,
                          "top_k": 2.5, "max_new_tokens": 512, "do_sample": true})");
  GenerationDefaults g = load_generation_config(tmp.path().string());
  EXPECT_DOUBLE_EQ(*g.temperature, 0.7);
  EXPECT_FALSE(g.top_p.has_value());
  EXPECT_DOUBLE_EQ(*g.min_p, 0.05);
  EXPECT_DOUBLE_EQ(*g.repetition_penalty, 1.05);
  EXPECT_FALSE(g.top_k.has_value());
  EXPECT_EQ(g.max_new_tokens, 512);
  EXPECT_TRUE(g.eos_token_ids.empty());
  testing::write_file(tmp.path() / "generation_config.json", R"({"max_new_tokens": 64})");
  g = load_generation_config(tmp.path().string());
  EXPECT_FALSE(g.sets_sampling()) << "max_new_tokens alone is not logged as an override";
  testing::write_file(tmp.path() / "generation_config.json", "{not json");
  EXPECT_THROW(load_generation_config(tmp.path().string()), Error);
}

TEST(ModelConfig, UnsupportedHiddenActFails) {
  json j = base_config();
  j["hidden_act"] = "gelu_pytorch_tanh";
  EXPECT_NE(error_of(j, ErrorKind::kUnsupported).find("gelu_pytorch_tanh"), std::string::npos);
}

json fp8_block() {
  return json::parse(R"({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                         "weight_block_size": [128, 128],
                         "modules_to_not_convert": ["lm_head", "model.layers.0.mlp.gate"]})");
}

TEST(ModelConfig, BlockScaledFp8QuantizationIsParsed) {
  json j = base_config();
  j["quantization_config"] = fp8_block();
  ModelConfig c = parse(j);
  EXPECT_TRUE(c.quant.fp8());
  EXPECT_TRUE(c.quant.from_checkpoint);
  EXPECT_EQ(c.quant.format, fp8_block_format());
  EXPECT_EQ(c.quant.format.block_rows, 128);
  EXPECT_EQ(c.quant.format.block_cols, 128);
  EXPECT_EQ(c.quant.format.element, DType::kF8E4M3);
  EXPECT_EQ(c.quant.format.scale, DType::kF32);
  EXPECT_TRUE(c.quant.excluded("lm_head.weight"));
  EXPECT_TRUE(c.quant.excluded("model.layers.0.mlp.gate.weight"));
  EXPECT_FALSE(c.quant.excluded("model.layers.0.mlp.gate_proj.weight"));  // a prefix only at a '.'
  EXPECT_FALSE(c.quant.excluded("model.layers.10.mlp.gate.weight"));
  // transformers' own spelling (fine-grained FP8), with ignored_layers (llm-compressor's name).
  j["quantization_config"] = json::parse(R"({"quant_method": "fp8", "activation_scheme": "dynamic",
      "dequantize": false, "modules_to_convert": null, "modules_to_not_convert": null, "scale_fmt": "float",
      "weight_block_size": [128, 128], "ignored_layers": ["model.layers.1.self_attn"]})");
  c = parse(j);
  EXPECT_TRUE(c.quant.excluded("model.layers.1.self_attn.q_proj.weight"));
  j = base_config();
  EXPECT_FALSE(parse(j).quant.fp8());
  EXPECT_FALSE(parse(j).quant.quantized());
  j["quantization_config"] = nullptr;  // null is the same as absent
  EXPECT_FALSE(parse(j).quant.fp8());
}

// Methods of other formats (no kernels) are refused naming the method, the format the
// checkpoint holds (group size, element and scale types) and what is supported.
TEST(ModelConfig, OtherQuantizationMethodsNameTheirWeightFormat) {
  struct Case {
    json q;
    const char* format;
  };
  for (const Case& c :
       {Case{{{"quant_method", "awq"}, {"bits", 4}, {"group_size", 64}}, "int4, f16 scale per group of 64 columns"},
        Case{{{"quant_method", "gptq"}, {"bits", 4}}, "int4, f16 scale per group of 128 columns"},
        Case{{{"quant_method", "mxfp4"}}, "mxfp4 (e2m1), e8m0 scale per 32 columns"},
        Case{{{"quant_method", "modelopt_fp4"}}, "nvfp4 (e2m1), e4m3 scale per 16 columns"}}) {
    json j = base_config();
    j["quantization_config"] = c.q;
    const std::string m = error_of(j, ErrorKind::kUnsupported);
    EXPECT_NE(m.find("'" + c.q["quant_method"].get<std::string>() + "'"), std::string::npos) << m;
    EXPECT_NE(m.find(c.format), std::string::npos) << m;
    EXPECT_NE(m.find("supported: fp8 with weight_block_size [128, 128]"), std::string::npos) << m;
  }
}

// The format object's sizes: FP8 blocks (one byte an element, f32 per 128 x 128 with partial
// edge blocks), packed 4-bit formats (half a byte an element), plain (the given dtype).
TEST(WeightFormat, BytesAndScaleShapes) {
  const Shape w{200, 300};
  EXPECT_EQ(fp8_block_format().scale_shape(w), (Shape{2, 3}));
  EXPECT_EQ(fp8_block_format().scale_shape(Shape{4, 200, 300}), (Shape{4, 2, 3}));
  EXPECT_EQ(fp8_block_format().weight_bytes(w, DType::kBF16), size_t{200 * 300});
  EXPECT_EQ(fp8_block_format().scale_bytes(w), size_t{6 * 4});
  EXPECT_EQ(int4_group_format(128).scale_shape(w), (Shape{200, 3}));
  EXPECT_EQ(int4_group_format(128).weight_bytes(w, DType::kBF16), size_t{200 * 300 / 2});
  EXPECT_EQ(int4_group_format(128).scale_bytes(w), size_t{200 * 3 * 2});
  EXPECT_EQ(nvfp4_format().scale_shape(w), (Shape{200, 19}));
  EXPECT_EQ(mxfp4_format().scale_bytes(w), size_t{200 * 10});
  EXPECT_EQ(plain_format().weight_bytes(w, DType::kBF16), size_t{200 * 300 * 2});
  EXPECT_EQ(plain_format().scale_bytes(w), 0u);
  EXPECT_FALSE(plain_format().quantized());
  EXPECT_TRUE(fp8_block_format().supported());
  EXPECT_FALSE(nvfp4_format().supported());
  EXPECT_FALSE(int4_group_format(64) == int4_group_format(128));
}

TEST(ModelConfig, OtherQuantizationIsRefusedNamingTheField) {
  auto refused = [](const char* field, const json& value) {
    json j = base_config();
    j["quantization_config"] = fp8_block();
    if (value.is_null())
      j["quantization_config"].erase(field);
    else
      j["quantization_config"][field] = value;
    std::string m = error_of(j, ErrorKind::kUnsupported);
    EXPECT_NE(m.find(field), std::string::npos) << m;
  };
  refused("quant_method", "awq");
  refused("fmt", "e5m2");
  refused("activation_scheme", "static");
  refused("weight_block_size", json::array({64, 64}));
  refused("weight_block_size", nullptr);  // per-tensor FP8
  refused("scale_fmt", "ue8m0");
  refused("dequantize", true);
  refused("modules_to_convert", json::array({"q_proj"}));
  refused("kv_cache_scheme", json::object({{"num_bits", 8}}));
  json j = base_config();
  j["quantization_config"] = {{"bits", 4}};
  EXPECT_NE(error_of(j, ErrorKind::kUnsupported).find("quant_method"), std::string::npos);
  j["quantization_config"] = "gptq";  // not an object: still refused, still a tessera::Error
  error_of(j, ErrorKind::kUnsupported);
  j["quantization_config"] = fp8_block();
  j["quantization_config"]["modules_to_not_convert"] = "lm_head";  // not a list
  error_of(j, ErrorKind::kCorrupt);
}

TEST(ModelConfig, OtherRefusedFeatures) {
  json j = base_config();
  j["mlp_bias"] = true;
  error_of(j, ErrorKind::kUnsupported);
}

// Sliding windows as transformers configures them (ModelConfig::layer_windows).
TEST(ModelConfig, SlidingWindowsOfQwen2AndMistralConfigs) {
  auto windows = [](const json& j) { return parse(j).layer_windows; };
  json q = base_config();  // Qwen2-style: use_sliding_window decides, then layer_types or max_window_layers
  q["num_hidden_layers"] = 4;
  q["use_sliding_window"] = false;
  q["sliding_window"] = 4096;
  q["max_window_layers"] = 1;
  EXPECT_TRUE(windows(q).empty()) << "use_sliding_window false: no window";
  q["sliding_window"] = 0;  // (Qwen2-MoE configs write 0 beside false)
  EXPECT_TRUE(windows(q).empty());
  q["use_sliding_window"] = true;
  q["sliding_window"] = 8;
  EXPECT_EQ(windows(q), std::vector<int>({0, 8, 8, 8})) << "layers from max_window_layers on";
  EXPECT_EQ(parse(q).sliding_window, 8);
  EXPECT_EQ(parse(q).layer_window(0), 0);
  EXPECT_EQ(parse(q).layer_window(3), 8);
  q["layer_types"] = {"full_attention", "sliding_attention", "full_attention", "sliding_attention"};
  EXPECT_EQ(windows(q), std::vector<int>({0, 8, 0, 8})) << "layer_types decides over max_window_layers";
  EXPECT_TRUE(parse(q).layer_types.size() == 4 && !parse(q).is_hybrid());
  q.erase("layer_types");
  q.erase("max_window_layers");
  EXPECT_TRUE(windows(q).empty()) << "transformers' max_window_layers default is 28";
  q.erase("sliding_window");
  q["max_window_layers"] = 0;
  EXPECT_EQ(windows(q), std::vector<int>(4, 4096)) << "transformers' sliding_window default is 4096";
  q["sliding_window"] = nullptr;
  EXPECT_TRUE(windows(q).empty()) << "null: no window";

  json m = base_config();  // Mistral: sliding_window set windows every layer
  m["architectures"] = {"MistralForCausalLM"};
  m["model_type"] = "mistral";
  m["sliding_window"] = 5;
  EXPECT_EQ(windows(m), std::vector<int>({5, 5}));
  m["sliding_window"] = nullptr;
  EXPECT_TRUE(windows(m).empty());
  m.erase("sliding_window");
  EXPECT_TRUE(windows(m).empty());
  m["sliding_window"] = 5;
  m["layer_types"] = {"full_attention", "sliding_attention"};  // MistralModel reads no layer_types
  EXPECT_EQ(windows(m), std::vector<int>({5, 5}));
  m.erase("layer_types");

  json l = base_config();  // Llama's transformers model ignores sliding_window
  l["sliding_window"] = 5;
  EXPECT_TRUE(windows(l).empty());
  l["layer_types"] = {"sliding_attention", "full_attention"};  // nor layer_types
  EXPECT_TRUE(windows(l).empty());

  m["sliding_window"] = 5;
  ModelConfig c = parse(m);
  disable_sliding_window(c);
  EXPECT_TRUE(c.layer_windows.empty());
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_EQ(c.layer_window(1), 0);
}

TEST(ModelConfig, BadSlidingWindowsFailNamingTheField) {
  json q = base_config();
  q["use_sliding_window"] = true;
  q["sliding_window"] = 0;
  EXPECT_NE(error_of(q, ErrorKind::kCorrupt).find("sliding_window"), std::string::npos);
  q["sliding_window"] = -3;
  EXPECT_NE(error_of(q, ErrorKind::kCorrupt).find("sliding_window"), std::string::npos);
  q["sliding_window"] = "8";
  EXPECT_NE(error_of(q, ErrorKind::kCorrupt).find("sliding_window"), std::string::npos);
  q["sliding_window"] = 8;
  q["max_window_layers"] = -1;
  EXPECT_NE(error_of(q, ErrorKind::kCorrupt).find("max_window_layers"), std::string::npos);
  q = base_config();
  q["use_sliding_window"] = false;
  q["sliding_window"] = 8;
  q["layer_types"] = {"full_attention", "sliding_attention"};
  EXPECT_NE(error_of(q, ErrorKind::kCorrupt).find("sliding_attention"), std::string::npos)
      << "a windowed layer without a window";
  json m = base_config();
  m["model_type"] = "mistral";
  m["sliding_window"] = 0;
  EXPECT_NE(error_of(m, ErrorKind::kCorrupt).find("sliding_window"), std::string::npos);
}

TEST(ModelConfig, InconsistentOrMissingSizesFail) {
  json j = base_config();
  j["num_key_value_heads"] = 3;  // 4 % 3 != 0
  error_of(j, ErrorKind::kCorrupt);
  j = base_config();
  j.erase("vocab_size");
  error_of(j, ErrorKind::kCorrupt);
  j = base_config();
  j["num_attention_heads"] = 0;
  error_of(j, ErrorKind::kCorrupt);
  j = base_config();
  j["head_dim"] = -8;
  error_of(j, ErrorKind::kCorrupt);
  j = base_config();
  j.erase("architectures");
  error_of(j, ErrorKind::kCorrupt);
}

TEST(ModelConfig, OutOfRangeValuesFailNamingTheField) {
  const std::vector<std::pair<std::string, json>> bad = {
      {"rope_theta", 0},
      {"rope_theta", -10000.0},
      {"rope_theta", 1e999},  // parses as infinity
      {"rms_norm_eps", 0},
      {"rms_norm_eps", -1e-6},
      {"partial_rotary_factor", 0},
      {"partial_rotary_factor", 1.5},
      {"hidden_size", 1 << 21},
      {"intermediate_size", -1},
      {"num_hidden_layers", 100000},
      {"num_attention_heads", 1 << 13},
      {"vocab_size", 1 << 25},
      {"head_dim", 1 << 15},
      {"max_position_embeddings", 0},
      {"eos_token_id", -1},
      {"eos_token_id", json::array({2, "x"})},
      {"eos_token_id", int64_t{1} << 40},
  };
  for (const auto& [key, value] : bad) {
    SCOPED_TRACE(key + "=" + value.dump());
    json j = base_config();
    j[key] = value;
    std::string message = error_of(j, ErrorKind::kCorrupt);
    EXPECT_NE(message.find("'" + key + "'"), std::string::npos) << message;
  }
  json j = base_config();
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 0.0}};
  EXPECT_NE(error_of(j, ErrorKind::kCorrupt).find("rope_scaling.factor"), std::string::npos);
  // The edges of the ranges still load.
  j = base_config();
  j["partial_rotary_factor"] = 1.0;
  j["rope_theta"] = 1e9;
  EXPECT_NO_THROW(parse(j));
}

// A generation_config.json default the engine would refuse (temperature -1) made every request that sets
// no temperature fail with a 400 blaming the client; it now fails at load, naming the file and field.
TEST(ModelConfig, GenerationConfigOutOfRangeFailsAtLoadNamingFileAndField) {
  testing::TempDir tmp;
  const std::string file = (tmp.path() / "generation_config.json").string();
  const std::vector<std::pair<std::string, json>> bad = {
      {"temperature", -1},
      {"temperature", 101},
      {"top_p", 0},
      {"top_p", 1.5},
      {"min_p", 2},
      {"min_p", -0.1},
      {"repetition_penalty", 0},
      {"repetition_penalty", 11},
      {"top_k", -2},
      {"top_k", int64_t{1} << 40},
      {"max_new_tokens", 0},
      {"eos_token_id", -5},
      {"eos_token_id", json::array({1, 2.5})},
  };
  for (const auto& [key, value] : bad) {
    SCOPED_TRACE(key + "=" + value.dump());
    testing::write_file(file, json{{key, value}}.dump());
    try {
      load_generation_config(tmp.path().string());
      ADD_FAILURE() << "expected an error";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kCorrupt) << e.what();
      EXPECT_NE(std::string(e.what()).find(file + ": '" + key + "'"), std::string::npos) << e.what();
    }
  }
  testing::write_file(file, R"({"temperature": 0, "top_p": 1, "min_p": 0, "top_k": -1, "max_new_tokens": 1})");
  GenerationDefaults g = load_generation_config(tmp.path().string());
  EXPECT_EQ(*g.temperature, 0.0);
  EXPECT_EQ(*g.top_k, -1);
}

TEST(ModelConfig, WrongTypesAreTesseraErrorsNamingFileAndField) {
  for (auto [key, value] : std::vector<std::pair<std::string, json>>{{"hidden_size", "64"},
                                                                     {"architectures", {42}},
                                                                     {"architectures", "LlamaForCausalLM"},
                                                                     {"rms_norm_eps", "small"},
                                                                     {"tie_word_embeddings", "yes"}}) {
    SCOPED_TRACE(key + "=" + value.dump());
    json j = base_config();
    j[key] = value;
    EXPECT_NE(error_of(j, ErrorKind::kCorrupt).find(key), std::string::npos);
  }
  json j = base_config();
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"attention_factor", "big"}};
  EXPECT_NE(error_of(j, ErrorKind::kCorrupt).find("attention_factor"), std::string::npos);
}

json moe_config() {
  json j = base_config();
  j["architectures"] = {"Qwen3MoeForCausalLM"};
  j["num_hidden_layers"] = 6;
  j["num_experts"] = 8;
  j["num_experts_per_tok"] = 2;
  j["moe_intermediate_size"] = 32;
  j["norm_topk_prob"] = true;
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {3};
  j["output_router_logits"] = false;  // training only
  j["router_aux_loss_coef"] = 0.001;
  return j;
}

TEST(ModelConfig, MixtureOfExpertsFieldsAndTheSparseLayerRule) {
  ModelConfig c = parse(moe_config());
  EXPECT_EQ(c.moe.num_experts, 8);
  EXPECT_EQ(c.moe.num_experts_per_tok, 2);
  EXPECT_EQ(c.moe.moe_intermediate_size, 32);
  EXPECT_TRUE(c.moe.norm_topk_prob);
  EXPECT_EQ(c.moe.shared_expert_intermediate_size, 0);
  // transformers: sparse iff not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0.
  std::vector<bool> sparse;
  for (int i = 0; i < 6; ++i) sparse.push_back(c.moe.is_moe_layer(i));
  EXPECT_EQ(sparse, (std::vector<bool>{false, true, false, false, false, true}));
  // Defaults: every layer sparse, no renormalisation.
  json j = moe_config();
  j.erase("decoder_sparse_step");
  j.erase("mlp_only_layers");
  j.erase("norm_topk_prob");
  c = parse(j);
  EXPECT_FALSE(c.moe.norm_topk_prob);
  for (int i = 0; i < 6; ++i) EXPECT_TRUE(c.moe.is_moe_layer(i)) << i;
  // transformers 5 spells num_experts num_local_experts (Qwen3-MoE).
  j = moe_config();
  j.erase("num_experts");
  j["num_local_experts"] = 16;
  EXPECT_EQ(parse(j).moe.num_experts, 16);
  j["num_experts"] = 8;
  EXPECT_NE(error_of(j, ErrorKind::kCorrupt).find("num_local_experts"), std::string::npos);
  // Dense models have no MoE layers.
  c = parse(base_config());
  EXPECT_EQ(c.moe.num_experts, 0);
  EXPECT_FALSE(c.moe.is_moe_layer(0));
}

TEST(ModelConfig, BadOrUnsupportedMixtureOfExpertsFieldsFail) {
  auto with = [](const char* key, json value) {
    json j = moe_config();
    j[key] = value;
    return j;
  };
  EXPECT_NE(error_of(with("num_experts_per_tok", 9), ErrorKind::kCorrupt).find("num_experts_per_tok"),
            std::string::npos);
  EXPECT_NE(error_of(with("num_experts_per_tok", 0), ErrorKind::kCorrupt).find("num_experts_per_tok"),
            std::string::npos);
  EXPECT_NE(error_of(with("moe_intermediate_size", 0), ErrorKind::kCorrupt).find("moe_intermediate_size"),
            std::string::npos);
  EXPECT_NE(error_of(with("decoder_sparse_step", 0), ErrorKind::kCorrupt).find("decoder_sparse_step"),
            std::string::npos);
  EXPECT_NE(error_of(with("mlp_only_layers", {6}), ErrorKind::kCorrupt).find("mlp_only_layers"), std::string::npos);
  EXPECT_NE(error_of(with("mlp_only_layers", "0"), ErrorKind::kCorrupt).find("mlp_only_layers"), std::string::npos);
  EXPECT_NE(error_of(with("norm_topk_prob", "yes"), ErrorKind::kCorrupt).find("norm_topk_prob"), std::string::npos);
  // Other families' routing: refused, not ignored.
  EXPECT_NE(error_of(with("scoring_func", "sigmoid"), ErrorKind::kUnsupported).find("scoring_func"), std::string::npos);
  EXPECT_NE(error_of(with("n_shared_experts", 1), ErrorKind::kUnsupported).find("n_shared_experts"), std::string::npos);
  EXPECT_NE(error_of(with("routed_scaling_factor", 2.5), ErrorKind::kUnsupported).find("routed_scaling_factor"),
            std::string::npos);
  EXPECT_NO_THROW(parse(with("routed_scaling_factor", 1.0)));
}

json hybrid_config() {
  json j = base_config();
  j["architectures"] = {"Qwen3NextForCausalLM"};
  j["num_hidden_layers"] = 4;
  j["layer_types"] = {"linear_attention", "linear_attention", "linear_attention", "full_attention"};
  j["linear_conv_kernel_dim"] = 4;
  j["linear_key_head_dim"] = 16;
  j["linear_value_head_dim"] = 32;
  j["linear_num_key_heads"] = 2;
  j["linear_num_value_heads"] = 6;
  return j;
}

TEST(ModelConfig, HybridLayerTypesAndLinearAttentionShape) {
  ModelConfig c = parse(hybrid_config());
  ASSERT_EQ(c.layer_types.size(), 4u);
  EXPECT_TRUE(c.is_hybrid());
  EXPECT_TRUE(c.is_linear_layer(0));
  EXPECT_FALSE(c.is_linear_layer(3));
  EXPECT_EQ(c.linear.conv_kernel, 4);
  EXPECT_EQ(c.linear.key_head_dim, 16);
  EXPECT_EQ(c.linear.value_head_dim, 32);
  EXPECT_EQ(c.linear.num_key_heads, 2);
  EXPECT_EQ(c.linear.num_value_heads, 6);
  EXPECT_FALSE(parse(base_config()).is_hybrid());

  // The older spelling: every full_attention_interval-th layer is full attention.
  json j = hybrid_config();
  j.erase("layer_types");
  j["num_hidden_layers"] = 8;
  j["full_attention_interval"] = 4;
  c = parse(j);
  ASSERT_EQ(c.layer_types.size(), 8u);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(c.is_linear_layer(i), (i + 1) % 4 != 0) << i;
}

TEST(ModelConfig, HybridWrapperKeepsItsOwnDtypeAndMropeIsPlainRopeForText) {
  json j = {{"architectures", {"Qwen3_5MoeForConditionalGeneration"}},
            {"model_type", "qwen3_5_moe"},
            {"dtype", "bfloat16"},
            {"text_config", hybrid_config()}};
  j["text_config"]["dtype"] = "float32";
  j["text_config"]["rope_parameters"] = {{"rope_type", "default"},
                                         {"rope_theta", 1e7},
                                         {"partial_rotary_factor", 0.25},
                                         {"mrope_section", {11, 11, 10}},
                                         {"mrope_interleaved", true}};
  ModelConfig c = parse(j);
  EXPECT_TRUE(c.nested_text_config);
  EXPECT_EQ(c.dtype, DType::kBF16);
  EXPECT_DOUBLE_EQ(c.partial_rotary_factor, 0.25);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e7);
  EXPECT_EQ(c.layer_types.size(), 4u);
}

TEST(ModelConfig, BadOrUnsupportedHybridFieldsFailNamingThem) {
  json j = hybrid_config();
  j["layer_types"][1] = "sliding_attention";
  EXPECT_NE(error_of(j, ErrorKind::kUnsupported).find("sliding_attention"), std::string::npos);
  j = hybrid_config();
  j["layer_types"] = {"linear_attention", "full_attention"};
  EXPECT_NE(error_of(j, ErrorKind::kCorrupt).find("layer_types"), std::string::npos);
  j = hybrid_config();
  j.erase("linear_key_head_dim");
  EXPECT_NE(error_of(j, ErrorKind::kCorrupt).find("linear_key_head_dim"), std::string::npos);
  j = hybrid_config();
  j["linear_num_value_heads"] = 5;
  EXPECT_NE(error_of(j, ErrorKind::kCorrupt).find("linear_num_value_heads"), std::string::npos);
  j = hybrid_config();
  j["attn_output_gate"] = false;
  EXPECT_NE(error_of(j, ErrorKind::kUnsupported).find("attn_output_gate"), std::string::npos);
}

TEST(ModelConfig, ConfigThatIsNotAnObject) {
  error_of(json::array({1, 2}), ErrorKind::kCorrupt);
  error_of(json("text"), ErrorKind::kCorrupt);
}

}  // namespace
}  // namespace tessera
