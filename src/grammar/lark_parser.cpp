// A Lark subset: `rule: alt | alt` (also ?rule and TERMINAL definitions), "literals", /regex/, [optional],
// ( ), ?, *, +, // comments. Rules and terminals both become grammar rules (no separate lexer: terminals
// match as part of the grammar). Directives (%ignore, %import, ...), aliases (->), priorities, templates,
// flags and ~ repetition are reported by name.
#include <fmt/format.h>

#include "grammar/ir.h"

namespace tessera::grammar {
namespace {

bool is_ident_char(char c) { return isalnum(static_cast<unsigned char>(c)) || c == '_'; }

class LarkParser {
 public:
  LarkParser(std::string_view text, RuleSet& rules, Budget& budget) : t_(text), rules_(rules), budget_(budget) {}

  void parse() {
    if (t_.size() > budget_.limits().max_grammar_bytes) {
      throw GrammarError(fmt::format("Lark grammar is {} bytes, more than the limit of {}", t_.size(),
                                     budget_.limits().max_grammar_bytes));
    }
    skip_space(true);
    while (pos_ < t_.size()) {
      if (t_[pos_] == '%') {
        const size_t start = pos_;
        while (pos_ < t_.size() && !isspace(static_cast<unsigned char>(t_[pos_]))) ++pos_;
        fail(fmt::format("directive {} is not supported", t_.substr(start, pos_ - start)));
      }
      if (t_[pos_] == '?' || t_[pos_] == '!') ++pos_;  // ?rule inlines a single child: same language
      const std::string name = parse_ident();
      if (pos_ < t_.size() && t_[pos_] == '.') fail(fmt::format("priority on '{}' is not supported", name));
      if (pos_ < t_.size() && t_[pos_] == '{') fail(fmt::format("template rule '{}' is not supported", name));
      skip_space(false);
      if (pos_ >= t_.size() || t_[pos_] != ':') fail(fmt::format("expected ':' after rule name '{}'", name));
      ++pos_;
      const int rule = rules_.rule_id(name);
      if (rules_.defined(rule)) fail(fmt::format("rule '{}' is defined twice", name));
      rules_.define(rule, parse_alternation(0, true));
      skip_space(true);
    }
  }

 private:
  [[noreturn]] void fail(std::string_view what) const {
    throw GrammarError(fmt::format("Lark grammar: {} at {}", what, text_position(t_, pos_)));
  }

  // Skips blanks and // comments; newlines only when `newlines` (inside a rule, a newline ends it unless
  // the next line continues with '|').
  void skip_space(bool newlines) {
    while (pos_ < t_.size()) {
      const char c = t_[pos_];
      if (c == '/' && pos_ + 1 < t_.size() && t_[pos_ + 1] == '/') {
        while (pos_ < t_.size() && t_[pos_] != '\n') ++pos_;
      } else if (c == '\n' && !newlines) {
        size_t i = pos_;
        while (i < t_.size() && isspace(static_cast<unsigned char>(t_[i]))) ++i;
        if (i < t_.size() && t_[i] == '|') {
          pos_ = i;
        } else {
          break;
        }
      } else if (isspace(static_cast<unsigned char>(c))) {
        ++pos_;
      } else {
        break;
      }
    }
  }

  std::string parse_ident() {
    const size_t start = pos_;
    while (pos_ < t_.size() && is_ident_char(t_[pos_])) ++pos_;
    if (pos_ == start) fail("expected a rule or terminal name");
    return std::string(t_.substr(start, pos_ - start));
  }

  bool at_end_of_rule() const { return pos_ >= t_.size() || t_[pos_] == '\n'; }

  int parse_alternation(int depth, bool top) {
    budget_.check_depth(depth, "Lark group");
    std::vector<int> alts{parse_sequence(depth, top)};
    while (pos_ < t_.size() && t_[pos_] == '|') {
      ++pos_;
      alts.push_back(parse_sequence(depth, top));
    }
    return rules_.choice(std::move(alts));
  }

