// Thread-safe cache of BPE results per pre-token: most text repeats a small set of words, and
// merging is the expensive step. Sharded so that concurrent encoders rarely contend.
#pragma once
#include <array>
#include <cstdint>
#include <shared_mutex>
#include <string_view>
#include <vector>

#include "tokenizer/string_map.h"

namespace tessera::tokenizer {

class BpeCache {
 public:
  explicit BpeCache(size_t capacity) : shard_capacity_(capacity / kShards + 1) {}

  // Appends the cached ids of `piece` to `ids` and returns true on a hit.
  bool lookup(std::string_view piece, std::vector<int32_t>& ids) const;
  // Remembers ids for `piece` unless its shard is full (then the result is simply not kept,
  // as in HF: a full cache stops growing rather than evicting).
  void insert(std::string_view piece, const int32_t* ids, size_t count);

  static constexpr size_t kMaxPieceBytes = 256;  // longer pieces are rare and not worth keeping

 private:
  static constexpr size_t kShards = 32;
  struct Shard {
    mutable std::shared_mutex mutex;
    StringMap<std::vector<int32_t>> entries;
  };
  Shard& shard_for(std::string_view piece) const { return shards_[StringHash{}(piece) % kShards]; }

  size_t shard_capacity_;
  mutable std::array<Shard, kShards> shards_;
};

}  // namespace tessera::tokenizer
