// Regular expressions (ECMAScript-like) lowered to grammar expressions. The whole pattern must match:
// ^ and $ are accepted only at its two ends. Lookarounds, backreferences and word boundaries have no
// grammar equivalent and are reported by name.
#include <fmt/format.h>

#include "grammar/ir.h"

namespace tessera::grammar {
namespace {

constexpr int kMaxRepeatBound = 100000;

const CodepointRanges kDigit = {{'0', '9'}};
const CodepointRanges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const CodepointRanges kSpace = {{0x09, 0x0D},     {0x20, 0x20},     {0xA0, 0xA0},     {0x1680, 0x1680},
                                {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F},
                                {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
const CodepointRanges kNotLineTerminator = complement_ranges({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}});

class RegexParser {
 public:
  RegexParser(std::string_view pattern, RuleSet& rules, Budget& budget, bool json_string_body)
      : p_(pattern), rules_(rules), budget_(budget), json_(json_string_body) {}

  int parse() {
    if (p_.size() > budget_.limits().max_grammar_bytes) {
      throw GrammarError(
          fmt::format("regex is {} bytes, more than the limit of {}", p_.size(), budget_.limits().max_grammar_bytes));
    }
    if (!p_.empty() && p_[0] == '^') pos_ = 1;
    end_ = p_.size();
    if (end_ > pos_ && p_[end_ - 1] == '$' && !escaped_at(end_ - 1)) --end_;
    const int e = parse_alternation(0);
    if (pos_ < end_) fail(p_[pos_] == ')' ? "unbalanced ')'" : "unexpected character");
    return e;
  }

 private:
  [[noreturn]] void fail(std::string_view what) const {
    throw GrammarError(fmt::format("regex /{}/: {} at offset {}", p_, what, pos_));
  }

  // True when the character at i is preceded by an odd number of backslashes.
  bool escaped_at(size_t i) const {
    size_t n = 0;
    while (i > n && p_[i - n - 1] == '\\') ++n;
    return n % 2 == 1;
  }

  bool at_end() const { return pos_ >= end_; }
  char peek() const { return p_[pos_]; }

  int parse_alternation(int depth) {
    budget_.check_depth(depth, "regex group");
    std::vector<int> alts{parse_sequence(depth)};
    while (!at_end() && peek() == '|') {
      ++pos_;
      alts.push_back(parse_sequence(depth));
    }
    return rules_.choice(std::move(alts));
  }

  int parse_sequence(int depth) {
    std::vector<int> items;
    while (!at_end() && peek() != '|' && peek() != ')') {
      budget_.check_time("regex");
      int atom = parse_atom(depth);
      items.push_back(parse_quantifier(atom));
    }
    return rules_.sequence(std::move(items));
  }

  int parse_quantifier(int atom) {
    if (at_end()) return atom;
    int min = 0, max = 0;
    const char c = peek();
    if (c == '*') {
      min = 0, max = kUnbounded, ++pos_;
    } else if (c == '+') {
      min = 1, max = kUnbounded, ++pos_;
    } else if (c == '?') {
      min = 0, max = 1, ++pos_;
    } else if (c == '{' && parse_braces(min, max)) {
    } else {
      return atom;
    }
    if (!at_end() && peek() == '?') ++pos_;  // lazy: the same language
    if (!at_end() && (peek() == '*' || peek() == '+' || peek() == '?' || peek() == '{')) {
      if (peek() != '{' || looks_like_braces()) fail("nothing to repeat (two quantifiers in a row)");
    }
    return rules_.repeat(atom, min, max);
  }

  bool looks_like_braces() const {
    size_t i = pos_ + 1;
    if (i >= end_ || !isdigit(static_cast<unsigned char>(p_[i]))) return false;
    while (i < end_ && (isdigit(static_cast<unsigned char>(p_[i])) || p_[i] == ',')) ++i;
    return i < end_ && p_[i] == '}';
  }

  int parse_number() {
    long v = 0;
    if (at_end() || !isdigit(static_cast<unsigned char>(peek()))) fail("expected a number in {m,n}");
    while (!at_end() && isdigit(static_cast<unsigned char>(peek()))) {
      v = v * 10 + (peek() - '0');
      if (v > kMaxRepeatBound) fail(fmt::format("repetition bound over {}", kMaxRepeatBound));
      ++pos_;
    }
    return static_cast<int>(v);
  }

  // {m}, {m,}, {m,n}; a '{' that starts none of them is a literal (as in ECMAScript's Annex B).
  bool parse_braces(int& min, int& max) {
    if (!looks_like_braces()) return false;
    ++pos_;
    min = max = parse_number();
    if (peek() == ',') {
      ++pos_;
      max = peek() == '}' ? kUnbounded : parse_number();
    }
    if (peek() != '}') fail("expected '}'");
    ++pos_;
    if (max != kUnbounded && max < min) fail("repetition {m,n} with n < m");
    return true;
  }

  int parse_atom(int depth) {
    const char c = peek();
    switch (c) {
      case '(':
        return parse_group(depth);
      case '[':
        return parse_class();
      case '.':
        ++pos_;
        return cls(kNotLineTerminator);
      case '^':
        fail("anchor ^ is only supported at the start of the pattern");
      case '$':
        fail("anchor $ is only supported at the end of the pattern");
      case '*':
      case '+':
      case '?':
        fail("nothing to repeat");
      case '\\':
        return parse_escape_atom();
      default: {
        const uint32_t cp = decode_utf8(p_, pos_);
        return cls({{cp, cp}});
      }
    }
  }

  int parse_group(int depth) {
    ++pos_;
    if (p_.substr(pos_, 2) == "?=" || p_.substr(pos_, 2) == "?!") fail("lookahead (?= / ?!) is not supported");
    if (p_.substr(pos_, 3) == "?<=" || p_.substr(pos_, 3) == "?<!") fail("lookbehind (?<= / ?<!) is not supported");
    if (p_.substr(pos_, 2) == "?:") {
      pos_ += 2;
    } else if (p_.substr(pos_, 2) == "?<" || p_.substr(pos_, 2) == "?P") {
      const size_t close = p_.find('>', pos_);
      if (close == std::string_view::npos) fail("unterminated group name");
      pos_ = close + 1;
    } else if (!at_end() && peek() == '?') {
      fail("unsupported group modifier (?");
    }
    const int e = parse_alternation(depth + 1);
    if (at_end() || peek() != ')') fail("missing ')'");
    ++pos_;
    return e;
  }

  // An escape outside a class: a class shorthand, a control escape or a literal.
  int parse_escape_atom() {
    ++pos_;
    if (at_end()) fail("trailing backslash");
    const char c = peek();
    if (c == 'b' || c == 'B') fail("word boundary \\b / \\B is not supported");
    if (c >= '1' && c <= '9') fail("backreference \\N is not supported");
    if (c == 'k' && pos_ + 1 < end_ && p_[pos_ + 1] == '<') fail("named backreference \\k<...> is not supported");
    if (c == 'p' || c == 'P') fail("Unicode property escape \\p{...} is not supported");
    CodepointRanges ranges;
    parse_escape(ranges, false);
    return cls(ranges);
  }

  // Appends what the escape at pos_ (after the backslash) matches to `out`.
  void parse_escape(CodepointRanges& out, bool in_class) {
    const char c = peek();
    ++pos_;
    switch (c) {
      case 'd':
        return append(out, kDigit);
      case 'D':
        return append(out, complement_ranges(kDigit));
      case 'w':
        return append(out, kWord);
      case 'W':
        return append(out, complement_ranges(kWord));
      case 's':
        return append(out, kSpace);
      case 'S':
        return append(out, complement_ranges(kSpace));
      default:
        break;
    }
    const uint32_t cp = escape_codepoint(c, in_class);
    out.push_back({cp, cp});
  }

  uint32_t escape_codepoint(char c, bool in_class) {
    if (const int32_t control = control_escape(c); control >= 0) return static_cast<uint32_t>(control);
    switch (c) {
      case 'b':
        if (in_class) return '\b';
        break;
      case 'x':
        return hex(2);
      case 'u':
        if (!at_end() && peek() == '{') {
          ++pos_;
          const size_t close = p_.find('}', pos_);
          if (close == std::string_view::npos || close == pos_ || close - pos_ > 6) fail("bad \\u{...} escape");
          const uint32_t cp = hex(static_cast<int>(close - pos_));
          ++pos_;
          return cp;
        }
        return hex(4);
      case 'c':
        fail("control escape \\c is not supported");
      default:
        break;
    }
    if (isalnum(static_cast<unsigned char>(c))) fail(fmt::format("unknown escape \\{}", c));
    --pos_;
    return decode_utf8(p_, pos_);  // escaped punctuation or a non-ASCII character
  }

  uint32_t hex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      if (at_end() || !isxdigit(static_cast<unsigned char>(peek()))) fail("bad hexadecimal escape");
      const char h = peek();
      v = v * 16 + (isdigit(static_cast<unsigned char>(h)) ? h - '0' : (tolower(h) - 'a' + 10));
      ++pos_;
    }
    if (v > kMaxCodepoint) fail("escape beyond U+10FFFF");
    return v;
  }

