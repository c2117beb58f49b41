// AsyncEngine's contract (docs/engine.md): every sequence of every submitted request gets
// exactly one output with finished = true, and nothing after it, whatever ends it: its length,
// a stop token or string, an abort (before or after it started), a preemption it resumes from,
// a refusal on the engine thread, a failed step, a failure outside it (fail()), or a drain. Run on the tiny qwen3
// fixture (with the real Qwen3 tokenizer for stop strings), behind an executor that can slow or fail a step.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <span>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "engine/async_engine.h"
#include "engine/model_loader.h"
#include "fixture_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace tessera {
namespace {

// The model in this process, with a step that throws when asked to.
class FaultyExecutor : public Executor {
 public:
  FaultyExecutor(std::unique_ptr<Model> model, Backend& backend) : inner_(std::move(model), backend) {}
  const ModelConfig& model_config() const override { return inner_.model_config(); }
  std::vector<LayerCacheSpec> cache_specs() const override { return inner_.cache_specs(); }
  Backend& backend() override { return inner_.backend(); }
  void init_kv_cache(const CacheInit& init) override { inner_.init_kv_cache(init); }
  void execute(const ModelInput& input, const StepSampling& sampling, StepOutput& out) override {
    if (fail_next.exchange(false)) fail(ErrorKind::kInternal, "injected step failure");
    // Slow steps keep a request running while the test aborts, drains or fails it.
    if (int ms = step_delay_ms.load()) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    inner_.execute(input, sampling, out);
  }
  std::atomic<bool> fail_next{false};
  std::atomic<int> step_delay_ms{0};

 private:
  LocalExecutor inner_;
};

// What one sequence received.
struct Seen {
  int deltas = 0, finished = 0, after_finish = 0, tokens = 0;
  FinishReason reason = FinishReason::kNone;
  std::string text;
  std::vector<int32_t> ids;
};

struct Harness {
  std::unique_ptr<Backend> backend = testing::make_test_backend();
  std::unique_ptr<tokenizer::Tokenizer> tok;  // only for stop strings (loading it takes seconds)
  FaultyExecutor* exec = nullptr;
  std::unique_ptr<AsyncEngine> engine;
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, Seen> seen;  // by "<label>/<index>"
  int finished_total = 0;

  explicit Harness(int num_blocks = 64, int max_num_seqs = 8, int step_delay_ms = 0, bool text = false) {
    if (text)
      tok =
          tokenizer::Tokenizer::from_dir(std::string(TESSERA_SOURCE_DIR) + "/.npm-pkgs/tokenizer-qwen3/package/models");
    LoadOptions lo;
    lo.model_dir = testing::fixtures_dir() + "/qwen3_gqa4_hd32";
    EngineConfig ec;
    ec.num_blocks_override = num_blocks;
    ec.scheduler.max_num_seqs = max_num_seqs;
    ec.scheduler.max_num_batched_tokens = 512;
    ec.scheduler.max_model_len = 128;
    auto e = std::make_unique<FaultyExecutor>(load_model(lo, *backend), *backend);
    exec = e.get();
    exec->step_delay_ms = step_delay_ms;
    engine = std::make_unique<AsyncEngine>(std::make_unique<LLMEngine>(std::move(e), ec), tok.get());
  }
  ~Harness() { engine.reset(); }

