// The streaming detokenizer, fed one token at a time, gives exactly the full decode, never a
// broken UTF-8 sequence, and catches stop strings across token boundaries.
#include "tokenizer/detokenizer.h"

#include <gtest/gtest.h>

#include <random>

#include "tokenizer/utf8.h"
#include "tokenizer_test_data.h"

namespace tessera::tokenizer {
namespace {

using testing::load_tokenizer;

std::string stream_all(const Tokenizer& tokenizer, const std::vector<int32_t>& ids, DetokenizerOptions options,
                       std::vector<std::string>* chunks = nullptr) {
  StreamingDetokenizer detokenizer(tokenizer, std::move(options));
  std::string text;
  for (int32_t id : ids) {
    DetokenizerOutput out = detokenizer.push(id);
    if (chunks) chunks->push_back(out.text);
    text += out.text;
  }
  DetokenizerOutput last = detokenizer.finish();
  if (chunks) chunks->push_back(last.text);
  text += last.text;
  EXPECT_EQ(text, detokenizer.output());
  return text;
}

class DetokenizerTest : public ::testing::TestWithParam<const char*> {};

TEST_P(DetokenizerTest, CharactersSpreadOverTokensComeOutWhole) {
  const Tokenizer& tokenizer = load_tokenizer(GetParam());
  const std::string text = "龘靐齉爩 👨‍👩‍👧‍👦 🏴󠁧󠁢󠁳󠁣󠁴󠁿 𠀀𪚥 ü";
  std::vector<int32_t> ids = tokenizer.encode(text);
  ASSERT_GT(ids.size(), 10u);
  std::vector<std::string> chunks;
  EXPECT_EQ(stream_all(tokenizer, ids, {}, &chunks), text);
  int empty_chunks = 0;
  for (const std::string& chunk : chunks) {
    EXPECT_TRUE(is_valid_utf8(chunk)) << nlohmann::json(chunk).dump();
    EXPECT_EQ(chunk.find(kReplacementCharacter), std::string::npos);
    empty_chunks += chunk.empty();
  }
  EXPECT_GT(empty_chunks, 0) << "some character should have needed more than one token";
}

// The full decode of `ids`, less the bytes of a character the last tokens left unfinished (which a
// full decode turns into U+FFFD and the streaming detokenizer drops).
std::string decode_without_unfinished_end(const Tokenizer& tokenizer, const std::vector<int32_t>& ids, bool skip) {
  if (!tokenizer.decodes_by_byte_concatenation()) {
    std::string full = tokenizer.decode(ids, skip);
    if (full.ends_with(kReplacementCharacter)) full.resize(full.size() - kReplacementCharacter.size());
    return full;
  }
  std::string bytes;
  for (int32_t id : ids) tokenizer.append_token_bytes(id, skip, bytes);
  return utf8_lossy(std::string_view(bytes).substr(0, decidable_prefix_length(bytes)));
}

// Random id sequences (ordinary tokens, lone byte tokens that split characters, special tokens,
// unknown ids): the stream equals the full decode (less an unfinished character at the very end),
// and every chunk is valid UTF-8.
TEST_P(DetokenizerTest, FuzzedIdSequencesStreamExactlyTheFullDecode) {
  const Tokenizer& tokenizer = load_tokenizer(GetParam());
  std::mt19937 rng(1234);
  // Tokens whose bytes are not valid UTF-8 on their own: fragments of multi-byte characters.
  std::vector<int32_t> byte_tokens;
  for (int32_t id = 0; id < static_cast<int32_t>(tokenizer.vocab_size()) && byte_tokens.size() < 300; ++id) {
    std::string bytes;
    tokenizer.append_token_bytes(id, false, bytes);
    if (!bytes.empty() && !is_valid_utf8(bytes)) byte_tokens.push_back(id);
  }
  ASSERT_FALSE(byte_tokens.empty());
  std::vector<int32_t> specials;
  for (const AddedToken& token : tokenizer.added_tokens()) specials.push_back(token.id);
  std::uniform_int_distribution<int32_t> any_id(0, static_cast<int32_t>(tokenizer.vocab_size()) - 1);
  for (int round = 0; round < 300; ++round) {
    std::vector<int32_t> ids;
    int length = 1 + static_cast<int>(rng() % 40);
    for (int i = 0; i < length; ++i) {
      unsigned kind = rng() % 10;
      if (kind < 5) {
        ids.push_back(any_id(rng));
      } else if (kind < 8) {
        ids.push_back(byte_tokens[rng() % byte_tokens.size()]);
      } else if (kind < 9) {
        ids.push_back(specials[rng() % specials.size()]);
      } else {
        ids.push_back(static_cast<int32_t>(tokenizer.vocab_size()) + static_cast<int32_t>(rng() % 1000));
      }
    }
    for (bool skip : {false, true}) {
      std::vector<std::string> chunks;
      DetokenizerOptions options;
      options.skip_special_tokens = skip;
      std::string streamed = stream_all(tokenizer, ids, options, &chunks);
      ASSERT_EQ(streamed, decode_without_unfinished_end(tokenizer, ids, skip))
          << "round " << round << " ids " << nlohmann::json(ids).dump();
      for (const std::string& chunk : chunks) ASSERT_TRUE(is_valid_utf8(chunk)) << "round " << round;
    }
  }
}

// Random id sequences with a stop string cut from their own decode: the stream stops exactly
// before the first occurrence, and no emitted chunk ever contains the stop string.
TEST_P(DetokenizerTest, FuzzedStopStringsStopAtTheFirstOccurrence) {
  const Tokenizer& tokenizer = load_tokenizer(GetParam());
  std::mt19937 rng(77);
  std::uniform_int_distribution<int32_t> any_id(0, static_cast<int32_t>(tokenizer.vocab_size()) - 1);
  int stops_seen = 0;
  for (int round = 0; round < 300; ++round) {
    std::vector<int32_t> ids;
    for (int i = 0, n = 2 + static_cast<int>(rng() % 30); i < n; ++i) ids.push_back(any_id(rng));
    const std::string full = tokenizer.decode(ids, true);
    if (full.size() < 2) continue;
    // A stop string on character boundaries, 1..8 bytes long.
    auto boundary = [&](size_t i) {
      while (i > 0 && i < full.size() && (static_cast<uint8_t>(full[i]) & 0xC0) == 0x80) --i;
      return i;
    };
    size_t begin = boundary(rng() % full.size());
    size_t end = boundary(std::min(full.size(), begin + 1 + rng() % 8));
    if (end <= begin) end = begin + valid_sequence_length(full, begin);  // at least one character
    if (end <= begin) continue;
    const std::string stop = full.substr(begin, end - begin);
    DetokenizerOptions options;
    options.stop_strings = {stop};
    StreamingDetokenizer detokenizer(tokenizer, options);
    std::string emitted;
    bool stopped = false;
    for (int32_t id : ids) {
      DetokenizerOutput out = detokenizer.push(id);
      emitted += out.text;
      ASSERT_EQ(emitted.find(stop), std::string::npos) << "round " << round;
      if ((stopped = out.stopped)) break;
    }
    if (!stopped) {
      DetokenizerOutput last = detokenizer.finish();
      emitted += last.text;
      stopped = last.stopped;
    }
    ++stops_seen;
    EXPECT_TRUE(stopped) << "round " << round << " stop " << nlohmann::json(stop).dump();
    EXPECT_EQ(emitted, full.substr(0, full.find(stop))) << "round " << round;
  }
  EXPECT_GT(stops_seen, 200);
}

TEST_P(DetokenizerTest, StreamsEveryReferenceStringExactly) {
  const Tokenizer& tokenizer = load_tokenizer(GetParam());
  nlohmann::json strings = testing::read_json(testing::fixture("strings.json")).at("strings");
  for (const auto& entry : strings) {
    std::vector<int32_t> ids = tokenizer.encode(entry.get<std::string>());
    for (bool skip : {false, true}) {
      DetokenizerOptions options;
      options.skip_special_tokens = skip;
      EXPECT_EQ(stream_all(tokenizer, ids, options), tokenizer.decode(ids, skip));
    }
  }
}

TEST_P(DetokenizerTest, StopStringAcrossTokenBoundariesIsCaughtAndNeverLeaks) {
  const Tokenizer& tokenizer = load_tokenizer(GetParam());
  const std::string text = "The answer is 42.\n\nObservation: 你好世界 and more text after";
  for (const std::string stop : {"Observation:", "\n\nObs", "好世", "answer is 42", "after"}) {
    std::vector<int32_t> ids = tokenizer.encode(text);
    DetokenizerOptions options;
    options.stop_strings = {stop, "never-appears-xyz"};
    StreamingDetokenizer detokenizer(tokenizer, options);
    std::string emitted;
    bool stopped = false;
    for (int32_t id : ids) {
      DetokenizerOutput out = detokenizer.push(id);
      emitted += out.text;
      EXPECT_EQ(emitted.find(stop), std::string::npos) << "stop string leaked: " << stop;
      if (out.stopped) {
        EXPECT_EQ(out.stop_string, stop);
        stopped = true;
        break;
      }
    }
    EXPECT_TRUE(stopped) << stop;
    EXPECT_EQ(emitted, text.substr(0, text.find(stop))) << stop;
    EXPECT_TRUE(detokenizer.push(ids[0]).text.empty()) << "nothing after a stop";
  }
}

TEST_P(DetokenizerTest, StopStringIncludedWhenAsked) {
  const Tokenizer& tokenizer = load_tokenizer(GetParam());
  DetokenizerOptions options;
  options.stop_strings = {"STOP"};
  options.include_stop_string_in_output = true;
  std::string streamed = stream_all(tokenizer, tokenizer.encode("abc STOP def"), options);
  EXPECT_EQ(streamed, "abc STOP");
}

TEST_P(DetokenizerTest, HeldBackPrefixIsReleasedWhenItIsNotAStop) {
  const Tokenizer& tokenizer = load_tokenizer(GetParam());
  DetokenizerOptions options;
  options.stop_strings = {"</answer>"};
  std::vector<int32_t> ids = tokenizer.encode("x </ans y </answe");
  StreamingDetokenizer detokenizer(tokenizer, options);
  std::string emitted;
  for (int32_t id : ids) emitted += detokenizer.push(id).text;
  EXPECT_EQ(emitted.find("</answe"), std::string::npos) << "a possible stop start must be held: " << emitted;
  DetokenizerOutput last = detokenizer.finish();
  EXPECT_FALSE(last.stopped);
  EXPECT_EQ(emitted + last.text, "x </ans y </answe");
}

TEST_P(DetokenizerTest, SpecialTokensSkippedOrKept) {
  const Tokenizer& tokenizer = load_tokenizer(GetParam());
  std::string special;
  for (const AddedToken& token : tokenizer.added_tokens())
    if (token.special) special = token.content;
  ASSERT_FALSE(special.empty());
  std::vector<int32_t> ids = tokenizer.encode("hi" + special + "there");
  DetokenizerOptions keep;
  keep.skip_special_tokens = false;
  EXPECT_EQ(stream_all(tokenizer, ids, keep), "hi" + special + "there");
  EXPECT_EQ(stream_all(tokenizer, ids, {}), "hithere");
}

// An answer cut at max_tokens inside a character that spans several tokens ends before that
// character: never in U+FFFD.
TEST_P(DetokenizerTest, UnfinishedCharacterAtTheEndIsDroppedNotReplaced) {
  const Tokenizer& tokenizer = load_tokenizer(GetParam());
  const std::string text = "ok 龘靐齉爩 👨‍👩‍👧‍👦 𠀀𪚥";
  const std::vector<int32_t> ids = tokenizer.encode(text);
  int cut_inside = 0;
  for (size_t n = 1; n <= ids.size(); ++n) {
    const std::vector<int32_t> head(ids.begin(), ids.begin() + static_cast<long>(n));
    const std::string full = tokenizer.decode(head, true);
    const std::string streamed = stream_all(tokenizer, head, {});
    EXPECT_FALSE(streamed.ends_with(kReplacementCharacter)) << n << " tokens: " << nlohmann::json(streamed).dump();
    EXPECT_TRUE(is_valid_utf8(streamed));
    EXPECT_TRUE(text.starts_with(streamed)) << n << " tokens";
    if (full.ends_with(kReplacementCharacter)) {
      ++cut_inside;
      EXPECT_LT(streamed.size(), full.size());
    } else {
      EXPECT_EQ(streamed, full);
    }
  }
  EXPECT_GT(cut_inside, 0) << "some cut should fall inside a character";
}

// vLLM's min_tokens: a stop string counts only once more than min_tokens tokens were generated, and
// only where it ends in the text of a later token; the first such occurrence stops the stream.
TEST_P(DetokenizerTest, MinTokensHoldsBackStopStrings) {
  const Tokenizer& tokenizer = load_tokenizer(GetParam());
  const std::string text = "a. b. c. d. e. f. g. h. i. j. k.";
  const std::vector<int32_t> ids = tokenizer.encode(text);
  for (const std::string stop : {".", ". ", " c"}) {
    for (int min_tokens = 0; min_tokens <= static_cast<int>(ids.size()); ++min_tokens) {
      // Expected: the first token i > min_tokens whose text completes an occurrence ending past the
      // text of the first min_tokens tokens.
      const size_t floor = tokenizer.decode(std::span(ids).first(static_cast<size_t>(min_tokens)), true).size();
      std::string expected = text;
      for (size_t i = static_cast<size_t>(min_tokens) + 1; i <= ids.size(); ++i) {
        const std::string so_far = tokenizer.decode(std::span(ids).first(i), true);
        const size_t from = floor >= stop.size() ? floor - stop.size() + 1 : 0;
        if (size_t at = so_far.find(stop, from); at != std::string::npos) {
          expected = so_far.substr(0, at);
          break;
        }
      }
      DetokenizerOptions options;
      options.stop_strings = {stop};
      options.min_tokens = min_tokens;
      EXPECT_EQ(stream_all(tokenizer, ids, options), expected)
          << "stop " << nlohmann::json(stop).dump() << " min_tokens " << min_tokens;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, DetokenizerTest, ::testing::ValuesIn(testing::kTokenizerNames),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace tessera::tokenizer
