// OpenAI Responses API: request translation and the output items / streamed events (see responses_api.h).
#include "server/responses_api.h"

#include <fmt/format.h>

#include "core/error.h"
#include "server/text_only.h"

namespace tessera::server {

using ojson = nlohmann::ordered_json;

namespace {

[[noreturn]] void refuse(const std::string& message) { throw Error(ErrorKind::kInvalidArgument, message); }

const ojson* member(const ojson& o, const char* name) {
  if (!o.is_object()) return nullptr;
  auto it = o.find(name);
  if (it == o.end() || it->is_null()) return nullptr;
  return &*it;
}

std::string string_member(const ojson& o, const char* name) {
  const ojson* v = member(o, name);
  return v && v->is_string() ? v->get<std::string>() : std::string();
}

// Tool types that the hosted OpenAI service runs itself (or groups of tools, `namespace`). A self-hosted
// model cannot run them; clients such as Codex add them to every request, so they are dropped (logged)
// unless tool_choice asks for one.
bool hosted_tool_type(const std::string& t) {
  static const char* kinds[] = {
      "web_search",           "web_search_preview", "file_search", "code_interpreter", "image_generation",
      "computer_use_preview", "computer_use",       "mcp",         "local_shell",      "namespace",
      "tool_search"};
  for (const char* k : kinds)
    if (t == k) return true;
  return t.rfind("web_search_preview_", 0) == 0 || t.rfind("web_search_", 0) == 0;
}

// Text of a message's content: a string, or a list of input_text / output_text / text / refusal parts.
std::string content_text(const ojson& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) refuse(where + ".content must be a string or a list of content parts");
  std::string s;
  for (size_t i = 0; i < content.size(); ++i) {
    const ojson& p = content[i];
    const std::string type = string_member(p, "type");
    if (type == "input_text" || type == "output_text" || type == "text" || type == "summary_text" ||
        type == "reasoning_text") {
      const ojson* t = member(p, "text");
      if (!t || !t->is_string()) refuse(fmt::format("{}.content[{}].text must be a string", where, i));
      s += t->get<std::string>();
    } else if (type == "refusal") {
      s += string_member(p, "refusal");
    } else if (media_kind(type)) {
      refuse(text_only_message(fmt::format("{}.content[{}]", where, i), type));
    } else {
      refuse(fmt::format("{}.content[{}]: content parts of type '{}' are not supported by this server (text only)",
                         where, i, type));
    }
  }
  return s;
}

void add_tool_call(ojson& messages, const ojson& item, const std::string& where) {
  const std::string name = string_member(item, "name");
  if (name.empty()) refuse(where + ".name must be a non-empty string");
  const ojson* args = member(item, "arguments");
  if (args && !args->is_string()) refuse(where + ".arguments must be a string (JSON text)");
  std::string call_id = string_member(item, "call_id");
  if (call_id.empty()) call_id = string_member(item, "id");
  ojson call{{"id", call_id},
             {"type", "function"},
             {"function", {{"name", name}, {"arguments", args ? args->get<std::string>() : std::string("{}")}}}};
  // Consecutive function calls belong to one assistant turn (as vLLM joins them).
  if (!messages.empty() && messages.back()["role"] == "assistant" && messages.back().contains("tool_calls")) {
    messages.back()["tool_calls"].push_back(call);
    return;
  }
  messages.push_back({{"role", "assistant"}, {"content", ""}, {"tool_calls", ojson::array({call})}});
}

}  // namespace

