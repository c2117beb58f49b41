// Multi-turn conversations on the hybrid fixtures (Gated DeltaNet layers): turn N+1's prompt is
// turn N's prompt, its answer and a new message. A finished sequence leaves a state checkpoint at
// the last full block of its prompt and output, so turn N+1 recomputes only its new tokens and
// less than one block before them, and generates what it would without prefix caching.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/kv_cache_coordinator.h"
#include "engine/model_loader.h"
#include "engine/spec/proposer.h"
#include "fixture_util.h"

namespace tessera {
namespace {

constexpr int kBlockSize = 16;  // EngineConfig's default

struct Turn {
  std::vector<int32_t> tokens;
  int cached = 0;
};

// Drafts each request's known greedy continuation, every fifth position wrong: accepted drafts
// pass block boundaries without ending there.
class ContinuationProposer : public Proposer {
 public:
  explicit ContinuationProposer(std::vector<int32_t> want) : want_(std::move(want)) {}
  void propose(const std::vector<Request*>& rs, const std::vector<int>& room) override {
    for (size_t i = 0; i < rs.size(); ++i) {
      rs[i]->spec_tokens.clear();
      for (size_t p = rs[i]->output.size();
           p < want_.size() && rs[i]->spec_tokens.size() < static_cast<size_t>(room[i]); ++p)
        rs[i]->spec_tokens.push_back(p % 5 == 4 ? (want_[p] + 1) % 200 : want_[p]);
    }
  }

 private:
  std::vector<int32_t> want_;
};

class Conversation {
 public:
  Conversation(const std::string& fixture, bool prefix_caching, int max_num_seqs = 8, int num_drafts = 0) {
    LoadOptions lo;
    lo.model_dir = testing::fixtures_dir() + "/" + fixture;
    EngineConfig ec;
    ec.num_blocks_override = 128;
    ec.scheduler.max_num_seqs = max_num_seqs;
    ec.scheduler.max_num_batched_tokens = 512;
    ec.scheduler.max_model_len = 512;
    ec.enable_prefix_caching = prefix_caching;
    // Every block, so that short conversations show where each turn's checkpoint lands (the
    // default interval, 256 tokens, is kv_cache_coordinator_test's).
    ec.state_checkpoint_interval = kBlockSize;
    if (num_drafts > 0) {
      ec.speculative.method = "ngram";
      ec.speculative.num_speculative_tokens = num_drafts;
    }
    auto model = load_model(lo, backend_);
    engine_ = std::make_unique<LLMEngine>(std::make_unique<LocalExecutor>(std::move(model), backend_), ec);
  }

  // Runs the requests to the end; the tokens and cached prompt tokens of each.
  std::map<std::string, Turn> run(const std::map<std::string, std::vector<int32_t>>& prompts, int max_tokens) {
    for (const auto& [id, prompt] : prompts) {
      SamplingParams p;
      p.temperature = 0;
      p.max_tokens = max_tokens;
      p.ignore_eos = true;
      EXPECT_TRUE(engine_->add_request(id, prompt, p).ok()) << id;
    }
    std::map<std::string, Turn> out;
    while (engine_->has_unfinished()) {
      for (const auto& o : engine_->step()) {
        Turn& t = out[o.request_id];
        t.tokens.insert(t.tokens.end(), o.new_token_ids.begin(), o.new_token_ids.end());
        t.cached = o.num_cached_tokens;
      }
    }
    EXPECT_TRUE(engine_->cache_manager().pool().all_free()) << "KV blocks leaked";
    EXPECT_EQ(engine_->cache_manager().state_slots().num_held(), 0) << "state slots leaked";
    return out;
  }
  LLMEngine& engine() { return *engine_; }

