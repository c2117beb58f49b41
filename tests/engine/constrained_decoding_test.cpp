// Constrained decoding in the engine, through its TokenConstraint seam (no grammar here: the constraints
// are small rules the test can check), on a tiny random-weight model: every token obeys the constraint,
// with sampling, several sequences, speculative drafts, a start after a given token (the end of the
// reasoning), a constraint that can only end; also allowed_token_ids and bad_words.
#include <gtest/gtest.h>

#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <stdexcept>

#include "engine/engine.h"
#include "engine/model_loader.h"
#include "engine/spec/proposer.h"
#include "fixture_util.h"

namespace tessera {
namespace {

constexpr int32_t kEos = 2;  // llama_gqa2's eos_token_id

// Token i of the constrained part must be = i (mod 5) (never the eos, whose residue is 2, before the end),
// and after `length` tokens only the eos may follow.
// throw_at >= 0: fill_mask throws at that position (a broken constraint).
class ResidueConstraint : public TokenConstraint {
 public:
  explicit ResidueConstraint(int length, int* accepts, int throw_at = -1)
      : length_(length), throw_at_(throw_at), accepts_(accepts) {}
  void fill_mask(std::span<uint32_t> mask) override {
    if (pos_ == throw_at_) throw std::runtime_error("residue table lost");
    std::fill(mask.begin(), mask.end(), 0u);
    const int vocab = static_cast<int>(mask.size()) * 32;
    if (pos_ >= length_) {
      mask[kEos / 32] |= 1u << (kEos % 32);
      return;
    }
    for (int t = 0; t < vocab; ++t)
      if (allowed(t)) mask[static_cast<size_t>(t) / 32] |= 1u << (t % 32);
  }
  bool accept(int32_t t) override {
    if (pos_ >= length_ ? t != kEos : !allowed(t)) return false;
    ++pos_;
    if (accepts_) ++*accepts_;
    return true;
  }
  bool is_finished() const override { return pos_ >= length_; }
  void rollback(int n) override {
    pos_ -= n;
    if (accepts_) *accepts_ -= n;
  }
  bool allowed(int32_t t) const { return t != kEos && t % 5 == pos_ % 5; }

 private:
  int length_, throw_at_, pos_ = 0;
  int* accepts_;
};

class ResidueFactory : public TokenConstraintFactory {
 public:
  explicit ResidueFactory(int length, int* accepts = nullptr, int throw_at = -1)
      : length_(length), throw_at_(throw_at), accepts_(accepts) {}
  std::unique_ptr<TokenConstraint> make() const override {
    return std::make_unique<ResidueConstraint>(length_, accepts_, throw_at_);
  }
  std::string describe() const override { return "residues"; }

 private:
  int length_, throw_at_;
  int* accepts_;
};

// Proposes the given continuation (drafts that the constraint accepts or not).
class FixedProposer : public Proposer {
 public:
  explicit FixedProposer(std::vector<int32_t> cont) : cont_(std::move(cont)) {}
  void propose(const std::vector<Request*>& rs, const std::vector<int>& room) override {
    for (size_t i = 0; i < rs.size(); ++i) {
      rs[i]->spec_tokens.clear();
      for (size_t j = rs[i]->output.size(); j < cont_.size() && rs[i]->spec_tokens.size() < size_t(room[i]); ++j)
        rs[i]->spec_tokens.push_back(cont_[j]);
    }
  }

