// JSON leaf values for the schema lowering: whitespace and separators, strings (length, pattern, format),
// integers and numbers (with bounds), constants, and the shared any-value rules.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "grammar/json_schema.h"

namespace tessera::grammar {
namespace {

// Formats as reasonable regular expressions (RFC 3339 date/time, a practical e-mail address, RFC 4122
// UUID text, an absolute URI without whitespace).
const char* format_regex(const std::string& format) {
  static constexpr const char* kDate = R"(\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01]))";
  if (format == "date") return kDate;
  if (format == "time") return R"(([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d{1,9})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d))";
  if (format == "date-time") {
    return R"(\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])T([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d{1,9})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d))";
  }
  if (format == "email") {
    return R"([A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z]{2,63})";
  }
  if (format == "uuid") return R"([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})";
  if (format == "uri") {
    // RFC 3986: scheme ":" then "//" authority and an absolute-or-empty path, or a path; query; fragment.
    // ASCII only, other bytes percent-encoded.
    return R"([A-Za-z][A-Za-z0-9+.\-]*:(//(([A-Za-z0-9\-._~!$&'()*+,;=:]|%[0-9A-Fa-f]{2})*@)?)"
           R"(([A-Za-z0-9\-._~!$&'()*+,;=]|%[0-9A-Fa-f]{2})*(:[0-9]*)?(/([A-Za-z0-9\-._~!$&'()*+,;=:@]|%[0-9A-Fa-f]{2})*)*)"
           R"(|/?([A-Za-z0-9\-._~!$&'()*+,;=:@]|%[0-9A-Fa-f]{2})+(/([A-Za-z0-9\-._~!$&'()*+,;=:@]|%[0-9A-Fa-f]{2})*)*))"
           R"((\?([A-Za-z0-9\-._~!$&'()*+,;=:@/?]|%[0-9A-Fa-f]{2})*)?(#([A-Za-z0-9\-._~!$&'()*+,;=:@/?]|%[0-9A-Fa-f]{2})*)?)";
  }
  return nullptr;
}

std::optional<double> number_of(const ojson& schema, const char* key) {
  if (!schema.contains(key) || !schema[key].is_number()) return std::nullopt;
  return schema[key].get<double>();
}

// Integer bounds [lo, hi] implied by minimum/maximum and their exclusive forms (numeric, or the draft-4
// boolean flags).
void integer_bounds(const ojson& schema, std::optional<double>& lo, bool& lo_exclusive, std::optional<double>& hi,
                    bool& hi_exclusive) {
  lo = number_of(schema, "minimum");
  hi = number_of(schema, "maximum");
  lo_exclusive = schema.contains("exclusiveMinimum") && schema["exclusiveMinimum"] == true;
  hi_exclusive = schema.contains("exclusiveMaximum") && schema["exclusiveMaximum"] == true;
  if (auto x = number_of(schema, "exclusiveMinimum"); x && (!lo || *x >= *lo)) lo = x, lo_exclusive = true;
  if (auto x = number_of(schema, "exclusiveMaximum"); x && (!hi || *x <= *hi)) hi = x, hi_exclusive = true;
}

constexpr double kInt64Limit = 9.0e18;

}  // namespace

int SchemaLowering::ws() {
  if (ws_expr_ >= 0) return ws_expr_;
  if (!options_.whitespace_pattern.empty()) {
    ws_expr_ = lower_regex(options_.whitespace_pattern, rules_, budget_);
  } else if (options_.any_whitespace) {
    ws_expr_ = rules_.repeat(rules_.char_class({{'\t', '\n'}, {' ', ' '}}), 0, options_.max_whitespace);
  } else {
    ws_expr_ = rules_.empty();
  }
  return ws_expr_;
}

bool compact(const JsonOptions& o) { return !o.any_whitespace && o.whitespace_pattern.empty(); }

int SchemaLowering::separator(char c) {
  if (compact(options_)) return rules_.bytes(std::string(1, c) + " ");
  return rules_.sequence({ws(), rules_.bytes(std::string(1, c)), ws()});
}

int SchemaLowering::open(char c) {
  if (compact(options_)) return rules_.bytes(std::string(1, c));
  return rules_.sequence({rules_.bytes(std::string(1, c)), ws()});
}

int SchemaLowering::close(char c) {
  if (compact(options_)) return rules_.bytes(std::string(1, c));
  return rules_.sequence({ws(), rules_.bytes(std::string(1, c))});
}

// One character of a JSON string: unescaped (no ", \ or control character) or an escape sequence.
static int string_char(RuleSet& r) {
  const int hex = r.char_class({{'0', '9'}, {'A', 'F'}, {'a', 'f'}});
  return r.choice({r.char_class({{0x20, 0x21}, {0x23, 0x5B}, {0x5D, kMaxCodepoint}}),
                   r.sequence({r.bytes("\\"), r.choice({r.char_class({{'"', '"'},
                                                                      {'/', '/'},
                                                                      {'\\', '\\'},
                                                                      {'b', 'b'},
                                                                      {'f', 'f'},
                                                                      {'n', 'n'},
                                                                      {'r', 'r'},
                                                                      {'t', 't'}}),
                                                        r.sequence({r.bytes("u"), r.repeat(hex, 4, 4)})})})});
}

int SchemaLowering::string_rest_rule() {
  if (string_rest_rule_ < 0) {
    string_rest_rule_ = rules_.new_rule(prefix_ + "_string_rest");
    rules_.define(string_rest_rule_,
                  rules_.sequence({rules_.repeat(string_char(rules_), 0, kUnbounded), rules_.bytes("\"")}));
  }
  return string_rest_rule_;
}

namespace {

// A JSON-escaped string body as its characters: an escape sequence or one UTF-8 encoded codepoint.
std::vector<std::string> string_units(const std::string& body) {
  std::vector<std::string> units;
  for (size_t i = 0; i < body.size();) {
    size_t len = 1;
    if (body[i] == '\\') {
      len = i + 1 < body.size() && body[i + 1] == 'u' ? 6 : 2;
    } else {
      size_t j = i;
      decode_utf8(body, j);
      len = j - i;
    }
    units.push_back(body.substr(i, len));
    i += len;
  }
  return units;
}

struct KeyTrie {
  bool terminal = false;
  std::vector<std::pair<std::string, std::unique_ptr<KeyTrie>>> children;
};

}  // namespace

// Any JSON string (with its quotes) except the given keys as written (a key spelled with different
// escapes is not recognised as the same key).
int SchemaLowering::key_excluding(const std::vector<std::string>& names) {
  KeyTrie root;
  for (const auto& name : names) {
    const std::string dumped = ojson(name).dump();
    KeyTrie* node = &root;
    for (const auto& unit : string_units(dumped.substr(1, dumped.size() - 2))) {
      auto it =
          std::find_if(node->children.begin(), node->children.end(), [&](const auto& c) { return c.first == unit; });
      if (it == node->children.end()) {
        node->children.push_back({unit, std::make_unique<KeyTrie>()});
        it = node->children.end() - 1;
      }
      node = it->second.get();
    }
    node->terminal = true;
  }
  const int hex = rules_.char_class({{'0', '9'}, {'A', 'F'}, {'a', 'f'}});
  std::function<int(const KeyTrie&, int)> body = [&](const KeyTrie& node, int depth) -> int {
    budget_.check_depth(depth / 8, "property name");
    std::vector<int> alts;
    if (!node.terminal) alts.push_back(rules_.bytes("\""));
    CodepointRanges plain = {{0x20, 0x21}, {0x23, 0x5B}, {0x5D, kMaxCodepoint}};
    CodepointRanges escapes = {{'"', '"'}, {'/', '/'}, {'\\', '\\'}, {'b', 'b'},
                               {'f', 'f'}, {'n', 'n'}, {'r', 'r'},   {'t', 't'}};
    auto remove = [](CodepointRanges& ranges, uint32_t cp) {
      CodepointRanges out;
      for (auto [lo, hi] : ranges) {
        if (cp < lo || cp > hi) {
          out.push_back({lo, hi});
          continue;
        }
        if (lo < cp) out.push_back({lo, cp - 1});
        if (cp < hi) out.push_back({cp + 1, hi});
      }
      ranges = std::move(out);
    };
    for (const auto& [unit, child] : node.children) {
      alts.push_back(rules_.sequence({rules_.bytes(unit), body(*child, depth + 1)}));
      if (unit[0] != '\\') {
        size_t pos = 0;
        remove(plain, decode_utf8(unit, pos));
      } else if (unit.size() == 2) {
        remove(escapes, static_cast<unsigned char>(unit[1]));
      }
    }
    std::vector<int> other;  // a first character that leaves every key
    if (!plain.empty()) other.push_back(rules_.char_class(plain));
    if (!escapes.empty()) other.push_back(rules_.sequence({rules_.bytes("\\"), rules_.char_class(escapes)}));
    other.push_back(rules_.sequence({rules_.bytes("\\u"), rules_.repeat(hex, 4, 4)}));
    alts.push_back(rules_.sequence({rules_.choice(std::move(other)), rules_.ref(string_rest_rule())}));
    return rules_.choice(std::move(alts));
  };
  return rules_.sequence({rules_.bytes("\""), body(root, 0)});
}

int SchemaLowering::string_rule() {
  if (string_rule_ < 0) {
    string_rule_ = rules_.new_rule(prefix_ + "_string");
    rules_.define(string_rule_, rules_.sequence({rules_.bytes("\""), rules_.repeat(string_char(rules_), 0, kUnbounded),
                                                 rules_.bytes("\"")}));
  }
  return string_rule_;
}

int SchemaLowering::string_value(const ojson& schema, const std::string& pointer) {
  const bool has_length = schema.contains("minLength") || schema.contains("maxLength");
  std::string pattern;
  if (schema.contains("pattern")) {
    if (!schema["pattern"].is_string()) fail(pointer, "pattern must be a string");
    pattern = schema["pattern"].get<std::string>();
    if (has_length) fail(pointer, "keyword 'pattern' together with minLength/maxLength is not supported");
  } else if (schema.contains("format") && schema["format"].is_string()) {
    if (const char* regex = format_regex(schema["format"].get<std::string>())) {
      if (has_length) fail(pointer, "keyword 'format' together with minLength/maxLength is not supported");
      pattern = regex;
    }
  }
  const int quote = rules_.bytes("\"");
  if (!pattern.empty()) {
    // A JSON Schema pattern is matched against the whole string here (as xgrammar does), not searched for.
    int body;
    try {
      body = lower_regex(pattern, rules_, budget_, true);
    } catch (const GrammarError& e) {
      fail(pointer + "/pattern", e.what());
    }
    return rule_for(pointer, "pattern", rules_.sequence({quote, body, quote}));
  }
  if (!has_length) return rules_.ref(string_rule());
  auto length = [&](const char* key, int64_t fallback) -> int64_t {
    if (!schema.contains(key)) return fallback;
    if (!schema[key].is_number_unsigned()) fail(pointer, fmt::format("{} must be a non-negative integer", key));
    return schema[key].get<int64_t>();
  };
  const int64_t min = length("minLength", 0), max = length("maxLength", -1);
  if (max >= 0 && min > max) fail(pointer, "minLength is greater than maxLength");
  if (min > 10000 || max > 10000) fail(pointer, "minLength/maxLength over 10000 is not supported");
  const int body = rules_.repeat(string_char(rules_), static_cast<int>(min), static_cast<int>(max));
  return rule_for(pointer, "string", rules_.sequence({quote, body, quote}));
}

int SchemaLowering::digits(int min, int max) { return rules_.repeat(rules_.char_class({{'0', '9'}}), min, max); }

// JSON numbers as a model may write them: at most 20 integer digits (a 64-bit integer's), 17 fraction digits
// (beyond what a double holds) and 3 exponent digits, so a number ends (an unbounded digit run lets a model
// write digits until max_tokens).
constexpr int kMaxIntegerDigits = 20, kMaxFractionDigits = 17, kMaxExponentDigits = 3;

int SchemaLowering::integer_rule() {
  if (integer_rule_ < 0) {
    integer_rule_ = rules_.new_rule(prefix_ + "_integer");
    rules_.define(integer_rule_, int_range(std::nullopt, std::nullopt));
  }
  return integer_rule_;
}

int SchemaLowering::number_rule() {
  if (number_rule_ < 0) {
    number_rule_ = rules_.new_rule(prefix_ + "_number");
    const int fraction = rules_.repeat(rules_.sequence({rules_.bytes("."), digits(1, kMaxFractionDigits)}), 0, 1);
    const int exponent =
        rules_.repeat(rules_.sequence({rules_.char_class({{'E', 'E'}, {'e', 'e'}}),
                                       rules_.repeat(rules_.char_class({{'+', '+'}, {'-', '-'}}), 0, 1),
                                       digits(1, kMaxExponentDigits)}),
                      0, 1);
    rules_.define(number_rule_, rules_.sequence({int_range(std::nullopt, std::nullopt), fraction, exponent}));
  }
  return number_rule_;
}

int SchemaLowering::integer_value(const ojson& schema, const std::string& pointer) {
  std::optional<double> lo, hi;
  bool lo_ex = false, hi_ex = false;
  integer_bounds(schema, lo, lo_ex, hi, hi_ex);
  if (!lo && !hi) return rules_.ref(integer_rule());
  std::optional<int64_t> ilo, ihi;
  if (lo) {
    const double v = lo_ex ? std::floor(*lo) + 1 : std::ceil(*lo);
    if (v > kInt64Limit) fail(pointer, "minimum beyond the 64-bit integer range");
    if (v > -kInt64Limit) ilo = static_cast<int64_t>(v);
  }
  if (hi) {
    const double v = hi_ex ? std::ceil(*hi) - 1 : std::floor(*hi);
    if (v < -kInt64Limit) fail(pointer, "maximum beyond the 64-bit integer range");
    if (v < kInt64Limit) ihi = static_cast<int64_t>(v);
  }
  if (ilo && ihi && *ilo > *ihi) fail(pointer, "no integer lies between minimum and maximum");
  return rule_for(pointer, "integer", int_range(ilo, ihi));
}

// Numbers with bounds: every integer in range, and k.ddd / -k.ddd where every value with that integer
// part lies in range (sound, not complete: 3.5 is not offered when maximum is 3.7). No exponent.
int SchemaLowering::number_value(const ojson& schema, const std::string& pointer) {
  std::optional<double> lo, hi;
  bool lo_ex = false, hi_ex = false;
  integer_bounds(schema, lo, lo_ex, hi, hi_ex);
  if (!lo && !hi) return rules_.ref(number_rule());
  if ((lo && std::fabs(*lo) > kInt64Limit) || (hi && std::fabs(*hi) > kInt64Limit)) {
    fail(pointer, "number bounds beyond +-9e18 are not supported");
  }
  if (lo && hi && (*lo > *hi || (*lo == *hi && (lo_ex || hi_ex)))) fail(pointer, "no number lies between the bounds");
  std::vector<int> alts;
  std::optional<int64_t> ilo, ihi;
  if (lo) ilo = static_cast<int64_t>(lo_ex ? std::floor(*lo) + 1 : std::ceil(*lo));
  if (hi) ihi = static_cast<int64_t>(hi_ex ? std::ceil(*hi) - 1 : std::floor(*hi));
  if (!ilo || !ihi || *ilo <= *ihi) alts.push_back(int_range(ilo, ihi));
  const int fraction = rules_.sequence({rules_.bytes("."), digits(1, kMaxFractionDigits)});
  // Non-negative k.ddd lies in [k, k+1): needs k >= lo (k > lo when exclusive) and k + 1 <= hi.
  {
    int64_t kmin = 0;
    if (lo) kmin = std::max<int64_t>(0, static_cast<int64_t>(lo_ex ? std::floor(*lo) + 1 : std::ceil(*lo)));
    std::optional<int64_t> kmax;
    if (hi) kmax = static_cast<int64_t>(std::floor(*hi)) - 1;
    if (!kmax || kmin <= *kmax) {
      alts.push_back(rules_.sequence({kmax ? nonneg_range(kmin, *kmax) : nonneg_at_least(kmin), fraction}));
    }
  }
  // -k.ddd lies in (-(k+1), -k]: needs -(k+1) >= lo and -k <= hi (-k < hi when exclusive).
  {
    int64_t kmin = 0;
    if (hi) kmin = std::max<int64_t>(0, static_cast<int64_t>(hi_ex ? std::floor(-*hi) + 1 : std::ceil(-*hi)));
    std::optional<int64_t> kmax;
    if (lo) kmax = static_cast<int64_t>(std::floor(-*lo)) - 1;
    if (!kmax || kmin <= *kmax) {
      alts.push_back(
          rules_.sequence({rules_.bytes("-"), kmax ? nonneg_range(kmin, *kmax) : nonneg_at_least(kmin), fraction}));
    }
  }
  if (alts.empty()) fail(pointer, "no number lies between the bounds");
  return rule_for(pointer, "number", rules_.choice(std::move(alts)));
}

// Integers in [lo, hi] as JSON writes them (no leading zeros, no -0); either bound may be absent.
int SchemaLowering::int_range(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  std::vector<int> alts;
  // Negative part: -m for m in [max(1, -hi), -lo].
  if (!lo || *lo < 0) {
    const uint64_t mmin = hi && *hi < 0 ? static_cast<uint64_t>(-(*hi + 1)) + 1 : 1;
    const int magnitudes = lo ? nonneg_range(mmin, static_cast<uint64_t>(-(*lo + 1)) + 1) : nonneg_at_least(mmin);
    alts.push_back(rules_.sequence({rules_.bytes("-"), magnitudes}));
  }
  if (!hi || *hi >= 0) {
    const uint64_t from = lo && *lo > 0 ? static_cast<uint64_t>(*lo) : 0;
    alts.push_back(hi ? nonneg_range(from, static_cast<uint64_t>(*hi)) : nonneg_at_least(from));
  }
  return rules_.choice(std::move(alts));
}

int SchemaLowering::nonneg_at_least(uint64_t lo) {
  if (lo == 0)
    return rules_.choice(
        {rules_.bytes("0"), rules_.sequence({rules_.char_class({{'1', '9'}}), digits(0, kMaxIntegerDigits - 1)})});
  const std::string s = std::to_string(lo);
  const int n = static_cast<int>(s.size());
  if (n >= 19)
    return rules_.sequence({rules_.char_class({{'1', '9'}}), digits(n - 1, std::max(n - 1, kMaxIntegerDigits - 1))});
  uint64_t top = 1;
  for (int i = 0; i < n; ++i) top *= 10;
  return rules_.choice({nonneg_range(lo, top - 1),
                        rules_.sequence({rules_.char_class({{'1', '9'}}), digits(n, kMaxIntegerDigits - 1)})});
}

int SchemaLowering::nonneg_range(uint64_t lo, uint64_t hi) {
  std::vector<int> alts;
  std::string a = std::to_string(lo);
  const std::string b = std::to_string(hi);
  for (size_t len = a.size(); len <= b.size(); ++len) {
    const std::string from = len == a.size() ? a : "1" + std::string(len - 1, '0');
    const std::string to = len == b.size() ? b : std::string(len, '9');
    alts.push_back(same_length_range(from, to));
  }
  return rules_.choice(std::move(alts));
}

// Digit strings of one length between lo and hi inclusive (the classic range-to-pattern split).
int SchemaLowering::same_length_range(const std::string& lo, const std::string& hi) {
  if (lo.empty()) return rules_.empty();
  if (lo[0] == hi[0]) {
    return rules_.sequence({rules_.bytes(lo.substr(0, 1)), same_length_range(lo.substr(1), hi.substr(1))});
  }
  const std::string lo_rest = lo.substr(1), hi_rest = hi.substr(1);
  const int rest = static_cast<int>(lo_rest.size());
  const bool lo_zeros = lo_rest.find_first_not_of('0') == std::string::npos;
  const bool hi_nines = hi_rest.find_first_not_of('9') == std::string::npos;
  std::vector<int> alts;
  const char first = lo_zeros ? lo[0] : static_cast<char>(lo[0] + 1);
  const char last = hi_nines ? hi[0] : static_cast<char>(hi[0] - 1);
  if (!lo_zeros) {
    alts.push_back(
        rules_.sequence({rules_.bytes(lo.substr(0, 1)), same_length_range(lo_rest, std::string(rest, '9'))}));
  }
  if (first <= last) {
    alts.push_back(rules_.sequence(
        {rules_.char_class({{static_cast<uint32_t>(first), static_cast<uint32_t>(last)}}), digits(rest, rest)}));
  }
  if (!hi_nines) {
    alts.push_back(
        rules_.sequence({rules_.bytes(hi.substr(0, 1)), same_length_range(std::string(rest, '0'), hi_rest)}));
  }
  return rules_.choice(std::move(alts));
}

int SchemaLowering::constant(const ojson& v, int depth) {
  budget_.check_depth(depth, "JSON Schema const/enum value");
  if (v.is_object()) {
    if (v.empty()) return rules_.sequence({rules_.bytes("{"), ws(), rules_.bytes("}")});
    std::vector<int> items{open('{')};
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (!first) items.push_back(separator(','));
      first = false;
      items.push_back(rules_.bytes(ojson(it.key()).dump()));
      items.push_back(separator(':'));
      items.push_back(constant(it.value(), depth + 1));
    }
    items.push_back(close('}'));
    return rules_.sequence(std::move(items));
  }
  if (v.is_array()) {
    if (v.empty()) return rules_.sequence({rules_.bytes("["), ws(), rules_.bytes("]")});
    std::vector<int> items{open('[')};
    for (size_t i = 0; i < v.size(); ++i) {
      if (i > 0) items.push_back(separator(','));
      items.push_back(constant(v[i], depth + 1));
    }
    items.push_back(close(']'));
    return rules_.sequence(std::move(items));
  }
  return rules_.bytes(v.dump());
}