namespace {

// instructions (a system message) and `input` as chat messages; a reasoning item's text goes to the next
// assistant turn.
ojson input_messages(const ojson& body) {
  ojson messages = ojson::array();
  if (const ojson* ins = member(body, "instructions")) {
    if (!ins->is_string()) refuse("instructions must be a string");
    messages.push_back({{"role", "system"}, {"content", *ins}});
  }
  const ojson* input = member(body, "input");
  if (!input) refuse("input: Field required (a string or a list of input items)");
  std::string reasoning;  // a reasoning item's text, attached to the next assistant turn
  auto flush_reasoning = [&](ojson& assistant) {
    if (!reasoning.empty()) assistant["reasoning_content"] = reasoning;
    reasoning.clear();
  };
  if (input->is_string()) {
    messages.push_back({{"role", "user"}, {"content", *input}});
  } else if (input->is_array()) {
    for (size_t i = 0; i < input->size(); ++i) {
      const ojson& item = (*input)[i];
      const std::string where = fmt::format("input[{}]", i);
      if (!item.is_object()) refuse(where + " must be an object");
      std::string type = string_member(item, "type");
      if (type.empty() && member(item, "role")) type = "message";
      if (type == "message") {
        std::string role = string_member(item, "role");
        if (role != "user" && role != "assistant" && role != "system" && role != "developer")
          refuse(fmt::format("{}.role '{}' is not one of user, assistant, system, developer", where, role));
        if (role == "developer") role = "system";  // chat templates know system; developer takes its place
        const ojson* content = member(item, "content");
        ojson m{{"role", role}, {"content", content ? content_text(*content, where) : std::string()}};
        if (role == "assistant") flush_reasoning(m);
        messages.push_back(m);
      } else if (type == "function_call") {
        add_tool_call(messages, item, where);
        flush_reasoning(messages.back());
      } else if (type == "function_call_output") {
        const std::string call_id = string_member(item, "call_id");
        if (call_id.empty()) refuse(where + ".call_id must be a non-empty string");
        const ojson* out = member(item, "output");
        messages.push_back(
            {{"role", "tool"}, {"tool_call_id", call_id}, {"content", out ? content_text(*out, where) : ""}});
      } else if (type == "reasoning") {
        for (const char* part : {"content", "summary"}) {
          const ojson* c = member(item, part);
          if (c && c->is_array() && !c->empty()) {
            reasoning += content_text(*c, where);
            break;
          }
        }
      } else if (type == "item_reference") {
        refuse(where + ": item_reference needs stored items; this server stores none, send the item itself");
      } else {
        refuse(
            fmt::format("{}: input items of type '{}' are not supported (message, function_call, "
                        "function_call_output and reasoning are)",
                        where, type));
      }
    }
  } else {
    refuse("input must be a string or a list of input items");
  }
  if (messages.empty()) refuse("input: the request has no messages");
  return messages;
}

// Function tools as chat tools (their names in `names`, the request's entries in `echo`); hosted tools are
// dropped (named in rq.ignored_tools); custom (free-form) tools are refused.
ojson chat_tools_of(const ojson& body, ResponsesRequest& rq, ojson& tools_echo, std::vector<std::string>& names) {
  ojson chat_tools = ojson::array();
  if (const ojson* tools = member(body, "tools")) {
    if (!tools->is_array()) refuse("tools must be a list of tool objects");
    for (size_t i = 0; i < tools->size(); ++i) {
      const ojson& t = (*tools)[i];
      const std::string type = string_member(t, "type");
      if (type == "function") {
        const std::string name = string_member(t, "name");
        if (name.empty()) refuse(fmt::format("tools[{}].name must be a non-empty string", i));
        ojson f{{"name", name}};
        if (const ojson* d = member(t, "description")) f["description"] = *d;
        const ojson* params = member(t, "parameters");
        if (params && !params->is_object()) refuse(fmt::format("tools[{}].parameters must be a JSON Schema object", i));
        f["parameters"] = params ? *params : ojson{{"type", "object"}, {"properties", ojson::object()}};
        chat_tools.push_back({{"type", "function"}, {"function", f}});
        tools_echo.push_back(t);
        names.push_back(name);
      } else if (hosted_tool_type(type)) {
        rq.ignored_tools.push_back(type == "namespace" ? "namespace " + string_member(t, "name") : type);
      } else if (type == "custom") {
        refuse(
            fmt::format("tools[{}]: custom (free-form grammar) tools are not supported; declare '{}' as a function "
                        "tool",
                        i, string_member(t, "name")));
      } else {
        refuse(
            fmt::format("tools[{}].type '{}' is not supported (function tools are; hosted tools such as "
                        "web_search are ignored)",
                        i, type));
      }
    }
  }
  return chat_tools;
}

// tool_choice auto / none / required / {"type": "function", "name"} (the last also set on `chat`).
ojson tool_choice_of(const ojson& body, const std::vector<std::string>& names, ojson& chat) {
  ojson tool_choice = "auto";
  if (const ojson* tc = member(body, "tool_choice")) {
    if (tc->is_string()) {
      const std::string s = tc->get<std::string>();
      if (s != "auto" && s != "none" && s != "required")
        refuse(fmt::format("tool_choice '{}' is not one of auto, none, required", s));
      tool_choice = s;
    } else if (tc->is_object() && string_member(*tc, "type") == "function") {
      const std::string name = string_member(*tc, "name");
      if (std::find(names.begin(), names.end(), name) == names.end())
        refuse(fmt::format("tool_choice names function '{}', which is not among the function tools", name));
      tool_choice = *tc;
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", name}}}};
    } else {
      refuse(
          fmt::format("tool_choice {} is not supported: use auto, none, required or {{\"type\": \"function\", "
                      "\"name\": ...}} (hosted tools do not run on this server)",
                      tc->dump()));
    }
  }
  return tool_choice;
}

// reasoning {effort, summary}: effort "none" turns the model's thinking off (enable_thinking=false); a summary
// asks for the reasoning text in summary parts. Returns what the response object repeats.
ojson reasoning_of(const ojson& body, ResponsesRequest& rq, ojson& chat) {
  ojson reasoning_echo{{"effort", nullptr}, {"summary", nullptr}};
  if (const ojson* r = member(body, "reasoning")) {
    if (!r->is_object()) refuse("reasoning must be an object");
    if (const ojson* e = member(*r, "effort")) {
      static const char* efforts[] = {"none", "minimal", "low", "medium", "high", "xhigh"};
      if (!e->is_string() ||
          std::find(std::begin(efforts), std::end(efforts), e->get<std::string>()) == std::end(efforts))
        refuse("reasoning.effort must be one of none, minimal, low, medium, high, xhigh");
      reasoning_echo["effort"] = *e;
      chat["chat_template_kwargs"] = {{"enable_thinking", *e != "none"}};
    }
    const ojson* s = member(*r, "summary");
    if (!s) s = member(*r, "generate_summary");
    if (s) {
      if (!s->is_string()) refuse("reasoning.summary must be one of auto, concise, detailed");
      reasoning_echo["summary"] = *s;
      rq.reasoning_summary = true;
    }
  }
  return reasoning_echo;
}

// text.format: text, json_object, or json_schema ({"type", "name", "schema", "strict"}), passed on as the chat
// request's response_format (structured output checks and compiles it there). Returns what the response repeats.
ojson text_of(const ojson& body, ojson& chat) {
  ojson text_echo{{"format", {{"type", "text"}}}};
  if (const ojson* t = member(body, "text")) {
    if (!t->is_object()) refuse("text must be an object");
    if (const ojson* f = member(*t, "format")) {
      if (!f->is_object()) refuse("text.format must be an object");
      const std::string type = string_member(*f, "type");
      if (type == "json_object") {
        chat["response_format"] = {{"type", "json_object"}};
      } else if (type == "json_schema") {
        const ojson* schema = member(*f, "schema");
        if (!schema) refuse("text.format: a json_schema format needs 'schema'");
        ojson js{{"name", f->value("name", "response")}, {"schema", *schema}};
        if (const ojson* strict = member(*f, "strict")) js["strict"] = *strict;
        chat["response_format"] = {{"type", "json_schema"}, {"json_schema", std::move(js)}};
      } else if (type != "text") {
        refuse(fmt::format("text.format.type '{}' is not one of text, json_object, json_schema", type));
      }
      text_echo["format"] = *f;
    }
    if (const ojson* v = member(*t, "verbosity")) text_echo["verbosity"] = *v;
  }
  return text_echo;
}

}  // namespace

