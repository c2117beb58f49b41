// Helpers for the grammar tests: small vocabularies, whole-string acceptance, and a brute-force mask
// (every token tried with accept_token + rollback) to compare fill_next_token_bitmask with.
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "grammar/grammar.h"

namespace tessera::grammar::testing {

// Every single byte (ids 0..255), then `extra` multi-byte tokens, then a special token and an EOS
// (the stop id), then two ids past the tokenizer (vocab_size is larger).
inline std::shared_ptr<const TokenizerInfo> byte_vocab(const std::vector<std::string>& extra = {}) {
  auto info = std::make_shared<TokenizerInfo>();
  for (int b = 0; b < 256; ++b) info->token_bytes.push_back(std::string(1, static_cast<char>(b)));
  for (const auto& e : extra) info->token_bytes.push_back(e);
  info->special.assign(info->token_bytes.size(), false);
  info->token_bytes.push_back("<|special|>");
  info->special.push_back(true);
  info->token_bytes.push_back("<|eos|>");
  info->special.push_back(true);
  info->stop_ids = {static_cast<int32_t>(info->token_bytes.size()) - 1};
  info->vocab_size = static_cast<int32_t>(info->token_bytes.size()) + 2;
  return info;
}

// Multi-byte tokens typical of JSON output, for walks that exercise token boundaries.
inline std::vector<std::string> json_tokens() {
  return {"{\"",  "\":",   "\": ",   "\",",  "\", \"", "\"}",   "\"]",  "},",       "}}",   "]}",   "[{",    "{}",
          "[]",   "true",  "false",  "null", "nul",    "tr",    "ue",   ", ",       ",\n",  "\n  ", "  ",    "    ",
          "\"\"", "12",    "345",    "0.",   ".5",     "e+",    "-1",   "name",     "id",   "type", "value", "items",
          "abc",  "hello", " world", "\\n",  "\\\"",   "\\u00", "é",    "\xe4\xb8", "\xad", "中文", "2024",  "-01",
          "-15",  "T12",   ":00",    "Z\"",  "@",      ".com",  "http", "://",      "a-b"};
}

inline std::shared_ptr<const Grammar> build_ebnf(const std::string& text, const std::string& root = "root") {
  GrammarBuilder b;
  b.add_ebnf(text);
  return b.build(root);
}

inline std::shared_ptr<const Grammar> build_schema(const std::string& schema, const JsonOptions& options = {}) {
  GrammarBuilder b;
  const std::string root = b.add_json_schema_text(schema, options);
  return b.build(root);
}

inline std::shared_ptr<const Grammar> build_regex(const std::string& regex) {
  GrammarBuilder b;
  const std::string root = b.add_regex(regex);
  return b.build(root);
}

// True when the grammar matches exactly `text` (fed byte by byte).
inline bool matches(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  static auto vocab = byte_vocab();
  Matcher m(compile(g, vocab));
  if (!text.empty() && !m.accept_bytes(text)) return false;
  return m.can_terminate();
}

inline bool bit(const std::vector<uint32_t>& mask, int32_t id) { return (mask[id / 32] >> (id % 32)) & 1u; }

// The mask as accept_token says it should be (each token accepted, then rolled back).
inline std::vector<uint32_t> brute_force_mask(Matcher& m, const TokenizerInfo& info) {
  std::vector<uint32_t> mask(m.mask_words(), 0);
  for (int32_t id = 0; id < static_cast<int32_t>(m.mask_words() * 32); ++id) {
    if (m.accept_token(id)) {
      mask[id / 32] |= 1u << (id % 32);
      m.rollback(1);
    }
  }
  return mask;
}

// Samples tokens from the mask until a stop id is accepted (or `max_tokens`); returns the text and
// whether it terminated. Prefers non-stop tokens with probability `continue_bias` while the text is short.
struct Walk {
  std::string text;
  bool terminated = false;
  int tokens = 0;
};

// Tokens that contain a closing bracket or quote (cached per vocabulary).
inline const std::vector<int32_t>& closers(const TokenizerInfo& info) {
  static std::map<const TokenizerInfo*, std::vector<int32_t>> cache;
  auto [it, inserted] = cache.try_emplace(&info);
  if (inserted) {
    for (size_t id = 0; id < info.token_bytes.size(); ++id) {
      const std::string& s = info.token_bytes[id];
      if (!info.special[id] && s.size() <= 3 && s.find_first_of("}]\"") != std::string::npos) {
        it->second.push_back(static_cast<int32_t>(id));
      }
    }
  }
  return it->second;
}

inline Walk random_walk(Matcher& m, const TokenizerInfo& info, std::mt19937& rng, int max_tokens = 400) {
  Walk w;
  std::vector<uint32_t> mask(m.mask_words());
  for (; w.tokens < max_tokens; ++w.tokens) {
    m.fill_next_token_bitmask(mask);
    std::vector<int32_t> allowed, stops;
    for (size_t word = 0; word < mask.size(); ++word) {
      for (uint32_t x = mask[word]; x; x &= x - 1) {
        const auto id = static_cast<int32_t>(word * 32 + __builtin_ctz(x));
        const bool stop = std::find(info.stop_ids.begin(), info.stop_ids.end(), id) != info.stop_ids.end();
        (stop ? stops : allowed).push_back(id);
      }
    }
    if (allowed.empty() && stops.empty()) return w;  // dead end: the caller's assertion fails
    // Past half the budget, stop as soon as allowed.
    const bool stop_now = !stops.empty() && (allowed.empty() || w.tokens > max_tokens / 2 ||
                                             std::uniform_int_distribution<int>(0, 9)(rng) == 0);
    if (stop_now) {
      if (!m.accept_token(stops[0])) return w;
      w.terminated = true;
      return w;
    }
    // Past a quarter of the budget, prefer tokens that close strings and structures, to finish.
    int32_t id = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
    if (w.tokens > max_tokens / 4 && std::uniform_int_distribution<int>(0, 1)(rng) == 0) {
      std::vector<int32_t> closing;
      for (int32_t c : closers(info))
        if (bit(mask, c)) closing.push_back(c);
      if (!closing.empty()) id = closing[std::uniform_int_distribution<size_t>(0, closing.size() - 1)(rng)];
    }
    if (!m.accept_token(id)) return w;
    w.text += info.token_bytes[id];
  }
  return w;
}

}  // namespace tessera::grammar::testing
