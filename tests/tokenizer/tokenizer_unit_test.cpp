// Pieces of the tokenizer against hand-made tokenizer.json files and HF's documented behaviour,
// plus properties of the real tokenizers that hold for any input.
#include <gtest/gtest.h>

#include <deque>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/regex.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"
#include "tokenizer_test_data.h"

namespace tessera::tokenizer {
namespace {

using nlohmann::json;
using testing::load_tokenizer;

// A byte-level BPE over the 256 byte characters plus the given merges (ids 256 and up, in order).
json tiny_byte_level_tokenizer(const std::vector<std::pair<std::string, std::string>>& merges, bool array_form,
                               json added_tokens = json::array()) {
  const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::get();
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[std::string(alphabet.char_for_byte(static_cast<uint8_t>(b)))] = b;
  json merge_list = json::array();
  int next_id = 256;
  for (const auto& [left, right] : merges) {
    std::string l = alphabet.from_bytes(left), r = alphabet.from_bytes(right);
    if (!vocab.contains(l + r)) vocab[l + r] = next_id++;
    merge_list.push_back(array_form ? json::array({l, r}) : json(l + " " + r));
  }
  return {{"version", "1.0"},
          {"added_tokens", added_tokens},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
          {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merge_list}}}};
}

std::unique_ptr<Tokenizer> load(const json& tokenizer_json) {
  return Tokenizer::from_json_text(tokenizer_json.dump(), "", "test tokenizer.json");
}

std::vector<std::string> pieces_of(const Tokenizer& tokenizer, std::string_view text) {
  std::vector<std::string> pieces;
  for (int32_t id : tokenizer.encode(text)) pieces.push_back(tokenizer.decode(std::vector<int32_t>{id}));
  return pieces;
}

TEST(BpeTest, LowestRankMergesFirstLeftmostOnTies) {
  auto bc_first = load(tiny_byte_level_tokenizer({{"b", "c"}, {"a", "b"}}, false));
  EXPECT_EQ(pieces_of(*bc_first, "abc"), (std::vector<std::string>{"a", "bc"}));
  auto ab_first = load(tiny_byte_level_tokenizer({{"a", "b"}, {"b", "c"}}, false));
  EXPECT_EQ(pieces_of(*ab_first, "abc"), (std::vector<std::string>{"ab", "c"}));
  auto repeated = load(tiny_byte_level_tokenizer({{"a", "a"}}, false));
  EXPECT_EQ(pieces_of(*repeated, "aaaaa"), (std::vector<std::string>{"aa", "aa", "a"}));
  auto chained = load(tiny_byte_level_tokenizer({{"a", "a"}, {"aa", "aa"}, {"aaaa", "a"}}, false));
  // a+a merges pairwise from the left (aa aa aa a), then aa+aa once; "aaaa"+"a" never meet.
  EXPECT_EQ(pieces_of(*chained, "aaaaaaa"), (std::vector<std::string>{"aaaa", "aa", "a"}));
  EXPECT_EQ(pieces_of(*chained, "aaaaa"), (std::vector<std::string>{"aaaaa"}));
}

TEST(BpeTest, MergesAsStringsAndAsArraysAreTheSame) {
  std::vector<std::pair<std::string, std::string>> merges = {{" ", "t"}, {"h", "e"}, {" t", "he"}, {"1", "2"}};
  auto strings = load(tiny_byte_level_tokenizer(merges, false));
  auto arrays = load(tiny_byte_level_tokenizer(merges, true));
  for (const char* text : {" the 12 theme", "the", "121212"}) {
    EXPECT_EQ(strings->encode(text), arrays->encode(text)) << text;
  }
  EXPECT_EQ(pieces_of(*strings, " the"), (std::vector<std::string>{" the"}));
}

TEST(BpeTest, IgnoreMergesTakesWholeWordsFromTheVocab) {
  json config = tiny_byte_level_tokenizer({{"a", "b"}}, false);
  config["model"]["vocab"]["abc"] = 1000;  // no merge path leads here
  EXPECT_EQ(pieces_of(*load(config), "abc"), (std::vector<std::string>{"ab", "c"}));
  config["model"]["ignore_merges"] = true;
  EXPECT_EQ(load(config)->encode("abc"), (std::vector<int32_t>{1000}));
}

