#include "tokenizer/bpe_cache.h"

#include <mutex>

namespace tessera::tokenizer {

bool BpeCache::lookup(std::string_view piece, std::vector<int32_t>& ids) const {
  if (piece.size() > kMaxPieceBytes) return false;
  Shard& shard = shard_for(piece);
  std::shared_lock lock(shard.mutex);
  auto it = shard.entries.find(piece);
  if (it == shard.entries.end()) return false;
  ids.insert(ids.end(), it->second.begin(), it->second.end());
  return true;
}

void BpeCache::insert(std::string_view piece, const int32_t* ids, size_t count) {
  if (piece.size() > kMaxPieceBytes) return;
  Shard& shard = shard_for(piece);
  std::unique_lock lock(shard.mutex);
  if (shard.entries.size() >= shard_capacity_) return;
  shard.entries.try_emplace(std::string(piece), ids, ids + count);
}

}  // namespace tessera::tokenizer
