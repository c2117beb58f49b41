// The sampling family of the CUDA backend: sampling (backend/sampling.h's rule), argmax (of whole
// rows, and of vocabulary shards with their merge: tensor parallelism's greedy rows), and
// speculative decoding's acceptance and draft positions on the device (graph-safe).
#pragma once
#include <vector>

#include "backend/cuda/cuda_device.h"

namespace tessera::cuda {

class SamplingOps {
 public:
  explicit SamplingOps(CudaDevice& dev) : dev_(dev) {}
  void sample(const Tensor& logits, const std::vector<SamplingRow>& rows, const Tensor& out);
  void argmax(const Tensor& logits, const Tensor& out);
  void shard_argmax(const Tensor& logits, int64_t width, int64_t first, const Tensor& out);
  void merge_shard_argmax(const Tensor& pairs, const Tensor& rows, const Tensor& logits);
  void apply_token_mask(const Tensor& logits, const Tensor& mask, const Tensor& rows);
  void accept_drafts(const Tensor& sampled, const Tensor& tokens, int q, const Tensor& rows);
  void draft_positions(const Tensor& rows, const Tensor& positions, const Tensor& slot_mapping,
                       const Tensor& block_tables, int q, int block_size, int ahead, const Tensor& out_positions,
                       const Tensor& out_slots, const Tensor& out_seq_lens);

 private:
  CudaDevice& dev_;
  Tensor greedy_rows_;  // argmax: default SamplingRows (temperature 0), grown outside graphs
  int64_t greedy_rows_n_ = 0;
};

}  // namespace tessera::cuda
