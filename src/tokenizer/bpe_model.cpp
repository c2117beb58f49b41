#include "tokenizer/bpe_model.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/utf8.h"

namespace tessera::tokenizer {
namespace {

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

uint64_t mix(uint64_t x) {  // splitmix64 finalizer: spreads pair keys over the table
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A merge is "a b" (older files) or ["a", "b"] (newer ones, which allow spaces in tokens).
std::pair<std::string, std::string> parse_merge(const nlohmann::json& merge, size_t rank) {
  if (merge.is_string()) {
    const std::string& text = merge.get_ref<const std::string&>();
    size_t space = text.find(' ', 1);
    if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos) {
      fail(ErrorKind::kCorrupt, "tokenizer.json: merge {} ('{}') is not two tokens separated by one space", rank, text);
    }
    return {text.substr(0, space), text.substr(space + 1)};
  }
  if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
    return {merge[0].get<std::string>(), merge[1].get<std::string>()};
  }
  fail(ErrorKind::kCorrupt, "tokenizer.json: merge {} is neither \"a b\" nor [\"a\", \"b\"]", rank);
}

}  // namespace

BpeModel::BpeModel(const nlohmann::json& model, bool byte_level) : byte_level_(byte_level) {
  const std::string type = model.value("type", "BPE");
  if (type != "BPE") fail(ErrorKind::kUnsupported, "tokenizer.json: model type '{}' is not supported (only BPE)", type);
  if (!model.contains("vocab") || !model.at("vocab").is_object()) {
    fail(ErrorKind::kCorrupt, "tokenizer.json: model.vocab is missing or not an object");
  }
  if (!model.value("dropout", nlohmann::json()).is_null() && model.at("dropout").get<double>() > 0) {
    fail(ErrorKind::kUnsupported, "tokenizer.json: BPE dropout is not supported");
  }
  for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto it = model.find(affix);
    if (it != model.end() && it->is_string() && !it->get_ref<const std::string&>().empty()) {
      fail(ErrorKind::kUnsupported, "tokenizer.json: BPE {} is not supported", affix);
    }
  }
  ignore_merges_ = model.value("ignore_merges", false);
  fuse_unk_ = model.value("fuse_unk", false);
  byte_fallback_ = model.value("byte_fallback", false);

  const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::get();
  const size_t entries = model.at("vocab").size();
  if (entries == 0) fail(ErrorKind::kCorrupt, "tokenizer.json: model.vocab is empty; the tokenizer has no tokens");
  const size_t id_bound = entries + kTokenIdMargin;
  vocab_.reserve(entries);
  piece_to_id_.reserve(entries);
  for (const auto& [token, id_json] : model.at("vocab").items()) {
    if (!id_json.is_number_integer() || id_json.get<int64_t>() < 0 || id_json.get<int64_t>() > INT32_MAX) {
      fail(ErrorKind::kCorrupt, "tokenizer.json: vocab entry '{}' has no valid id (a non-negative integer): {}", token,
           id_json.dump());
    }
    auto id = id_json.get<int32_t>();
    if (static_cast<size_t>(id) >= id_bound)
      fail(ErrorKind::kCorrupt,
           "tokenizer.json: vocab entry '{}' has id {}, far past the {} tokens model.vocab defines (ids must stay "
           "below {}); the file is damaged",
           token, id, entries, id_bound);
    vocab_.emplace(token, id);
    if (static_cast<size_t>(id) >= id_to_token_.size()) {
      id_to_token_.resize(id + 1);
      id_present_.resize(id + 1, 0);
    }
    if (id_present_[id])
      fail(ErrorKind::kCorrupt, "tokenizer.json: vocab entries '{}' and '{}' both have id {}; each id names one token",
           id_to_token_[id], token, id);
    id_to_token_[id] = token;
    id_present_[id] = 1;
    if (byte_level_) {
      // Tokens outside the byte alphabet can never come out of byte-level pieces; skip them.
      if (auto bytes = alphabet.to_bytes(token)) piece_to_id_.emplace(std::move(*bytes), id);
    } else {
      piece_to_id_.emplace(token, id);
    }
  }

  byte_ids_.fill(-1);
  for (int b = 0; b < 256; ++b) {
    std::string key = byte_level_ ? std::string(1, static_cast<char>(b)) : fmt::format("<0x{:02X}>", b);
    auto it = (byte_level_ ? piece_to_id_ : vocab_).find(key);
    if (it != (byte_level_ ? piece_to_id_ : vocab_).end()) byte_ids_[b] = it->second;
  }

  if (auto unk = model.find("unk_token"); unk != model.end() && unk->is_string()) {
    auto it = vocab_.find(unk->get<std::string>());
    if (it == vocab_.end())
      fail(ErrorKind::kCorrupt, "tokenizer.json: unk_token '{}' is not in the vocab", unk->get<std::string>());
    unk_id_ = it->second;
  }

  const nlohmann::json& merges = model.contains("merges") ? model.at("merges") : nlohmann::json::array();
  size_t capacity = 16;
  while (capacity < merges.size() * 2) capacity <<= 1;
  merges_.assign(capacity, MergeSlot{});
  merge_mask_ = capacity - 1;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    auto [left, right] = parse_merge(merges[rank], rank);
    auto left_it = vocab_.find(left);
    auto right_it = vocab_.find(right);
    auto merged_it = vocab_.find(left + right);
    if (left_it == vocab_.end() || right_it == vocab_.end() || merged_it == vocab_.end()) {
      fail(ErrorKind::kCorrupt, "tokenizer.json: merge {} ('{}' + '{}') uses a token that is not in the vocab", rank,
           left, right);
    }
    // A pair listed twice keeps its first (lowest) rank, as HF's HashMap insert order implies.
    if (!find_merge(left_it->second, right_it->second)) {
      add_merge(left_it->second, right_it->second, static_cast<int32_t>(rank), merged_it->second);
    }
  }
}