 private:
  std::vector<int32_t> cont_;
};

struct EngineRun {
  std::map<std::string, std::vector<int32_t>> tokens;
  std::map<std::string, FinishReason> finish;
  std::map<std::string, std::string> error;
  // Each step's masks as the executor sampled with them (RecordingExecutor).
  std::vector<std::vector<int32_t>> mask_rows, masks;
};

// A LocalExecutor that records the masks of each step after it sampled; `before` runs first in each step.
class RecordingExecutor : public Executor {
 public:
  RecordingExecutor(std::unique_ptr<Model> model, Backend& be, EngineRun& run, std::function<void()> before)
      : inner_(std::move(model), be), run_(run), before_(std::move(before)) {}
  const ModelConfig& model_config() const override { return inner_.model_config(); }
  std::vector<LayerCacheSpec> cache_specs() const override { return inner_.cache_specs(); }
  Backend& backend() override { return inner_.backend(); }
  void init_kv_cache(const CacheInit& init) override { inner_.init_kv_cache(init); }
  void execute(const ModelInput& input, const StepSampling& sampling, StepOutput& out) override {
    if (before_) before_();
    inner_.execute(input, sampling, out);
    run_.mask_rows.push_back(sampling.mask_rows);
    run_.masks.push_back(sampling.masks);
  }

