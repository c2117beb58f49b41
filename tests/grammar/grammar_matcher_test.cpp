// Matcher: the bitmask equals a brute-force per-token check along random paths, rollback restores,
// stop ids only where the grammar can end, special and out-of-range ids never; limits fail fast.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>

#include "grammar_test_util.h"

namespace tessera::grammar {
namespace {

using testing::bit;
using testing::brute_force_mask;
using testing::byte_vocab;
using ::testing::HasSubstr;

// Along random paths (tokens drawn from the mask), every mask equals the brute-force one.
void check_masks(const std::shared_ptr<const Grammar>& g, const std::shared_ptr<const TokenizerInfo>& vocab, int walks,
                 uint32_t seed) {
  auto compiled = compile(g, vocab);
  std::mt19937 rng(seed);
  for (int w = 0; w < walks; ++w) {
    Matcher m(compiled);
    for (int step = 0; step < 40; ++step) {
      std::vector<uint32_t> mask(m.mask_words());
      m.fill_next_token_bitmask(mask);
      const auto expected = brute_force_mask(m, *vocab);
      ASSERT_EQ(mask, expected) << "walk " << w << " step " << step;
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < static_cast<int32_t>(mask.size() * 32); ++id)
        if (bit(mask, id)) allowed.push_back(id);
      if (allowed.empty()) break;
      const int32_t id = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
      ASSERT_TRUE(m.accept_token(id));
      if (m.is_terminated()) break;
    }
  }
}

TEST(GrammarMatcher, MaskEqualsBruteForceOnEbnf) {
  auto vocab = byte_vocab({"ab", "abc", "ba", "(a", "a)", "))", "((", "x y", " ", "  ", "aaaa", "ca", "b)c"});
  check_masks(testing::build_ebnf(R"G(root ::= item (" " item)*
                                      item ::= "(" item ")" | [a-c]+ | "x y")G"),
              vocab, 6, 1);
}

TEST(GrammarMatcher, MaskEqualsBruteForceOnJsonSchema) {
  auto vocab = byte_vocab(testing::json_tokens());
  check_masks(testing::build_schema(R"({"type":"object","properties":{
      "name":{"type":"string"},"id":{"type":"integer","minimum":-5,"maximum":300},
      "items":{"type":"array","items":{"enum":["a","b",null,true]},"maxItems":3},
      "value":{"anyOf":[{"type":"number"},{"type":"object","properties":{"x":{"type":"boolean"}}}]}},
      "required":["name"]})"),
              vocab, 8, 2);
}

TEST(GrammarMatcher, MaskEqualsBruteForceOnAnyJsonWithCompactWhitespace) {
  auto vocab = byte_vocab(testing::json_tokens());
  GrammarBuilder b;
  JsonOptions compact;
  compact.any_whitespace = false;
  const std::string root = b.add_any_json_object(compact);
  check_masks(b.build(root), vocab, 8, 3);
}

// The matcher remembers whole masks per configuration set: along random paths with speculative-style
// advances and rollbacks (whose stack nodes are dropped and their ids reused by other stacks), every mask
// equals that of a fresh matcher given the same tokens.
TEST(GrammarMatcher, CachedMasksHoldAcrossRollback) {
  auto vocab = byte_vocab(testing::json_tokens());
  auto compiled = compile(testing::build_schema(R"({"type":"object","properties":{
      "name":{"type":"string"},"tags":{"type":"array","items":{"type":"string"}},
      "n":{"type":"integer"}},"required":["name","tags"]})"),
                          vocab);
  std::mt19937 rng(11);
  for (int walk = 0; walk < 6; ++walk) {
    Matcher m(compiled);
    std::vector<int32_t> taken;
    std::vector<uint32_t> mask(m.mask_words()), fresh_mask(m.mask_words());
    const auto check = [&](const char* where) {
      m.fill_next_token_bitmask(mask);
      Matcher fresh(compiled);
      for (int32_t id : taken) ASSERT_TRUE(fresh.accept_token(id));
      fresh.fill_next_token_bitmask(fresh_mask);
      ASSERT_EQ(mask, fresh_mask) << where << ", walk " << walk << " after " << taken.size() << " tokens";
    };
    const auto draw = [&]() {
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < static_cast<int32_t>(mask.size() * 32); ++id)
        if (bit(mask, id) && std::ranges::find(vocab->stop_ids, id) == vocab->stop_ids.end()) allowed.push_back(id);
      return allowed.empty() ? -1 : allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
    };
    for (int step = 0; step < 30 && !m.can_terminate(); ++step) {
      // Drafts: up to 3 tokens, each mask checked, then rolled back.
      const int drafts = std::uniform_int_distribution<int>(0, 3)(rng);
      int advanced = 0;
      for (int d = 0; d < drafts; ++d) {
        check("draft");
        const int32_t id = draw();
        if (id < 0) break;
        ASSERT_TRUE(m.accept_token(id));
        taken.push_back(id);
        ++advanced;
      }
      m.rollback(advanced);
      taken.resize(taken.size() - static_cast<size_t>(advanced));
      check("after rollback");
      const int32_t id = draw();
      if (id < 0) break;
      ASSERT_TRUE(m.accept_token(id));
      taken.push_back(id);
    }
  }
}

