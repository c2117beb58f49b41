// qwen3_coder: Qwen3-Coder / Qwen3.5 XML calls
//
//   <tool_call>
//   <function=NAME>
//   <parameter=P>
//   VALUE
//   </parameter>
//   </function>
//   </tool_call>
//
// Follows vLLM's Qwen3CoderToolParser where it matters to clients:
//  - content is the text before the first <tool_call> that holds a <function=...>; a bare
//    <tool_call> without a function (the model talking about the format) stays content;
//  - a function name with whitespace, quotes, braces or angle brackets is not a call;
//  - one leading and one trailing newline of each VALUE are dropped; VALUE is converted with
//    the parameter's JSON schema type (see convert_parameter below);
//  - streaming: the first delta carries the name and "{", each parameter is sent as
//    `"P": <json>` once its </parameter> arrives, "}" at </function>; the non-streaming
//    arguments are the same text.
// Simplifications (documented in docs/parsers.md): a VALUE ends at the first </parameter>
// (vLLM looks ahead to allow a literal </parameter> inside a value); other tags inside a
// VALUE are literal text; text between and after calls is dropped; a VALUE left open at the
// end loses a trailing </function> / </tool_call>. Linear time: each byte is scanned at most
// twice.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <deque>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "server/parsers/tool_parser_base.h"

namespace tessera::server::detail {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

// vLLM's _is_valid_function_name: rejects template residue such as `{{ tool.name }}`.
bool valid_function_name(std::string_view name) {
  if (name.empty()) return false;
  for (char c : name)
    if (c == '{' || c == '}' || c == '<' || c == '>' || c == '"' || c == '\'' || is_space(c)) return false;
  return true;
}

// `s`, trimmed and without a leading '+', read whole as a T; false when it is not one.
template <typename T>
bool parse_whole(std::string_view s, T* v) {
  s = trim(s);
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *v);
  return ec == std::errc() && p == s.data() + s.size();
}

bool parse_integer(std::string_view s, nlohmann::json* out) {
  int64_t v = 0;
  if (!parse_whole(s, &v)) return false;
  *out = v;
  return true;
}

bool parse_number(std::string_view s, nlohmann::json* out) {
  double v = 0;
  if (!parse_whole(s, &v) || !std::isfinite(v)) return false;
  // vLLM: a float with no fractional part becomes an int ("5.0" -> 5).
  if (v == std::floor(v) && std::fabs(v) < 9.0e15) {
    *out = static_cast<int64_t>(v);
  } else {
    *out = v;
  }
  return true;
}

constexpr int kMaxJsonDepth = 256;

