// Shared by model and engine tests: the tiny HF fixtures in tests/fixtures/models.
#pragma once
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

inline std::string fixtures_dir() { return std::string(TESSERA_SOURCE_DIR) + "/tests/fixtures/models"; }

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

// The fixtures of supported families (what the model and engine tests run).
inline std::vector<std::string> fixture_names() {
  std::vector<std::string> names;
  for (const auto& n : all_fixture_names())
    if (fixture_supported(n)) names.push_back(n);
  return names;
}

inline nlohmann::json load_reference(const std::string& name) {
  std::ifstream f(fixtures_dir() + "/" + name + "/reference.json");
  return nlohmann::json::parse(f);
}

// f32 logits of rows `rows` after one prefill of `ids` (a single sequence) through a fresh f32
// cache on `be`.
inline std::vector<float> prefill_logits(Model& model, Backend& be, const std::vector<int32_t>& ids,
                                         std::vector<int32_t> rows) {
  const int n = static_cast<int>(ids.size()), blocks = (n + 15) / 16;
  KvCache cache;
  cache.num_blocks = blocks;
  for (const auto& spec : model.cache_specs()) {
    cache.k.push_back(be.alloc({blocks, 16, spec.num_kv_heads, spec.head_dim}, DType::kF32));
    cache.v.push_back(be.alloc({blocks, 16, spec.num_kv_heads, spec.head_dim}, DType::kF32));
  }
  ModelInput in;
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

}  // namespace tessera::testing