void BpeModel::add_merge(int32_t left, int32_t right, int32_t rank, int32_t merged_id) {
  uint64_t key = pair_key(left, right);
  for (uint64_t slot = mix(key) & merge_mask_;; slot = (slot + 1) & merge_mask_) {
    if (merges_[slot].key == ~uint64_t{0}) {
      merges_[slot] = {key, {rank, merged_id}};
      return;
    }
  }
}

std::optional<BpeModel::MergeResult> BpeModel::find_merge(int32_t left, int32_t right) const {
  uint64_t key = pair_key(left, right);
  for (uint64_t slot = mix(key) & merge_mask_;; slot = (slot + 1) & merge_mask_) {
    const MergeSlot& entry = merges_[slot];
    if (entry.key == key) return entry.result;
    if (entry.key == ~uint64_t{0}) return std::nullopt;
  }
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || !id_present_[id]) return nullptr;
  return &id_to_token_[id];
}

void BpeModel::initial_symbols(std::string_view piece, std::vector<int32_t>& symbols) const {
  if (byte_level_) {
    for (char c : piece) {
      int32_t id = byte_ids_[static_cast<uint8_t>(c)];
      if (id >= 0) symbols.push_back(id);  // a byte missing from the vocab is dropped, as HF does
    }
    return;
  }
  // Character-level start: each UTF-8 character is a symbol; unknown ones fall back to bytes
  // (<0xXX> tokens) or the unk token, or are dropped.
  bool previous_unknown = false;
  size_t i = 0;
  while (i < piece.size()) {
    size_t length = std::max<size_t>(valid_sequence_length(piece, i), 1);
    std::string_view character = piece.substr(i, length);
    i += length;
    if (auto it = piece_to_id_.find(character); it != piece_to_id_.end()) {
      symbols.push_back(it->second);
      previous_unknown = false;
    } else if (byte_fallback_ && std::all_of(character.begin(), character.end(),
                                             [&](char c) { return byte_ids_[static_cast<uint8_t>(c)] >= 0; })) {
      for (char c : character) symbols.push_back(byte_ids_[static_cast<uint8_t>(c)]);
      previous_unknown = false;
    } else if (unk_id_) {
      if (!(fuse_unk_ && previous_unknown)) symbols.push_back(*unk_id_);
      previous_unknown = true;
    }
  }
}

void BpeModel::merge_symbols(std::string_view piece, std::vector<int32_t>& ids) const {
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    bool alive;
  };
  struct Candidate {
    int32_t rank;
    int32_t position;
    int32_t merged_id;
    bool operator>(const Candidate& other) const {
      return rank != other.rank ? rank > other.rank : position > other.position;
    }
  };
  thread_local std::vector<int32_t> start_ids;
  thread_local std::vector<Symbol> symbols;
  thread_local std::vector<Candidate> queue;  // a min-heap through std::push_heap/pop_heap
  start_ids.clear();
  initial_symbols(piece, start_ids);
  const auto n = static_cast<int32_t>(start_ids.size());
  if (n <= 1) {
    ids.insert(ids.end(), start_ids.begin(), start_ids.end());
    return;
  }
  symbols.clear();
  for (int32_t i = 0; i < n; ++i) symbols.push_back({start_ids[i], i - 1, i + 1 < n ? i + 1 : -1, true});

  // Lowest rank first, leftmost on ties: HF's Word::merge_all.
  queue.clear();
  auto push = [&](Candidate candidate) {
    queue.push_back(candidate);
    std::push_heap(queue.begin(), queue.end(), std::greater<>{});
  };
  for (int32_t i = 0; i + 1 < n; ++i) {
    if (auto merge = find_merge(symbols[i].id, symbols[i + 1].id)) push({merge->rank, i, merge->merged_id});
  }
  while (!queue.empty()) {
    std::pop_heap(queue.begin(), queue.end(), std::greater<>{});
    Candidate top = queue.back();
    queue.pop_back();
    Symbol& left = symbols[top.position];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    // Skip candidates made stale by an earlier merge of either neighbour.
    auto current = find_merge(left.id, right.id);
    if (!current || current->merged_id != top.merged_id) continue;
    left.id = top.merged_id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.position;
    if (left.prev >= 0) {
      if (auto merge = find_merge(symbols[left.prev].id, left.id)) push({merge->rank, left.prev, merge->merged_id});
    }
    if (left.next >= 0) {
      if (auto merge = find_merge(left.id, symbols[left.next].id)) push({merge->rank, top.position, merge->merged_id});
    }
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) ids.push_back(symbols[i].id);
}

void BpeModel::encode_piece(std::string_view piece, std::vector<int32_t>& ids) const {
  if (piece.empty()) return;
  if (ignore_merges_) {
    if (auto it = piece_to_id_.find(piece); it != piece_to_id_.end()) {
      ids.push_back(it->second);
      return;
    }
  }
  if (piece.size() == 1 && byte_level_ && byte_ids_[static_cast<uint8_t>(piece[0])] >= 0) {
    ids.push_back(byte_ids_[static_cast<uint8_t>(piece[0])]);
    return;
  }
  if (cache_.lookup(piece, ids)) return;
  size_t first = ids.size();
  merge_symbols(piece, ids);
  cache_.insert(piece, ids.data() + first, ids.size() - first);
}

}  // namespace tessera::tokenizer
