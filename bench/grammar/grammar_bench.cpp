// Grammar compile time and next-token mask time on the real Qwen3 vocabulary (151,936 logits), for
// several JSON Schemas from tests/grammar/schemas and json_object mode.
//   bash scripts/fetch_test_data.sh && cmake --build build/cpu --target grammar_bench
//   build/cpu/bench/grammar/grammar_bench
// BM_Compile: GrammarBuilder + compile() with the default limits (token tables built eagerly for up to
// CompileLimits::eager_table_time, the rest on first use). BM_CompileAllTables: every table built.
// BM_Mask: fill_next_token_bitmask per generated token along a fixed document (a seeded random walk of
// masked-in tokens), tables already built; the counter us_per_mask is the mean. BM_MaskFirstPass: the
// same right after a default compile (tables not built eagerly are built when first reached).
#include <benchmark/benchmark.h>

#include <chrono>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include "grammar_test_util.h"
#include "qwen3_vocab.h"

namespace tessera::grammar {
namespace {

using ojson = nlohmann::ordered_json;

const std::vector<std::string> kSchemas = {
    "01_weather_tool",    "02_search_tool_strict", "08_recursive_tree", "09_formats",
    "22_ecommerce_order", "24_sql_query",          "27_user_profile",   "json_object"};

std::shared_ptr<const Grammar> grammar_for(const std::string& name) {
  GrammarBuilder b;
  if (name == "json_object") return b.build(b.add_any_json_object());
  std::ifstream in(std::filesystem::path(TESSERA_SOURCE_DIR) / "tests/grammar/schemas" / (name + ".json"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return b.build(b.add_json_schema(ojson::parse(buffer.str())["schema"]));
}

std::shared_ptr<const TokenizerInfo> vocab_or_skip(benchmark::State& state) {
  auto vocab = testing::qwen3_vocab();
  if (!vocab) state.SkipWithError("Qwen3 tokenizer absent: run scripts/fetch_test_data.sh");
  return vocab;
}

void BM_Compile(benchmark::State& state, const std::string& name) {
  auto vocab = vocab_or_skip(state);
  if (!vocab) return;
  compile(grammar_for(name), vocab);  // builds the shared vocabulary index once
  for (auto _ : state) benchmark::DoNotOptimize(compile(grammar_for(name), vocab));
}

void BM_CompileAllTables(benchmark::State& state, const std::string& name) {
  auto vocab = vocab_or_skip(state);
  if (!vocab) return;
  CompileLimits all;
  all.eager_table_time = std::chrono::milliseconds(100000);
  compile(grammar_for(name), vocab);
  for (auto _ : state) benchmark::DoNotOptimize(compile(grammar_for(name), vocab, all));
}

// first_pass: compile with the default limits, then the document's masks, so that tables the eager
// phase left are built on the way (the first request's cost); else every table is built beforehand.
void BM_Mask(benchmark::State& state, const std::string& name, bool first_pass) {
  auto vocab = vocab_or_skip(state);
  if (!vocab) return;
  CompileLimits all;
  all.eager_table_time = std::chrono::milliseconds(100000);
  auto compiled = compile(grammar_for(name), vocab, all);
  // A fixed document: the tokens of a seeded random walk.
  std::vector<int32_t> tokens;
  {
    Matcher m(compiled);
    std::mt19937 rng(7);
    std::vector<uint32_t> mask(m.mask_words());
    for (int i = 0; i < 300 && !m.is_terminated(); ++i) {
      m.fill_next_token_bitmask(mask);
      std::vector<int32_t> allowed;
      for (size_t w = 0; w < mask.size(); ++w)
        for (uint32_t x = mask[w]; x; x &= x - 1) allowed.push_back(static_cast<int32_t>(w * 32 + __builtin_ctz(x)));
      int32_t id = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
      if (i > 60) {  // then steer to the end: closing tokens when allowed
        std::vector<int32_t> closing;
        for (int32_t c : testing::closers(*vocab))
          if (testing::bit(mask, c)) closing.push_back(c);
        if (!closing.empty()) id = closing[std::uniform_int_distribution<size_t>(0, closing.size() - 1)(rng)];
      }
      if (m.can_terminate()) break;
      m.accept_token(id);
      tokens.push_back(id);
    }
  }
  std::vector<uint32_t> mask(Matcher(compiled).mask_words());
  double total_us = 0;
  size_t masks = 0;
  for (auto _ : state) {
    if (first_pass) compiled = compile(grammar_for(name), vocab);
    Matcher m(compiled);
    const auto start = std::chrono::steady_clock::now();
    for (int32_t id : tokens) {
      m.fill_next_token_bitmask(mask);
      m.accept_token(id);
    }
    m.fill_next_token_bitmask(mask);
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    total_us += us;
    masks += tokens.size() + 1;
    state.SetIterationTime(us / 1e6);
  }
  state.counters["tokens"] = static_cast<double>(tokens.size());
  state.counters["us_per_mask"] = masks ? total_us / static_cast<double>(masks) : 0;
}

int register_all() {
  for (const auto& name : kSchemas) {
    benchmark::RegisterBenchmark(("BM_Compile/" + name).c_str(), BM_Compile, name)->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("BM_CompileAllTables/" + name).c_str(), BM_CompileAllTables, name)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("BM_Mask/" + name).c_str(), BM_Mask, name, false)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("BM_MaskFirstPass/" + name).c_str(), BM_Mask, name, true)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }
  return 0;
}
const int registered = register_all();

}  // namespace
}  // namespace tessera::grammar

BENCHMARK_MAIN();
