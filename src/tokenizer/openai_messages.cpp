#include "tokenizer/openai_messages.h"

#include <string>
#include <vector>

#include "core/error.h"
#include "core/json_depth.h"

namespace tessera::tokenizer {
namespace {

using Json = nlohmann::ordered_json;

// A content part's text, or its modality for media parts; vLLM's part parser.
struct Part {
  bool is_text = false;
  std::string text;
  std::string modality;  // image, audio, video
};

std::optional<Part> parse_part(const Json& part) {
  if (part.is_string()) return Part{true, part.get<std::string>(), ""};
  if (!part.is_object()) fail(ErrorKind::kInvalidArgument, "a message content part must be a string or an object");
  std::string type = part.value("type", "");
  if (type == "text" || type == "input_text" || type == "output_text" || type == "refusal" || type == "thinking") {
    const char* field = type == "refusal" ? "refusal" : type == "thinking" ? "thinking" : "text";
    auto text = part.find(field);
    if (text == part.end() || !text->is_string()) return std::nullopt;  // vLLM skips empty text parts
    return Part{true, text->get<std::string>(), ""};
  }
  if (type == "image_url" || type == "input_image" || type == "image_embeds" || type == "image_pil") {
    return Part{false, "", "image"};
  }
  if (type == "audio_url" || type == "input_audio" || type == "audio_embeds") return Part{false, "", "audio"};
  if (type == "video_url") return Part{false, "", "video"};
  if (type.empty()) fail(ErrorKind::kInvalidArgument, "a message content part has no \"type\"");
  fail(ErrorKind::kInvalidArgument, "unknown message content part type \"{}\"", type);
}

Json convert_content(const Json& content, ContentFormat format) {
  std::vector<Part> parts;
  if (content.is_string()) {
    parts.push_back(Part{true, content.get<std::string>(), ""});
  } else if (content.is_array()) {
    for (const Json& part : content) {
      if (std::optional<Part> parsed = parse_part(part)) parts.push_back(*parsed);
    }
  } else if (!content.is_null()) {
    fail(ErrorKind::kInvalidArgument, "message content must be a string, a list of parts or null");
  }
  if (format == ContentFormat::kOpenAI) {
    Json list = Json::array();
    for (const Part& part : parts) {
      list.push_back(part.is_text ? Json{{"type", "text"}, {"text", part.text}} : Json{{"type", part.modality}});
    }
    return list;
  }
  std::string text;
  bool first = true;
  for (const Part& part : parts) {
    if (!part.is_text) {
      fail(ErrorKind::kUnsupported, "this model's chat template takes text only, but a message has a {} part",
           part.modality);
    }
    if (!first) text += "\n";
    text += part.text;
    first = false;
  }
  return text;
}

// Tool-call arguments as an object: parsed from a JSON string; null, "", invalid JSON or a non-object become {}.
Json arguments_object(const Json& arguments) {
  if (arguments.is_object()) return arguments;
  if (arguments.is_string() && !arguments.get<std::string>().empty()) {
    // The arguments are request data too: bound their nesting before anything walks them recursively.
    if (json_nesting_depth(arguments.get_ref<const std::string&>()) > kMaxJsonDepth)
      fail(ErrorKind::kInvalidArgument, "tool call arguments nest arrays and objects more than {} levels deep",
           kMaxJsonDepth);
    Json parsed = Json::parse(arguments.get<std::string>(), nullptr, /*allow_exceptions=*/false);
    if (parsed.is_object()) return parsed;
  }
  return Json::object();
}

}  // namespace

nlohmann::ordered_json vllm_messages(const nlohmann::ordered_json& messages, ContentFormat format) {
  if (!messages.is_array()) fail(ErrorKind::kInvalidArgument, "\"messages\" must be a list");
  Json out = Json::array();
  for (const Json& message : messages) {
    if (!message.is_object() || !message.contains("role") || !message["role"].is_string()) {
      fail(ErrorKind::kInvalidArgument, "every message needs a \"role\"");
    }
    std::string role = message["role"].get<std::string>();
    Json converted = {{"role", role}, {"content", convert_content(message.value("content", Json()), format)}};
    if (role == "assistant") {
      auto tool_calls = message.find("tool_calls");
      if (tool_calls != message.end() && tool_calls->is_array() && !tool_calls->empty()) {
        Json calls = Json::array();
        for (Json call : *tool_calls) {
          if (!call.is_object() || call.value("type", "function") != "function" || !call.contains("function") ||
              !call["function"].is_object()) {
            fail(ErrorKind::kInvalidArgument, "assistant tool_calls entries must be function calls");
          }
          call["function"]["arguments"] = arguments_object(call["function"].value("arguments", Json()));
          calls.push_back(std::move(call));
        }
        converted["tool_calls"] = std::move(calls);
      }
      // vLLM reads "reasoning" and passes it as both names; clients of older servers send "reasoning_content".
      Json reasoning = message.value("reasoning", message.value("reasoning_content", Json()));
      if (!reasoning.is_null()) {
        converted["reasoning"] = reasoning;
        converted["reasoning_content"] = reasoning;
      }
    } else if (role == "tool" && message.contains("tool_call_id")) {
      converted["tool_call_id"] = message["tool_call_id"];
    }
    if (message.contains("name") && message["name"].is_string()) converted["name"] = message["name"];
    if (role == "developer") converted["tools"] = message.value("tools", Json());
    out.push_back(std::move(converted));
  }
  return out;
}

}  // namespace tessera::tokenizer
