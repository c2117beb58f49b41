// The vocab-parallel embedding and lm_head. Each TP rank holds rows [r * Vr, (r + 1) * Vr)
// of the table, the vocabulary padded up to a multiple of the TP size (vocab_rows_per_rank);
// padded rows are zeros, and their logits are never returned.
#pragma once
#include <span>
#include <string>

#include "model/layers/block.h"

namespace tessera {

class VocabParallelEmbedding {
 public:
  VocabParallelEmbedding() = default;
  VocabParallelEmbedding(BlockContext& ctx, const std::string& name, int64_t vocab, int64_t hidden);
  // out[T,H] = table[ids[t]] (each rank looks up its slice, the TP all-reduce completes the rows).
  // sampled_ids: ids the device sampled itself (MTP drafting), where -1 marks a row whose logits
  // held NaN (Backend::sample): such rows become zeros rather than failing the step (the engine
  // fails that request alone); otherwise an id outside the vocabulary fails the step.
  void forward(const Tensor& ids, const Tensor& out, bool sampled_ids = false) const;

 private:
  Backend* backend_ = nullptr;
  ModelComm* comm_ = nullptr;
  const Tensor* table_ = nullptr;
};

class ParallelLmHead {
 public:
  ParallelLmHead() = default;
  // Untied: reads `name`. Tied to `embedding_name`: shares the embedding's table when this
  // rank declared it (`embedding_here`), else reads that table itself (a last pipeline stage
  // that does not embed).
  ParallelLmHead(BlockContext& ctx, const std::string& name, int64_t vocab, int64_t hidden, bool tied,
                 const std::string& embedding_name, bool embedding_here);
  // f32 logits [n, vocab] of rows [n, H] on TP rank 0; an undefined tensor on the others.
  // Argmax rows (all of them, or those `argmax_rows` lists, ascending) need only their greedy
  // pick: under TP each rank sends its slice's (max, id) for them (Backend::shard_argmax) in the
  // same gather as the other rows' slices, and TP rank 0 writes them as stand-in rows with that
  // pick (Backend::merge_shard_argmax). At TP 1 every row is whole.
  Tensor forward(const Tensor& rows, bool argmax_all = false, std::span<const int32_t> argmax_rows = {}) const;

 private:
  Backend* backend_ = nullptr;
  ModelComm* comm_ = nullptr;
  const Tensor* weight_ = nullptr;
  int64_t vocab_ = 0;
};

}  // namespace tessera