  static SamplingParams params(int max_tokens, int n = 1) {
    SamplingParams p;
    p.temperature = 0;
    p.ignore_eos = true;
    p.max_tokens = max_tokens;
    p.n = n;
    return p;
  }
  OutputCallback record(const std::string& label) {
    return [this, label](const StreamDelta& d) {
      std::lock_guard<std::mutex> lk(mu);
      Seen& s = seen[label + "/" + std::to_string(d.index)];
      if (s.finished) ++s.after_finish;
      ++s.deltas;
      s.tokens += static_cast<int>(d.token_ids.size());
      s.ids.insert(s.ids.end(), d.token_ids.begin(), d.token_ids.end());
      s.text += d.text;
      if (d.finished) {
        ++s.finished;
        s.reason = d.finish_reason;
        ++finished_total;
      }
      cv.notify_all();
    };
  }
  // Submits under `label` (the request id unless given).
  SubmitResult submit(const std::string& label, std::vector<int32_t> prompt, SamplingParams p,
                      const std::string& id = "") {
    return engine->submit(GenerationRequest{id.empty() ? label : id, std::move(prompt), p}, record(label));
  }
  void wait_finished(int want) {
    std::unique_lock<std::mutex> lk(mu);
    ASSERT_TRUE(cv.wait_for(lk, std::chrono::seconds(60), [&] { return finished_total >= want; }))
        << finished_total << " of " << want << " sequences finished";
  }
  // Waits until `label`'s sequence 0 has streamed at least one token.
  void wait_started(const std::string& label) {
    std::unique_lock<std::mutex> lk(mu);
    ASSERT_TRUE(cv.wait_for(lk, std::chrono::seconds(60), [&] {
      auto it = seen.find(label + "/0");
      return it != seen.end() && it->second.tokens > 0;
    }));
  }
  Seen get(const std::string& key) {
    std::lock_guard<std::mutex> lk(mu);
    return seen[key];
  }
  // Every sequence seen finished exactly once and got nothing afterwards.
  void expect_one_finish_each(size_t sequences) {
    std::lock_guard<std::mutex> lk(mu);
    EXPECT_EQ(seen.size(), sequences);
    for (const auto& [key, s] : seen) {
      EXPECT_EQ(s.finished, 1) << key;
      EXPECT_EQ(s.after_finish, 0) << key;
    }
  }
};

std::vector<int32_t> prompt(int len, int first = 3) {
  std::vector<int32_t> p(static_cast<size_t>(len));
  for (int i = 0; i < len; ++i) p[static_cast<size_t>(i)] = (first + 7 * i) % 200 + 3;
  return p;
}

TEST(AsyncEngineContract, FinishedRequestsEndOncePerSequence) {
  Harness h;
  ASSERT_TRUE(h.submit("a", prompt(5), Harness::params(6)).ok());
  ASSERT_TRUE(h.submit("b", prompt(9, 11), Harness::params(3, /*n=*/3)).ok());
  ASSERT_TRUE(h.submit("probe", prompt(7, 5), Harness::params(4)).ok());
  h.wait_finished(5);
  // The probe's second token as a stop token (greedy: the same prompt gives the same tokens):
  // the sequence ends there, with reason stop.
  const std::vector<int32_t> probe = h.get("probe/0").ids;
  ASSERT_EQ(probe.size(), 4u);
  SamplingParams stop = Harness::params(50);
  stop.stop_token_ids = {probe[1]};
  ASSERT_TRUE(h.submit("s", prompt(7, 5), stop).ok());
  h.wait_finished(6);
  h.expect_one_finish_each(6);
  EXPECT_EQ(h.get("a/0").reason, FinishReason::kLength);
  EXPECT_EQ(h.get("a/0").tokens, 6);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(h.get("b/" + std::to_string(i)).tokens, 3);
  const Seen s = h.get("s/0");
  EXPECT_EQ(s.reason, FinishReason::kStop);
  ASSERT_LE(s.ids.size(), 2u);
  EXPECT_EQ(s.ids.back(), probe[1]);
}

TEST(AsyncEngineContract, AStopStringEndsItsSequenceOnce) {
  Harness h(64, 8, 0, /*text=*/true);
  ASSERT_TRUE(h.submit("probe", prompt(6), Harness::params(12)).ok());
  h.wait_finished(1);
  const std::string text = h.get("probe/0").text;
  // A character from the middle of the greedy text: both sequences (n = 2, greedy, same
  // tokens) meet it, each is cut there and ends once with reason stop.
  std::string stop;
  for (size_t i = text.size() / 2; i < text.size() && stop.empty(); ++i)
    if (text[i] > ' ' && text[i] < 127) stop = text.substr(i, 1);
  ASSERT_FALSE(stop.empty()) << "no ASCII character in the fixture's text: " << text;
  SamplingParams p = Harness::params(12, /*n=*/2);
  p.stop = {stop};
  ASSERT_TRUE(h.submit("s", prompt(6), p).ok());
  h.wait_finished(3);
  h.expect_one_finish_each(3);
  for (const char* k : {"s/0", "s/1"}) {
    const Seen s = h.get(k);
    EXPECT_EQ(s.reason, FinishReason::kStop) << k;
    EXPECT_EQ(s.text, text.substr(0, text.find(stop))) << k;
  }
}

// vLLM's rules for what a stop leaves in the text: a stop token's own text is not part of the output
// (its id is) unless include_stop_str_in_output, which also keeps a stop string.
TEST(AsyncEngineContract, StopTokenTextIsLeftOutUnlessAskedFor) {
  Harness h(64, 8, 0, /*text=*/true);
  ASSERT_TRUE(h.submit("probe", prompt(6), Harness::params(12)).ok());
  h.wait_finished(1);
  const std::vector<int32_t> ids = h.get("probe/0").ids;
  // The first token after the first whose text is not empty and that did not occur before it.
  size_t j = 1;
  while (j < ids.size() && (h.tok->decode(std::span(ids).subspan(j, 1), true).empty() ||
                            std::find(ids.begin(), ids.begin() + static_cast<long>(j), ids[j]) != ids.begin() + j))
    ++j;
  ASSERT_LT(j, ids.size()) << "no usable stop token in the fixture's greedy output";
  const std::span<const int32_t> all(ids);
  SamplingParams p = Harness::params(12);
  p.stop_token_ids = {ids[j]};
  ASSERT_TRUE(h.submit("excluded", prompt(6), p).ok());
  p.include_stop_str_in_output = true;
  ASSERT_TRUE(h.submit("included", prompt(6), p).ok());
  h.wait_finished(3);
  const Seen excluded = h.get("excluded/0"), included = h.get("included/0");
  EXPECT_EQ(excluded.reason, FinishReason::kStop);
  EXPECT_EQ(excluded.ids.size(), j + 1) << "the stop token's id stays in the token ids";
  EXPECT_EQ(excluded.text, h.tok->decode(all.first(j), true));
  EXPECT_EQ(included.text, h.tok->decode(all.first(j + 1), true));
  // A stop string kept with include_stop_str_in_output.
  const std::string text = h.get("probe/0").text;
  std::string stop;
  for (size_t i = text.size() / 2; i < text.size() && stop.empty(); ++i)
    if (text[i] > ' ' && text[i] < 127) stop = text.substr(i, 1);
  ASSERT_FALSE(stop.empty());
  SamplingParams q = Harness::params(12);
  q.stop = {stop};
  q.include_stop_str_in_output = true;
  ASSERT_TRUE(h.submit("kept", prompt(6), q).ok());
  h.wait_finished(4);
  EXPECT_EQ(h.get("kept/0").text, text.substr(0, text.find(stop) + stop.size()));
}

// min_tokens holds back every stop: a stop string whose only occurrences end in the text of the
// first min_tokens tokens, and stop tokens (masked until then).
TEST(AsyncEngineContract, MinTokensHoldsBackStopStringsAndStopTokens) {
  Harness h(64, 8, 0, /*text=*/true);
  ASSERT_TRUE(h.submit("probe", prompt(6), Harness::params(24)).ok());
  h.wait_finished(1);
  const std::vector<int32_t> ids = h.get("probe/0").ids;
  const std::string text = h.get("probe/0").text;
  const std::span<const int32_t> all(ids);
  // The first token's text (or its first character) as a stop string: without min_tokens the answer is
  // cut at once; with min_tokens 12 only an occurrence ending after the 12th token's text counts.
  size_t first = 0;
  while (first < ids.size() && h.tok->decode(all.subspan(first, 1), true).empty()) ++first;
  ASSERT_LT(first, 8u);
  const std::string first_text = h.tok->decode(all.subspan(first, 1), true);
  const std::string stop = first_text.substr(0, tokenizer::valid_sequence_length(first_text, 0));
  ASSERT_FALSE(stop.empty());
  constexpr int kMin = 12;
  SamplingParams p = Harness::params(24);
  p.stop = {stop};
  ASSERT_TRUE(h.submit("plain", prompt(6), p).ok());
  p.min_tokens = kMin;
  ASSERT_TRUE(h.submit("held", prompt(6), p).ok());
  h.wait_finished(3);
  EXPECT_EQ(h.get("plain/0").text, text.substr(0, text.find(stop)));
  EXPECT_LE(h.get("plain/0").tokens, static_cast<int>(first) + 1);
  const Seen held = h.get("held/0");
  const size_t floor = h.tok->decode(all.first(kMin), true).size();
  const size_t at = text.find(stop, floor >= stop.size() ? floor - stop.size() + 1 : 0);
  EXPECT_GT(held.tokens, kMin);
  EXPECT_EQ(held.text, text.substr(0, at)) << "stop " << stop;
  EXPECT_EQ(held.reason, at == std::string::npos ? FinishReason::kLength : FinishReason::kStop);
  // A stop token met early is masked until min_tokens tokens are out.
  SamplingParams t = Harness::params(24);
  t.stop_token_ids = {ids[first]};
  t.min_tokens = kMin;
  ASSERT_TRUE(h.submit("token", prompt(6), t).ok());
  h.wait_finished(4);
  const Seen token = h.get("token/0");
  EXPECT_GT(token.tokens, kMin);
  for (int i = 0; i < kMin; ++i) EXPECT_NE(token.ids[static_cast<size_t>(i)], ids[first]) << i;
}

TEST(AsyncEngineContract, AbortedRequestsEndOnceWhetherStartedOrNot) {
  Harness h(64, /*max_num_seqs=*/1, /*step_delay_ms=*/2);  // one runs, the others wait
  ASSERT_TRUE(h.submit("running", prompt(5), Harness::params(100, 2)).ok());
  ASSERT_TRUE(h.submit("waiting", prompt(5), Harness::params(100, 2)).ok());
  h.wait_started("running");
  h.engine->abort("running");
  h.engine->abort("waiting");
  h.engine->abort("waiting");      // twice
  h.engine->abort("never-there");  // unknown
  h.wait_finished(4);
  ASSERT_TRUE(h.submit("after", prompt(5), Harness::params(3)).ok());
  h.wait_finished(5);
  h.engine->abort("after");  // already finished
  h.engine->drain(std::chrono::seconds(10));
  h.expect_one_finish_each(5);
  for (const char* k : {"running/0", "running/1", "waiting/0", "waiting/1"})
    EXPECT_EQ(h.get(k).reason, FinishReason::kAbort) << k;
  EXPECT_EQ(h.get("waiting/0").tokens, 0);
  EXPECT_EQ(h.get("after/0").reason, FinishReason::kLength);
}

TEST(AsyncEngineContract, PreemptedSequencesResumeAndEndOnceWithoutRepeatingTokens) {
  // 10 blocks of 16 tokens: four sequences of up to 100 tokens do not fit together.
  Harness h(10, /*max_num_seqs=*/4);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(h.submit("p" + std::to_string(i), prompt(40, i), Harness::params(60)).ok());
  h.wait_finished(4);
  h.engine->drain(std::chrono::seconds(10));
  EXPECT_GT(h.engine->stats().engine.num_preemptions, 0u) << "the test did not preempt";
  h.expect_one_finish_each(4);
  for (int i = 0; i < 4; ++i) {
    const Seen s = h.get("p" + std::to_string(i) + "/0");
    EXPECT_EQ(s.reason, FinishReason::kLength);
    EXPECT_EQ(s.tokens, 60) << "a resumed sequence streams each token once";
  }
}

TEST(AsyncEngineContract, RequestsRefusedOnTheEngineThreadEndOnce) {
  Harness h(64, 8, /*step_delay_ms=*/2);
  ASSERT_TRUE(h.submit("x", prompt(5), Harness::params(100)).ok());
  // The same id again while x runs: refused with an error, x unaffected.
  ASSERT_TRUE(h.submit("dup", prompt(5), Harness::params(3), /*id=*/"x").ok());
  // "y" with n = 2 makes "y#1"; a request named "y#1" then collides inside the engine.
  ASSERT_TRUE(h.submit("y", prompt(5), Harness::params(100, 2)).ok());
  ASSERT_TRUE(h.submit("collide", prompt(5), Harness::params(3), /*id=*/"y#1").ok());
  h.wait_finished(2);
  EXPECT_EQ(h.get("dup/0").reason, FinishReason::kError);
  EXPECT_NE(h.get("dup/0").text.find("duplicate request id"), std::string::npos);
  EXPECT_EQ(h.get("collide/0").reason, FinishReason::kError);
  h.engine->abort("x");
  h.engine->abort("y");
  h.wait_finished(5);
  h.expect_one_finish_each(5);
  EXPECT_EQ(h.get("x/0").reason, FinishReason::kAbort);
}

TEST(AsyncEngineContract, AFailedStepEndsEverySequenceOnceAndTheEngineRefusesMore) {
  Harness h(64, /*max_num_seqs=*/1, /*step_delay_ms=*/2);
  ASSERT_TRUE(h.submit("running", prompt(5), Harness::params(100, 2)).ok());
  ASSERT_TRUE(h.submit("waiting", prompt(5), Harness::params(100)).ok());
  h.wait_started("running");
  h.exec->fail_next = true;
  h.wait_finished(3);
  h.expect_one_finish_each(3);
  for (const char* k : {"running/0", "running/1", "waiting/0"}) {
    EXPECT_EQ(h.get(k).reason, FinishReason::kError) << k;
    EXPECT_NE(h.get(k).text.find("injected step failure"), std::string::npos) << k;
  }
  // The engine thread marks itself dead right after it delivers the error finishes: wait for it
  // (at most 2 s), then every submission is refused.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (h.engine->stats().alive && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_FALSE(h.engine->stats().alive);
  SubmitResult r = h.submit("late", prompt(5), Harness::params(3));
  EXPECT_EQ(r.error, SubmitError::kDead);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  h.expect_one_finish_each(3);  // a refused submission gets no callback
}

// A failure outside the engine (a node of the job lost): every request ends once with an error whose
// text is the failure, not with an abort; the engine is dead afterwards.
TEST(AsyncEngineContract, FailEndsEveryRequestOnceWithTheFailureAndNothingRunsAfter) {
  Harness h(64, /*max_num_seqs=*/1, /*step_delay_ms=*/2);
  ASSERT_TRUE(h.submit("running", prompt(5), Harness::params(120 - 5, 2)).ok());
  ASSERT_TRUE(h.submit("waiting", prompt(5), Harness::params(50)).ok());
  h.wait_started("running");
  const std::string why = "node 1 (10.0.0.2), rank 1: no heartbeat for 10.0 s";
  h.engine->fail(why);
  h.expect_one_finish_each(3);
  for (const char* k : {"running/0", "running/1", "waiting/0"}) {
    EXPECT_EQ(h.get(k).reason, FinishReason::kError) << k;
    EXPECT_NE(h.get(k).text.find(why), std::string::npos) << k << ": " << h.get(k).text;
  }
  EXPECT_FALSE(h.engine->stats().alive);
  EXPECT_EQ(h.engine->stats().fatal_error, why);
  EXPECT_EQ(h.submit("late", prompt(5), Harness::params(3)).error, SubmitError::kDead);
  h.engine->fail("twice");  // the engine thread is gone: nothing happens
  h.engine->drain(std::chrono::milliseconds(0));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  h.expect_one_finish_each(3);
}

TEST(AsyncEngineContract, DrainEndsEveryRequestOnceAndNothingRunsAfter) {
  Harness h(64, /*max_num_seqs=*/1, /*step_delay_ms=*/2);
  ASSERT_TRUE(h.submit("running", prompt(5), Harness::params(120 - 5)).ok());
  ASSERT_TRUE(h.submit("waiting", prompt(5), Harness::params(50, 3)).ok());
  h.wait_started("running");
  h.engine->drain(std::chrono::milliseconds(0));
  h.expect_one_finish_each(4);
  for (const char* k : {"running/0", "waiting/0", "waiting/1", "waiting/2"})
    EXPECT_EQ(h.get(k).reason, FinishReason::kAbort) << k;
  EXPECT_EQ(h.submit("late", prompt(5), Harness::params(3)).error, SubmitError::kDraining);
  const int before = h.finished_total;
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::lock_guard<std::mutex> lk(h.mu);
  EXPECT_EQ(h.finished_total, before);
}

}  // namespace
}  // namespace tessera
