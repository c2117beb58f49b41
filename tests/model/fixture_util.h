// Shared by model and engine tests: the tiny HF fixtures in tests/fixtures/models.
#pragma once
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tessera::testing {

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

// Number of leading greedy steps that are decided by a margin above `min_margin`:
// past the first close call, a tiny numeric difference may legitimately pick the
// other token and the continuations diverge.
inline size_t decisive_prefix(const nlohmann::json& margins, double min_margin) {
  size_t n = 0;
  for (const auto& m : margins) {
    if (m.get<double>() <= min_margin) break;
    ++n;
  }
  return n;
}

}  // namespace tessera::testing
