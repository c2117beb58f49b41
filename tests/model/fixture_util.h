// Shared by model and engine tests: the tiny HF fixtures in tests/fixtures/models.
#pragma once
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "core/error.h"
#include "loader/model_config.h"
#include "model/registry.h"

namespace tessera::testing {

// TESSERA_TEST_DEVICE=cuda runs the model and engine tests on the CUDA backend (on the
// GPU machine); the default is the CPU reference backend.
inline bool testing_on_cuda() {
  const char* d = std::getenv("TESSERA_TEST_DEVICE");
  return d && std::string(d) == "cuda";
}
inline std::unique_ptr<Backend> make_test_backend() {
  BackendOptions o;
  o.type = testing_on_cuda() ? DeviceType::kCUDA : DeviceType::kCPU;
  return make_backend(o);
}

// TESSERA_TEST_FIXTURES overrides the source tree's folder (a test binary run from a bundle on
// another machine, where the tree sits elsewhere).
inline std::string fixtures_dir() {
  const char* d = std::getenv("TESSERA_TEST_FIXTURES");
  return d && *d ? std::string(d) : std::string(TESSERA_SOURCE_DIR) + "/tests/fixtures/models";
}

// The largest error transformers' own bf16 forward makes in the last-position logits of the
// fixture's reference prompts (`bf16_last_logits_err`, tools/fixture_bf16_spread.py; 0 where a
// case has none): how far bf16 rounding alone moves this model's logits.
inline double fixture_bf16_spread(const std::string& name) {
  std::ifstream f(fixtures_dir() + "/" + name + "/reference.json");
  if (!f) return 0.0;
  const nlohmann::json r = nlohmann::json::parse(f);
  double spread = 0.0;
  for (const auto& c : r.value("cases", nlohmann::json::array()))
    if (c.contains("bf16_last_logits_err")) spread = std::max(spread, c["bf16_last_logits_err"].get<double>());
  return spread;
}

// Two runs on CUDA (bf16) of the same fixture that batch or chunk differently round differently;
// they may take different tokens at a step one of them called within this bound: 0.05, or the
// fixture's bf16 spread where that is larger (a model whose logits bf16 rounding moves by 0.8
// can part at a margin of 0.5 for that alone: qwen3_5_moe_text_fp8 does, and so does a bf16
// copy of its dequantised weights, so no FP8 kernel is involved).
inline float cuda_close_call(const std::string& name) {
  return static_cast<float>(std::max(0.05, fixture_bf16_spread(name)));
}

// Two CUDA runs that each stand within the fixture's bf16 spread of the exact logits stand within
// twice that of each other: the bound for a parting between two runs that both round (at least
// 0.05; engine_test's every-token speculation comparison). HybridEngineTest's chunked-prefill
// comparison applies the same rule per reference prompt.
inline float cuda_two_run_bound(const std::string& name) {
  return static_cast<float>(std::max(0.05, 2.0 * fixture_bf16_spread(name)));
}

inline std::vector<std::string> all_fixture_names() {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(fixtures_dir()))
    if (std::filesystem::exists(e.path() / "reference.json")) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// Whether tessera runs this fixture's family: its config parses and names a supported
// architecture. Fixtures made ahead of their family (a later issue's) are not, and config
// parsing or the registry refuses them with kUnsupported (checked by model_fixture_test).
inline bool fixture_supported(const std::string& name) {
  try {
    const ModelConfig c = load_model_config(fixtures_dir() + "/" + name);
    const auto archs = supported_architectures();
    return std::find(archs.begin(), archs.end(), c.architecture) != archs.end();
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::kUnsupported) return false;
    throw;
  }
}

// Whether the fixture is a hybrid model (Gated DeltaNet layers with per-sequence state slots).
inline bool fixture_is_hybrid(const std::string& name) {
  return load_model_config(fixtures_dir() + "/" + name).is_hybrid();
}

// The fixtures of supported families whose layers all use the paged KV cache (what the
// engine tests run until the engine allocates state slots).
inline std::vector<std::string> fixture_names() {
  std::vector<std::string> names;
  for (const auto& n : all_fixture_names())
    if (fixture_supported(n) && !fixture_is_hybrid(n)) names.push_back(n);
  return names;
}

// The supported hybrid fixtures (Qwen3-Next, Qwen3.5).
inline std::vector<std::string> hybrid_fixture_names() {
  std::vector<std::string> names;
  for (const auto& n : all_fixture_names())
    if (fixture_supported(n) && fixture_is_hybrid(n)) names.push_back(n);
  return names;
}

// Every supported fixture (what the model tests run).
inline std::vector<std::string> all_supported_fixture_names() {
  std::vector<std::string> names;
  for (const auto& n : all_fixture_names())
    if (fixture_supported(n)) names.push_back(n);
  return names;
}

