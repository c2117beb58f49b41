// Shared by model and engine tests: the tiny HF fixtures in tests/fixtures/models.
#pragma once
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"

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

inline std::vector<std::string> fixture_names() {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(fixtures_dir()))
    if (std::filesystem::exists(e.path() / "reference.json")) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

inline nlohmann::json load_reference(const std::string& name) {
  std::ifstream f(fixtures_dir() + "/" + name + "/reference.json");
  return nlohmann::json::parse(f);
}

}  // namespace tessera::testing
