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

inline nlohmann::json load_reference(const std::string& name) {
  std::ifstream f(fixtures_dir() + "/" + name + "/reference.json");
  return nlohmann::json::parse(f);
}

}  // namespace tessera::testing
