// Grammar compile time and next-token mask time on the real Qwen3 vocabulary (151,936 logits), for
// several JSON Schemas from tests/grammar/schemas and json_object mode.
//   bash scripts/fetch_test_data.sh && cmake --build build/cpu --target grammar_bench
//   build/cpu/bench/grammar/grammar_bench
// BM_Compile: GrammarBuilder + compile() with the default limits (token tables built eagerly for up to
// CompileLimits::eager_table_time, the rest on first use). BM_CompileAllTables: every table built.
// BM_Mask: fill_next_token_bitmask per generated token along a fixed document (a seeded random walk of
// masked-in tokens; for nested_order, the schema of scripts/device_structured_bench.sh, a realistic
// order tokenized by the Qwen3 tokenizer), tables already built; the counter us_per_mask is the mean.
// BM_MaskFirstPass: the same right after a default compile (tables not built eagerly are built when
// first reached). BM_MaskStep: one engine step of 1 or 64 sequences along the nested_order document at
// staggered positions, the masks filled serially on the caller's thread, on BackgroundTasks (as
// LLMEngine does), or on BackgroundTasks overlapping a simulated forward; us_per_step is the caller's
// mean mask time per step (see BM_MaskStep below).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "core/background_tasks.h"
#include "grammar_test_util.h"
#include "qwen3_vocab.h"

namespace tessera::grammar {
namespace {

using ojson = nlohmann::ordered_json;

const std::vector<std::string> kSchemas = {"01_weather_tool", "02_search_tool_strict", "08_recursive_tree",
                                           "09_formats",      "22_ecommerce_order",    "24_sql_query",
                                           "27_user_profile", "json_object",           "nested_order"};

// scripts/device_structured_bench.sh's guided_json schema.
constexpr const char* kNestedOrderSchema = R"({"type": "object", "properties": {"order": {"type": "object",
  "properties": {"id": {"type": "string"}, "items": {"type": "array", "items": {"type": "object", "properties": {
  "sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}, "price": {"type": "number"}},
  "required": ["sku", "qty", "price"]}}, "customer": {"type": "object", "properties": {"name": {"type": "string"},
  "email": {"type": "string", "format": "email"}}, "required": ["name"]}}, "required": ["id", "items"]}},
  "required": ["order"]})";

// What a model writes for it (tokenized with the Qwen3 tokenizer).
constexpr const char* kNestedOrderDocument =
    R"({"order": {"id": "ORD-2026-118734", "items": [{"sku": "KB-MX-BROWN-US", "qty": 2, "price": 89.99}, {"sku": "MS-ERGO-WL", "qty": 1, "price": 49.5}, {"sku": "USB-C-HUB-7P", "qty": 3, "price": 24.75}], "customer": {"name": "Jordan Alvarez", "email": "jordan.alvarez@example.com"}}})";

