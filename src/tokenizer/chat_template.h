// A model's chat template: turns an OpenAI chat request into the prompt text, byte for byte as
// transformers' tokenizer.apply_chat_template(messages, tools=..., add_generation_prompt=...,
// tokenize=False, **chat_template_kwargs) does, with the template's bos/eos/unk/pad tokens.
#pragma once
#include <nlohmann/json.hpp>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "core/error.h"
#include "tokenizer/jinja/limits.h"
#include "tokenizer/jinja/template.h"
#include "tokenizer/openai_messages.h"

namespace tessera::tokenizer {

class ChatTemplate {
 public:
  // Where the template comes from, first found wins: `template_file` (--chat-template), DIR/chat_template.jinja,
  // DIR/chat_template.json {"chat_template": ...}, DIR/tokenizer_config.json "chat_template" (a string, or a list
  // of {"name", "template"} of which "default" is used). Special tokens come from DIR/tokenizer_config.json when
  // present. Throws tessera::Error when there is no template, or jinja::TemplateError naming the file and line for
  // a syntax error or a template nested past jinja::kMaxTemplateNesting.
  static ChatTemplate from_model_dir(const std::filesystem::path& dir,
                                     const std::optional<std::filesystem::path>& template_file = std::nullopt);
  // `tokenizer_config_json` may be empty; it supplies bos_token, eos_token, unk_token and pad_token.
  static ChatTemplate from_source(std::string_view source, std::string_view tokenizer_config_json = {});

  // `request` is an OpenAI chat completion body: "messages" (required), "tools", "add_generation_prompt"
  // (default true), "chat_template_kwargs" (e.g. {"enable_thinking": false}, merged into the template's
  // variables). Parse it as ordered_json: tojson prints keys in the order the client sent them, as Python does.
  // Throws jinja::TemplateError (a tessera::Error) for template errors and raise_exception(), tessera::Error
  // for a malformed request.
  std::string render(const nlohmann::ordered_json& request, const jinja::RenderLimits& limits = {}) const;
  // Same, without exceptions, for request handlers.
  Status try_render(const nlohmann::ordered_json& request, std::string* prompt,
                    const jinja::RenderLimits& limits = {}) const noexcept;

  // The request with its messages normalized as vLLM's OpenAI server does before rendering (see
  // openai_messages.h), for content_format(). The server renders vllm_request(body); render(body) alone is
  // transformers' behaviour.
  nlohmann::ordered_json vllm_request(const nlohmann::ordered_json& request) const;
  // vLLM's "auto" content format: kOpenAI when the template loops over a message's content, else kString.
  ContentFormat content_format() const { return content_format_; }

  const std::string& source() const { return source_; }

 private:
  ChatTemplate(std::string source, jinja::Dict special_tokens);
  static ChatTemplate from_file_text(std::string source, jinja::Dict special_tokens,
                                     const std::filesystem::path& origin);

  std::string source_;
  std::shared_ptr<const jinja::Template> template_;
  jinja::Dict special_tokens_;
  ContentFormat content_format_ = ContentFormat::kString;
};

}  // namespace tessera::tokenizer
