#include "tokenizer/tokenizer.h"

#include <deque>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/json_depth.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/post_processor.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/utf8.h"

namespace tessera::tokenizer {
namespace {

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ErrorKind::kNotFound, "cannot read {}: the model directory needs a tokenizer.json", path.string());
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

nlohmann::json parse_json(std::string_view text, const std::string& origin) {
  check_json_file_depth(text, origin);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorKind::kCorrupt, "{} is not valid JSON: {}", origin, e.what());
  }
}

AddedToken parse_added_token(const nlohmann::json& entry, std::optional<int32_t> id) {
  AddedToken token;
  token.content = entry.at("content").get<std::string>();
  token.id = id ? *id : entry.at("id").get<int32_t>();
  token.special = entry.value("special", false);
  token.lstrip = entry.value("lstrip", false);
  token.rstrip = entry.value("rstrip", false);
  token.single_word = entry.value("single_word", false);
  token.normalized = entry.value("normalized", !token.special);
  return token;
}

// tokenizer_config.json spells bos/eos as a string or as {"content": ..., "__type": "AddedToken"}.
std::string special_token_name(const nlohmann::json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return {};
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content")) return it->at("content").get<std::string>();
  return {};
}

}  // namespace

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

std::unique_ptr<Tokenizer> Tokenizer::from_dir(const std::filesystem::path& dir) {
  std::filesystem::path tokenizer_path = dir / "tokenizer.json";
  std::filesystem::path config_path = dir / "tokenizer_config.json";
  std::string config_text = std::filesystem::exists(config_path) ? read_file(config_path) : std::string();
  return from_json_text(read_file(tokenizer_path), config_text, tokenizer_path.string());
}

std::unique_ptr<Tokenizer> Tokenizer::from_json_text(std::string_view tokenizer_json, std::string_view config_json,
                                                     const std::string& origin) {
  nlohmann::json root = parse_json(tokenizer_json, origin);
  nlohmann::json config =
      config_json.empty() ? nlohmann::json::object() : parse_json(config_json, "tokenizer_config.json");
  std::unique_ptr<Tokenizer> tokenizer(new Tokenizer());
  Tokenizer& t = *tokenizer;
  try {
    if (!root.is_object() || !root.contains("model")) fail(ErrorKind::kCorrupt, "it has no 'model'");
    t.normalizer_ = make_normalizer(root.value("normalizer", nlohmann::json()));
    t.pre_tokenizer_ = make_pre_tokenizer(root.value("pre_tokenizer", nlohmann::json()));
    bool byte_level = t.pre_tokenizer_ && t.pre_tokenizer_->is_byte_level();
    t.model_ = std::make_unique<BpeModel>(root.at("model"), byte_level);
    t.decoder_ = make_decoder(root.value("decoder", nlohmann::json()));
    t.special_frame_ =
        std::make_unique<SpecialTokenFrame>(parse_post_processor(root.value("post_processor", nlohmann::json())));

    for (const auto& entry : root.value("added_tokens", nlohmann::json::array()))
      t.added_.add(parse_added_token(entry, {}));
    // transformers also reads added tokens from tokenizer_config.json; add those tokenizer.json lacks.
    if (auto decoder = config.find("added_tokens_decoder"); decoder != config.end() && decoder->is_object()) {
      for (const auto& [id_text, entry] : decoder->items()) {
        if (!t.added_.find_by_content(entry.at("content").get<std::string>())) {
          t.added_.add(parse_added_token(entry, std::stoi(id_text)));
        }
      }
    }
    t.added_.build(t.normalizer_.get());
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorKind::kCorrupt, "{} is not a valid HF tokenizer: {}", origin, e.what());
  } catch (const Error& e) {
    if (std::string_view(e.what()).starts_with("tokenizer.json")) throw;
    throw Error(e.kind(), fmt::format("{} is not a usable HF tokenizer: {}", origin, e.what()));
  }

  t.vocab_size_ = t.model_->id_limit();
  for (const AddedToken& token : t.added_.tokens()) t.vocab_size_ = std::max(t.vocab_size_, size_t(token.id) + 1);

  t.bos_token_ = special_token_name(config, "bos_token");
  t.eos_token_ = special_token_name(config, "eos_token");
  if (!t.bos_token_.empty()) t.bos_id_ = t.token_to_id(t.bos_token_);
  if (!t.eos_token_.empty()) t.eos_id_ = t.token_to_id(t.eos_token_);
  // transformers' add_bos_token/add_eos_token (LlamaTokenizerFast) add bos/eos unless the
  // post-processor already does.
  auto& frame = *t.special_frame_;
  if (config.value("add_bos_token", false) && t.bos_id_ &&
      (frame.prefix.empty() || frame.prefix.front() != *t.bos_id_)) {
    frame.prefix.insert(frame.prefix.begin(), *t.bos_id_);
  }
  if (config.value("add_eos_token", false) && t.eos_id_ &&
      (frame.suffix.empty() || frame.suffix.back() != *t.eos_id_)) {
    frame.suffix.push_back(*t.eos_id_);
  }

  if (t.decodes_by_byte_concatenation()) {
    const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::get();
    t.token_bytes_.resize(t.vocab_size_);
    for (size_t id = 0; id < t.vocab_size_; ++id) {
      std::optional<std::string> token = t.id_to_token(static_cast<int32_t>(id));
      if (!token) continue;
      std::optional<std::string> bytes = alphabet.to_bytes(*token);
      t.token_bytes_[id] = bytes ? std::move(*bytes) : std::move(*token);
    }
  }
  return tokenizer;
}