TEST(AddedTokensTest, StripFlagsSwallowWhitespace) {
  json added = json::array({{{"id", 500},
                             {"content", "<x>"},
                             {"special", true},
                             {"lstrip", true},
                             {"rstrip", false},
                             {"single_word", false},
                             {"normalized", false}},
                            {{"id", 501},
                             {"content", "<y>"},
                             {"special", false},
                             {"lstrip", false},
                             {"rstrip", true},
                             {"single_word", false},
                             {"normalized", false}},
                            {{"id", 502},
                             {"content", "<yy>"},
                             {"special", false},
                             {"lstrip", false},
                             {"rstrip", false},
                             {"single_word", false},
                             {"normalized", false}}});
  auto tokenizer = load(tiny_byte_level_tokenizer({}, false, added));
  EXPECT_EQ(tokenizer->encode("a  <x>b"), (std::vector<int32_t>{'a', 500, 'b'}));
  EXPECT_EQ(tokenizer->encode("a<y>  b"), (std::vector<int32_t>{'a', 501, 'b'}));
  EXPECT_EQ(tokenizer->encode("<yy><y>"), (std::vector<int32_t>{502, 501})) << "longest match wins";
  EXPECT_TRUE(tokenizer->is_special(500));
  EXPECT_FALSE(tokenizer->is_special(501));
  EXPECT_EQ(tokenizer->decode(std::vector<int32_t>{'a', 500, 501}, true), "a<y>");
  EXPECT_EQ(tokenizer->decode(std::vector<int32_t>{'a', 500, 501}, false), "a<x><y>");
}

TEST(AddedTokensTest, SingleWordMatchesOnlyBetweenNonWordCharacters) {
  json added = json::array({{{"id", 600},
                             {"content", "cat"},
                             {"special", false},
                             {"lstrip", false},
                             {"rstrip", false},
                             {"single_word", true},
                             {"normalized", false}}});
  auto tokenizer = load(tiny_byte_level_tokenizer({}, false, added));
  EXPECT_EQ(tokenizer->encode("a cat."), (std::vector<int32_t>{'a', ' ', 600, '.'}));
  EXPECT_EQ(tokenizer->encode("cats"), (std::vector<int32_t>{'c', 'a', 't', 's'}));
  EXPECT_EQ(tokenizer->encode("-cat"), (std::vector<int32_t>{'-', 600})) << "punctuation is not a word character";
  EXPECT_EQ(tokenizer->encode("\u0330cat").back(), 't') << "a combining mark is a word character";
}

TEST(AddedTokensTest, ConfigAddsTokensThatTokenizerJsonLacks) {
  json config = {{"added_tokens_decoder",
                  {{"700",
                    {{"content", "<extra>"},
                     {"special", true},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"single_word", false},
                     {"normalized", false}}}}},
                 {"bos_token", "<extra>"},
                 {"add_bos_token", true}};
  auto tokenizer = Tokenizer::from_json_text(tiny_byte_level_tokenizer({}, false).dump(), config.dump());
  EXPECT_EQ(tokenizer->encode("x<extra>"), (std::vector<int32_t>{'x', 700}));
  EXPECT_EQ(tokenizer->bos_id(), 700);
  EXPECT_EQ(tokenizer->encode("x", true), (std::vector<int32_t>{700, 'x'}));
  EXPECT_EQ(tokenizer->vocab_size(), 701u);
}

// HF's documented example for SplitDelimiterBehavior.
TEST(PreTokenizerTest, SplitBehaviorsFollowHf) {
  const std::map<std::string, std::vector<std::string>> expected = {
      {"Removed", {"the", "final", "countdown"}},
      {"Isolated", {"the", "-", "final", "-", "-", "countdown"}},
      {"MergedWithPrevious", {"the-", "final-", "-", "countdown"}},
      {"MergedWithNext", {"the", "-final", "-", "-countdown"}},
      {"Contiguous", {"the", "-", "final", "--", "countdown"}},
  };
  for (const auto& [behavior, pieces] : expected) {
    auto pre_tokenizer = make_pre_tokenizer(
        {{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}, {"invert", false}});
    std::vector<std::string_view> out{"the-final--countdown"};
    std::deque<std::string> storage;
    pre_tokenizer->split(out, storage);
    EXPECT_EQ(std::vector<std::string>(out.begin(), out.end()), pieces) << behavior;
  }
}