  int parse_sequence(int depth, bool top) {
    std::vector<int> items;
    while (true) {
      skip_space(!top);
      if (at_end_of_rule() || t_[pos_] == '|' || t_[pos_] == ')' || t_[pos_] == ']') break;
      if (t_.substr(pos_, 2) == "->") fail("alias (->) is not supported");
      budget_.check_time("Lark grammar");
      int atom = parse_atom(depth);
      if (pos_ < t_.size()) {
        const char c = t_[pos_];
        if (c == '*')
          atom = rules_.repeat(atom, 0, kUnbounded), ++pos_;
        else if (c == '+')
          atom = rules_.repeat(atom, 1, kUnbounded), ++pos_;
        else if (c == '?')
          atom = rules_.repeat(atom, 0, 1), ++pos_;
      }
      skip_space(!top);
      if (pos_ < t_.size() && t_[pos_] == '~') fail("repetition with ~ is not supported");
      items.push_back(atom);
    }
    return rules_.sequence(std::move(items));
  }

  int parse_atom(int depth) {
    const char c = t_[pos_];
    if (c == '"') return parse_literal();
    if (c == '/') return parse_regex();
    if (c == '(' || c == '[') {
      ++pos_;
      const int e = parse_alternation(depth + 1, false);
      skip_space(true);
      const char close = c == '(' ? ')' : ']';
      if (pos_ >= t_.size() || t_[pos_] != close) fail(fmt::format("missing '{}'", close));
      ++pos_;
      return c == '[' ? rules_.repeat(e, 0, 1) : e;
    }
    if (is_ident_char(c)) {
      const std::string name = parse_ident();
      if (pos_ < t_.size() && t_[pos_] == '{') fail(fmt::format("template use '{}{{...}}' is not supported", name));
      return rules_.ref(rules_.rule_id(name));
    }
    fail(fmt::format("unexpected character '{}'", c));
  }

  int parse_literal() {
    ++pos_;
    std::string bytes;
    while (true) {
      if (pos_ >= t_.size() || t_[pos_] == '\n') fail("unterminated string literal");
      const char c = t_[pos_];
      if (c == '"') break;
      if (c != '\\') {
        bytes += c;
        ++pos_;
        continue;
      }
      ++pos_;
      if (pos_ >= t_.size()) fail("trailing backslash");
      const char e = t_[pos_++];
      switch (e) {
        case 'n':
          bytes += '\n';
          break;
        case 't':
          bytes += '\t';
          break;
        case 'r':
          bytes += '\r';
          break;
        case 'x':
        case 'u': {
          const int digits = e == 'x' ? 2 : 4;
          uint32_t v = 0;
          for (int i = 0; i < digits; ++i, ++pos_) {
            if (pos_ >= t_.size() || !isxdigit(static_cast<unsigned char>(t_[pos_]))) fail("bad hexadecimal escape");
            const char h = t_[pos_];
            v = v * 16 + (isdigit(static_cast<unsigned char>(h)) ? h - '0' : (tolower(h) - 'a' + 10));
          }
          append_utf8(v, bytes);
          break;
        }
        default:
          bytes += e;  // \" \\ and other escaped characters
      }
    }
    ++pos_;
    if (pos_ < t_.size() && t_[pos_] == 'i') fail("case-insensitive literal flag \"...\"i is not supported");
    return rules_.bytes(bytes);
  }

  int parse_regex() {
    ++pos_;
    std::string pattern;
    while (true) {
      if (pos_ >= t_.size() || t_[pos_] == '\n') fail("unterminated /regex/");
      const char c = t_[pos_];
      if (c == '/') break;
      if (c == '\\' && pos_ + 1 < t_.size()) {
        if (t_[pos_ + 1] != '/') pattern += c;
        pattern += t_[pos_ + 1];
        pos_ += 2;
        continue;
      }
      pattern += c;
      ++pos_;
    }
    ++pos_;
    if (pos_ < t_.size() && isalpha(static_cast<unsigned char>(t_[pos_]))) {
      fail(fmt::format("regex flag '{}' is not supported", t_[pos_]));
    }
    return lower_regex(pattern, rules_, budget_);
  }

  std::string_view t_;
  RuleSet& rules_;
  Budget& budget_;
  size_t pos_ = 0;
};

}  // namespace

void parse_lark(std::string_view text, RuleSet& rules, Budget& budget) { LarkParser(text, rules, budget).parse(); }

}  // namespace tessera::grammar
