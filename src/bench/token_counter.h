// Exact token counts from a model's own tokenizer (`--tokenizer DIR`), for servers that send no
// `usage` and for random prompts of an exact length. Built only when the tokenizer layer is.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace tessera::tokenizer {
class Tokenizer;
class ChatTemplate;
}  // namespace tessera::tokenizer

namespace tessera::bench {

class TokenCounter {
 public:
  // Loads DIR/tokenizer.json (HF format). Throws tessera::Error when the file is unusable or
  // this build has no tokenizer layer.
  static std::unique_ptr<TokenCounter> load(const std::string& dir);
  ~TokenCounter();

  int count(std::string_view text) const;
  // The text of the first `tokens` tokens of `text` (all of it when shorter).
  std::string truncate(std::string_view text, int tokens) const;

  // Whether DIR has a chat template (chat_template.jinja, chat_template.json or tokenizer_config.json's).
  bool has_chat_template() const { return chat_template_ != nullptr; }
  // `user_text` as one user message rendered by the chat template with the generation prompt, as
  // transformers' apply_chat_template([{"role": "user", ...}], add_generation_prompt=True, tokenize=False);
  // `template_kwargs` (a JSON object, may be empty) joins the template's variables. nullopt without a template.
  std::optional<std::string> chat_prompt(const std::string& user_text, const std::string& template_kwargs = {}) const;

 private:
  TokenCounter();
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  std::unique_ptr<tokenizer::ChatTemplate> chat_template_;
};

}  // namespace tessera::bench
