// Broken weights: a request whose logits hold NaN fails alone (FinishReason::kError with a
// message naming the step and --check-weights) instead of sampling token 0, the engine and the
// other requests go on; --check-weights finds NaN/Inf weights by name after loading.
#include <gtest/gtest.h>

#include <unistd.h>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/dtype.h"
#include "core/error.h"
#include "engine/async_engine.h"
#include "engine/engine.h"
#include "engine/model_loader.h"
#include "fixture_util.h"
#include "nan_fixture.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

// Untied embeddings: a NaN embedding row poisons only the sequences that hold that token.
constexpr const char* kFixture = "qwen2_gqa2_untied";
constexpr const char* kEmbedding = "model.embed_tokens.weight";
constexpr int32_t kPoisonToken = 77;

const Tensor& weight(Model& m, const std::string& name) {
  const Tensor* found = nullptr;
  m.weights().for_each_tensor([&](const std::string& n, const Tensor& t) {
    if (n == name) found = &t;
  });
  if (!found) throw std::runtime_error("no weight " + name);
  return *found;
}

// Row `row` of the weight `name` becomes `value` (NaN, inf).
void overwrite_row(Model& m, Backend& be, const std::string& name, int64_t row, float value) {
  const Tensor& t = weight(m, name);
  const Tensor r = t.rows(row, row + 1);
  std::vector<float> f32(static_cast<size_t>(r.numel()), value);
  std::vector<char> bytes(r.nbytes());
  convert_host(f32.data(), DType::kF32, bytes.data(), r.dtype(), f32.size());
  be.copy_from_host(r, bytes.data());
}

std::unique_ptr<Model> load_fixture(Backend& be, const std::string& dir, bool check = false) {
  LoadOptions lo;
  lo.model_dir = dir;
  lo.check_weights = check;
  return load_model(lo, be);
}

std::unique_ptr<LLMEngine> make_engine(std::unique_ptr<Model> model, Backend& be) {
  EngineConfig ec;
  ec.num_blocks_override = 64;
  ec.scheduler.max_num_seqs = 8;
  ec.scheduler.max_num_batched_tokens = 512;
  ec.scheduler.max_model_len = 128;
  return std::make_unique<LLMEngine>(std::make_unique<LocalExecutor>(std::move(model), be), ec);
}

SamplingParams params(int max_tokens, float temperature = 0.0f, int logprobs = -1) {
  SamplingParams p;
  p.temperature = temperature;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  p.logprobs = logprobs;
  return p;
}

struct Finished {
  FinishReason reason = FinishReason::kNone;
  std::string error;
  std::vector<int32_t> tokens;
};

