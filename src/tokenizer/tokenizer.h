// A Hugging Face tokenizer.json tokenizer (byte-level BPE: Qwen2/Qwen3, Llama 3.x, DeepSeek-V3),
// giving the same ids as HF `tokenizers`. Immutable after loading, so one instance serves all
// threads (the per-word BPE cache inside is thread-safe).
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tokenizer/added_vocabulary.h"

namespace tessera::tokenizer {

class BpeModel;
class Decoder;
class Normalizer;
class PreTokenizer;
struct SpecialTokenFrame;

class Tokenizer {
 public:
  // Loads DIR/tokenizer.json and, when present, DIR/tokenizer_config.json (extra added tokens,
  // bos/eos, add_bos_token). Throws tessera::Error naming the file and what is wrong: besides malformed
  // fields, an empty vocabulary, two tokens with one id, and an id at or past the number of tokens the
  // files define plus kTokenIdMargin (ids size per-id tables). A bos/eos token that is in neither the
  // vocabulary nor the added tokens is logged as a warning.
  static std::unique_ptr<Tokenizer> from_dir(const std::filesystem::path& dir);
  // config_json may be empty (no tokenizer_config.json). `origin` and `config_origin` name the two files in errors.
  static std::unique_ptr<Tokenizer> from_json_text(std::string_view tokenizer_json, std::string_view config_json,
                                                   const std::string& origin = "tokenizer.json",
                                                   const std::string& config_origin = "tokenizer_config.json");
  ~Tokenizer();

  // Ids as HF's tokenizer.encode(text, add_special_tokens).ids. With add_special_tokens the
  // post-processor's tokens are added, and bos/eos where tokenizer_config.json asks for them
  // with add_bos_token/add_eos_token (as transformers does). Ill-formed UTF-8 in `text` is read
  // as U+FFFD (Python's errors="replace"); no input makes it fail.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = false) const;

  // Text as HF's tokenizer.decode(ids, skip_special_tokens); unknown ids are skipped.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(int32_t id) const;
  bool is_special(int32_t id) const;
  // One past the largest id of the vocabulary and the added tokens.
  size_t vocab_size() const { return vocab_size_; }

  std::optional<int32_t> bos_id() const { return bos_id_; }
  std::optional<int32_t> eos_id() const { return eos_id_; }
  const std::string& bos_token() const { return bos_token_; }  // empty when there is none
  const std::string& eos_token() const { return eos_token_; }
  const std::vector<AddedToken>& added_tokens() const { return added_.tokens(); }

  // For streaming: true when decode() is the lossy UTF-8 of the concatenated per-token bytes,
  // which append_token_bytes gives one token at a time (byte-level tokenizers).
  bool decodes_by_byte_concatenation() const;
  // Appends the raw bytes that token `id` contributes to a decode (nothing for an unknown id,
  // or a special token when skip_special_tokens). Meaningful when decodes_by_byte_concatenation().
  void append_token_bytes(int32_t id, bool skip_special_tokens, std::string& out) const;

 private:
  Tokenizer();
  void load_parts(const nlohmann::json& root, const std::string& origin);
  void load_added_tokens(const nlohmann::json& root, const nlohmann::json& config, const std::string& origin,
                         const std::string& config_origin);
  void load_special_tokens(const nlohmann::json& config, const std::string& config_origin);
  void encode_plain_text(std::string_view text, std::vector<int32_t>& ids) const;
  void encode_normalized_text(std::string_view text, std::vector<int32_t>& ids) const;

  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<BpeModel> model_;
  std::unique_ptr<Decoder> decoder_;
  std::unique_ptr<SpecialTokenFrame> special_frame_;
  AddedVocabulary added_;
  size_t vocab_size_ = 0;
  std::optional<int32_t> bos_id_, eos_id_;
  std::string bos_token_, eos_token_;
  // Per-id bytes for streaming decode, precomputed for byte-level tokenizers.
  std::vector<std::string> token_bytes_;
};

}  // namespace tessera::tokenizer
