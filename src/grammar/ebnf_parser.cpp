// GBNF (llama.cpp) and EBNF as xgrammar accepts it: `name ::= expression`, "literals" and 'literals'
// with escapes, [classes] / [^classes], ., ( ), |, * + ? {m} {m,} {m,n}, # comments. A rule ends where the
// next `name ::=` starts.
#include <fmt/format.h>

#include "grammar/ir.h"

namespace tessera::grammar {
namespace {

bool is_name_char(char c) { return isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.'; }

class EbnfParser {
 public:
  EbnfParser(std::string_view text, RuleSet& rules, Budget& budget) : t_(text), rules_(rules), budget_(budget) {}

  void parse() {
    if (t_.size() > budget_.limits().max_grammar_bytes) {
      throw GrammarError(
          fmt::format("grammar is {} bytes, more than the limit of {}", t_.size(), budget_.limits().max_grammar_bytes));
    }
    skip_space();
    while (pos_ < t_.size()) {
      const std::string name = parse_name();
      skip_space();
      if (t_.substr(pos_, 3) != "::=") fail(fmt::format("expected '::=' after rule name '{}'", name));
      pos_ += 3;
      const int rule = rules_.rule_id(name);
      if (rules_.defined(rule)) fail(fmt::format("rule '{}' is defined twice", name));
      rules_.define(rule, parse_alternation(0));
      skip_space();
    }
  }

 private:
  [[noreturn]] void fail(std::string_view what) const {
    throw GrammarError(fmt::format("EBNF grammar: {} at {}", what, text_position(t_, pos_)));
  }

  void skip_space() {
    while (pos_ < t_.size()) {
      const char c = t_[pos_];
      if (c == '#') {
        while (pos_ < t_.size() && t_[pos_] != '\n') ++pos_;
      } else if (isspace(static_cast<unsigned char>(c))) {
        ++pos_;
      } else {
        break;
      }
    }
  }

  std::string parse_name() {
    const size_t start = pos_;
    while (pos_ < t_.size() && is_name_char(t_[pos_])) ++pos_;
    if (pos_ == start) fail("expected a rule name");
    return std::string(t_.substr(start, pos_ - start));
  }

  // True when a `name ::=` starts at pos_ (the end of the current rule).
  bool at_rule_start() const {
    size_t i = pos_;
    while (i < t_.size() && is_name_char(t_[i])) ++i;
    if (i == pos_) return false;
    while (i < t_.size() && (t_[i] == ' ' || t_[i] == '\t' || t_[i] == '\n' || t_[i] == '\r')) ++i;
    return t_.substr(i, 3) == "::=";
  }

  int parse_alternation(int depth) {
    budget_.check_depth(depth, "EBNF group");
    std::vector<int> alts{parse_sequence(depth)};
    while (pos_ < t_.size() && t_[pos_] == '|') {
      ++pos_;
      alts.push_back(parse_sequence(depth));
    }
    return rules_.choice(std::move(alts));
  }

  int parse_sequence(int depth) {
    std::vector<int> items;
    while (true) {
      skip_space();
      if (pos_ >= t_.size() || t_[pos_] == '|' || t_[pos_] == ')' || at_rule_start()) break;
      budget_.check_time("EBNF grammar");
      const int atom = parse_atom(depth);
      items.push_back(parse_postfix(atom));
    }
    return rules_.sequence(std::move(items));
  }

  int parse_postfix(int atom) {
    while (pos_ < t_.size()) {
      const char c = t_[pos_];
      if (c == '*') {
        atom = rules_.repeat(atom, 0, kUnbounded), ++pos_;
      } else if (c == '+') {
        atom = rules_.repeat(atom, 1, kUnbounded), ++pos_;
      } else if (c == '?') {
        atom = rules_.repeat(atom, 0, 1), ++pos_;
      } else if (c == '{') {
        ++pos_;
        int min = parse_int(), max = min;
        skip_space();
        if (pos_ < t_.size() && t_[pos_] == ',') {
          ++pos_;
          skip_space();
          max = pos_ < t_.size() && t_[pos_] == '}' ? kUnbounded : parse_int();
        }
        skip_space();
        if (pos_ >= t_.size() || t_[pos_] != '}') fail("expected '}' after repetition bounds");
        ++pos_;
        if (max != kUnbounded && max < min) fail("repetition {m,n} with n < m");
        atom = rules_.repeat(atom, min, max);
      } else {
        break;
      }
    }
    return atom;
  }

  int parse_int() {
    skip_space();
    long v = 0;
    const size_t start = pos_;
    while (pos_ < t_.size() && isdigit(static_cast<unsigned char>(t_[pos_]))) {
      v = v * 10 + (t_[pos_++] - '0');
      if (v > 100000) fail("repetition bound over 100000");
    }
    if (pos_ == start) fail("expected a number in {m,n}");
    return static_cast<int>(v);
  }

  int parse_atom(int depth) {
    const char c = t_[pos_];
    if (c == '"' || c == '\'') return parse_literal(c);
    if (c == '[') return parse_class();
    if (c == '.') {
      ++pos_;
      return rules_.char_class({{0, kMaxCodepoint}});
    }
    if (c == '(') {
      ++pos_;
      skip_space();
      if (pos_ < t_.size() && t_[pos_] == '=') fail("lookahead assertion (= ...) is not supported");
      const int e = parse_alternation(depth + 1);
      skip_space();
      if (pos_ >= t_.size() || t_[pos_] != ')') fail("missing ')'");
      ++pos_;
      return e;
    }
    if (is_name_char(c)) return rules_.ref(rules_.rule_id(parse_name()));
    fail(fmt::format("unexpected character '{}'", c));
  }

  uint32_t hex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      if (pos_ >= t_.size() || !isxdigit(static_cast<unsigned char>(t_[pos_]))) fail("bad hexadecimal escape");
      const char h = t_[pos_++];
      v = v * 16 + (isdigit(static_cast<unsigned char>(h)) ? h - '0' : (tolower(h) - 'a' + 10));
    }
    if (v > kMaxCodepoint) fail("escape beyond U+10FFFF");
    return v;
  }