ResponsesRequest responses_to_chat(const ojson& body) {
  ResponsesRequest rq;
  if (member(body, "previous_response_id"))
    refuse(
        "previous_response_id: this server stores no responses; send the whole conversation in `input` (as clients "
        "do with store: false)");
  if (member(body, "conversation"))
    refuse("conversation: this server stores no conversations; send the whole conversation in `input`");
  if (const ojson* bg = member(body, "background"); bg && bg->is_boolean() && bg->get<bool>())
    refuse("background: background responses are not supported; leave background unset or false");
  ojson chat{{"messages", input_messages(body)}};
  for (const char* k : {"model", "temperature", "top_p", "stream", "user"})
    if (const ojson* v = member(body, k)) chat[k] = *v;
  if (const ojson* m = member(body, "max_output_tokens")) chat["max_tokens"] = *m;

  ojson tools_echo = ojson::array();
  std::vector<std::string> names;
  const ojson chat_tools = chat_tools_of(body, rq, tools_echo, names);
  const ojson tool_choice = tool_choice_of(body, names, chat);
  if (!chat_tools.empty()) {
    chat["tools"] = chat_tools;
    if (!chat.contains("tool_choice")) chat["tool_choice"] = tool_choice;
  } else if (tool_choice == "required") {
    refuse("tool_choice 'required' needs at least one function tool");
  }
  if (const ojson* p = member(body, "parallel_tool_calls")) {
    if (!p->is_boolean()) refuse("parallel_tool_calls must be a boolean");
    chat["parallel_tool_calls"] = *p;
  }
  const ojson reasoning_echo = reasoning_of(body, rq, chat);
  const ojson text_echo = text_of(body, chat);

  rq.chat = std::move(chat);
  rq.echo = {{"instructions", body.contains("instructions") ? body["instructions"] : ojson(nullptr)},
             {"max_output_tokens", body.contains("max_output_tokens") ? body["max_output_tokens"] : ojson(nullptr)},
             {"parallel_tool_calls", body.value("parallel_tool_calls", true)},
             {"reasoning", reasoning_echo},
             {"store", false},
             {"temperature", body.contains("temperature") ? body["temperature"] : ojson(1.0)},
             {"text", text_echo},
             {"tool_choice", tool_choice},
             {"tools", tools_echo},
             {"top_p", body.contains("top_p") ? body["top_p"] : ojson(1.0)},
             {"truncation", "disabled"},
             {"metadata", member(body, "metadata") ? body["metadata"] : ojson::object()},
             {"user", body.contains("user") ? body["user"] : ojson(nullptr)}};
  return rq;
}

