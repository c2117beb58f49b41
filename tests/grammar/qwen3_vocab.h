// The real Qwen3 vocabulary as a TokenizerInfo (from scripts/fetch_test_data.sh's copy of the tokenizer),
// built through the tokenizer library. Null when the test data is absent.
#pragma once
#include <filesystem>
#include <memory>

#include "grammar/grammar.h"
#include "tokenizer/tokenizer.h"

namespace tessera::grammar::testing {

inline std::filesystem::path qwen3_dir() {
  return std::filesystem::path(TESSERA_SOURCE_DIR) / ".npm-pkgs/tokenizer-qwen3/package/models";
}

inline std::shared_ptr<const TokenizerInfo> qwen3_vocab() {
  static const std::shared_ptr<const TokenizerInfo> info = []() -> std::shared_ptr<const TokenizerInfo> {
    if (!std::filesystem::exists(qwen3_dir() / "tokenizer.json")) return nullptr;
    auto tok = tokenizer::Tokenizer::from_dir(qwen3_dir());
    auto out = std::make_shared<TokenizerInfo>();
    for (size_t id = 0; id < tok->vocab_size(); ++id) {
      std::string bytes;
      tok->append_token_bytes(static_cast<int32_t>(id), false, bytes);
      out->token_bytes.push_back(std::move(bytes));
      out->special.push_back(tok->is_special(static_cast<int32_t>(id)));
    }
    for (const char* stop : {"<|im_end|>", "<|endoftext|>"}) {
      if (auto id = tok->token_to_id(stop)) out->stop_ids.push_back(*id);
    }
    out->vocab_size = 151936;  // Qwen3's logits are wider than the tokenizer
    return out;
  }();
  return info;
}

}  // namespace tessera::grammar::testing