TEST(GrammarMatcher, StopIdsSpecialAndOutOfRangeIds) {
  auto vocab = byte_vocab({"ab"});
  Matcher m(compile(testing::build_ebnf(R"(root ::= "a" "b"?)"), vocab));
  const int32_t special = static_cast<int32_t>(vocab->token_bytes.size()) - 2;
  const int32_t eos = vocab->stop_ids[0];
  std::vector<uint32_t> mask(m.mask_words());
  m.fill_next_token_bitmask(mask);
  EXPECT_FALSE(bit(mask, eos));
  EXPECT_FALSE(bit(mask, special));
  EXPECT_FALSE(m.accept_token(eos));
  EXPECT_FALSE(m.can_terminate());
  EXPECT_TRUE(bit(mask, 'a'));
  EXPECT_TRUE(bit(mask, 256));  // "ab"
  EXPECT_FALSE(m.accept_token(special));
  EXPECT_FALSE(m.accept_token(vocab->vocab_size - 1));  // past the tokenizer, inside the logits
  EXPECT_FALSE(m.accept_token(vocab->vocab_size));
  EXPECT_FALSE(m.accept_token(-1));
  ASSERT_TRUE(m.accept_token('a'));
  EXPECT_TRUE(m.can_terminate());
  EXPECT_FALSE(m.is_terminated());
  m.fill_next_token_bitmask(mask);
  EXPECT_TRUE(bit(mask, eos));
  EXPECT_TRUE(bit(mask, 'b'));
  EXPECT_FALSE(bit(mask, 'a'));
  ASSERT_TRUE(m.accept_token('b'));
  EXPECT_TRUE(m.is_terminated());  // nothing but a stop id can follow
  EXPECT_TRUE(m.accept_token(eos));
  EXPECT_TRUE(m.is_terminated());
  EXPECT_FALSE(m.can_terminate());
  EXPECT_FALSE(m.accept_token('a'));
  for (size_t w = 0; w < mask.size(); ++w) mask[w] = 0xFFFFFFFFu;
  m.fill_next_token_bitmask(mask);
  for (int32_t id = 0; id < static_cast<int32_t>(mask.size() * 32); ++id) EXPECT_EQ(bit(mask, id), id == eos) << id;
}