void Tokenizer::encode_normalized_text(std::string_view text, std::vector<int32_t>& ids) const {
  std::vector<std::string_view> pieces{text};
  std::deque<std::string> storage;
  if (pre_tokenizer_) pre_tokenizer_->split(pieces, storage);
  for (std::string_view piece : pieces) model_->encode_piece(piece, ids);
}

void Tokenizer::encode_plain_text(std::string_view text, std::vector<int32_t>& ids) const {
  std::string normalized;
  std::string_view view = text;
  if (normalizer_) {
    normalized.assign(text);
    normalizer_->normalize(normalized);
    view = normalized;
  }
  std::vector<TextSegment> segments;
  added_.split(view, AddedVocabulary::Stage::kNormalized, segments);
  for (const TextSegment& segment : segments) {
    if (segment.id >= 0) {
      ids.push_back(segment.id);
    } else {
      encode_normalized_text(segment.text, ids);
    }
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::string repaired;
  if (!is_valid_utf8(text)) {
    repaired = utf8_lossy(text);
    text = repaired;
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (add_special_tokens) ids.insert(ids.end(), special_frame_->prefix.begin(), special_frame_->prefix.end());
  std::vector<TextSegment> segments;
  added_.split(text, AddedVocabulary::Stage::kRaw, segments);
  for (const TextSegment& segment : segments) {
    if (segment.id >= 0) {
      ids.push_back(segment.id);
    } else {
      encode_plain_text(segment.text, ids);
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), special_frame_->suffix.begin(), special_frame_->suffix.end());
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  if (decodes_by_byte_concatenation()) {
    std::string bytes;
    for (int32_t id : ids) append_token_bytes(id, skip_special_tokens, bytes);
    return utf8_lossy(bytes);
  }
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (skip_special_tokens && is_special(id)) continue;
    if (auto token = id_to_token(id)) tokens.push_back(std::move(*token));
  }
  if (!decoder_) {
    std::string joined;
    for (size_t i = 0; i < tokens.size(); ++i) joined.append(i ? " " : "").append(tokens[i]);
    return joined;
  }
  decoder_->decode_chain(tokens);
  std::string text;
  for (const std::string& token : tokens) text.append(token);
  return text;
}

bool Tokenizer::decodes_by_byte_concatenation() const { return decoder_ && decoder_->is_byte_concatenation(); }

void Tokenizer::append_token_bytes(int32_t id, bool skip_special_tokens, std::string& out) const {
  if (id < 0 || static_cast<size_t>(id) >= token_bytes_.size()) return;
  if (skip_special_tokens && is_special(id)) return;
  out.append(token_bytes_[id]);
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (const AddedToken* added = added_.find_by_content(token)) return added->id;
  return model_->token_to_id(token);
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  if (const AddedToken* added = added_.find_by_id(id)) return added->content;
  if (const std::string* token = model_->id_to_token(id)) return *token;
  return std::nullopt;
}

bool Tokenizer::is_special(int32_t id) const {
  const AddedToken* added = added_.find_by_id(id);
  return added && added->special;
}

}  // namespace tessera::tokenizer
