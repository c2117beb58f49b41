#include "bench/token_counter.h"

#include <algorithm>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace tessera::bench {

TokenCounter::TokenCounter() = default;

std::unique_ptr<TokenCounter> TokenCounter::load(const std::string& dir) {
  std::unique_ptr<TokenCounter> counter(new TokenCounter());
  counter->tokenizer_ = tokenizer::Tokenizer::from_dir(dir);
  try {
    counter->chat_template_ = std::make_unique<tokenizer::ChatTemplate>(tokenizer::ChatTemplate::from_model_dir(dir));
  } catch (const Error&) {
    // No template in DIR: prompts that vLLM would format with one are sent as they are (the report says so).
  }
  return counter;
}

TokenCounter::~TokenCounter() = default;

std::optional<std::string> TokenCounter::chat_prompt(const std::string& user_text,
                                                     const std::string& template_kwargs) const {
  if (!chat_template_) return std::nullopt;
  nlohmann::ordered_json request;
  request["messages"] = nlohmann::ordered_json::array({{{"role", "user"}, {"content", user_text}}});
  request["add_generation_prompt"] = true;
  if (!template_kwargs.empty()) {
    nlohmann::ordered_json kwargs = nlohmann::ordered_json::parse(template_kwargs, nullptr, false);
    if (!kwargs.is_object())
      fail(ErrorKind::kInvalidArgument, "--chat-template-kwargs must be a JSON object, got: {}", template_kwargs);
    request["chat_template_kwargs"] = std::move(kwargs);
  }
  return chat_template_->render(request);
}

int TokenCounter::count(std::string_view text) const { return static_cast<int>(tokenizer_->encode(text).size()); }

std::string TokenCounter::truncate(std::string_view text, int tokens) const {
  std::vector<int32_t> ids = tokenizer_->encode(text);
  if (static_cast<int>(ids.size()) <= tokens) return std::string(text);
  ids.resize(static_cast<size_t>(std::max(0, tokens)));
  return tokenizer_->decode(ids);
}

}  // namespace tessera::bench