TEST(GrammarMatcher, RollbackAndReset) {
  auto vocab = byte_vocab({"12", "345"});
  auto compiled = compile(testing::build_regex("[0-9]{1,6}x"), vocab);
  Matcher m(compiled);
  std::vector<uint32_t> before(m.mask_words()), after(m.mask_words());
  m.fill_next_token_bitmask(before);
  ASSERT_TRUE(m.accept_token(256));  // "12"
  ASSERT_TRUE(m.accept_token(257));  // "345"
  m.fill_next_token_bitmask(after);
  EXPECT_TRUE(bit(after, '6'));
  EXPECT_FALSE(bit(after, 257));  // would make 8 digits
  EXPECT_FALSE(m.accept_token(257));
  m.rollback(1);
  EXPECT_TRUE(m.accept_token(257));
  m.rollback(2);
  std::vector<uint32_t> again(m.mask_words());
  m.fill_next_token_bitmask(again);
  EXPECT_EQ(before, again);
  ASSERT_TRUE(m.accept_token('1'));
  ASSERT_TRUE(m.accept_token('x'));
  ASSERT_TRUE(m.accept_token(vocab->stop_ids[0]));
  m.rollback(1);  // undo the stop
  EXPECT_TRUE(m.can_terminate());
  EXPECT_THROW(m.rollback(5), std::out_of_range);
  m.reset();
  m.fill_next_token_bitmask(again);
  EXPECT_EQ(before, again);
  // Speculative decoding: many accepts, rollback of the last 8 and replay.
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(m.accept_token('7'));
  m.rollback(3);
  EXPECT_TRUE(m.accept_bytes("123456"));
  EXPECT_FALSE(m.accept_bytes("7"));
  EXPECT_TRUE(m.accept_bytes("x"));
  EXPECT_TRUE(m.can_terminate());
}

TEST(GrammarMatcher, AcceptBytesFailureLeavesStateUnchanged) {
  Matcher m(compile(testing::build_ebnf(R"(root ::= "abc" | "abd")"), byte_vocab()));
  EXPECT_FALSE(m.accept_bytes("abx"));
  EXPECT_TRUE(m.accept_bytes("ab"));
  EXPECT_FALSE(m.accept_bytes("cd"));
  EXPECT_TRUE(m.accept_bytes("d"));
  EXPECT_TRUE(m.is_terminated());
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const GrammarError& e) {
    return e.what();
  }
  return "(no error)";
}

double seconds_of(const std::function<void()>& f) {
  const auto start = std::chrono::steady_clock::now();
  try {
    f();
  } catch (const GrammarError&) {
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

TEST(GrammarLimits, PathologicalInputsFailFast) {
  // Exponential DFA blow-up: the n-th character from the end is an 'a'.
  // (Default limits: fails in about a second on a 2-core CPU; smaller limits keep the test short.)
  CompileLimits limits;
  limits.max_states = 20000;
  auto regex_with = [](const CompileLimits& l, const std::string& re) {
    GrammarBuilder b(l);
    b.build(b.add_regex(re));
  };
  EXPECT_THAT(error_of([&] { regex_with(limits, "(a|b)*a(a|b){24}"); }), HasSubstr("automaton states"));
  EXPECT_LT(seconds_of([&] { regex_with(limits, "(a|b)*a(a|b){24}"); }), 1.0);
  EXPECT_THAT(error_of([] { testing::build_regex("((a{1000}){1000}){1000}"); }), HasSubstr("automaton states"));
  std::string deep(200, '(');
  deep += "a" + std::string(200, ')');
  EXPECT_THAT(error_of([&] { testing::build_regex(deep); }), HasSubstr("nests deeper"));
  std::string schema = "true";
  for (int i = 0; i < 100; ++i) schema = R"({"type":"array","items":)" + schema + "}";
  EXPECT_THAT(error_of([&] { testing::build_schema(schema); }), HasSubstr("nests deeper"));
  nlohmann::ordered_json big_enum = {{"enum", nlohmann::ordered_json::array()}};
  for (int i = 0; i < 10001; ++i) big_enum["enum"].push_back(i);
  EXPECT_THAT(error_of([&] { testing::build_schema(big_enum.dump()); }), HasSubstr("enum has 10001 values"));
  CompileLimits tight;
  tight.max_compile_time = std::chrono::milliseconds(1);
  tight.max_states = 100000000;
  EXPECT_THAT(error_of([&] {
                GrammarBuilder b(tight);
                b.build(b.add_regex("(a|b|c|d)*a(a|b|c|d){16}"));
              }),
              HasSubstr("compile time limit"));
  CompileLimits small;
  small.max_grammar_bytes = 10;
  EXPECT_THAT(error_of([&] { GrammarBuilder(small).add_regex("aaaaaaaaaaaaaaaaaaaaaa"); }), HasSubstr("limit of 10"));
}

}  // namespace
}  // namespace tessera::grammar
