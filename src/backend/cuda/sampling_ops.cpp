// SamplingOps (sampling_ops.h).
#include "backend/cuda/sampling_ops.h"

#include <algorithm>
#include <string>
#include <vector>

#include "backend/cuda/cuda_ops.h"

namespace tessera::cuda {

void SamplingOps::sample(const Tensor& logits, const std::vector<SamplingRow>& rows, const Tensor& out) {
  CUDA_REQUIRE(logits.dtype() == DType::kF32 && logits.ndim() == 2 && out.dtype() == DType::kI32 &&
                   out.numel() == logits.dim(0) && static_cast<int64_t>(rows.size()) == logits.dim(0),
               "sample", logits.str() + " -> " + out.str());
  dev_.need_cuda(logits, "sample");
  dev_.need_cuda(out, "sample");
  dev_.bind();
  if (rows.empty()) return;
  Tensor dev_rows = dev_.scratch({static_cast<int64_t>(rows.size() * sizeof(SamplingRow))}, DType::kU8);
  dev_.copy_from_host(dev_rows, rows.data());
  launch_sample(logits.data<float>(), logits.dim(0), logits.dim(1), dev_rows.raw(), out.data<int32_t>(), dev_.stream());
}
void SamplingOps::argmax(const Tensor& logits, const Tensor& out) {
  CUDA_REQUIRE(
      logits.dtype() == DType::kF32 && logits.ndim() == 2 && out.dtype() == DType::kI32 && out.numel() == logits.dim(0),
      "argmax", logits.str() + " -> " + out.str());
  dev_.need_cuda(logits, "argmax");
  dev_.need_cuda(out, "argmax");
  dev_.bind();
  const int64_t n = logits.dim(0);
  if (n == 0) return;
  if (greedy_rows_n_ < n) {  // greedy sampling rows kept on the device (grown outside graphs)
    TESSERA_CHECK(!dev_.capturing(), "argmax: {} rows while capturing a graph, {} prepared", n, greedy_rows_n_);
    const int64_t rows = std::max<int64_t>(n, 256);
    greedy_rows_ = dev_.alloc({rows * static_cast<int64_t>(sizeof(SamplingRow))}, DType::kU8);
    const std::vector<SamplingRow> greedy(static_cast<size_t>(rows));
    dev_.copy_from_host(greedy_rows_, greedy.data());
    greedy_rows_n_ = rows;
  }
  launch_sample(logits.data<float>(), n, logits.dim(1), greedy_rows_.raw(), out.data<int32_t>(), dev_.stream());
}
void SamplingOps::shard_argmax(const Tensor& logits, int64_t width, int64_t first, const Tensor& out) {
  CUDA_REQUIRE(logits.dtype() == DType::kF32 && logits.ndim() == 2 && out.dtype() == DType::kI32 &&
                   out.numel() == 2 * logits.dim(0) && width >= 0 && width <= logits.dim(1) && first >= 0,
               "shard_argmax", logits.str() + " -> " + out.str());
  dev_.need_cuda(logits, "shard_argmax");
  dev_.need_cuda(out, "shard_argmax");
  dev_.bind();
  launch_shard_argmax(logits.data<float>(), logits.dim(0), logits.dim(1), width, first, out.data<int32_t>(),
                      dev_.stream());
}
void SamplingOps::merge_shard_argmax(const Tensor& pairs, const Tensor& rows, const Tensor& logits) {
  CUDA_REQUIRE(pairs.ndim() == 3 && pairs.dtype() == DType::kI32 && pairs.dim(2) == 2 && logits.ndim() == 2 &&
                   logits.dtype() == DType::kF32 &&
                   (rows.defined() ? rows.dtype() == DType::kI32 && rows.numel() == pairs.dim(1)
                                   : pairs.dim(1) <= logits.dim(0)),
               "merge_shard_argmax", pairs.str() + ", " + logits.str());
  dev_.need_cuda(pairs, "merge_shard_argmax");
  dev_.need_cuda(logits, "merge_shard_argmax");
  if (rows.defined()) dev_.need_cuda(rows, "merge_shard_argmax");
  dev_.bind();
  launch_merge_shard_argmax(pairs.data<int32_t>(), static_cast<int>(pairs.dim(0)), pairs.dim(1),
                            rows.defined() ? rows.data<int32_t>() : nullptr, logits.data<float>(), logits.dim(1),
                            dev_.stream());
}
void SamplingOps::apply_token_mask(const Tensor& logits, const Tensor& mask, const Tensor& rows) {
  const int64_t m = rows.numel();
  CUDA_REQUIRE(logits.ndim() == 2 && logits.dtype() == DType::kF32 && mask.ndim() == 2 && mask.dtype() == DType::kI32 &&
                   rows.dtype() == DType::kI32 && mask.dim(0) == m,
               "apply_token_mask", logits.str() + ", " + mask.str() + ", " + rows.str());
  for (const Tensor* t : {&logits, &mask, &rows}) dev_.need_cuda(*t, "apply_token_mask");
  dev_.bind();
  launch_apply_token_mask(logits.data<float>(), logits.dim(1), reinterpret_cast<const uint32_t*>(mask.data<int32_t>()),
                          m, mask.dim(1), rows.data<int32_t>(), dev_.stream());
}
void SamplingOps::accept_drafts(const Tensor& sampled, const Tensor& tokens, int q, const Tensor& rows) {
  const int64_t S = rows.numel();
  CUDA_REQUIRE(q >= 1 && sampled.dtype() == DType::kI32 && tokens.dtype() == DType::kI32 &&
                   rows.dtype() == DType::kI32 && sampled.numel() >= S * q && tokens.numel() >= S * q,
               "accept_drafts", sampled.str() + ", " + tokens.str() + " -> " + rows.str());
  for (const Tensor* t : {&sampled, &tokens, &rows}) dev_.need_cuda(*t, "accept_drafts");
  dev_.bind();
  launch_accept_drafts(sampled.data<int32_t>(), tokens.data<int32_t>(), static_cast<int>(S), q, rows.data<int32_t>(),
                       dev_.stream());
}
void SamplingOps::draft_positions(const Tensor& rows, const Tensor& positions, const Tensor& slot_mapping,
                                  const Tensor& block_tables, int q, int block_size, int ahead,
                                  const Tensor& out_positions, const Tensor& out_slots, const Tensor& out_seq_lens) {
  const int64_t S = rows.numel();
  CUDA_REQUIRE(q >= 1 && block_size > 0 && block_tables.ndim() == 2 && block_tables.dim(0) >= S &&
                   positions.numel() >= S * q && slot_mapping.numel() >= S * q && out_positions.numel() == S &&
                   out_slots.numel() == S && out_seq_lens.numel() == S,
               "draft_positions", rows.str() + ", " + positions.str() + ", " + block_tables.str());
  for (const Tensor* t : {&rows, &positions, &slot_mapping, &block_tables, &out_positions, &out_slots, &out_seq_lens})
    dev_.need_cuda(*t, "draft_positions");
  dev_.bind();
  launch_draft_positions(rows.data<int32_t>(), positions.data<int32_t>(), slot_mapping.data<int32_t>(),
                         block_tables.data<int32_t>(), static_cast<int>(S), q, static_cast<int>(block_tables.dim(1)),
                         block_size, ahead, out_positions.data<int32_t>(), out_slots.data<int32_t>(),
                         out_seq_lens.data<int32_t>(), dev_.stream());
}

}  // namespace tessera::cuda