 private:
  LocalExecutor inner_;
  EngineRun& run_;
  std::function<void()> before_;
};

// mask_threads: EngineConfig::mask_threads (-1: the serial path). before_execute: a RecordingExecutor
// runs the steps, calling it first in each.
EngineRun run(Backend& be, const std::vector<SamplingParams>& params, const std::vector<int32_t>* drafts = nullptr,
              int mask_threads = 0, std::function<void()> before_execute = nullptr) {
  LoadOptions lo;
  lo.model_dir = testing::fixtures_dir() + "/llama_gqa2";
  EngineConfig ec;
  ec.num_blocks_override = 256;
  ec.scheduler.max_model_len = 64;
  ec.mask_threads = mask_threads;
  if (drafts) {
    ec.speculative.method = "ngram";
    ec.speculative.num_speculative_tokens = 3;
  }
  EngineRun r;
  auto e = before_execute
               ? std::make_unique<LLMEngine>(
                     std::make_unique<RecordingExecutor>(load_model(lo, be), be, r, std::move(before_execute)), ec)
               : std::make_unique<LLMEngine>(load_model(lo, be), be, ec);
  if (drafts) e->set_proposer(std::make_unique<FixedProposer>(*drafts));
  const std::vector<int32_t> prompt = {11, 12, 13, 14, 15, 16, 17, 18};
  for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(e->add_request(std::to_string(i), prompt, params[i]).ok());
  while (e->has_unfinished())
    for (const auto& o : e->step()) {
      auto& v = r.tokens[o.request_id];
      v.insert(v.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      if (o.finished) {
        r.finish[o.request_id] = o.finish_reason;
        r.error[o.request_id] = o.error;
      }
    }
  return r;
}

SamplingParams sampled(uint64_t seed, int max_tokens = 12) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = seed;
  p.max_tokens = max_tokens;
  return p;
}

void expect_residues(const std::vector<int32_t>& tokens, size_t from, int length) {
  for (size_t i = from; i < tokens.size(); ++i) {
    const int pos = static_cast<int>(i - from);
    if (pos < length)
      EXPECT_EQ(tokens[i] % 5, pos % 5) << "token " << i << " = " << tokens[i];
    else
      EXPECT_EQ(tokens[i], kEos) << "token " << i;
  }
}

TEST(ConstrainedDecoding, EveryTokenObeysAndTheSequenceEndsWhereTheConstraintDoes) {
  auto be = testing::make_test_backend();
  int accepts = 0;
  std::vector<SamplingParams> ps;
  for (int i = 0; i < 4; ++i) {
    SamplingParams p = sampled(100 + i, 20);
    p.n = i == 3 ? 3 : 1;  // three sequences: each its own state
    p.constraint = std::make_shared<ResidueFactory>(6, &accepts);
    ps.push_back(p);
  }
  EngineRun r = run(*be, ps);
  ASSERT_EQ(r.tokens.size(), 6u);
  for (const auto& [id, t] : r.tokens) {
    ASSERT_EQ(t.size(), 7u) << id;  // six constrained tokens, then the eos
    expect_residues(t, 0, 6);
    EXPECT_EQ(r.finish[id], FinishReason::kStop) << id;
  }
  EXPECT_EQ(accepts, 6 * 7);  // the eos is accepted too
}

TEST(ConstrainedDecoding, ALongConstraintEndsWithLength) {
  auto be = testing::make_test_backend();
  SamplingParams p = sampled(7, 5);
  p.constraint = std::make_shared<ResidueFactory>(50);
  EngineRun r = run(*be, {p});
  ASSERT_EQ(r.tokens["0"].size(), 5u);
  expect_residues(r.tokens["0"], 0, 50);
  EXPECT_EQ(r.finish["0"], FinishReason::kLength);
}

TEST(ConstrainedDecoding, StartsAfterTheGivenToken) {
  auto be = testing::make_test_backend();
  SamplingParams g = sampled(0, 6);
  g.temperature = 0;
  g.ignore_eos = true;
  const std::vector<int32_t> free = run(*be, {g}).tokens["0"];
  ASSERT_EQ(free.size(), 6u);
  ASSERT_NE(free[0], kEos);
  ASSERT_NE(free[1], kEos);
  SamplingParams p = g;
  p.ignore_eos = false;
  p.max_tokens = 10;
  p.constraint = std::make_shared<ResidueFactory>(4);
  p.constraint_after_token = free[1];
  const std::vector<int32_t> t = run(*be, {p}).tokens["0"];
  // Free (greedy, as without the constraint) up to and including the first free[1], constrained after it.
  size_t start = 0;
  while (start < t.size() && t[start] != free[1]) ++start;
  ASSERT_LT(start, t.size());
  for (size_t i = 0; i <= start; ++i) EXPECT_EQ(t[i], free[i]);
  ASSERT_EQ(t.size(), start + 1 + 5);
  expect_residues(t, start + 1, 4);
}

TEST(ConstrainedDecoding, DraftsAreCheckedAgainstTheConstraint) {
  auto be = testing::make_test_backend();
  // Drafts of which some obey the constraint (residues 0, 1, 2, ...) and some do not.
  const std::vector<int32_t> drafts = {5, 6, 99, 8, 9, 10, 11, 17, 13, 14, 15, 16};
  std::vector<SamplingParams> ps;
  for (int i = 0; i < 3; ++i) {
    SamplingParams p = sampled(40 + i, 16);
    p.temperature = i == 0 ? 0.0f : 1.0f;
    p.constraint = std::make_shared<ResidueFactory>(10);
    ps.push_back(p);
  }
  EngineRun r = run(*be, ps, &drafts);
  for (const auto& [id, t] : r.tokens) {
    ASSERT_EQ(t.size(), 11u) << id;
    expect_residues(t, 0, 10);
  }
}

TEST(ConstrainedDecoding, ManySequencesWithDraftsBesideFreeOnes) {
  // The masks of a step are filled on the thread pool: constrained sequences interleaved with free ones,
  // drafts refused at different places, each constrained row masked with its own sequence's state.
  auto be = testing::make_test_backend();
  const std::vector<int32_t> drafts = {5, 6, 99, 8, 9, 10, 11, 17, 13, 14, 15, 16};
  std::vector<SamplingParams> ps;
  for (int i = 0; i < 12; ++i) {
    SamplingParams p = sampled(60 + i, 14);
    if (i % 3 != 1) p.constraint = std::make_shared<ResidueFactory>(4 + i % 7);
    ps.push_back(p);
  }
  EngineRun r = run(*be, ps, &drafts);
  ASSERT_EQ(r.tokens.size(), ps.size());
  for (size_t i = 0; i < ps.size(); ++i) {
    const std::vector<int32_t>& t = r.tokens[std::to_string(i)];
    if (!ps[i].constraint) continue;
    const int length = 4 + static_cast<int>(i) % 7;
    ASSERT_EQ(t.size(), static_cast<size_t>(length) + 1) << i;  // then the eos
    expect_residues(t, 0, length);
    EXPECT_EQ(r.finish[std::to_string(i)], FinishReason::kStop) << i;
  }
}

// Constrained sequences with drafts refused at different places and ones whose constraint starts after a
// token, beside free ones.
std::vector<SamplingParams> mixed_batch(int32_t after_token) {
  std::vector<SamplingParams> ps;
  for (int i = 0; i < 16; ++i) {
    SamplingParams p = sampled(300 + i, 14);
    if (i % 4 != 1) p.constraint = std::make_shared<ResidueFactory>(3 + i % 7);
    if (i % 4 == 2) p.constraint_after_token = after_token;
    ps.push_back(p);
  }
  return ps;
}

TEST(ConstrainedDecoding, BackgroundFillGivesTheSerialMasks) {
  // The same steps with the masks filled on the engine thread before the forward (mask_threads -1) and on
  // 1 or 3 background threads during it: the same masks for the same rows at every step, so the same tokens.
  auto be = testing::make_test_backend();
  const std::vector<int32_t> drafts = {5, 6, 99, 8, 9, 10, 11, 17, 13, 14, 15, 16};
  const std::vector<SamplingParams> ps = mixed_batch(drafts[1]);
  const EngineRun serial = run(*be, ps, &drafts, -1, [] {});
  size_t masked_steps = 0;
  for (const auto& rows : serial.mask_rows) masked_steps += rows.empty() ? 0 : 1;
  ASSERT_GT(masked_steps, 3u);
  for (int threads : {1, 3}) {
    const EngineRun background = run(*be, ps, &drafts, threads, [] {});
    EXPECT_EQ(background.tokens, serial.tokens) << threads << " threads";
    EXPECT_EQ(background.finish, serial.finish) << threads << " threads";
    ASSERT_EQ(background.mask_rows.size(), serial.mask_rows.size()) << threads << " threads";
    for (size_t step = 0; step < serial.mask_rows.size(); ++step) {
      EXPECT_EQ(background.mask_rows[step], serial.mask_rows[step]) << "step " << step;
      EXPECT_TRUE(background.masks[step] == serial.masks[step]) << "step " << step;
    }
  }
  for (size_t i = 0; i < ps.size(); ++i) {
    if (!ps[i].constraint || ps[i].constraint_after_token >= 0) continue;
    const std::vector<int32_t>& t = serial.tokens.at(std::to_string(i));
    ASSERT_EQ(t.size(), static_cast<size_t>(3 + i % 7) + 1) << i;
    expect_residues(t, 0, 3 + static_cast<int>(i) % 7);
  }
}

TEST(ConstrainedDecoding, TheMasksAreFilledWhileTheStepExecutes) {
  // The executor does not start a step until a constraint of the step has begun filling its mask: only a
  // background thread can do that once the engine thread is in execute (the serial path would hang here,
  // bounded by a generous guard that fails the test).
  auto be = testing::make_test_backend();
  struct Signal {
    std::mutex mu;
    std::condition_variable cv;
    int fills = 0;
  };
  auto signal = std::make_shared<Signal>();
  class SignallingConstraint : public ResidueConstraint {
   public:
    explicit SignallingConstraint(std::shared_ptr<Signal> s) : ResidueConstraint(6, nullptr), s_(std::move(s)) {}
    void fill_mask(std::span<uint32_t> mask) override {
      {
        std::lock_guard<std::mutex> lk(s_->mu);
        ++s_->fills;
      }
      s_->cv.notify_all();
      ResidueConstraint::fill_mask(mask);
    }

   private:
    std::shared_ptr<Signal> s_;
  };
  class SignallingFactory : public TokenConstraintFactory {
   public:
    explicit SignallingFactory(std::shared_ptr<Signal> s) : s_(std::move(s)) {}
    std::unique_ptr<TokenConstraint> make() const override { return std::make_unique<SignallingConstraint>(s_); }
    std::string describe() const override { return "signalling residues"; }

   private:
    std::shared_ptr<Signal> s_;
  };
  SamplingParams p = sampled(11, 20);
  p.constraint = std::make_shared<SignallingFactory>(signal);
  int steps = 0;
  bool hung = false;
  const EngineRun r = run(*be, {p}, nullptr, 1, [&] {
    // Each step masks the sequence's one row (the prefill's last row included): step s makes fill s + 1.
    const int step = ++steps;
    std::unique_lock<std::mutex> lk(signal->mu);
    hung = hung || !signal->cv.wait_for(lk, std::chrono::seconds(60), [&] { return signal->fills >= step; });
  });
  EXPECT_FALSE(hung) << "a step reached the executor with its masks not being filled";
  const std::vector<int32_t>& t = r.tokens.at("0");
  ASSERT_EQ(t.size(), 7u);
  expect_residues(t, 0, 6);
}

TEST(ConstrainedDecoding, AConstraintThatThrowsEndsOnlyItsSequence) {
  // Sequence 0's constraint throws at its third mask: it ends there with finish_reason error naming the
  // constraint and what it threw; the others of the batch finish as without it, serial or in the background.
  auto be = testing::make_test_backend();
  const std::vector<int32_t> drafts = {5, 6, 99, 8, 9, 10, 11, 17, 13, 14, 15, 16};
  for (int threads : {-1, 2}) {
    std::vector<SamplingParams> ps = mixed_batch(drafts[1]);
    const EngineRun clean = run(*be, ps, &drafts, threads);
    ps[0].constraint = std::make_shared<ResidueFactory>(3, nullptr, 2);
    const EngineRun r = run(*be, ps, &drafts, threads);
    EXPECT_EQ(r.finish.at("0"), FinishReason::kError) << threads;
    EXPECT_NE(r.error.at("0").find("the output constraint (residues) failed: residue table lost"), std::string::npos)
        << r.error.at("0");
    const std::vector<int32_t>& t = r.tokens.at("0");
    ASSERT_LE(t.size(), 2u) << threads;  // the tokens of the steps before the throw, then none
    expect_residues(t, 0, 3);
    for (size_t i = 1; i < ps.size(); ++i) {
      EXPECT_EQ(r.tokens.at(std::to_string(i)), clean.tokens.at(std::to_string(i))) << i;
      EXPECT_EQ(r.finish.at(std::to_string(i)), clean.finish.at(std::to_string(i))) << i;
    }
  }
}

TEST(ConstrainedDecoding, AllowedTokenIdsAndBadWords) {
  auto be = testing::make_test_backend();
  SamplingParams p = sampled(3, 16);
  p.ignore_eos = true;
  p.allowed_token_ids = {20, 21, 22, 40};
  EngineRun allowed = run(*be, {p});
  for (int32_t t : allowed.tokens["0"]) EXPECT_TRUE(t == 20 || t == 21 || t == 22 || t == 40) << t;

  SamplingParams g = sampled(0, 4);
  g.temperature = 0;
  g.ignore_eos = true;
  const std::vector<int32_t> free = run(*be, {g}).tokens["0"];
  SamplingParams one = g;
  one.bad_words_ids = {{free[0]}};  // a one-token word: never taken
  EXPECT_NE(run(*be, {one}).tokens["0"][0], free[0]);
  SamplingParams two = g;
  two.bad_words_ids = {{free[0], free[1]}};  // the second token only right after the first
  const std::vector<int32_t> t = run(*be, {two}).tokens["0"];
  EXPECT_EQ(t[0], free[0]);
  EXPECT_NE(t[1], free[1]);
}

TEST(ConstrainedDecoding, ValidationNamesTheField) {
  SamplingParams p;
  p.allowed_token_ids = {1, 100000};
  EXPECT_NE(validate_sampling_params(p, 1000).message().find("allowed_token_ids"), std::string::npos);
  SamplingParams q;
  q.bad_words_ids = {{5, -1}};
  EXPECT_NE(validate_sampling_params(q, 1000).message().find("bad_words"), std::string::npos);
}

}  // namespace
}  // namespace tessera