// ---------------------------------------------------------------------------------------------
ResponseBuilder::ResponseBuilder(std::string id, std::string model, int64_t created, const ResponsesRequest& request)
    : id_(std::move(id)),
      model_(std::move(model)),
      created_(created),
      echo_(request.echo),
      summary_(request.reasoning_summary) {}

std::string ResponseBuilder::item_id(const char* prefix) {
  // resp_<hex> -> <prefix>_<hex>_<n>: unique within the server's lifetime as the response id is.
  return fmt::format("{}_{}_{}", prefix, id_.substr(id_.find('_') + 1), next_item_++);
}

ojson ResponseBuilder::object(const std::string& status) const {
  ojson o{{"id", id_},           {"object", "response"}, {"created_at", created_},       {"status", status},
          {"background", false}, {"error", nullptr},     {"incomplete_details", nullptr}};
  o["instructions"] = echo_["instructions"];
  o["max_output_tokens"] = echo_["max_output_tokens"];
  o["max_tool_calls"] = nullptr;
  o["model"] = model_;
  ojson output = ojson::array();
  for (const auto& it : items_) output.push_back(it.json);
  o["output"] = output;
  o["parallel_tool_calls"] = echo_["parallel_tool_calls"];
  o["previous_response_id"] = nullptr;
  o["reasoning"] = echo_["reasoning"];
  o["service_tier"] = "default";
  o["store"] = false;
  for (const char* k : {"temperature", "text", "tool_choice", "tools", "top_p", "truncation", "metadata", "user"})
    o[k] = echo_[k];
  o["usage"] = nullptr;
  return o;
}

std::string ResponseBuilder::event(const char* type, ojson fields) {
  ojson e{{"type", type}, {"sequence_number", seq_++}};
  for (auto& [k, v] : fields.items()) e[k] = v;
  return fmt::format("event: {}\ndata: {}\n\n", type, e.dump(-1, ' ', false, ojson::error_handler_t::replace));
}

std::string ResponseBuilder::start() {
  std::string out = event("response.created", {{"response", object("in_progress")}});
  out += event("response.in_progress", {{"response", object("in_progress")}});
  return out;
}

