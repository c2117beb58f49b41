// The waiting queue (--max-waiting-requests) counts front-end requests, not sequences: one
// submission of several prompts takes one place (before, each prompt took one, so a few
// multi-prompt requests locked every other client out with 429), and a submission whose
// sequences alone exceed the queue is refused as invalid.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "engine/async_engine.h"
#include "engine/model_loader.h"
#include "fixture_util.h"

namespace tessera {
namespace {

struct Queue {
  std::unique_ptr<Backend> backend = testing::make_test_backend();
  std::unique_ptr<AsyncEngine> engine;
  std::atomic<int> finished{0};

  explicit Queue(int max_waiting) {
    LoadOptions lo;
    lo.model_dir = testing::fixtures_dir() + "/qwen3_gqa4_hd32";
    EngineConfig ec;
    ec.num_blocks_override = 64;
    ec.scheduler.max_num_seqs = 1;  // one sequence runs, the rest wait
    ec.scheduler.max_num_batched_tokens = 512;
    ec.scheduler.max_model_len = 128;
    AsyncEngineOptions ao;
    ao.max_waiting_requests = max_waiting;
    engine =
        std::make_unique<AsyncEngine>(std::make_unique<LLMEngine>(load_model(lo, *backend), *backend, ec), nullptr, ao);
  }

  // One submission of `prompts` requests with `n` sequences each.
  SubmitResult submit(const std::string& id, int prompts, int n, int max_tokens) {
    std::vector<GenerationRequest> reqs;
    std::vector<OutputCallback> cbs;
    for (int p = 0; p < prompts; ++p) {
      SamplingParams sp;
      sp.temperature = 0;
      sp.ignore_eos = true;
      sp.max_tokens = max_tokens;
      sp.n = n;
      reqs.push_back(GenerationRequest{id + "-" + std::to_string(p), {5, 6, 7, 8}, sp});
      cbs.emplace_back([this](const StreamDelta& d) {
        if (d.finished) finished++;
      });
    }
    return engine->submit(std::move(reqs), std::move(cbs));
  }

  void wait_finished(int want) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (finished.load() < want && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ASSERT_EQ(finished.load(), want);
  }
};

TEST(AsyncEngineQueue, ASubmissionOfManyPromptsTakesOnePlace) {
  Queue q(3);
  ASSERT_TRUE(q.submit("a", 3, 1, 100).ok());  // 3 sequences, one place (before: all 3 places)
  ASSERT_TRUE(q.submit("b", 3, 1, 100).ok());
  ASSERT_TRUE(q.submit("c", 1, 1, 100).ok());
  SubmitResult d = q.submit("d", 1, 1, 100);  // three requests wait: full
  EXPECT_EQ(d.error, SubmitError::kOverloaded);
  EXPECT_NE(d.message.find("--max-waiting-requests"), std::string::npos);
  q.engine->drain(std::chrono::milliseconds(0));
  q.wait_finished(7);
}

TEST(AsyncEngineQueue, SequencesBeyondTheWholeQueueAreInvalid) {
  Queue q(3);
  SubmitResult r = q.submit("a", 2, 2, 4);  // 4 sequences can never fit a queue of 3
  EXPECT_EQ(r.error, SubmitError::kInvalid);
  EXPECT_NE(r.message.find("4 sequences"), std::string::npos) << r.message;
  EXPECT_TRUE(q.submit("b", 3, 1, 4).ok());
}

TEST(AsyncEngineQueue, PlacesAreFreedOnceTheSequencesStartOrEnd) {
  Queue q(2);
  ASSERT_TRUE(q.submit("a", 2, 1, 2).ok());
  ASSERT_TRUE(q.submit("b", 1, 2, 2).ok());
  q.wait_finished(4);
  // Both finished: their places are free again.
  ASSERT_TRUE(q.submit("c", 1, 1, 2).ok());
  ASSERT_TRUE(q.submit("d", 2, 1, 2).ok());
  q.wait_finished(7);
  // A refused submission (an out-of-vocabulary prompt) takes no place.
  std::vector<GenerationRequest> bad{GenerationRequest{"e", {1 << 30}, SamplingParams{}}};
  std::vector<OutputCallback> cb{[](const StreamDelta&) {}};
  EXPECT_EQ(q.engine->submit(std::move(bad), std::move(cb)).error, SubmitError::kInvalid);
  ASSERT_TRUE(q.submit("f", 1, 1, 2).ok());
  ASSERT_TRUE(q.submit("g", 1, 1, 2).ok());
  q.wait_finished(9);
}

}  // namespace
}  // namespace tessera