TEST(PreTokenizerTest, DigitsSplitsNumericCharacters) {
  for (bool individual : {false, true}) {
    auto pre_tokenizer = make_pre_tokenizer({{"type", "Digits"}, {"individual_digits", individual}});
    std::vector<std::string_view> out{"Hey 123 friend ٣½!"};
    std::deque<std::string> storage;
    pre_tokenizer->split(out, storage);
    std::vector<std::string> expected = individual
                                            ? std::vector<std::string>{"Hey ", "1", "2", "3", " friend ", "٣", "½", "!"}
                                            : std::vector<std::string>{"Hey ", "123", " friend ", "٣½", "!"};
    EXPECT_EQ(std::vector<std::string>(out.begin(), out.end()), expected) << individual;
  }
}

TEST(RegexTest, WhitespaceIsOnigurumasWhiteSpace) {
  Regex whitespace(R"(\s+)");
  std::vector<std::pair<size_t, size_t>> matches;
  whitespace.find_all("a\u0085b", matches);
  EXPECT_EQ(matches.size(), 1u) << "U+0085 is White_Space";
  whitespace.find_all("a\u180eb", matches);
  EXPECT_TRUE(matches.empty()) << "U+180E is not White_Space since Unicode 6.3";
  Regex not_space(R"([^\s]+|\S+)");
  not_space.find_all("x\u3000y", matches);
  EXPECT_EQ(matches.size(), 2u);
}

TEST(RegexTest, BadPatternIsAClearError) {
  try {
    Regex bad("(unclosed");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("(unclosed"), std::string::npos) << e.what();
  }
}

TEST(Utf8Test, LossyReplacesMaximalSubpartsLikePython) {
  // bytes.decode("utf-8", "replace") and Rust's from_utf8_lossy agree on these.
  EXPECT_EQ(utf8_lossy("a\xe4\xbd"), "a\ufffd");
  EXPECT_EQ(utf8_lossy("\xf0\x80\x80"), "\ufffd\ufffd\ufffd");
  EXPECT_EQ(utf8_lossy("\xed\xa0\x80"), "\ufffd\ufffd\ufffd");
  EXPECT_EQ(utf8_lossy("\xe4\xbd\xa0\xff\xc3"), "你\ufffd\ufffd");
  EXPECT_EQ(utf8_lossy("\xf4\x90\x80\x80"), "\ufffd\ufffd\ufffd\ufffd");
  EXPECT_EQ(utf8_lossy("\xc0\xaf"), "\ufffd\ufffd");
  EXPECT_EQ(utf8_lossy("\xf0\x9f\x98"), "\ufffd");
}

TEST(Utf8Test, DecidablePrefixStopsBeforeAnUnfinishedCharacter) {
  EXPECT_EQ(decidable_prefix_length("ab"), 2u);
  EXPECT_EQ(decidable_prefix_length("a\xe4\xbd"), 1u);
  EXPECT_EQ(decidable_prefix_length("a\xf0\x9f\x98"), 1u);
  EXPECT_EQ(decidable_prefix_length("a\xff"), 2u) << "0xFF can never be completed";
  EXPECT_EQ(decidable_prefix_length("a\xe4x"), 3u) << "cut short by 'x': decided";
  EXPECT_EQ(decidable_prefix_length("\xed\xa0"), 2u) << "a surrogate lead is already ill-formed";
}

class RealTokenizerTest : public ::testing::TestWithParam<const char*> {};

// Any bytes at all: no exception, no crash; ill-formed UTF-8 reads as U+FFFD. Tokenizers without
// a normalizer are lossless, so decode(encode(x)) gives back exactly the repaired text.
TEST_P(RealTokenizerTest, RandomBytesNeverFailAndRoundTrip) {
  const std::string name = GetParam();
  const Tokenizer& tokenizer = load_tokenizer(name);
  std::mt19937 rng(99);
  for (int round = 0; round < 1500; ++round) {
    std::string bytes(rng() % 64, '\0');
    for (char& c : bytes) c = static_cast<char>(round % 2 ? rng() % 256 : "a \n<|>\xe4\xbd\xa0\xf0\x9f"[rng() % 12]);
    std::vector<int32_t> ids;
    ASSERT_NO_THROW(ids = tokenizer.encode(bytes, round % 3 == 0));
    EXPECT_EQ(tokenizer.encode(bytes), tokenizer.encode(utf8_lossy(bytes)));
    std::string decoded = tokenizer.decode(tokenizer.encode(bytes));
    EXPECT_TRUE(is_valid_utf8(decoded));
    if (name != "qwen3") {
      EXPECT_EQ(decoded, utf8_lossy(bytes)) << json(utf8_lossy(bytes)).dump();
    }
  }
}

