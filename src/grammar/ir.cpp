#include "grammar/ir.h"

#include <fmt/format.h>

#include <algorithm>

namespace tessera::grammar {

int RuleSet::add(Expr e) {
  exprs_.push_back(std::move(e));
  return static_cast<int>(exprs_.size()) - 1;
}

int RuleSet::bytes(std::string_view text) {
  if (text.empty()) return empty();
  Expr e;
  e.kind = ExprKind::kBytes;
  e.bytes = std::string(text);
  return add(std::move(e));
}

int RuleSet::char_class(CodepointRanges ranges) {
  Expr e;
  e.kind = ExprKind::kClass;
  e.ranges = normalize_ranges(std::move(ranges));
  return add(std::move(e));
}

int RuleSet::ref(int rule) {
  Expr e;
  e.kind = ExprKind::kRuleRef;
  e.rule = rule;
  return add(std::move(e));
}

int RuleSet::sequence(std::vector<int> items) {
  if (items.size() == 1) return items[0];
  if (items.empty()) return empty();
  Expr e;
  e.kind = ExprKind::kSequence;
  e.items = std::move(items);
  return add(std::move(e));
}

int RuleSet::choice(std::vector<int> items) {
  if (items.size() == 1) return items[0];
  Expr e;
  e.kind = ExprKind::kChoice;  // no items: matches nothing
  e.items = std::move(items);
  return add(std::move(e));
}

int RuleSet::repeat(int item, int min, int max) {
  if (min == 1 && max == 1) return item;
  Expr e;
  e.kind = ExprKind::kRepeat;
  e.items = {item};
  e.min = min;
  e.max = max;
  return add(std::move(e));
}

int RuleSet::tag_dispatch(std::vector<std::string> triggers, std::vector<int> continuations,
                          std::vector<std::string> stops, bool loop) {
  Expr e;
  e.kind = ExprKind::kTagDispatch;
  e.strings = std::move(triggers);
  e.items = std::move(continuations);
  e.stops = std::move(stops);
  e.loop = loop;
  return add(std::move(e));
}

int RuleSet::empty() { return add(Expr{}); }

int RuleSet::rule_id(const std::string& name) {
  auto it = by_name_.find(name);
  if (it != by_name_.end()) return it->second;
  rules_.push_back({name, -1});
  const int id = static_cast<int>(rules_.size()) - 1;
  by_name_.emplace(name, id);
  return id;
}

int RuleSet::new_rule(const std::string& name_hint) {
  std::string name = name_hint;
  for (int i = 1; by_name_.count(name); ++i) name = fmt::format("{}_{}", name_hint, i);
  return rule_id(name);
}

void RuleSet::define(int rule, int body) { rules_[rule].body = body; }

int RuleSet::find_rule(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? -1 : it->second;
}

void Budget::check_depth(int depth, std::string_view what) const {
  if (depth > limits_.max_nesting) {
    throw GrammarError(fmt::format("{} nests deeper than {} levels", what, limits_.max_nesting));
  }
}

void Budget::check_time(std::string_view what) {
  if ((++calls_ & 63) != 0) return;
  if (std::chrono::steady_clock::now() > deadline_) {
    throw GrammarError(
        fmt::format("{} took longer than the compile time limit ({} ms)", what, limits_.max_compile_time.count()));
  }
}

uint32_t decode_utf8(std::string_view text, size_t& pos) {
  const auto b0 = static_cast<unsigned char>(text[pos]);
  int len = b0 < 0x80 ? 1 : (b0 >> 5) == 6 ? 2 : (b0 >> 4) == 14 ? 3 : (b0 >> 3) == 30 ? 4 : 0;
  if (len == 0 || pos + len > text.size()) {
    ++pos;
    return b0;
  }
  uint32_t cp = len == 1 ? b0 : len == 2 ? (b0 & 0x1F) : len == 3 ? (b0 & 0x0F) : (b0 & 0x07);
  for (int i = 1; i < len; ++i) {
    const auto b = static_cast<unsigned char>(text[pos + i]);
    if ((b & 0xC0) != 0x80) {
      ++pos;
      return b0;
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  pos += len;
  return cp;
}

void append_utf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

CodepointRanges normalize_ranges(CodepointRanges ranges) {
  CodepointRanges split;
  for (auto [lo, hi] : ranges) {
    hi = std::min(hi, kMaxCodepoint);
    if (lo > hi) continue;
    // Surrogates have no UTF-8 encoding.
    if (lo < 0xD800 && hi >= 0xD800) split.push_back({lo, 0xD7FF});
    if (hi > 0xDFFF && lo <= 0xDFFF) split.push_back({0xE000, hi});
    if (hi < 0xD800 || lo > 0xDFFF) split.push_back({lo, hi});
  }
  std::sort(split.begin(), split.end());
  CodepointRanges out;
  for (auto r : split) {
    if (!out.empty() && r.first <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, r.second);
    } else {
      out.push_back(r);
    }
  }
  return out;
}

CodepointRanges complement_ranges(const CodepointRanges& ranges) {
  CodepointRanges norm = normalize_ranges(ranges), out;
  uint32_t next = 0;
  for (auto [lo, hi] : norm) {
    if (lo > next) out.push_back({next, lo - 1});
    next = hi + 1;
  }
  if (next <= kMaxCodepoint) out.push_back({next, kMaxCodepoint});
  return normalize_ranges(out);
}

namespace {

int utf8_length(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

std::string encode(uint32_t cp) {
  std::string s;
  append_utf8(cp, s);
  return s;
}

}  // namespace

// Splits [lo, hi] until each piece's encodings form a product of byte ranges (first byte range, then
// continuation ranges), the usual construction for UTF-8 automata.
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<ByteRangeSeq>& out) {
  if (lo > hi) return;
  static constexpr uint32_t kLengthEnds[] = {0x7F, 0x7FF, 0xFFFF};
  for (uint32_t end : kLengthEnds) {
    if (lo <= end && hi > end) {
      utf8_sequences(lo, end, out);
      utf8_sequences(end + 1, hi, out);
      return;
    }
  }
  const int len = utf8_length(lo);
  for (int i = 1; i < len; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_sequences(lo, lo | m, out);
        utf8_sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_sequences(lo, (hi & ~m) - 1, out);
        utf8_sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  const std::string a = encode(lo), b = encode(hi);
  ByteRangeSeq seq;
  for (size_t i = 0; i < a.size(); ++i) {
    seq.push_back({static_cast<uint8_t>(a[i]), static_cast<uint8_t>(b[i])});
  }
  out.push_back(std::move(seq));
}

std::string text_position(std::string_view text, size_t pos) {
  size_t line = 1, col = 1;
  for (size_t i = 0; i < pos && i < text.size(); ++i) {
    if (text[i] == '\n') ++line, col = 0;
    ++col;
  }
  return fmt::format("line {} column {}", line, col);
}

}  // namespace tessera::grammar