  int parse_class() {
    ++pos_;
    bool negated = false;
    if (!at_end() && peek() == '^') negated = true, ++pos_;
    CodepointRanges ranges;
    bool first = true;
    while (true) {
      if (at_end()) fail("unterminated character class");
      if (peek() == ']' && !first) break;
      first = false;
      if (peek() == '[' && pos_ + 1 < end_ && p_[pos_ + 1] == ':') fail("POSIX class [:name:] is not supported");
      uint32_t lo;
      if (!class_atom(ranges, lo)) continue;  // a shorthand like \d: no range
      if (pos_ + 1 < end_ && peek() == '-' && p_[pos_ + 1] != ']') {
        ++pos_;
        uint32_t hi;
        CodepointRanges ignored;
        if (!class_atom(ignored, hi)) fail("class shorthand as a range end");
        if (hi < lo) fail("character class range out of order");
        ranges.push_back({lo, hi});
      } else {
        ranges.push_back({lo, lo});
      }
    }
    ++pos_;
    return cls(negated ? complement_ranges(ranges) : ranges);
  }

  // One class member: returns false after appending a shorthand's ranges, else true with its codepoint.
  bool class_atom(CodepointRanges& out, uint32_t& cp) {
    if (peek() != '\\') {
      cp = decode_utf8(p_, pos_);
      return true;
    }
    ++pos_;
    if (at_end()) fail("trailing backslash");
    const char c = peek();
    if (c == 'd' || c == 'D' || c == 'w' || c == 'W' || c == 's' || c == 'S') {
      parse_escape(out, true);
      return false;
    }
    if (c == 'p' || c == 'P') fail("Unicode property escape \\p{...} is not supported");
    ++pos_;
    cp = escape_codepoint(c, true);
    return true;
  }