TEST_P(RealTokenizerTest, ConcurrentEncodesAgreeWithSequentialOnes) {
  const Tokenizer& tokenizer = load_tokenizer(GetParam());
  std::vector<std::string> texts;
  const json strings = testing::read_json(testing::fixture("strings.json"));
  for (const auto& s : strings.at("strings")) texts.push_back(s);
  std::vector<std::vector<int32_t>> expected;
  for (const auto& text : texts) expected.push_back(tokenizer.encode(text + " thread-check"));
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = 0; i < texts.size(); ++i) {
        size_t k = (i * 7 + t * 13) % texts.size();
        if (tokenizer.encode(texts[k] + " thread-check") != expected[k]) ++mismatches;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST_P(RealTokenizerTest, VocabularyLookupsAgree) {
  const Tokenizer& tokenizer = load_tokenizer(GetParam());
  for (int32_t id : {0, 1, 100, 1000, 50000, static_cast<int32_t>(tokenizer.vocab_size()) - 1}) {
    auto token = tokenizer.id_to_token(id);
    ASSERT_TRUE(token.has_value()) << id;
    EXPECT_EQ(tokenizer.token_to_id(*token), id);
  }
  EXPECT_FALSE(tokenizer.id_to_token(static_cast<int32_t>(tokenizer.vocab_size())).has_value());
  EXPECT_FALSE(tokenizer.id_to_token(-1).has_value());
  EXPECT_FALSE(tokenizer.token_to_id("no such token, surely").has_value());
  EXPECT_EQ(tokenizer.decode(std::vector<int32_t>{-5, static_cast<int32_t>(tokenizer.vocab_size()) + 3}), "");
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, RealTokenizerTest, ::testing::ValuesIn(testing::kTokenizerNames),
                         [](const auto& info) { return std::string(info.param); });

TEST(RealTokenizerFactsTest, SpecialTokensBosAndEos) {
  const Tokenizer& qwen = load_tokenizer("qwen3");
  EXPECT_EQ(qwen.vocab_size(), 151669u);
  EXPECT_EQ(qwen.encode("Hello", true), (std::vector<int32_t>{9707}));
  EXPECT_FALSE(qwen.bos_id().has_value());
  EXPECT_EQ(qwen.eos_id(), 151645);
  EXPECT_EQ(qwen.eos_token(), "<|im_end|>");
  EXPECT_TRUE(qwen.is_special(151644));
  EXPECT_FALSE(qwen.is_special(*qwen.token_to_id("<think>")));
  EXPECT_EQ(qwen.encode("<|im_start|>user"), (std::vector<int32_t>{151644, 872}));

  const Tokenizer& llama = load_tokenizer("llama3_1");
  EXPECT_EQ(llama.vocab_size(), 128256u);
  EXPECT_EQ(llama.encode("Hello", true), (std::vector<int32_t>{128000, 9906}));
  EXPECT_EQ(llama.encode("Hello", false), (std::vector<int32_t>{9906}));
  EXPECT_EQ(llama.bos_id(), 128000);
  EXPECT_EQ(llama.eos_id(), 128009);

  // DeepSeek's post-processor adds nothing; tokenizer_config.json's add_bos_token adds bos (transformers).
  const Tokenizer& deepseek = load_tokenizer("deepseek_v3");
  EXPECT_EQ(deepseek.vocab_size(), 128815u);
  EXPECT_EQ(deepseek.encode("Hello", true), (std::vector<int32_t>{0, 19923}));
  EXPECT_EQ(deepseek.bos_id(), 0);
  EXPECT_EQ(deepseek.eos_id(), 1);
}

TEST(LoadErrorsTest, SayWhatIsWrong) {
  auto expect_error = [](auto&& load_call, ErrorKind kind, const std::string& words) {
    try {
      load_call();
      ADD_FAILURE() << "expected an error mentioning " << words;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), kind) << e.what();
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  expect_error([] { Tokenizer::from_dir("/nonexistent/model"); }, ErrorKind::kNotFound,
               "/nonexistent/model/tokenizer.json");
  expect_error([] { Tokenizer::from_json_text("{not json", ""); }, ErrorKind::kCorrupt, "not valid JSON");
  json unigram = tiny_byte_level_tokenizer({}, false);
  unigram["model"]["type"] = "Unigram";
  expect_error([&] { load(unigram); }, ErrorKind::kUnsupported, "Unigram");
  json bad_merge = tiny_byte_level_tokenizer({}, false);
  bad_merge["model"]["merges"] = json::array({"nope zilch"});
  expect_error([&] { load(bad_merge); }, ErrorKind::kCorrupt, "not in the vocab");
  json no_model = json::object();
  expect_error([&] { load(no_model); }, ErrorKind::kCorrupt, "model");
}

// A file nested 100,000 deep overflowed the stack while loading; it is refused naming the file.
TEST(LoadErrorsTest, DeeplyNestedFilesAreRefusedNamingTheFile) {
  std::string nested = "{\"model\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  auto message_of = [](auto&& load_call) -> std::string {
    try {
      load_call();
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kCorrupt) << e.what();
      return e.what();
    }
    ADD_FAILURE() << "expected an error";
    return "";
  };
  std::string message = message_of([&] { Tokenizer::from_json_text(nested, "", "/m/tokenizer.json"); });
  EXPECT_NE(message.find("/m/tokenizer.json: JSON nested deeper than 128"), std::string::npos) << message;
  std::string good = tiny_byte_level_tokenizer({}, false).dump();
  message = message_of([&] { Tokenizer::from_json_text(good, nested, "/m/tokenizer.json"); });
  EXPECT_NE(message.find("tokenizer_config.json: JSON nested deeper"), std::string::npos) << message;
}