  // One character of a literal or class (pos_ at it), decoding escapes.
  uint32_t parse_char() {
    if (t_[pos_] != '\\') return decode_utf8(t_, pos_);
    ++pos_;
    if (pos_ >= t_.size()) fail("trailing backslash");
    const char e = t_[pos_++];
    if (const int32_t c = control_escape(e); c >= 0) return static_cast<uint32_t>(c);
    switch (e) {
      case 'b':
        return '\b';
      case 'x':
        return hex(2);
      case 'u':
        return hex(4);
      case 'U':
        return hex(8);
      default:
        if (isalnum(static_cast<unsigned char>(e))) fail(fmt::format("unknown escape \\{}", e));
        --pos_;
        return decode_utf8(t_, pos_);
    }
  }

  int parse_literal(char quote) {
    ++pos_;
    std::string bytes;
    while (true) {
      if (pos_ >= t_.size() || t_[pos_] == '\n') fail("unterminated string literal");
      if (t_[pos_] == quote) break;
      // \xHH in a literal is a raw byte (GBNF), so non-UTF-8 byte sequences can be written.
      if (t_[pos_] == '\\' && pos_ + 1 < t_.size() && t_[pos_ + 1] == 'x') {
        pos_ += 2;
        bytes += static_cast<char>(hex(2));
        continue;
      }
      append_utf8(parse_char(), bytes);
    }
    ++pos_;
    return rules_.bytes(bytes);
  }

  int parse_class() {
    ++pos_;
    bool negated = false;
    if (pos_ < t_.size() && t_[pos_] == '^') negated = true, ++pos_;
    CodepointRanges ranges;
    while (true) {
      if (pos_ >= t_.size()) fail("unterminated character class");
      if (t_[pos_] == ']') break;
      const uint32_t lo = parse_char();
      uint32_t hi = lo;
      if (pos_ + 1 < t_.size() && t_[pos_] == '-' && t_[pos_ + 1] != ']') {
        ++pos_;
        hi = parse_char();
        if (hi < lo) fail("character class range out of order");
      }
      ranges.push_back({lo, hi});
    }
    ++pos_;
    return rules_.char_class(negated ? complement_ranges(ranges) : ranges);
  }

  std::string_view t_;
  RuleSet& rules_;
  Budget& budget_;
  size_t pos_ = 0;
};

}  // namespace

void parse_ebnf(std::string_view text, RuleSet& rules, Budget& budget) { EbnfParser(text, rules, budget).parse(); }

}  // namespace tessera::grammar