// Deepest bracket nesting outside JSON strings (an upper bound for valid JSON).
int nesting_depth(std::string_view s) {
  int depth = 0, deepest = 0;
  bool in_string = false, escape = false;
  for (char c : s) {
    if (in_string) {
      if (escape)
        escape = false;
      else if (c == '\\')
        escape = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

// Type name of a parameter schema: "type" (first non-null of a list), else the first non-null
// "type" in anyOf/oneOf, else "string" (vLLM's default). `nullable`: null is allowed.
std::string schema_type(const nlohmann::json& schema, bool* nullable) {
  *nullable = false;
  if (!schema.is_object()) return "string";
  auto from_type = [&](const nlohmann::json& t, std::string* picked) {
    if (t.is_string()) {
      std::string ty = lower(trim(t.get<std::string>()));
      if (ty == "null")
        *nullable = true;
      else if (picked->empty())
        *picked = ty;
    } else if (t.is_array()) {
      for (const nlohmann::json& x : t)
        if (x.is_string()) {
          std::string ty = lower(trim(x.get<std::string>()));
          if (ty == "null")
            *nullable = true;
          else if (picked->empty())
            *picked = ty;
        }
    }
  };
  std::string picked;
  if (schema.contains("type")) {
    from_type(schema["type"], &picked);
    if (picked.empty() && *nullable) return "null";
    return picked.empty() ? "string" : picked;
  }
  for (const char* key : {"anyOf", "oneOf"}) {
    if (!schema.contains(key) || !schema[key].is_array()) continue;
    for (const nlohmann::json& option : schema[key])
      if (option.is_object() && option.contains("type")) from_type(option["type"], &picked);
    return picked.empty() ? "string" : picked;
  }
  return "string";
}

// vLLM's _convert_param_value: the raw text typed by the schema; anything that does not
// convert stays a string (booleans: anything but "true" is false, as in vLLM).
nlohmann::json convert_parameter(const std::string& value, const nlohmann::json* schema) {
  if (!schema) return value;  // unknown tool or parameter: string
  bool nullable = false;
  std::string type = schema_type(*schema, &nullable);
  std::string lowered = lower(value);
  if (nullable && (lowered == "null" || lowered == "none")) return nullptr;
  if (type == "string" || type == "str" || type == "text" || type == "varchar" || type == "char" || type == "enum")
    return value;
  if (lowered == "null" || lowered == "none") return nullptr;
  nlohmann::json out;
  if (starts_with(type, "int") || starts_with(type, "uint") || starts_with(type, "long") ||
      starts_with(type, "short") || starts_with(type, "unsigned"))
    return parse_integer(value, &out) ? out : nlohmann::json(value);
  if (starts_with(type, "num") || starts_with(type, "float"))
    return parse_number(value, &out) ? out : nlohmann::json(value);
  if (type == "boolean" || type == "bool" || type == "binary") return lowered == "true";
  // object, array and anything else: JSON if it parses, else the string. Deeply nested text
  // stays a string: nlohmann parses iteratively but dump() recurses.
  if (nesting_depth(value) > kMaxJsonDepth) return value;
  out = nlohmann::json::parse(value, nullptr, false);
  if (out.is_discarded()) return value;
  return out;
}

enum Tag { kToolCallOpen, kToolCallClose, kFunctionOpen, kFunctionClose, kParameterOpen, kParameterClose };

class Qwen3CoderToolParser final : public ToolParser {
 public:
  explicit Qwen3CoderToolParser(ToolParserOptions options)
      : options_(std::move(options)),
        sink_(options_.make_id),
        scanner_({"<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=", "</parameter>"}) {
    if (options_.tools.is_array())
      for (const nlohmann::json& t : options_.tools) {
        if (!t.is_object() || !t.contains("function") || !t["function"].is_object()) continue;
        const nlohmann::json& f = t["function"];
        if (!f.contains("name") || !f["name"].is_string()) continue;
        const nlohmann::json* props = nullptr;
        if (f.contains("parameters") && f["parameters"].is_object() && f["parameters"].contains("properties") &&
            f["parameters"]["properties"].is_object())
          props = &f["parameters"]["properties"];
        properties_.emplace(f["name"].get<std::string>(), props);
      }
  }

  ToolStreamDelta push(std::string_view delta) override {
    drain(delta);
    return sink_.take(false);
  }

  ToolStreamDelta finish() override {
    for (char c : scanner_.take_pending()) {
      ScanEvent e{-1, c};
      if (handle(e)) {
        // Cannot happen at the end (a replay needs a following byte), but stay total.
        std::string replay = std::move(replay_);
        sink_.content(replay);
      }
    }
    switch (state_) {
      case State::kExpectFunction:
      case State::kFunctionName:
        if (!calls_begun_) sink_.content(held_);  // an unfinished opening is text
        break;
      case State::kParamValue:
        finish_parameter(/*at_end=*/true);
        close_call();
        break;
      case State::kParamName:
      case State::kParams:
        close_call();
        break;
      default:
        break;
    }
    return sink_.take(true);
  }

  std::unique_ptr<ToolParser> fresh() const override { return std::make_unique<Qwen3CoderToolParser>(options_); }

 private:
  enum class State {
    kContent,         // before the first call
    kExpectFunction,  // after <tool_call>: whitespace, then <function=
    kFunctionName,    // <function=NAME>
    kParams,          // inside a function, between parameters
    kParamName,       // <parameter=NAME>
    kParamValue,      // VALUE up to </parameter>
    kAfterFunction,   // after </function>, until </tool_call>
    kBetween,         // between calls: text dropped
    kSkipBlock,       // a block that is not a call, after calls began: dropped
  };

  // Scans `input`; bytes handed back for a second look (replay_) go first, through queue_.
  void drain(std::string_view input) {
    std::vector<ScanEvent> events;
    size_t i = 0;
    for (;;) {
      char c;
      if (!next_byte(queue_, input, i, c)) return;
      scanner_.feed_or_replay(c, events, replay_, queue_, [this](const ScanEvent& e) { return handle(e); });
    }
  }

  std::string text_of(const ScanEvent& e) const { return e.tag >= 0 ? scanner_.tag(e.tag) : std::string(1, e.byte); }

  // Returns true when replay_ must be scanned again (in content state).
  bool handle(const ScanEvent& e) {
    switch (state_) {
      case State::kContent:
        if (e.tag == kToolCallOpen) {
          state_ = State::kExpectFunction;
          held_ = "<tool_call>";
        } else if (e.tag >= 0) {
          sink_.content(scanner_.tag(e.tag));
        } else {
          sink_.content_byte(e.byte);
        }
        return false;
      case State::kExpectFunction:
        if (e.tag < 0 && is_space(e.byte)) {
          held_ += e.byte;
          return false;
        }
        if (e.tag == kFunctionOpen) {
          held_ += scanner_.tag(e.tag);
          name_.clear();
          state_ = State::kFunctionName;
          return false;
        }
        return not_a_call(e);
      case State::kFunctionName:
        if (e.tag < 0 && e.byte == '>') {
          if (!valid_function_name(name_)) return not_a_call(e);
          start_call();
          return false;
        }
        if (e.tag >= 0 || e.byte == '{' || e.byte == '}' || e.byte == '<' || e.byte == '"' || e.byte == '\'' ||
            is_space(e.byte))
          return not_a_call(e);
        name_ += e.byte;
        held_ += e.byte;
        return false;
      case State::kParams:
        params_event(e);
        return false;
      case State::kParamName:
        if (e.tag >= 0) {  // a tag before '>': drop the half-open parameter
          state_ = State::kParams;
          params_event(e);
        } else if (e.byte == '>') {
          state_ = State::kParamValue;
          value_.clear();
          value_started_ = false;
        } else {
          param_name_ += e.byte;
        }
        return false;
      case State::kParamValue:
        if (e.tag == kParameterClose) {
          finish_parameter(/*at_end=*/false);
          state_ = State::kParams;
          return false;
        }
        if (e.tag >= 0) {
          value_started_ = true;
          value_ += scanner_.tag(e.tag);
        } else if (value_started_ || e.byte != '\n') {
          value_ += e.byte;
          value_started_ = true;
        } else {
          value_started_ = true;  // one leading newline belongs to the markup
        }
        return false;
      case State::kAfterFunction:
      case State::kBetween:
        if (e.tag == kToolCallOpen) {
          state_ = State::kExpectFunction;
          held_.clear();
        } else if (e.tag == kFunctionOpen) {  // a function without its <tool_call> wrapper
          name_.clear();
          state_ = State::kFunctionName;
        } else if (e.tag == kToolCallClose) {
          state_ = State::kBetween;
        }
        return false;
      case State::kSkipBlock:
        if (e.tag == kToolCallClose) state_ = State::kBetween;
        return false;
    }
    return false;
  }

  // The block that began with <tool_call> is not a call. Before any call it is text: emit the
  // <tool_call> and re-scan what followed it, in content state. After calls began, drop it.
  bool not_a_call(const ScanEvent& e) {
    if (calls_begun_) {
      state_ = e.tag == kToolCallClose ? State::kBetween : State::kSkipBlock;
      return false;
    }
    state_ = State::kContent;
    sink_.content("<tool_call>");
    replay_ = held_.substr(std::string_view("<tool_call>").size());
    replay_ += text_of(e);
    held_.clear();
    return true;
  }

  void start_call() {
    calls_begun_ = true;
    held_.clear();
    state_ = State::kParams;
    params_sent_ = 0;
    auto it = properties_.find(name_);
    current_properties_ = it == properties_.end() ? nullptr : it->second;
    if ((!options_.only_function.empty() && name_ != options_.only_function) || (options_.single_call && call_sent_)) {
      call_active_ = false;  // parsed, but not sent
      return;
    }
    sink_.start_call(name_);
    call_sent_ = true;
    sink_.arguments("{");
    call_active_ = true;
  }

  void close_call() {
    if (call_active_) {
      sink_.arguments("}");
      sink_.close_call();
    }
    call_active_ = false;
  }

  void params_event(const ScanEvent& e) {
    switch (e.tag) {
      case kParameterOpen:
        param_name_.clear();
        state_ = State::kParamName;
        return;
      case kFunctionClose:
        close_call();
        state_ = State::kAfterFunction;
        return;
      case kToolCallClose:
        close_call();
        state_ = State::kBetween;
        return;
      case kToolCallOpen:  // the model forgot to close this call
        close_call();
        state_ = State::kExpectFunction;
        held_.clear();
        return;
      case kFunctionOpen:
        close_call();
        name_.clear();
        state_ = State::kFunctionName;
        return;
      default:
        return;  // stray text or </parameter> between parameters: ignored
    }
  }

  void finish_parameter(bool at_end) {
    std::string value = std::move(value_);
    value_.clear();
    if (at_end) {
      // </parameter> never came: drop closing markup the model wrote after the value.
      std::string_view v(value);
      bool cut = false;
      for (;;) {
        size_t n = v.size();
        while (n > 0 && is_space(v[n - 1])) --n;
        std::string_view t = v.substr(0, n);
        if (t.size() >= 12 && t.substr(t.size() - 12) == "</tool_call>") {
          v = t.substr(0, t.size() - 12);
          cut = true;
        } else if (t.size() >= 11 && t.substr(t.size() - 11) == "</function>") {
          v = t.substr(0, t.size() - 11);
          cut = true;
        } else {
          break;
        }
      }
      if (cut) value.resize(v.size());
    }
    if (!value.empty() && value.back() == '\n') value.pop_back();
    if (!call_active_) return;
    const nlohmann::json* schema = nullptr;
    if (current_properties_ && current_properties_->contains(param_name_))
      schema = &(*current_properties_)[param_name_];
    nlohmann::json converted = convert_parameter(value, schema);
    std::string fragment = params_sent_ == 0 ? "\"" : ", \"";
    append_json_escaped(fragment, param_name_);
    fragment += "\": ";
    fragment += converted.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    sink_.arguments(fragment);
    ++params_sent_;
  }

  ToolParserOptions options_;
  ToolDeltaSink sink_;
  TagScanner scanner_;
  std::unordered_map<std::string, const nlohmann::json*> properties_;  // points into options_.tools
  const nlohmann::json* current_properties_ = nullptr;
  State state_ = State::kContent;
  std::deque<char> queue_;
  std::string replay_;
  std::string held_;  // "<tool_call>" and what followed, until it proves to be a call
  std::string name_;
  std::string param_name_;
  std::string value_;
  bool value_started_ = false;
  bool calls_begun_ = false;
  bool call_active_ = false;
  bool call_sent_ = false;  // a call was sent (single_call drops the ones after it)
  int params_sent_ = 0;
};

}  // namespace

std::unique_ptr<ToolParser> make_qwen3_coder_tool_parser(ToolParserOptions options) {
  return std::make_unique<Qwen3CoderToolParser>(std::move(options));
}

}  // namespace tessera::server::detail
