#include "model/layers/embedding.h"

#include <algorithm>
#include <vector>

#include "core/error.h"

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

// Each rank computes the logits of its slice and sends TP rank 0 one message: the slices of the
// whole rows ([f, Vr]), then the argmax rows' (max, id) pairs ([m, 2] i32 words). TP rank 0 lays
// out the vocabulary's columns of the whole rows as [n, V], leaving out the padding, and writes
// the argmax rows as stand-in rows with their greedy pick.
Tensor ParallelLmHead::forward(const Tensor& rows, bool argmax_all, std::span<const int32_t> argmax_rows) const {
  Backend& be = *backend_;
  const int64_t n = rows.dim(0), V = vocab_, Vr = weight_->dim(0);
  if (comm_->tp_size() == 1) {
    Tensor logits = be.scratch({n, V}, DType::kF32);
    be.linear(rows, *weight_, nullptr, logits);
    return logits;
  }
  const int tp = comm_->tp_size(), rank = comm_->tp_rank();
  Tensor local = be.scratch({n, Vr}, DType::kF32);
  be.linear(rows, *weight_, nullptr, local);
  // The whole rows and the argmax rows, by row number (host).
  std::vector<int32_t> whole, picks;
  if (!argmax_all) {
    size_t next = 0;
    for (int32_t i = 0; i < static_cast<int32_t>(n); ++i) {
      const bool pick = next < argmax_rows.size() && argmax_rows[next] == i;
      (pick ? picks : whole).push_back(i);
      next += pick ? 1 : 0;
    }
    TESSERA_CHECK(next == argmax_rows.size(), "lm_head: argmax rows must be ascending row numbers below {}", n);
  }
  const int64_t m = argmax_all ? n : static_cast<int64_t>(picks.size());
  const int64_t f = n - m, words = f * Vr + 2 * m;
  auto upload = [&](const std::vector<int32_t>& v) {
    Tensor t = be.scratch({static_cast<int64_t>(v.size())}, DType::kI32);
    be.copy_from_host(t, v.data());
    return t;
  };
  Tensor pack = local;
  if (m > 0) {
    pack = be.scratch({words}, DType::kF32);
    const Tensor pairs(pack.storage(), pack.offset_bytes() + static_cast<size_t>(f * Vr) * 4, Shape{m, 2}, DType::kI32);
    const int64_t width = std::clamp<int64_t>(V - rank * Vr, 0, Vr);
    if (f == 0) {
      be.shard_argmax(local, width, rank * Vr, pairs);
    } else {
      Tensor sub = be.scratch({m, Vr}, DType::kF32);
      be.gather_rows(local, upload(picks), sub);
      be.shard_argmax(sub, width, rank * Vr, pairs);
      be.gather_rows(local, upload(whole), pack.rows(0, f * Vr).view({f, Vr}));
    }
  }
  const bool root = rank == 0;
  Tensor gathered = root ? be.scratch({tp * words}, DType::kF32) : Tensor();
  comm_->gather_to_first(pack.view({words}), gathered);
  if (!root) return Tensor();
  Tensor logits = be.scratch({n, V}, DType::kF32);
  const size_t base = gathered.offset_bytes();
  for (int r = 0; r < tp; ++r) {
    const int64_t width = std::clamp<int64_t>(V - r * Vr, 0, Vr);
    if (width == 0) continue;
    for (int64_t i = 0; i < f; ++i) {
      const int64_t row = m == 0 ? i : whole[static_cast<size_t>(i)];
      Tensor dst(logits.storage(), logits.offset_bytes() + static_cast<size_t>(row * V + r * Vr) * 4, Shape{width},
                 DType::kF32);
      Tensor src(gathered.storage(), base + static_cast<size_t>(r * words + i * Vr) * 4, Shape{width}, DType::kF32);
      be.copy(dst, src);
    }
  }
  if (m == 0) return logits;
  // Every rank's pairs, [tp, m, 2]: as gathered when no whole row sits before them, else packed.
  Tensor pairs(gathered.storage(), base, Shape{tp, m, 2}, DType::kI32);
  if (f > 0) {
    pairs = be.scratch({tp, m, 2}, DType::kI32);
    for (int r = 0; r < tp; ++r)
      be.copy(
          pairs.rows(r, r + 1).view({2 * m}),
          Tensor(gathered.storage(), base + static_cast<size_t>(r * words + f * Vr) * 4, Shape{2 * m}, DType::kI32));
  }
  be.merge_shard_argmax(pairs, argmax_all || f == 0 ? Tensor() : upload(picks), logits);
  return logits;
}

}  // namespace tessera