int SchemaLowering::any_value_rule() {
  if (any_value_rule_ >= 0) return any_value_rule_;
  any_value_rule_ = rules_.new_rule(prefix_ + "_value");
  rules_.define(any_value_rule_, rules_.choice({rules_.ref(any_object_rule()), rules_.ref(any_array_rule()),
                                                rules_.ref(string_rule()), rules_.ref(number_rule()),
                                                rules_.bytes("true"), rules_.bytes("false"), rules_.bytes("null")}));
  return any_value_rule_;
}

int SchemaLowering::any_object_rule() {
  if (any_object_rule_ >= 0) return any_object_rule_;
  any_object_rule_ = rules_.new_rule(prefix_ + "_object");
  const int entry = rules_.sequence({rules_.ref(string_rule()), separator(':'), rules_.ref(any_value_rule())});
  rules_.define(any_object_rule_,
                rules_.choice({rules_.sequence({rules_.bytes("{"), ws(), rules_.bytes("}")}),
                               rules_.sequence({open('{'), entry,
                                                rules_.repeat(rules_.sequence({separator(','), entry}), 0, kUnbounded),
                                                close('}')})}));
  return any_object_rule_;
}

int SchemaLowering::any_array_rule() {
  if (any_array_rule_ >= 0) return any_array_rule_;
  any_array_rule_ = rules_.new_rule(prefix_ + "_array");
  const int item = rules_.ref(any_value_rule());
  rules_.define(any_array_rule_,
                rules_.choice({rules_.sequence({rules_.bytes("["), ws(), rules_.bytes("]")}),
                               rules_.sequence({open('['), item,
                                                rules_.repeat(rules_.sequence({separator(','), item}), 0, kUnbounded),
                                                close(']')})}));
  return any_array_rule_;
}

}  // namespace tessera::grammar