// Every layer's cache as the engine lays it out: paged K/V of num_blocks blocks of 16 tokens
// for attention layers; for Gated DeltaNet layers `slots` state slots (conv state in the
// compute dtype, the recurrent state in f32, the engine's defaults). A vector entry of the
// other kind stays undefined; the state vectors are empty for models without state layers.
inline KvCache alloc_test_cache(Backend& be, const std::vector<LayerCacheSpec>& specs, int num_blocks, DType kv_dtype,
                                int slots) {
  KvCache c;
  c.block_size = 16;
  c.num_blocks = num_blocks;
  c.dtype = kv_dtype;
  bool states = false;
  for (const auto& s : specs) {
    const bool state = s.kind == CacheKind::kStateSlot;
    states = states || state;
    c.k.push_back(state ? Tensor() : be.alloc({num_blocks, 16, s.num_kv_heads, s.head_dim}, kv_dtype));
    c.v.push_back(state ? Tensor() : be.alloc({num_blocks, 16, s.num_kv_heads, s.head_dim}, kv_dtype));
    c.conv_state.push_back(state ? be.alloc({slots, s.conv_state_shape[0], s.conv_state_shape[1]}, be.compute_dtype())
                                 : Tensor());
    c.ssm_state.push_back(
        state ? be.alloc({slots, s.ssm_state_shape[0], s.ssm_state_shape[1], s.ssm_state_shape[2]}, DType::kF32)
              : Tensor());
  }
  if (states) {
    c.num_state_slots = slots;
  } else {
    c.conv_state.clear();
    c.ssm_state.clear();
  }
  return c;
}

inline nlohmann::json load_reference(const std::string& name) {
  std::ifstream f(fixtures_dir() + "/" + name + "/reference.json");
  return nlohmann::json::parse(f);
}

// f32 logits of rows `rows` after one prefill of `ids` (a single sequence) through a fresh f32
// cache on `be` (hybrid models: state slot 0, starting from zeros).
inline std::vector<float> prefill_logits(Model& model, Backend& be, const std::vector<int32_t>& ids,
                                         std::vector<int32_t> rows) {
  const int n = static_cast<int>(ids.size()), blocks = (n + 15) / 16;
  KvCache cache = alloc_test_cache(be, model.cache_specs(), blocks, DType::kF32, 1);
  ModelInput in;
  if (!cache.conv_state.empty()) in.linear = {{0, n}, {0}, {0}};
  for (int i = 0; i < n; ++i) {
    in.token_ids.push_back(ids[i]);
    in.positions.push_back(i);
    in.attention.slot_mapping.push_back(i);
  }
  in.attention.query_start_loc = {0, n};
  in.attention.seq_lens = {n};
  in.attention.max_blocks_per_seq = blocks;
  for (int b = 0; b < blocks; ++b) in.attention.block_tables.push_back(b);
  in.logits_indices = std::move(rows);
  Tensor lg = model.forward(in, cache);
  std::vector<float> v(static_cast<size_t>(lg.numel()));
  be.copy_to_host(v.data(), lg);
  be.synchronize();
  return v;
}

// One sequence's part of a step: tokens [start, start+len) of `all_tokens`, its KV in
// blocks [first_block, first_block + num_blocks) in order, its linear-attention state in
// `slot` (continued when the step starts after position 0).
// A tensor's values on the host (f32), after the backend's queued work.
inline std::vector<float> to_host(Backend& be, const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  be.copy_to_host(v.data(), t);
  be.synchronize();
  return v;
}

inline int argmax(const std::vector<float>& v) {
  return static_cast<int>(std::max_element(v.begin(), v.end()) - v.begin());
}

// The gap between the largest and the second largest value.
inline float top2_gap(const std::vector<float>& v) {
  float a = -INFINITY, b = -INFINITY;
  for (float x : v) {
    if (x > a) {
      b = a;
      a = x;
    } else if (x > b) {
      b = x;
    }
  }
  return a - b;
}

struct SeqPart {
  const std::vector<int32_t>* tokens;
  int start, len;
  int first_block, num_blocks;
  int slot;
};

inline ModelInput step_of(const std::vector<SeqPart>& seqs) {
  ModelInput in;
  in.attention.query_start_loc = {0};
  in.linear.query_start_loc = {0};
  int max_blocks = 0;
  for (const auto& s : seqs) max_blocks = std::max(max_blocks, s.num_blocks);
  in.attention.max_blocks_per_seq = max_blocks;
  for (const auto& s : seqs) {
    for (int i = s.start; i < s.start + s.len; ++i) {
      in.token_ids.push_back((*s.tokens)[i]);
      in.positions.push_back(i);
      in.attention.slot_mapping.push_back((s.first_block + i / 16) * 16 + i % 16);
    }
    const int end = static_cast<int>(in.token_ids.size());
    in.attention.query_start_loc.push_back(end);
    in.attention.seq_lens.push_back(s.start + s.len);
    for (int b = 0; b < max_blocks; ++b) in.attention.block_tables.push_back(b < s.num_blocks ? s.first_block + b : 0);
    in.linear.query_start_loc.push_back(end);
    in.linear.state_slots.push_back(s.slot);
    in.linear.has_initial_state.push_back(s.start > 0 ? 1 : 0);
    in.logits_indices.push_back(end - 1);
  }
  return in;
}

}  // namespace tessera::testing
