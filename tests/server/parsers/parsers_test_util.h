// Helpers for the parser tests: ways to cut a text into deltas, streaming runners that fold the
// deltas back together, and checks on the OpenAI shape of streamed tool-call deltas.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <functional>

#include <random>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "server/parsers/chat_output_parser.h"
#include "server/parsers/reasoning_parser.h"
#include "server/parsers/stream_text.h"
#include "server/parsers/tool_parser.h"
#include "tokenizer/utf8.h"

namespace tessera::server::testing {

using Chunking = std::vector<std::string>;

inline Chunking cut_at(std::string_view text, const std::vector<size_t>& cuts) {
  Chunking out;
  size_t prev = 0;
  for (size_t c : cuts) {
    out.emplace_back(text.substr(prev, c - prev));
    prev = c;
  }
  out.emplace_back(text.substr(prev));
  return out;
}

// Every byte its own delta; every split into two; random splits (some with empty deltas);
// splits only inside UTF-8 characters.
inline std::vector<Chunking> chunkings(std::string_view text, int random_count = 60, uint32_t seed = 1) {
  std::vector<Chunking> all;
  std::vector<size_t> every;
  for (size_t i = 1; i < text.size(); ++i) every.push_back(i);
  all.push_back(cut_at(text, every));
  for (size_t i = 0; i <= text.size(); ++i) all.push_back(cut_at(text, {i}));
  std::mt19937 rng(seed);
  for (int r = 0; r < random_count; ++r) {
    std::vector<size_t> cuts;
    size_t pos = 0;
    while (pos < text.size()) {
      pos += rng() % 7;  // 0: an empty delta
      if (pos >= text.size()) break;
      cuts.push_back(pos);
    }
    all.push_back(cut_at(text, cuts));
  }
  std::vector<size_t> utf8_cuts;
  for (size_t i = 1; i < text.size(); ++i)
    if ((static_cast<unsigned char>(text[i]) & 0xC0) == 0x80) utf8_cuts.push_back(i);
  if (!utf8_cuts.empty()) all.push_back(cut_at(text, utf8_cuts));
  return all;
}

using tokenizer::is_valid_utf8;

inline ReasoningResult stream_reasoning(const ReasoningParser& prototype, const Chunking& chunks,
                                        bool check_utf8 = true) {
  std::unique_ptr<ReasoningParser> p = prototype.fresh();
  ReasoningResult r;
  auto add = [&](const ReasoningDelta& d) {
    if (check_utf8) {
      EXPECT_TRUE(is_valid_utf8(d.reasoning)) << "delta splits a character: " << d.reasoning;
      EXPECT_TRUE(is_valid_utf8(d.content)) << "delta splits a character: " << d.content;
    }
    r.reasoning += d.reasoning;
    r.content += d.content;
  };
  for (const std::string& c : chunks) add(p->push(c));
  add(p->finish());
  return r;
}

// Streams and folds tool deltas as a client would, checking OpenAI's shape on the way.
inline ToolParseResult stream_tools(const ToolParser& prototype, const Chunking& chunks, bool check_utf8 = true) {
  std::unique_ptr<ToolParser> p = prototype.fresh();
  ToolParseResult r;
  int next_new_index = 0;
  auto add = [&](const ToolStreamDelta& d) {
    if (check_utf8) {
      EXPECT_TRUE(is_valid_utf8(d.content));
    }
    std::set<int> seen;
    for (const ToolCallDelta& t : d.tool_calls) {
      EXPECT_TRUE(seen.insert(t.index).second) << "index " << t.index << " twice in one delta";
      if (t.first()) {
        EXPECT_EQ(t.index, next_new_index) << "calls must be numbered 0, 1, ... in order";
        EXPECT_FALSE(t.name.empty());
        ++next_new_index;
      } else {
        EXPECT_LT(t.index, next_new_index) << "arguments before the call's first delta";
        EXPECT_TRUE(t.name.empty());
        EXPECT_FALSE(t.arguments.empty()) << "empty non-first delta";
      }
      if (check_utf8) {
        EXPECT_TRUE(is_valid_utf8(t.arguments)) << t.arguments;
      }
    }
    r.content += d.content;
    accumulate_tool_deltas(r.tool_calls, d.tool_calls);
  };
  for (const std::string& c : chunks) add(p->push(c));
  add(p->finish());
  return r;
}

inline ChatParseResult stream_chat(ChatOutputParser& p, const Chunking& chunks) {
  ChatParseResult r;
  auto add = [&](const ChatDelta& d) {
    r.reasoning += d.reasoning;
    r.content += d.content;
    std::vector<ToolCall> calls = std::move(r.tool_calls);
    accumulate_tool_deltas(calls, d.tool_calls);
    r.tool_calls = std::move(calls);
  };
  for (const std::string& c : chunks) add(p.push(c));
  add(p.finish());
  return r;
}

// Ids "call-0", "call-1", ... so that results compare equal across runs.
inline ToolCallIdGenerator counting_ids() {
  auto n = std::make_shared<int>(0);
  return [n] { return "call-" + std::to_string((*n)++); };
}

inline void expect_same_calls(const std::vector<ToolCall>& a, const std::vector<ToolCall>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].name, b[i].name) << what;
    EXPECT_EQ(a[i].arguments, b[i].arguments) << what;
    EXPECT_FALSE(a[i].id.empty()) << what;
  }
}

inline std::string repeat(std::string_view s, size_t bytes) {
  std::string out;
  while (out.size() < bytes) out += s;
  return out;
}

// Linear time, checked by scaling rather than by a wall-clock bound that depends on the build
// (Debug + ASan is ~50x slower): 8x the input may cost at most ~20x the time (linear: 8x,
// quadratic: 64x), plus slack for timer noise on a busy machine.
inline void expect_linear(const std::function<void(const std::string&)>& run,
                          const std::function<std::string(size_t)>& make_input) {
  auto time = [&](size_t bytes) {
    std::string in = make_input(bytes);
    auto start = std::chrono::steady_clock::now();
    run(in);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  double small = time(64 << 10);
  double big = time(512 << 10);
  EXPECT_LT(big, 20 * small + 0.3) << "64 KiB: " << small << " s, 512 KiB: " << big
                                   << " s; input starts: " << make_input(64).substr(0, 40);
}

}  // namespace tessera::server::testing