// Opens a new output item of `type` (closing the open one) and its first content part.
std::string ResponseBuilder::open(const std::string& type, int tool_index) {
  std::string out = close_open();
  Item it{type, ojson(), tool_index};
  if (type == "reasoning") {
    it.json = {{"id", item_id("rs")}, {"type", "reasoning"}, {"summary", ojson::array()}};
    if (!summary_) it.json["content"] = ojson::array();
    it.json["encrypted_content"] = nullptr;
    it.json["status"] = "in_progress";
  } else if (type == "message") {
    it.json = {{"id", item_id("msg")},
               {"type", "message"},
               {"status", "in_progress"},
               {"role", "assistant"},
               {"content", ojson::array()}};
  }
  items_.push_back(it);
  open_ = true;
  const int index = static_cast<int>(items_.size()) - 1;
  Item& cur = items_.back();
  if (type == "function_call") return out;  // the caller fills in name and call id, then announces it
  out += event("response.output_item.added", {{"output_index", index}, {"item", cur.json}});
  const std::string& id = cur.json["id"].get_ref<const std::string&>();
  if (type == "message") {
    ojson part{{"type", "output_text"}, {"text", ""}, {"annotations", ojson::array()}, {"logprobs", ojson::array()}};
    out += event("response.content_part.added",
                 {{"item_id", id}, {"output_index", index}, {"content_index", 0}, {"part", part}});
    cur.json["content"].push_back(part);
  } else if (summary_) {
    ojson part{{"type", "summary_text"}, {"text", ""}};
    out += event("response.reasoning_summary_part.added",
                 {{"item_id", id}, {"output_index", index}, {"summary_index", 0}, {"part", part}});
    cur.json["summary"].push_back(part);
  } else {
    ojson part{{"type", "reasoning_text"}, {"text", ""}};
    out += event("response.content_part.added",
                 {{"item_id", id}, {"output_index", index}, {"content_index", 0}, {"part", part}});
    cur.json["content"].push_back(part);
  }
  return out;
}

// Closes the open item: the *.done events for its part and the item itself.
std::string ResponseBuilder::close_open() {
  if (!open_) return {};
  open_ = false;
  const int index = static_cast<int>(items_.size()) - 1;
  Item& cur = items_.back();
  cur.json["status"] = "completed";
  const std::string id = cur.json["id"].get<std::string>();
  std::string out;
  // A text part ends with two events: its text (with `extra` fields), then the part.
  auto part_done = [&](const char* text_event, const char* part_event, const char* index_key, const ojson& part,
                       const ojson& extra) {
    ojson text{{"item_id", id}, {"output_index", index}, {index_key, 0}, {"text", part["text"]}};
    for (auto it = extra.begin(); it != extra.end(); ++it) text[it.key()] = it.value();
    out += event(text_event, text);
    out += event(part_event, {{"item_id", id}, {"output_index", index}, {index_key, 0}, {"part", part}});
  };
  if (cur.type == "message") {
    part_done("response.output_text.done", "response.content_part.done", "content_index", cur.json["content"][0],
              {{"logprobs", ojson::array()}});
  } else if (cur.type == "reasoning" && summary_) {
    part_done("response.reasoning_summary_text.done", "response.reasoning_summary_part.done", "summary_index",
              cur.json["summary"][0], ojson::object());
  } else if (cur.type == "reasoning") {
    part_done("response.reasoning_text.done", "response.content_part.done", "content_index", cur.json["content"][0],
              ojson::object());
  } else if (cur.type == "function_call") {
    out += event(
        "response.function_call_arguments.done",
        {{"item_id", id}, {"output_index", index}, {"name", cur.json["name"]}, {"arguments", cur.json["arguments"]}});
  }
  out += event("response.output_item.done", {{"output_index", index}, {"item", cur.json}});
  return out;
}

