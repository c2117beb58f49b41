#include "bench/openai_protocol.h"

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace tessera::bench {
namespace {

using nlohmann::json;

void append_text(const json& object, const char* key, MessageContent& out, bool content = true) {
  auto it = object.find(key);
  if (it == object.end() || !it->is_string()) return;
  const std::string& text = it->get_ref<const std::string&>();
  if (text.empty()) return;
  out.has_text = true;
  out.text += text;
  if (content) out.content += text;
}

void read_usage(const json& message, MessageContent& out) {
  auto usage = message.find("usage");
  if (usage == message.end() || !usage->is_object()) return;
  Usage u;
  u.prompt_tokens = usage->value("prompt_tokens", 0);
  u.completion_tokens = usage->value("completion_tokens", 0);
  if (auto details = usage->find("prompt_tokens_details"); details != usage->end() && details->is_object())
    if (auto cached = details->find("cached_tokens"); cached != details->end() && cached->is_number_integer())
      u.cached_tokens = cached->get<int>();
  out.usage = u;
}

std::string describe_error(const json& error) {
  if (error.is_object()) {
    std::string message = error.value("message", std::string());
    if (!message.empty()) return message;
  }
  if (error.is_string()) return error.get<std::string>();
  return error.dump();
}

MessageContent parse_message(std::string_view data, ApiEndpoint endpoint, const char* choice_key) {
  MessageContent out;
  json message = json::parse(data, nullptr, false);
  if (message.is_discarded() || !message.is_object()) {
    out.error = "not JSON: " + std::string(data.substr(0, 120));
    return out;
  }
  if (auto error = message.find("error"); error != message.end() && !error->is_null()) {
    out.error = describe_error(*error);
    return out;
  }
  if (auto choices = message.find("choices"); choices != message.end() && choices->is_array()) {
    for (const auto& choice : *choices) {
      if (!choice.is_object()) continue;
      if (auto reason = choice.find("finish_reason"); reason != choice.end() && reason->is_string())
        out.has_finish_reason = true;
      if (endpoint == ApiEndpoint::kCompletions) {
        append_text(choice, "text", out);
        continue;
      }
      auto part = choice.find(choice_key);
      if (part == choice.end() || !part->is_object()) continue;
      // Reasoning models stream their thinking in separate fields; those tokens count as output.
      append_text(*part, "reasoning_content", out, false);
      append_text(*part, "reasoning", out, false);
      append_text(*part, "content", out);
    }
  }
  read_usage(message, out);
  return out;
}

}  // namespace

ApiEndpoint parse_endpoint(std::string_view path) {
  if (path == "/v1/chat/completions" || path == "chat") return ApiEndpoint::kChatCompletions;
  if (path == "/v1/completions" || path == "completions") return ApiEndpoint::kCompletions;
  fail(ErrorKind::kInvalidArgument, "--endpoint must be /v1/chat/completions or /v1/completions, got '{}'", path);
}

const char* endpoint_path(ApiEndpoint endpoint) {
  return endpoint == ApiEndpoint::kChatCompletions ? "/v1/chat/completions" : "/v1/completions";
}

namespace {

// The fields every request carries after its prompt or messages; --extra-body last.
std::string finish_body(json& body, int max_tokens, const GenerationParams& params) {
  body["max_tokens"] = max_tokens;
  body["temperature"] = params.temperature;
  body["stream"] = params.stream;
  if (params.stream) body["stream_options"] = {{"include_usage", true}};
  if (params.ignore_eos) body["ignore_eos"] = true;
  if (!params.extra_body.empty()) {
    json extra;
    try {
      extra = json::parse(params.extra_body);
    } catch (const std::exception& e) {
      fail(ErrorKind::kInvalidArgument, "--extra-body is not valid JSON: {}", e.what());
    }
    if (!extra.is_object()) fail(ErrorKind::kInvalidArgument, "--extra-body must be a JSON object");
    for (auto& [k, v] : extra.items()) body[k] = v;
  }
  return body.dump();
}

}  // namespace

std::string build_request_body(ApiEndpoint endpoint, const PromptSpec& prompt, const GenerationParams& params) {
  json body;
  body["model"] = params.model;
  if (endpoint == ApiEndpoint::kChatCompletions) {
    body["messages"] = json::array({{{"role", "user"}, {"content", prompt.prompt}}});
  } else {
    body["prompt"] = prompt.prompt;
  }
  return finish_body(body, prompt.max_tokens, params);
}

std::string build_chat_request_body(const std::vector<ChatMessage>& messages, int max_tokens,
                                    const GenerationParams& params) {
  json body;
  body["model"] = params.model;
  body["messages"] = json::array();
  for (const ChatMessage& m : messages) body["messages"].push_back({{"role", m.role}, {"content", m.content}});
  return finish_body(body, max_tokens, params);
}

MessageContent parse_stream_message(std::string_view data, ApiEndpoint endpoint) {
  size_t first = data.find_first_not_of(" \t\r\n");
  if (first != std::string_view::npos && data.substr(first, 6) == "[DONE]") {
    MessageContent done;
    done.is_done_marker = true;
    return done;
  }
  return parse_message(data, endpoint, "delta");
}

MessageContent parse_full_response(std::string_view body, ApiEndpoint endpoint) {
  return parse_message(body, endpoint, "message");
}

std::string error_body_summary(std::string_view body) {
  json message = json::parse(body, nullptr, false);
  if (!message.is_discarded() && message.is_object()) {
    if (auto error = message.find("error"); error != message.end()) return describe_error(*error);
    if (auto detail = message.find("detail"); detail != message.end())  // FastAPI-style errors
      return detail->is_string() ? detail->get<std::string>() : detail->dump();
    if (auto text = message.find("message"); text != message.end() && text->is_string())
      return text->get<std::string>();
  }
  std::string shortened(body.substr(0, 200));
  for (char& c : shortened)
    if (c == '\n' || c == '\r') c = ' ';
  return shortened;
}

}  // namespace tessera::bench