 private:
  std::unique_ptr<Backend> owned_ = testing::make_test_backend();
  Backend& backend_ = *owned_;
  std::unique_ptr<LLMEngine> engine_;
};

std::vector<int32_t> random_tokens(std::mt19937& g, int len) {
  std::uniform_int_distribution<int> d(3, 255);
  std::vector<int32_t> p(static_cast<size_t>(len));
  for (auto& t : p) t = d(g);
  return p;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

class HybridContinuationTest : public ::testing::TestWithParam<std::string> {};

// Turn 1: prompt P (a shared system prompt and a message), G greedy tokens. Turn 2: P + G + a new
// message. Turn 2's cache hit reaches the last full block of P + G (the state checkpoint turn 1
// left when it finished), and its tokens are those of a run without prefix caching.
TEST_P(HybridContinuationTest, TheNextTurnRecomputesOnlyItsNewTokens) {
  std::mt19937 g(53);
  const std::vector<int32_t> prompt = random_tokens(g, 45);
  const int answer_len = 37;  // P + G = 82 tokens: the last full block ends at 80, well past P's (32)
  const std::vector<int32_t> next_message = random_tokens(g, 11);

  Conversation cold(GetParam(), /*prefix_caching=*/false), warm(GetParam(), /*prefix_caching=*/true);
  ASSERT_TRUE(warm.engine().cache_manager().has_state_slots()) << GetParam() << " is not hybrid";
  const Turn cold1 = cold.run({{"t1", prompt}}, answer_len).at("t1");
  const Turn warm1 = warm.run({{"t1", prompt}}, answer_len).at("t1");
  ASSERT_EQ(warm1.tokens.size(), static_cast<size_t>(answer_len));
  if (!testing::testing_on_cuda()) {
    EXPECT_EQ(warm1.tokens, cold1.tokens);
  }

  const std::vector<int32_t> turn2 = concat(concat(prompt, warm1.tokens), next_message);
  const Turn cold2 = cold.run({{"t2", turn2}}, 9).at("t2");
  const Turn warm2 = warm.run({{"t2", turn2}}, 9).at("t2");
  const int previous = static_cast<int>(prompt.size()) + answer_len;
  EXPECT_GE(warm2.cached, previous - kBlockSize) << "turn 2 recomputed part of turn 1's answer";
  EXPECT_EQ(warm2.cached % kBlockSize, 0);
  EXPECT_EQ(cold2.cached, 0);
  if (!testing::testing_on_cuda()) {
    EXPECT_EQ(warm2.tokens, cold2.tokens);
  }
}

// Speculative decoding (k = 3, drafts of the greedy continuation, some wrong): accepted drafts pass
// block boundaries inside a step, and the state kept after each draft gives the checkpoint there.
TEST_P(HybridContinuationTest, DraftsPassingABlockBoundaryLeaveItsCheckpoint) {
  if (!testing::make_test_backend()->supports_token_state_slots())
    GTEST_SKIP() << "this backend does not keep per-token linear-attention states";
  std::mt19937 g(61);
  // 83 tokens: the last full block ends at 80. With these drafts the accepted ones pass 64 and 80
  // inside steps (without the states kept there the hit would fall back to 48).
  const std::vector<int32_t> prompt = random_tokens(g, 33);
  const int answer_len = 50;
  Conversation cold(GetParam(), false);
  const Turn want1 = cold.run({{"t1", prompt}}, answer_len).at("t1");
  const std::vector<int32_t> turn2 = concat(concat(prompt, want1.tokens), random_tokens(g, 6));
  const Turn want2 = cold.run({{"t2", turn2}}, 7).at("t2");

  Conversation warm(GetParam(), true, 8, /*num_drafts=*/3);
  warm.engine().set_proposer(std::make_unique<ContinuationProposer>(want1.tokens));
  const Turn got1 = warm.run({{"t1", prompt}}, answer_len).at("t1");
  EXPECT_GT(warm.engine().stats().spec.num_accepted_tokens, 0u) << "no draft was accepted";
  warm.engine().set_proposer(std::make_unique<ContinuationProposer>(want2.tokens));
  const Turn got2 = warm.run({{"t2", turn2}}, 7).at("t2");
  EXPECT_EQ(got2.cached, 80) << "the checkpoint at turn 1's last full block (80) was not left";
  if (!testing::testing_on_cuda()) {
    EXPECT_EQ(got1.tokens, want1.tokens);
    EXPECT_EQ(got2.tokens, want2.tokens);
  }
}

// Several conversations at once, three turns each, sharing a system prompt: every turn from the
// second on hits the cache up to within a block of the previous turn's end, and the tokens are
// those of a run without prefix caching. --max-num-seqs is twice the conversations: the slots of
// the sequences not running (and the quarter planned for checkpoints) hold the checkpoints.
TEST_P(HybridContinuationTest, ConcurrentConversationsEachContinueFromTheirLastTurn) {
  std::mt19937 g(59);
  const std::vector<int32_t> system = random_tokens(g, 40);
  const int conversations = 4, turns = 3, answer_len = 21;
  std::map<std::string, std::vector<int32_t>> history;
  for (int c = 0; c < conversations; ++c) history["c" + std::to_string(c)] = concat(system, random_tokens(g, 7));
  Conversation cold(GetParam(), false), warm(GetParam(), true, /*max_num_seqs=*/2 * conversations);
  for (int turn = 1; turn <= turns; ++turn) {
    SCOPED_TRACE("turn " + std::to_string(turn));
    const auto want = cold.run(history, answer_len);
    const auto got = warm.run(history, answer_len);
    for (auto& [id, tokens] : history) {
      if (!testing::testing_on_cuda()) {
        EXPECT_EQ(got.at(id).tokens, want.at(id).tokens) << id;
      }
      if (turn > 1) {
        const int previous = static_cast<int>(tokens.size()) - 9;  // before this turn's message
        EXPECT_GE(got.at(id).cached, previous - kBlockSize) << id << " recomputed part of its last turn";
      }
      tokens = concat(concat(tokens, got.at(id).tokens), random_tokens(g, 9));
    }
  }
}

// A hybrid model cut to its first layer, a Gated DeltaNet one: no paged-attention layer at all.
// The engine keeps a layer-less paged group before the state group (engine_cache_groups); it
// crashed building the step's input without one. Greedy tokens with prefix caching equal those
// without, and a second turn starts from the first one's checkpoint.
TEST(LinearAttentionOnly, AModelWithoutAttentionLayersServesAndContinues) {
  const std::string src = testing::fixtures_dir() + "/qwen3_5_moe_text_tiny";
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / "linear_only_model";
  std::filesystem::create_directories(dir);
  nlohmann::json c = nlohmann::json::parse(std::ifstream(src + "/config.json"));
  nlohmann::json& t = c.contains("text_config") ? c["text_config"] : c;
  ASSERT_EQ(t["layer_types"][0], "linear_attention");
  t["num_hidden_layers"] = 1;
  t["layer_types"] = nlohmann::json::array({"linear_attention"});
  std::ofstream(dir / "config.json") << c.dump();
  auto run = [&](bool prefix_caching, const std::vector<std::vector<int32_t>>& prompts) {
    auto be = testing::make_test_backend();
    LoadOptions lo;
    lo.model_dir = dir.string();
    lo.load_format = "dummy";
    EngineConfig ec;
    ec.num_blocks_override = 64;
    ec.scheduler.max_num_seqs = 4;
    ec.scheduler.max_num_batched_tokens = 256;
    ec.scheduler.max_model_len = 256;
    ec.enable_prefix_caching = prefix_caching;
    ec.state_checkpoint_interval = kBlockSize;
    LLMEngine e(std::make_unique<LocalExecutor>(load_model(lo, *be), *be), ec);
    std::vector<Turn> out;
    for (const auto& prompt : prompts) {  // one after the other: the second may start from the first
      SamplingParams p;
      p.temperature = 0;
      p.max_tokens = 8;
      p.ignore_eos = true;
      EXPECT_TRUE(e.add_request("r" + std::to_string(out.size()), prompt, p).ok());
      Turn turn;
      while (e.has_unfinished())
        for (const auto& o : e.step()) {
          turn.tokens.insert(turn.tokens.end(), o.new_token_ids.begin(), o.new_token_ids.end());
          turn.cached = o.num_cached_tokens;
        }
      out.push_back(turn);
    }
    EXPECT_TRUE(e.cache_manager().pool().all_free()) << "KV blocks leaked";
    EXPECT_EQ(e.cache_manager().state_slots().num_held(), 0) << "state slots leaked";
    return out;
  };
  std::mt19937 g(3);
  const std::vector<int32_t> first = random_tokens(g, 40);
  const std::vector<Turn> plain = run(false, {first}), cached = run(true, {first});
  ASSERT_EQ(plain[0].tokens.size(), 8u);
  EXPECT_EQ(cached[0].tokens, plain[0].tokens);
  const std::vector<int32_t> second = concat(concat(first, plain[0].tokens), random_tokens(g, 10));
  const std::vector<Turn> turns = run(true, {first, second}), alone = run(false, {second});
  EXPECT_EQ(turns[1].tokens, alone[0].tokens) << "the second turn from the first one's checkpoint";
  EXPECT_GT(turns[1].cached, 0) << "the second turn started from a checkpoint";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HybridContinuationTest, ::testing::ValuesIn(testing::hybrid_fixture_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace tessera