// The message of the tessera::Error that loading throws (kCorrupt), or a test failure.
std::string corrupt_error(const std::string& tokenizer_json, const std::string& config_json = "") {
  try {
    Tokenizer::from_json_text(tokenizer_json, config_json, "/m/tokenizer.json", "/m/tokenizer_config.json");
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kCorrupt) << e.what();
    std::string message = e.what();
    EXPECT_EQ(message.find("json.exception"), std::string::npos) << message;
    return message;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a tessera::Error: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected an error";
  return "";
}

json with_added_token(const json& token) {
  json t = tiny_byte_level_tokenizer({}, false);
  t["added_tokens"] = json::array({token});
  return t;
}

json added_token(const std::string& content, json id) { return {{"id", id}, {"content", content}, {"special", true}}; }

// An added token with id 10^8 made the loader allocate per-id tables of 3.4 GB, and 2^31 - 1 ended
// in "internal: std::bad_alloc"; a negative one in "vector::_M_default_append".
TEST(TokenizerValidation, AddedTokenIdsFarPastTheVocabularyAreRefused) {
  for (json id : {json(100000000), json(2147483647)}) {
    std::string message = corrupt_error(with_added_token(added_token("<far>", id)).dump());
    EXPECT_NE(message.find("/m/tokenizer.json: added_tokens[0] ('<far>') has id " + id.dump()), std::string::npos)
        << message;
    EXPECT_NE(message.find("ids must stay below 65793"), std::string::npos) << message;
  }
  std::string negative = corrupt_error(with_added_token(added_token("<neg>", -2)).dump());
  EXPECT_NE(negative.find("added_tokens[0] ('<neg>') has id -2"), std::string::npos) << negative;
  std::string huge = corrupt_error(with_added_token(added_token("<huge>", json(uint64_t{1} << 40))).dump());
  EXPECT_NE(huge.find("('<huge>') has id"), std::string::npos) << huge;
  // Ids a little past the vocabulary (reserved ranges) still load.
  auto ok = load(with_added_token(added_token("<near>", 5000)));
  EXPECT_EQ(ok->vocab_size(), 5001u);
}

