#include "tokenizer/tokenizer.h"

#include <deque>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/json_depth.h"
#include "core/logging.h"
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
    fail(ErrorKind::kCorrupt, "{} is not valid JSON: {}", origin, json_error_text(e));
  }
}

// One added token: tokenizer.json's added_tokens[i] (its id inside) or tokenizer_config.json's
// added_tokens_decoder entry (its id is the key). `where` names the entry in errors, with its file.
AddedToken parse_added_token(const nlohmann::json& entry, std::optional<int64_t> key_id, const std::string& where) {
  if (!entry.is_object()) fail(ErrorKind::kCorrupt, "{} is not an object: {}", where, entry.dump());
  auto content = entry.find("content");
  if (content == entry.end() || !content->is_string()) fail(ErrorKind::kCorrupt, "{} has no \"content\" string", where);
  AddedToken token;
  token.content = content->get<std::string>();
  int64_t id = -1;
  if (key_id) {
    id = *key_id;
  } else if (auto it = entry.find("id"); it != entry.end() && it->is_number_integer()) {
    id = it->is_number_unsigned() && it->get<uint64_t>() > INT32_MAX ? int64_t{INT32_MAX} + 1 : it->get<int64_t>();
  } else {
    fail(ErrorKind::kCorrupt, "{} ('{}') has no integer \"id\"", where, token.content);
  }
  if (id < 0 || id > INT32_MAX)
    fail(ErrorKind::kCorrupt, "{} ('{}') has id {}, not an id between 0 and 2^31 - 1", where, token.content, id);
  token.id = static_cast<int32_t>(id);
  auto flag = [&](const char* name, bool fallback) {
    auto it = entry.find(name);
    if (it == entry.end() || it->is_null()) return fallback;
    if (!it->is_boolean())
      fail(ErrorKind::kCorrupt, "{} ('{}'): \"{}\" must be true or false", where, token.content, name);
    return it->get<bool>();
  };
  token.special = flag("special", false);
  token.lstrip = flag("lstrip", false);
  token.rstrip = flag("rstrip", false);
  token.single_word = flag("single_word", false);
  token.normalized = flag("normalized", !token.special);
  return token;
}

// tokenizer_config.json spells bos/eos as a string or as {"content": ..., "__type": "AddedToken"}.
std::string special_token_name(const nlohmann::json& config, const char* key, const std::string& origin) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return {};
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content")) {
    if (!it->at("content").is_string())
      fail(ErrorKind::kCorrupt, "{}: \"{}\".content must be a string: {}", origin, key, it->dump());
    return it->at("content").get<std::string>();
  }
  return {};
}

// tokenizer_config.json's added_tokens_decoder keys are ids: "151643".
int64_t decoder_key_id(const std::string& key, const std::string& where) {
  if (key.empty() || key.size() > 10 || key.find_first_not_of("0123456789") != std::string::npos)
    fail(ErrorKind::kCorrupt, "{}: the key must be a token id (digits), not '{}'", where, key);
  return std::stoll(key);
}

// An added token's id must name one token and stay near the ids the files define: it sizes per-id tables.
void check_added_id(const AddedToken& token, const AddedVocabulary& added, size_t id_bound, const std::string& where) {
  if (static_cast<size_t>(token.id) >= id_bound)
    fail(ErrorKind::kCorrupt,
         "{} ('{}') has id {}, far past the tokens the vocabulary and the added tokens define (ids must stay below "
         "{}); the file is damaged",
         where, token.content, token.id, id_bound);
  const AddedToken* other = added.find_by_id(token.id);
  if (other && other->content != token.content)
    fail(ErrorKind::kCorrupt, "{} ('{}') has id {}, which the added token '{}' already has; each id names one token",
         where, token.content, token.id, other->content);
}

// A JSON library error inside one part of tokenizer.json, named with the part.
template <typename Make>
auto in_part(const std::string& origin, const char* part, Make&& make) {
  try {
    return make();
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorKind::kCorrupt, "{}: \"{}\" is not valid: {}", origin, part, json_error_text(e));
  }
}

}  // namespace

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

std::unique_ptr<Tokenizer> Tokenizer::from_dir(const std::filesystem::path& dir) {
  std::filesystem::path tokenizer_path = dir / "tokenizer.json";
  std::filesystem::path config_path = dir / "tokenizer_config.json";
  std::string config_text = std::filesystem::exists(config_path) ? read_file(config_path) : std::string();
  return from_json_text(read_file(tokenizer_path), config_text, tokenizer_path.string(), config_path.string());
}

void Tokenizer::load_parts(const nlohmann::json& root, const std::string& origin) {
  if (!root.is_object() || !root.contains("model")) fail(ErrorKind::kCorrupt, "{}: it has no 'model'", origin);
  try {
    normalizer_ =
        in_part(origin, "normalizer", [&] { return make_normalizer(root.value("normalizer", nlohmann::json())); });
    pre_tokenizer_ = in_part(origin, "pre_tokenizer",
                             [&] { return make_pre_tokenizer(root.value("pre_tokenizer", nlohmann::json())); });
    bool byte_level = pre_tokenizer_ && pre_tokenizer_->is_byte_level();
    model_ = in_part(origin, "model", [&] { return std::make_unique<BpeModel>(root.at("model"), byte_level); });
    decoder_ = in_part(origin, "decoder", [&] { return make_decoder(root.value("decoder", nlohmann::json())); });
    special_frame_ = in_part(origin, "post_processor", [&] {
      return std::make_unique<SpecialTokenFrame>(parse_post_processor(root.value("post_processor", nlohmann::json())));
    });
  } catch (const Error& e) {
    if (std::string_view(e.what()).starts_with("tokenizer.json") || std::string_view(e.what()).starts_with(origin))
      throw;
    throw Error(e.kind(), fmt::format("{} is not a usable HF tokenizer: {}", origin, e.what()));
  }
}

