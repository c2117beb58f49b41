// Where the tokenizer tests find their data: the real tokenizers fetched by
// scripts/fetch_test_data.sh and the reference fixtures in tests/fixtures/tokenizer/.
#pragma once
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "tokenizer/tokenizer.h"

namespace tessera::tokenizer::testing {

inline const char* kTokenizerNames[] = {"qwen3", "llama3_1", "deepseek_v3"};

inline std::filesystem::path model_dir(const std::string& name) {
  return std::filesystem::path(TESSERA_SOURCE_DIR) / ".npm-pkgs" / ("tokenizer-" + name) / "package" / "models";
}

inline std::filesystem::path fixture(const std::string& file) {
  return std::filesystem::path(TESSERA_SOURCE_DIR) / "tests" / "fixtures" / "tokenizer" / file;
}

inline nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("missing " + path.string());
  std::stringstream buffer;
  buffer << in.rdbuf();
  return nlohmann::json::parse(buffer.str());
}

// Loading the big vocabularies takes a moment; each test binary loads each tokenizer once.
inline const Tokenizer& load_tokenizer(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto& slot = cache[name];
  if (!slot) {
    if (!std::filesystem::exists(model_dir(name) / "tokenizer.json")) {
      throw std::runtime_error("missing " + model_dir(name).string() + ": run scripts/fetch_test_data.sh");
    }
    slot = Tokenizer::from_dir(model_dir(name));
  }
  return *slot;
}

}  // namespace tessera::tokenizer::testing
