#include "model/layers/embedding.h"

#include <algorithm>

namespace tessera {

VocabParallelEmbedding::VocabParallelEmbedding(BlockContext& ctx, const std::string& name, int64_t vocab,
                                               int64_t hidden)
    : backend_(&ctx.backend),
      comm_(&ctx.comm),
      table_(&ctx.weights.declare(name, {vocab, hidden}, ParallelStyle::kVocab)) {}

void VocabParallelEmbedding::forward(const Tensor& ids, const Tensor& out, bool sampled_ids) const {
  if (comm_->tp_size() == 1 && !sampled_ids) {
    backend_->embedding(ids, *table_, out);
    return;
  }
  backend_->embedding_slice(ids, *table_, comm_->tp_rank() * table_->dim(0), out);
  if (comm_->tp_size() > 1) comm_->all_reduce(out);
}

ParallelLmHead::ParallelLmHead(BlockContext& ctx, const std::string& name, int64_t vocab, int64_t hidden, bool tied,
                               const std::string& embedding_name, bool embedding_here)
    : backend_(&ctx.backend), comm_(&ctx.comm), vocab_(vocab) {
  WeightStore& w = ctx.weights;
  weight_ = !tied            ? &w.declare(name, {vocab, hidden}, ParallelStyle::kVocab)
            : embedding_here ? &w.declare_tied(name, embedding_name)
                             : &w.declare(embedding_name, {vocab, hidden}, ParallelStyle::kVocab);
}

// Each rank computes the logits of its slice; TP rank 0 gathers the slices ([tp, n, Vr]) and
// lays out the vocabulary's columns as [n, V], leaving out the padding.
Tensor ParallelLmHead::forward(const Tensor& rows) const {
  Backend& be = *backend_;
  const int64_t n = rows.dim(0), V = vocab_, Vr = weight_->dim(0);
  if (comm_->tp_size() == 1) {
    Tensor logits = be.scratch({n, V}, DType::kF32);
    be.linear(rows, *weight_, nullptr, logits);
    return logits;
  }
  const int tp = comm_->tp_size();
  Tensor local = be.scratch({n, Vr}, DType::kF32);
  be.linear(rows, *weight_, nullptr, local);
  const bool root = comm_->tp_rank() == 0;
  Tensor gathered = root ? be.scratch({tp * n, Vr}, DType::kF32) : Tensor();
  comm_->gather_to_first(local, gathered);
  if (!root) return Tensor();
  Tensor logits = be.scratch({n, V}, DType::kF32);
  for (int r = 0; r < tp; ++r) {
    const int64_t width = std::clamp<int64_t>(V - r * Vr, 0, Vr);
    if (width == 0) continue;
    for (int64_t i = 0; i < n; ++i) {
      Tensor dst(logits.storage(), logits.offset_bytes() + static_cast<size_t>(i * V + r * Vr) * 4, Shape{width},
                 DType::kF32);
      Tensor src(gathered.storage(), gathered.offset_bytes() + static_cast<size_t>((r * n + i) * Vr) * 4, Shape{width},
                 DType::kF32);
      be.copy(dst, src);
    }
  }
  return logits;
}

}  // namespace tessera
