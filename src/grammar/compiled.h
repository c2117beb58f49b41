// A grammar bound to a vocabulary: the vocabulary as a byte trie, and per automaton state (a "position")
// the tokens accepted or rejected whatever the stack below holds, plus the few whose fate depends on it
// (checked against the real stack when a mask is filled).
#pragma once
#include <memory>
#include <mutex>
#include <vector>

#include "grammar/fsm.h"
#include "grammar/grammar.h"

namespace tessera::grammar {

// The vocabulary's non-special, non-empty tokens sorted by bytes, as a trie in preorder: node i has
// `byte`, `depth` (1 for the first byte) and `end` (one past its subtree); `token` is the id ending there
// or -1 (further ids with the same bytes, rare, are chained through same_bytes_next).
struct VocabIndex {
  std::vector<uint8_t> byte;
  std::vector<uint16_t> depth;
  std::vector<int32_t> end;
  std::vector<int32_t> token;
  std::vector<uint8_t> has_duplicates;   // per node: further ids have the same bytes
  std::vector<int32_t> same_bytes_next;  // per id
  std::vector<uint32_t> valid_mask;      // ids that can ever match text
  size_t max_depth = 0;
  size_t mask_words = 0;
};

// Built once per TokenizerInfo object and shared by every grammar compiled against it.
std::shared_ptr<const VocabIndex> vocab_index(const std::shared_ptr<const TokenizerInfo>& tokenizer);

struct PositionTable {
  enum class Kind : uint8_t { kAcceptedIds, kExcludedIds, kAcceptedBits };
  Kind kind = Kind::kAcceptedIds;
  std::vector<int32_t> ids;        // kAcceptedIds: accepted; kExcludedIds: all valid ids but these are accepted
  std::vector<uint32_t> bits;      // kAcceptedBits
  std::vector<int32_t> uncertain;  // ids in byte order: decided against the real stack
};

class CompiledGrammar {
 public:
  CompiledGrammar(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenizerInfo> tokenizer,
                  const CompileLimits& limits);

  const Fsm& fsm() const { return *fsm_; }
  const TokenizerInfo& tokenizer() const { return *tokenizer_; }
  const VocabIndex& vocab() const { return *vocab_; }
  size_t mask_words() const { return mask_words_; }
  const std::vector<uint32_t>& stop_mask() const { return stop_mask_; }
  bool is_stop(int32_t id) const;
  // The table of a reachable state with byte edges; built on first use when compile did not reach it.
  const PositionTable& table(int32_t state) const;
  size_t eager_tables() const { return eager_tables_; }

 private:
  void build_table(int32_t state, PositionTable& out) const;

  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const TokenizerInfo> tokenizer_;
  std::shared_ptr<const VocabIndex> vocab_;
  std::shared_ptr<const Fsm> fsm_;
  size_t mask_words_ = 0;
  std::vector<uint32_t> stop_mask_;
  std::vector<int32_t> stop_ids_;
  mutable std::vector<std::unique_ptr<PositionTable>> tables_;
  std::unique_ptr<std::once_flag[]> once_;
  size_t eager_tables_ = 0;
};

}  // namespace tessera::grammar