std::string ResponseBuilder::push(const ChatDelta& d) {
  std::string out;
  if (!d.reasoning.empty()) {
    reasoning_all_ += d.reasoning;
    if (!open_ || items_.back().type != "reasoning") out += open("reasoning");
    const int index = static_cast<int>(items_.size()) - 1;
    ojson& item = items_.back().json;
    const std::string id = item["id"].get<std::string>();
    if (summary_) {
      item["summary"][0]["text"] = item["summary"][0]["text"].get<std::string>() + d.reasoning;
      out += event("response.reasoning_summary_text.delta",
                   {{"item_id", id}, {"output_index", index}, {"summary_index", 0}, {"delta", d.reasoning}});
    } else {
      item["content"][0]["text"] = item["content"][0]["text"].get<std::string>() + d.reasoning;
      out += event("response.reasoning_text.delta",
                   {{"item_id", id}, {"output_index", index}, {"content_index", 0}, {"delta", d.reasoning}});
    }
  }
  if (!d.content.empty()) {
    if (!open_ || items_.back().type != "message") out += open("message");
    const int index = static_cast<int>(items_.size()) - 1;
    ojson& item = items_.back().json;
    item["content"][0]["text"] = item["content"][0]["text"].get<std::string>() + d.content;
    out += event("response.output_text.delta", {{"item_id", item["id"]},
                                                {"output_index", index},
                                                {"content_index", 0},
                                                {"delta", d.content},
                                                {"logprobs", ojson::array()}});
  }
  for (const auto& tc : d.tool_calls) {
    if (tc.first()) {
      out += open("function_call", tc.index);
      ojson& item = items_.back().json;
      item = {{"id", item_id("fc")}, {"type", "function_call"}, {"status", "in_progress"},
              {"arguments", ""},     {"call_id", tc.id},        {"name", tc.name}};
      out +=
          event("response.output_item.added", {{"output_index", static_cast<int>(items_.size()) - 1}, {"item", item}});
    }
    if (tc.arguments.empty() || !open_ || items_.back().type != "function_call" || items_.back().tool_index != tc.index)
      continue;
    ojson& item = items_.back().json;
    item["arguments"] = item["arguments"].get<std::string>() + tc.arguments;
    out += event(
        "response.function_call_arguments.delta",
        {{"item_id", item["id"]}, {"output_index", static_cast<int>(items_.size()) - 1}, {"delta", tc.arguments}});
  }
  return out;
}

void ResponseBuilder::add(const ChatParseResult& r) {
  auto done = [&](ojson j, const std::string& type) {
    j["status"] = "completed";
    items_.push_back(Item{type, std::move(j), -1});
  };
  if (!r.reasoning.empty()) {
    reasoning_all_ += r.reasoning;
    ojson j{{"id", item_id("rs")}, {"type", "reasoning"}, {"summary", ojson::array()}};
    if (summary_)
      j["summary"].push_back({{"type", "summary_text"}, {"text", r.reasoning}});
    else
      j["content"] = ojson::array({ojson{{"type", "reasoning_text"}, {"text", r.reasoning}}});
    j["encrypted_content"] = nullptr;
    done(std::move(j), "reasoning");
  }
  if (!r.content.empty() || (r.tool_calls.empty() && r.reasoning.empty()))
    done(ojson{{"id", item_id("msg")},
               {"type", "message"},
               {"status", "completed"},
               {"role", "assistant"},
               {"content", ojson::array({ojson{{"type", "output_text"},
                                               {"text", r.content},
                                               {"annotations", ojson::array()},
                                               {"logprobs", ojson::array()}}})}},
         "message");
  for (const auto& c : r.tool_calls)
    done(ojson{{"id", item_id("fc")},
               {"type", "function_call"},
               {"status", "completed"},
               {"arguments", c.arguments},
               {"call_id", c.id},
               {"name", c.name}},
         "function_call");
}

ojson ResponseBuilder::response(const std::string& finish_reason, const ResponsesUsage& u) const {
  const bool incomplete = finish_reason == "length";
  ojson o = object(incomplete ? "incomplete" : "completed");
  if (incomplete) o["incomplete_details"] = {{"reason", "max_output_tokens"}};
  o["usage"] = {{"input_tokens", u.input_tokens},
                {"input_tokens_details", {{"cached_tokens", u.cached_tokens}}},
                {"output_tokens", u.output_tokens},
                {"output_tokens_details", {{"reasoning_tokens", u.reasoning_tokens}}},
                {"total_tokens", u.input_tokens + u.output_tokens}};
  return o;
}

std::string ResponseBuilder::finish(const std::string& finish_reason, const ResponsesUsage& usage,
                                    const std::string& error_message) {
  std::string out = close_open();
  if (finish_reason == "error" || finish_reason == "abort") {
    ojson o = response(finish_reason, usage);
    o["status"] = "failed";
    o["error"] = {{"code", "server_error"},
                  {"message", finish_reason == "abort" ? std::string("the request was aborted")
                                                       : "generation failed: " + error_message}};
    return out + event("response.failed", {{"response", o}});
  }
  ojson o = response(finish_reason, usage);
  return out + event(o["status"] == "incomplete" ? "response.incomplete" : "response.completed", {{"response", o}});
}

}  // namespace tessera::server