TEST(TokenizerValidation, ConfigAddedTokensAreCheckedNamingTokenizerConfig) {
  std::string good = tiny_byte_level_tokenizer({}, false).dump();
  json far = {{"added_tokens_decoder", {{"100000000", {{"content", "<far>"}, {"special", true}}}}}};
  std::string message = corrupt_error(good, far.dump());
  EXPECT_NE(message.find("/m/tokenizer_config.json: added_tokens_decoder['100000000'] ('<far>') has id 100000000"),
            std::string::npos)
      << message;
  json not_string = {{"added_tokens_decoder", {{"300", {{"content", 7}}}}}};
  message = corrupt_error(good, not_string.dump());
  EXPECT_NE(message.find("/m/tokenizer_config.json: added_tokens_decoder['300'] has no \"content\" string"),
            std::string::npos)
      << message;
  EXPECT_EQ(message.find("/m/tokenizer.json"), std::string::npos) << message;
  json bad_key = {{"added_tokens_decoder", {{"abc", {{"content", "<x>"}}}}}};
  message = corrupt_error(good, bad_key.dump());
  EXPECT_NE(message.find("/m/tokenizer_config.json: added_tokens_decoder['abc']: the key must be a token id"),
            std::string::npos)
      << message;
  json bad_eos = {{"eos_token", {{"content", 5}}}};
  message = corrupt_error(good, bad_eos.dump());
  EXPECT_NE(message.find("/m/tokenizer_config.json: \"eos_token\".content must be a string"), std::string::npos)
      << message;
}

TEST(TokenizerValidation, AddedTokensWithoutContentOrIdNameTheEntry) {
  json t = tiny_byte_level_tokenizer({}, false);
  t["added_tokens"] = json::array({added_token("<a>", 300), {{"id", 301}}});
  std::string message = corrupt_error(t.dump());
  EXPECT_NE(message.find("/m/tokenizer.json: added_tokens[1] has no \"content\" string"), std::string::npos) << message;
  t["added_tokens"] = json::array({{{"content", "<b>"}, {"id", "301"}}});
  message = corrupt_error(t.dump());
  EXPECT_NE(message.find("added_tokens[0] ('<b>') has no integer \"id\""), std::string::npos) << message;
  t["added_tokens"] = json::array({added_token("<a>", 300), added_token("<b>", 300)});
  message = corrupt_error(t.dump());
  EXPECT_NE(message.find("added_tokens[1] ('<b>') has id 300, which the added token '<a>' already has"),
            std::string::npos)
      << message;
}

TEST(TokenizerValidation, VocabularyConsistency) {
  json empty = tiny_byte_level_tokenizer({}, false);
  empty["model"]["vocab"] = json::object();
  EXPECT_NE(corrupt_error(empty.dump()).find("model.vocab is empty"), std::string::npos);
  json duplicate = tiny_byte_level_tokenizer({}, false);
  duplicate["model"]["vocab"]["extra"] = 65;
  std::string message = corrupt_error(duplicate.dump());
  EXPECT_NE(message.find("both have id 65"), std::string::npos) << message;
  json far = tiny_byte_level_tokenizer({}, false);
  far["model"]["vocab"]["extra"] = 100000000;
  message = corrupt_error(far.dump());
  EXPECT_NE(message.find("vocab entry 'extra' has id 100000000"), std::string::npos) << message;
}

TEST(TokenizerValidation, JsonLibraryErrorsAreNamedByPart) {
  json t = tiny_byte_level_tokenizer({}, false);
  t["normalizer"] = {{"type", 5}};
  std::string message = corrupt_error(t.dump());
  EXPECT_NE(message.find("/m/tokenizer.json: \"normalizer\" is not valid"), std::string::npos) << message;
  EXPECT_NE(corrupt_error("{not json").find("/m/tokenizer.json is not valid JSON: parse error"), std::string::npos);
}

TEST(TokenizerValidation, EosTokenMissingFromTheVocabularyIsAWarning) {
  std::ostringstream captured;
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(
      std::make_shared<spdlog::logger>("capture", std::make_shared<spdlog::sinks::ostream_sink_mt>(captured)));
  auto tokenizer =
      Tokenizer::from_json_text(tiny_byte_level_tokenizer({}, false).dump(), R"({"eos_token": "<|nowhere|>"})",
                                "/m/tokenizer.json", "/m/tokenizer_config.json");
  spdlog::set_default_logger(previous);
  EXPECT_FALSE(tokenizer->eos_id().has_value());
  EXPECT_NE(captured.str().find("/m/tokenizer_config.json: eos_token '<|nowhere|>' is not in the vocabulary"),
            std::string::npos)
      << captured.str();
}

}  // namespace
}  // namespace tessera::tokenizer