  static void append(CodepointRanges& out, const CodepointRanges& in) { out.insert(out.end(), in.begin(), in.end()); }

  // A class; in a JSON string body the characters JSON escapes match their escape sequences instead.
  int cls(const CodepointRanges& ranges) {
    if (!json_) return rules_.char_class(ranges);
    const CodepointRanges norm = normalize_ranges(ranges);
    auto contains = [&](uint32_t cp) {
      for (auto [lo, hi] : norm)
        if (cp >= lo && cp <= hi) return true;
      return false;
    };
    std::vector<int> alts;
    for (uint32_t cp = 0; cp <= 0x5C; ++cp) {
      if ((cp < 0x20 || cp == '"' || cp == '\\') && contains(cp)) alts.push_back(rules_.bytes(json_escape(cp)));
    }
    CodepointRanges allowed;
    for (auto [lo, hi] : norm) {
      // [lo, hi] minus the controls, '"' and '\\'
      lo = std::max<uint32_t>(lo, 0x20);
      for (uint32_t ex : {uint32_t{'"'}, uint32_t{'\\'}}) {
        if (lo <= ex && ex <= hi) {
          if (lo < ex) allowed.push_back({lo, ex - 1});
          lo = ex + 1;
        }
      }
      if (lo <= hi) allowed.push_back({lo, hi});
    }
    if (!allowed.empty()) alts.push_back(rules_.char_class(allowed));
    return rules_.choice(std::move(alts));
  }

  static std::string json_escape(uint32_t cp) {
    switch (cp) {
      case '"':
        return "\\\"";
      case '\\':
        return "\\\\";
      case '\n':
        return "\\n";
      case '\r':
        return "\\r";
      case '\t':
        return "\\t";
      case '\b':
        return "\\b";
      case '\f':
        return "\\f";
      default:
        return fmt::format("\\u{:04x}", cp);
    }
  }

  std::string_view p_;
  RuleSet& rules_;
  Budget& budget_;
  bool json_;
  size_t pos_ = 0, end_ = 0;
};

}  // namespace

int lower_regex(std::string_view pattern, RuleSet& rules, Budget& budget, bool json_string_body) {
  return RegexParser(pattern, rules, budget, json_string_body).parse();
}

}  // namespace tessera::grammar