std::shared_ptr<const Grammar> grammar_for(const std::string& name) {
  GrammarBuilder b;
  if (name == "json_object") return b.build(b.add_any_json_object());
  if (name == "nested_order") return b.build(b.add_json_schema(ojson::parse(kNestedOrderSchema)));
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

// A fixed document: the tokens of kNestedOrderDocument for nested_order, else of a seeded random walk.
std::vector<int32_t> document(const std::string& name, const std::shared_ptr<const CompiledGrammar>& compiled,
                              const TokenizerInfo& info) {
  std::vector<int32_t> tokens;
  if (name == "nested_order") {
    static const auto tok = tokenizer::Tokenizer::from_dir(testing::qwen3_dir());
    tokens = tok->encode(kNestedOrderDocument);
    Matcher m(compiled);
    for (int32_t id : tokens)
      if (!m.accept_token(id)) throw std::runtime_error("nested_order: the document does not match its schema");
    if (!m.can_terminate()) throw std::runtime_error("nested_order: the document is incomplete");
    return tokens;
  }
  const TokenizerInfo* vocab = &info;
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
  return tokens;
}

// first_pass: compile with the default limits, then the document's masks, so that tables the eager
// phase left are built on the way (the first request's cost); else every table is built beforehand.
void BM_Mask(benchmark::State& state, const std::string& name, bool first_pass) {
  auto vocab = vocab_or_skip(state);
  if (!vocab) return;
  CompileLimits all;
  all.eager_table_time = std::chrono::milliseconds(100000);
  auto compiled = compile(grammar_for(name), vocab, all);
  const std::vector<int32_t> tokens = document(name, compiled, *vocab);
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

// One step of `batch` sequences: each at its own position along the document (a sequence at the end starts
// over), masks filled into one buffer as StepSampling::masks, then each takes its next token. `mode` says
// how the masks are filled, as LLMEngine does with EngineConfig::mask_threads:
//   kSerial:     on the calling (engine) thread, one sequence after another (mask_threads -1);
//   kBackground: on a BackgroundTasks of `threads` threads, waited for at once (the caller helps);
//   kOverlapped: the same while the caller sleeps kForwardUs (a GPU forward in flight), then waits.
// us_per_step (us_median): the caller's mean (median) wall time spent on the masks per step (kOverlapped:
// start + wait, the forward excluded; 500 steps); us_accept: the tokens' accept_token, one sequence after another (the
// engine thread does that after the step in all modes); us_fill_cpu: the fill's time summed over the threads.
enum class MaskMode { kSerial, kBackground, kOverlapped };
constexpr int kForwardUs = 8000;  // about the TPOT of the H100 measurement (docs/performance.md)

void BM_MaskStep(benchmark::State& state, const std::string& name, int batch, MaskMode mode, int threads) {
  auto vocab = vocab_or_skip(state);
  if (!vocab) return;
  CompileLimits all;
  all.eager_table_time = std::chrono::milliseconds(100000);
  auto compiled = compile(grammar_for(name), vocab, all);
  const std::vector<int32_t> tokens = document(name, compiled, *vocab);
  std::vector<Matcher> matchers;
  std::vector<size_t> pos(static_cast<size_t>(batch));
  for (int i = 0; i < batch; ++i) {
    matchers.emplace_back(compiled);
    pos[i] = static_cast<size_t>(i) * tokens.size() / static_cast<size_t>(batch);
    for (size_t k = 0; k < pos[i]; ++k) matchers.back().accept_token(tokens[k]);
  }
  const size_t words = matchers[0].mask_words();
  std::vector<uint32_t> masks(words * static_cast<size_t>(batch));
  std::vector<double> fill_us(static_cast<size_t>(batch));
  auto fill = [&](int64_t i) {
    const auto t0 = std::chrono::steady_clock::now();
    matchers[i].fill_next_token_bitmask(std::span(masks.data() + i * words, words));
    fill_us[i] = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  };
  std::unique_ptr<BackgroundTasks> pool;
  if (mode != MaskMode::kSerial) pool = std::make_unique<BackgroundTasks>(threads);
  using clock = std::chrono::steady_clock;
  double total_us = 0, accept_us = 0, cpu_us = 0;
  size_t steps = 0;
  std::vector<double> per_step;
  for (auto _ : state) {
    double us = 0;
    if (mode == MaskMode::kSerial) {
      const auto start = clock::now();
      for (int64_t i = 0; i < batch; ++i) fill(i);
      us = std::chrono::duration<double, std::micro>(clock::now() - start).count();
    } else {
      const auto start = clock::now();
      pool->start(batch, fill);
      const auto started = clock::now();
      if (mode == MaskMode::kOverlapped) std::this_thread::sleep_for(std::chrono::microseconds(kForwardUs));
      const auto waiting = clock::now();
      pool->wait();
      us = std::chrono::duration<double, std::micro>(started - start).count() +
           std::chrono::duration<double, std::micro>(clock::now() - waiting).count();
    }
    const auto accepting = clock::now();
    for (int i = 0; i < batch; ++i) {
      if (pos[i] == tokens.size()) {
        matchers[i].reset();
        pos[i] = 0;
      } else {
        matchers[i].accept_token(tokens[pos[i]++]);
      }
    }
    accept_us += std::chrono::duration<double, std::micro>(clock::now() - accepting).count();
    for (double f : fill_us) cpu_us += f;
    total_us += us;
    ++steps;
    per_step.push_back(us);
    state.SetIterationTime(us / 1e6);
  }
  const double n = steps ? static_cast<double>(steps) : 1;
  state.counters["us_per_step"] = total_us / n;
  if (!per_step.empty()) {
    std::nth_element(per_step.begin(), per_step.begin() + static_cast<std::ptrdiff_t>(per_step.size() / 2),
                     per_step.end());
    state.counters["us_median"] = per_step[per_step.size() / 2];
  }
  state.counters["us_accept"] = accept_us / n;
  state.counters["us_fill_cpu"] = cpu_us / n;
  state.counters["threads"] = mode == MaskMode::kSerial ? 0 : threads;
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
  const int threads = BackgroundTasks::default_threads();
  const std::pair<const char*, MaskMode> modes[] = {
      {"serial", MaskMode::kSerial}, {"background", MaskMode::kBackground}, {"overlapped", MaskMode::kOverlapped}};
  for (int batch : {1, 64})
    for (const auto& mode : modes) {
      auto* b =
          benchmark::RegisterBenchmark(fmt::format("BM_MaskStep/nested_order/batch:{}/{}", batch, mode.first).c_str(),
                                       BM_MaskStep, std::string("nested_order"), batch, mode.second, threads);
      b->UseManualTime()->Unit(benchmark::kMicrosecond);
      if (mode.second == MaskMode::kOverlapped) b->Iterations(500);  // (each sleeps kForwardUs)
    }
  return 0;
}
const int registered = register_all();

}  // namespace
}  // namespace tessera::grammar

BENCHMARK_MAIN();