std::map<std::string, Finished> run_all(LLMEngine& e) {
  std::map<std::string, Finished> out;
  while (e.has_unfinished())
    for (const auto& o : e.step()) {
      Finished& f = out[o.request_id];
      f.tokens.insert(f.tokens.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      if (o.finished) {
        f.reason = o.finish_reason;
        f.error = o.error;
      }
    }
  return out;
}

void expect_nan_error(const Finished& f, const std::string& id) {
  EXPECT_EQ(f.reason, FinishReason::kError) << id;
  EXPECT_TRUE(f.tokens.empty()) << id << ": no token is sampled from NaN logits";
  EXPECT_NE(f.error.find("step "), std::string::npos) << f.error;
  EXPECT_NE(f.error.find("NaN"), std::string::npos) << f.error;
  EXPECT_NE(f.error.find("request " + id), std::string::npos) << f.error;
  EXPECT_NE(f.error.find("--check-weights"), std::string::npos) << f.error;
}

// Greedy and seeded rows (device sampling), and a row with logprobs (the host sampler): the
// poisoned ones fail with the message, the healthy ones beside them in the same steps finish.
TEST(NanWeights, RequestWithNanLogitsFailsAloneAndTheEngineGoesOn) {
  auto be = testing::make_test_backend();
  auto model = load_fixture(*be, testing::fixtures_dir() + "/" + kFixture);
  overwrite_row(*model, *be, kEmbedding, kPoisonToken, std::numeric_limits<float>::quiet_NaN());
  auto engine = make_engine(std::move(model), *be);
  const std::vector<int32_t> healthy{5, 9, 14, 3, 40}, poisoned{5, 9, kPoisonToken};
  ASSERT_TRUE(engine->add_request("bad-greedy", poisoned, params(6)).ok());
  ASSERT_TRUE(engine->add_request("bad-seeded", poisoned, params(6, 0.8f)).ok());
  ASSERT_TRUE(engine->add_request("bad-host", poisoned, params(6, 0.0f, 2)).ok());
  ASSERT_TRUE(engine->add_request("good", healthy, params(6)).ok());
  ASSERT_TRUE(engine->add_request("good-host", healthy, params(6, 0.7f, 2)).ok());
  auto out = run_all(*engine);
  for (const char* id : {"bad-greedy", "bad-seeded", "bad-host"}) expect_nan_error(out[id], id);
  for (const char* id : {"good", "good-host"}) {
    EXPECT_EQ(out[id].reason, FinishReason::kLength) << id;
    EXPECT_EQ(out[id].tokens.size(), 6u) << id;
  }
  EXPECT_TRUE(engine->cache_manager().pool().all_free()) << "KV blocks leaked";

  // The engine serves the next request as before.
  ASSERT_TRUE(engine->add_request("after", healthy, params(6)).ok());
  out = run_all(*engine);
  EXPECT_EQ(out["after"].reason, FinishReason::kLength);
  EXPECT_EQ(out["after"].tokens.size(), 6u);
}

// MTP speculation drafts on the device from the sampled tokens: a -1 there (NaN logits) must not fail the
// step. NaN in the MTP layer alone: its drafts are -1, dropped, and the output is plain greedy decoding's.
// NaN in the target model: every request fails alone, and the engine keeps stepping.
TEST(NanWeights, MtpDraftingSurvivesNanLogits) {
  auto be = testing::make_test_backend();
  if (!be->supports_token_state_slots()) GTEST_SKIP() << "this backend does not keep per-token linear-attention states";
  const std::string dir = testing::fixtures_dir() + "/qwen3_5_dense_tiny";
  auto run = [&](const char* poison, bool mtp) {
    LoadOptions lo;
    lo.model_dir = dir;
    lo.mtp = mtp;
    auto model = load_model(lo, *be);
    if (poison) overwrite_row(*model, *be, poison, 0, std::numeric_limits<float>::quiet_NaN());
    EngineConfig ec;
    ec.num_blocks_override = 64;
    ec.scheduler.max_num_seqs = 8;
    ec.scheduler.max_num_batched_tokens = 512;
    ec.scheduler.max_model_len = 128;
    if (mtp) {
      ec.speculative.method = "mtp";
      ec.speculative.num_speculative_tokens = 2;
    }
    LLMEngine e(std::make_unique<LocalExecutor>(std::move(model), *be), ec);
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(e.add_request("r" + std::to_string(i), {5, 9, 14, 3 + i}, params(8)).ok());
    return run_all(e);
  };
  const auto plain = run(nullptr, false);
  const auto bad_drafts = run("mtp.fc.weight", true);
  for (const auto& [id, f] : plain) {
    EXPECT_EQ(bad_drafts.at(id).reason, FinishReason::kLength) << id;
    EXPECT_EQ(bad_drafts.at(id).tokens, f.tokens) << id;
  }
  const auto bad_model = run("model.norm.weight", true);
  ASSERT_EQ(bad_model.size(), 3u);
  for (const auto& [id, f] : bad_model) expect_nan_error(f, id);
}

// Through AsyncEngine, the front ends' path: the error delta's text is the message (the server
// answers it with a 500, or an error event when streaming), and the engine stays alive.
TEST(NanWeights, AsyncEngineReportsTheMessage) {
  auto be = testing::make_test_backend();
  auto model = load_fixture(*be, testing::fixtures_dir() + "/" + kFixture);
  overwrite_row(*model, *be, kEmbedding, kPoisonToken, std::numeric_limits<float>::quiet_NaN());
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, StreamDelta> last;  // (before the engine: its callbacks write here until it drains)
  AsyncEngine engine(make_engine(std::move(model), *be), nullptr);
  auto submit = [&](const std::string& id, std::vector<int32_t> prompt) {
    GenerationRequest r;
    r.id = id;
    r.prompt_ids = std::move(prompt);
    r.params = params(4);
    auto res = engine.submit(r, [&, id](const StreamDelta& d) {
      if (!d.finished) return;
      std::lock_guard<std::mutex> lk(mu);
      last[id] = d;
      cv.notify_all();
    });
    ASSERT_TRUE(res.ok()) << res.message;
  };
  submit("bad", {5, kPoisonToken});
  submit("good", {5, 9});
  std::unique_lock<std::mutex> lk(mu);
  ASSERT_TRUE(cv.wait_for(lk, std::chrono::seconds(60), [&] { return last.size() == 2; }));
  EXPECT_EQ(last["bad"].finish_reason, FinishReason::kError);
  EXPECT_NE(last["bad"].text.find("NaN"), std::string::npos) << last["bad"].text;
  EXPECT_NE(last["bad"].text.find("--check-weights"), std::string::npos) << last["bad"].text;
  EXPECT_EQ(last["good"].finish_reason, FinishReason::kLength);
  EXPECT_TRUE(engine.stats().alive);
}

// --check-weights on the loaded weights: a NaN or an Inf anywhere in a tensor is found, by name.
TEST(NanWeights, FindNonFiniteWeightsNamesTheTensors) {
  auto be = testing::make_test_backend();
  auto model = load_fixture(*be, testing::fixtures_dir() + "/" + kFixture);
  NonFiniteWeights clean = find_nonfinite_weights(model->weights(), *be);
  EXPECT_TRUE(clean.names.empty());
  EXPECT_GT(clean.tensors_checked, 10u);
  const int64_t last_row = weight(*model, "lm_head.weight").dim(0) - 1;
  overwrite_row(*model, *be, "lm_head.weight", last_row, std::numeric_limits<float>::infinity());
  overwrite_row(*model, *be, "model.layers.1.mlp.down_proj.weight", 0, std::numeric_limits<float>::quiet_NaN());
  const NonFiniteWeights broken = find_nonfinite_weights(model->weights(), *be);
  EXPECT_EQ(broken.names, (std::vector<std::string>{"model.layers.1.mlp.down_proj.weight", "lm_head.weight"}));
  try {
    check_weights(model->weights(), *be, "M");
    ADD_FAILURE() << "check_weights passed NaN weights";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("2 of"), std::string::npos) << what;
    EXPECT_NE(what.find("model.layers.1.mlp.down_proj.weight, lm_head.weight"), std::string::npos) << what;
  }
}

// A copy of the fixture whose one tensor (the final norm) is NaN in the file: load_model with
// check_weights (--check-weights) refuses it naming the tensor; without, it loads.
TEST(NanWeights, CheckWeightsRefusesACheckpointWithANanTensor) {
  const fs::path src = fs::path(testing::fixtures_dir()) / kFixture;
  const fs::path dir = testing::copy_with_nan_tensor(src, "tessera_nan_weights", "model.norm.weight");
  auto be = testing::make_test_backend();
  EXPECT_NE(load_fixture(*be, dir.string()), nullptr);
  try {
    load_fixture(*be, dir.string(), /*check=*/true);
    ADD_FAILURE() << "--check-weights loaded a NaN tensor";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::kCorrupt);
    EXPECT_NE(what.find("--check-weights found NaN or Inf in 1 of"), std::string::npos) << what;
    EXPECT_NE(what.find("model.norm.weight"), std::string::npos) << what;
  }
  EXPECT_NE(load_fixture(*be, src.string(), /*check=*/true), nullptr) << "the clean fixture passes";
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tessera
