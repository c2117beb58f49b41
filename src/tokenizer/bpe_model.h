// The BPE model of tokenizer.json ("model": {"type": "BPE"}): vocabulary, ranked merges, and the
// merge loop that turns one pre-token into ids.
//
// For byte-level vocabularies (a ByteLevel pre-tokenizer) the model works on raw bytes: at load
// every token is mapped out of the GPT-2 byte alphabet, so encoding never builds byte-level strings.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tokenizer/bpe_cache.h"
#include "tokenizer/string_map.h"

namespace tessera::tokenizer {

// Token ids size per-id tables, so an id far past the tokens a file defines (an added token with id
// 10^8) would allocate gigabytes. Ids must stay below the number of tokens defined plus this margin,
// which leaves room for the gaps and reserved ranges of real vocabularies.
inline constexpr size_t kTokenIdMargin = 1 << 16;

class BpeModel {
 public:
  // Throws tessera::Error for a model that is not BPE, a merge of unknown tokens, an empty vocabulary, two
  // tokens with one id, an id at or past vocab size + kTokenIdMargin, and the like.
  BpeModel(const nlohmann::json& model, bool byte_level);

  // Appends the ids of one pre-token (raw text, not in the byte alphabet).
  void encode_piece(std::string_view piece, std::vector<int32_t>& ids) const;

  // The vocabulary as tokenizer.json spells it (byte-level tokens in the byte alphabet).
  std::optional<int32_t> token_to_id(std::string_view token) const;
  const std::string* id_to_token(int32_t id) const;
  // One past the largest id in the vocabulary.
  size_t id_limit() const { return id_to_token_.size(); }
  bool byte_level() const { return byte_level_; }

 private:
  struct MergeResult {
    int32_t rank;
    int32_t merged_id;
  };
  std::optional<MergeResult> find_merge(int32_t left, int32_t right) const;
  void add_merge(int32_t left, int32_t right, int32_t rank, int32_t merged_id);
  void merge_symbols(std::string_view piece, std::vector<int32_t>& ids) const;
  void initial_symbols(std::string_view piece, std::vector<int32_t>& symbols) const;

  bool byte_level_;
  bool ignore_merges_ = false;
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  StringMap<int32_t> vocab_;           // as spelled in tokenizer.json
  StringMap<int32_t> piece_to_id_;     // keyed in the encoding domain (raw bytes when byte-level)
  std::array<int32_t, 256> byte_ids_;  // byte-level: id of each single byte; byte fallback: <0xXX>
  std::vector<std::string> id_to_token_;
  std::vector<uint8_t> id_present_;

  // Open-addressing table of merges keyed by the pair of ids (never erased, so no tombstones).
  struct MergeSlot {
    uint64_t key = ~uint64_t{0};
    MergeResult result{};
  };
  std::vector<MergeSlot> merges_;
  uint64_t merge_mask_ = 0;

  mutable BpeCache cache_{1 << 17};
};

}  // namespace tessera::tokenizer