// Added tokens of tokenizer.json, then those of tokenizer_config.json's added_tokens_decoder that it lacks
// (transformers reads both). Errors name the file the bad entry is in.
void Tokenizer::load_added_tokens(const nlohmann::json& root, const nlohmann::json& config, const std::string& origin,
                                  const std::string& config_origin) {
  auto added_list = root.find("added_tokens");
  if (added_list != root.end() && !added_list->is_null() && !added_list->is_array())
    fail(ErrorKind::kCorrupt, "{}: \"added_tokens\" must be a list", origin);
  auto decoder = config.find("added_tokens_decoder");
  if (decoder != config.end() && !decoder->is_null() && !decoder->is_object())
    fail(ErrorKind::kCorrupt, "{}: \"added_tokens_decoder\" must be an object keyed by token id", config_origin);
  size_t defined = model_->id_limit();
  if (added_list != root.end() && added_list->is_array()) defined += added_list->size();
  if (decoder != config.end() && decoder->is_object()) defined += decoder->size();
  const size_t id_bound = defined + kTokenIdMargin;
  if (added_list != root.end() && added_list->is_array()) {
    for (size_t i = 0; i < added_list->size(); ++i) {
      std::string where = fmt::format("{}: added_tokens[{}]", origin, i);
      AddedToken token = parse_added_token((*added_list)[i], std::nullopt, where);
      check_added_id(token, added_, id_bound, where);
      added_.add(token);
    }
  }
  if (decoder != config.end() && decoder->is_object()) {
    for (const auto& [key, entry] : decoder->items()) {
      std::string where = fmt::format("{}: added_tokens_decoder['{}']", config_origin, key);
      AddedToken token = parse_added_token(entry, decoder_key_id(key, where), where);
      if (added_.find_by_content(token.content)) continue;
      check_added_id(token, added_, id_bound, where);
      added_.add(token);
    }
  }
  added_.build(normalizer_.get());
}

// bos/eos from tokenizer_config.json, and the special tokens add_bos_token/add_eos_token ask for.
void Tokenizer::load_special_tokens(const nlohmann::json& config, const std::string& config_origin) {
  bos_token_ = special_token_name(config, "bos_token", config_origin);
  eos_token_ = special_token_name(config, "eos_token", config_origin);
  if (!bos_token_.empty()) bos_id_ = token_to_id(bos_token_);
  if (!eos_token_.empty()) eos_id_ = token_to_id(eos_token_);
  auto warn_if_unknown = [&](const char* key, const std::string& name, const std::optional<int32_t>& id) {
    if (!name.empty() && !id)
      TLOG_WARN(
          "{}: {} '{}' is not in the vocabulary or the added tokens; it is ignored (generation stops only at "
          "the config's eos_token_id and the request's stop conditions)",
          config_origin, key, name);
  };
  warn_if_unknown("bos_token", bos_token_, bos_id_);
  warn_if_unknown("eos_token", eos_token_, eos_id_);
  // transformers' add_bos_token/add_eos_token (LlamaTokenizerFast) add bos/eos unless the
  // post-processor already does.
  auto& frame = *special_frame_;
  auto truthy = [&](const char* key) {
    auto it = config.find(key);
    return it != config.end() && it->is_boolean() && it->get<bool>();
  };
  if (truthy("add_bos_token") && bos_id_ && (frame.prefix.empty() || frame.prefix.front() != *bos_id_)) {
    frame.prefix.insert(frame.prefix.begin(), *bos_id_);
  }
  if (truthy("add_eos_token") && eos_id_ && (frame.suffix.empty() || frame.suffix.back() != *eos_id_)) {
    frame.suffix.push_back(*eos_id_);
  }
}

std::unique_ptr<Tokenizer> Tokenizer::from_json_text(std::string_view tokenizer_json, std::string_view config_json,
                                                     const std::string& origin, const std::string& config_origin) {
  nlohmann::json root = parse_json(tokenizer_json, origin);
  nlohmann::json config = config_json.empty() ? nlohmann::json::object() : parse_json(config_json, config_origin);
  if (!config.is_object()) fail(ErrorKind::kCorrupt, "{}: not a JSON object", config_origin);
  std::unique_ptr<Tokenizer> tokenizer(new Tokenizer());
  Tokenizer& t = *tokenizer;
  t.load_parts(root, origin);
  t.load_added_tokens(root, config, origin, config_origin);
  t.vocab_size_ = t.model_->id_limit();
  for (const AddedToken& token : t.added_.tokens()) t.vocab_size_ = std::max(t.vocab_size_, size_t(token.id) + 1);
  t.load_special_tokens(config, config_origin);

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
