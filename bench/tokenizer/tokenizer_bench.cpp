// Encode throughput (MB/s) of the tokenizers under test on ~1 MB of mixed text: the strings of
// tests/fixtures/tokenizer/strings.json joined by newlines and repeated to at least 1 MB, the same
// recipe as tools/make_tokenizer_refs.py --bench, so the figures compare with HF tokenizers.
//   tokenizer_bench [MODEL_DIR...]   (default: the three test tokenizers under .npm-pkgs/)
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace {

std::string benchmark_text(size_t min_bytes) {
  std::ifstream in(std::filesystem::path(TESSERA_SOURCE_DIR) / "tests/fixtures/tokenizer/strings.json");
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::string block;
  const auto strings = nlohmann::json::parse(buffer.str()).at("strings");
  for (size_t i = 0; i < strings.size(); ++i) {
    block += strings[i].get<std::string>();
    block += '\n';  // "\n".join(strings) + "\n"
  }
  std::string text;
  while (text.size() < min_bytes) text += block;
  return text;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::filesystem::path> dirs;
  for (int i = 1; i < argc; ++i) dirs.emplace_back(argv[i]);
  if (dirs.empty()) {
    for (const char* name : {"qwen3", "llama3_1", "deepseek_v3"}) {
      dirs.push_back(std::filesystem::path(TESSERA_SOURCE_DIR) / ".npm-pkgs" / (std::string("tokenizer-") + name) /
                     "package" / "models");
    }
  }
  const std::string text = benchmark_text(1000000);
  const double mb = static_cast<double>(text.size()) / 1e6;
  for (const auto& dir : dirs) {
    auto load_start = std::chrono::steady_clock::now();
    auto tokenizer = tessera::tokenizer::Tokenizer::from_dir(dir);
    double load_s = seconds_since(load_start);
    // The first pass fills the per-word cache; later passes show the steady state.
    auto first_start = std::chrono::steady_clock::now();
    size_t tokens = tokenizer->encode(text).size();
    double first_s = seconds_since(first_start);
    double best_s = 1e9;
    for (int run = 0; run < 3; ++run) {
      auto start = std::chrono::steady_clock::now();
      tokenizer->encode(text);
      best_s = std::min(best_s, seconds_since(start));
    }
    std::vector<int32_t> ids = tokenizer->encode(text);
    auto decode_start = std::chrono::steady_clock::now();
    std::string decoded = tokenizer->decode(ids);
    double decode_s = seconds_since(decode_start);
    if (decoded != text) std::printf("note: decode(encode(text)) differs from the text (a normalizer changed it)\n");
    std::printf(
        "%s: %.2f MB, %zu tokens; load %.2f s; encode first pass %.2f MB/s, warm %.2f MB/s (one thread); "
        "decode %.0f MB/s\n",
        dir.parent_path().parent_path().filename().c_str(), mb, tokens, load_s, mb / first_s, mb / best_s,
        mb / std::max(decode_s, 1e-6));
  }
  return 0;
}
