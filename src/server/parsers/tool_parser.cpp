#include "server/parsers/tool_parser.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <random>

#include "server/parsers/tool_parser_base.h"

namespace tessera::server {

std::string make_tool_call_id() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* kHex = "0123456789abcdef";
  std::string id = "chatcmpl-tool-";
  for (int half = 0; half < 2; ++half) {
    uint64_t r = rng();
    for (int i = 0; i < 16; ++i, r >>= 4) id += kHex[r & 0xF];
  }
  return id;
}

void accumulate_tool_deltas(std::vector<ToolCall>& calls, const std::vector<ToolCallDelta>& deltas) {
  for (const ToolCallDelta& d : deltas) {
    if (d.index < 0) continue;
    size_t i = static_cast<size_t>(d.index);
    if (calls.size() <= i) calls.resize(i + 1);
    if (!d.id.empty()) calls[i].id = d.id;
    if (!d.name.empty()) calls[i].name = d.name;
    calls[i].arguments += d.arguments;
  }
}

ToolParseResult ToolParser::parse(std::string_view text) const {
  std::unique_ptr<ToolParser> p = fresh();
  ToolStreamDelta a = p->push(text);
  ToolStreamDelta b = p->finish();
  ToolParseResult r;
  r.content = a.content + b.content;
  accumulate_tool_deltas(r.tool_calls, a.tool_calls);
  accumulate_tool_deltas(r.tool_calls, b.tool_calls);
  return r;
}

std::vector<std::string> supported_tool_parsers() { return {"hermes", "qwen3", "qwen3_coder", "qwen3_xml"}; }

std::unique_ptr<ToolParser> make_tool_parser(std::string_view name, ToolParserOptions options) {
  if (name == "hermes" || name == "qwen3") return detail::make_hermes_tool_parser(std::move(options));
  if (name == "qwen3_coder" || name == "qwen3_xml") return detail::make_qwen3_coder_tool_parser(std::move(options));
  fail(ErrorKind::kInvalidArgument, "unknown tool call parser '{}'; supported: {}", name,
       fmt::join(supported_tool_parsers(), ", "));
}

namespace {
// A string member or "" (json::value() throws when the member has another type).
std::string string_member(const nlohmann::json& object, const char* key) {
  if (!object.is_object()) return "";
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}
}  // namespace

Status plan_tool_choice(const nlohmann::json& tool_choice, const nlohmann::json& tools, bool enable_auto_tool_choice,
                        bool has_tool_parser, ToolChoicePlan* plan) {
  *plan = ToolChoicePlan();
  bool have_tools = tools.is_array() && !tools.empty();
  auto invalid = [](std::string m) { return Status(ErrorKind::kInvalidArgument, std::move(m)); };

  if (tool_choice.is_null()) {
    // Absent: "auto" when tools are given (as in OpenAI and vLLM, which then also asks for
    // --enable-auto-tool-choice), else "none".
    if (!have_tools) return Status::Ok();
    return plan_tool_choice(nlohmann::json("auto"), tools, enable_auto_tool_choice, has_tool_parser, plan);
  }
  if (tool_choice.is_string()) {
    const std::string& s = tool_choice.get_ref<const std::string&>();
    if (s == "none") return Status::Ok();
    if (s == "auto") {
      if (!enable_auto_tool_choice || !has_tool_parser)
        return invalid("\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set");
      plan->parse_tools = have_tools;
      return Status::Ok();
    }
    if (s == "required") {
      if (!have_tools) return invalid("tool_choice \"required\" needs a non-empty `tools` list");
      if (!has_tool_parser)
        return invalid("tool_choice \"required\" needs the server to be started with --tool-call-parser");
      plan->parse_tools = true;
      return Status::Ok();
    }
    return invalid(fmt::format("tool_choice must be \"none\", \"auto\", \"required\" or a named function; got \"{}\"",
                               one_line(s)));
  }
  if (tool_choice.is_object()) {
    const nlohmann::json* fn = tool_choice.contains("function") ? &tool_choice["function"] : nullptr;
    if (string_member(tool_choice, "type") != "function" || !fn || !fn->is_object() || !fn->contains("name") ||
        !(*fn)["name"].is_string())
      return invalid(
          "a named tool_choice must look like {\"type\": \"function\", \"function\": {\"name\": \"<function name>\"}}");
    std::string name = (*fn)["name"].get<std::string>();
    bool found = false;
    if (have_tools)
      for (const nlohmann::json& t : tools)
        if (t.is_object() && t.contains("function") && t["function"].is_object() &&
            string_member(t["function"], "name") == name)
          found = true;
    if (!found) return invalid(fmt::format("tool_choice names function '{}', which is not in `tools`", one_line(name)));
    if (!has_tool_parser) return invalid("a named tool_choice needs the server to be started with --tool-call-parser");
    plan->parse_tools = true;
    plan->only_function = std::move(name);
    return Status::Ok();
  }
  return invalid("tool_choice must be a string or an object");
}

}  // namespace tessera::server
