// The model side of MTP speculative decoding on one rank (MtpProposer's counterpart in the
// runner): the MTP layer's passes over the hidden states a step left on the device, its two
// graph families with their input buffers, and the hidden-state buffer itself. A ModelRunner
// whose model has an MTP layer owns one (ModelRunner::mtp); the executors and workers call it.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <vector>

#include "engine/model_runner.h"

namespace tessera {

class MtpDrafter {
 public:
  explicit MtpDrafter(ModelRunner& runner);
  // After the runner's cache and step graphs are set up: drops the graphs, reserves the hidden
  // states of the largest graphed step, and lays out the drafting graphs' buffer where the step's
  // graphs are on and speculation verifies drafts (graph_query_len > 1), for batches up to
  // max_graph_batch() (0: none).
  void init(int max_graph_batch);
  int max_graph_batch() const { return max_b_; }
  // The rows of the hidden-state buffer a step of `rows` rows writes (its bucket's on a graphed
  // step), `tokens` of them real; growing the buffer drops every graph that writes into it.
  Tensor step_hidden(int64_t rows, int64_t tokens);

  // The MTP passes of `in` over the last step's hidden states (MtpDraftInput): the greedy drafts,
  // i32 [passes, W] in scratch memory: row j, column i < in.num_drafting is draft j + 1 of
  // drafting sequence i (W >= num_drafting: a graph's bucket). After a step whose sequences all
  // had q rows and all draft (MtpProposer's uniform pass 1), the passes replay a captured graph
  // (one per (bucket, q, passes)) where the step's graphs are on.
  Tensor draft(const MtpDraftInput& in);
  // The step and its drafting with no host round trip between them (MtpStepResult). `in` must
  // pass step_fusable: every sequence q rows (decode, or the verification of q - 1 drafts), the
  // logits of every row. After the step, `sample` draws the rows' tokens into the tensor it is
  // given; then, on the device: accept_drafts, the MTP pass over every row of the step (its
  // tokens: the sampled ones; a row past a sequence's accepted ones computes what a later pass
  // overwrites) and `passes` - 1 chained passes from each sequence's accepted row
  // (draft_positions), with one download of the tokens, the accepted counts and the drafts at the
  // end. Graphed steps replay one captured graph for the drafting per (bucket, q, passes), up to
  // max_graph_batch(); other steps run the same ops eagerly.
  bool step_fusable(const ModelInput& in) const;
  using SampleFn = std::function<void(const Tensor& logits, const Tensor& ids)>;
  void run_with_step(const ModelInput& in, int passes, const SampleFn& sample, MtpStepResult& result);

 private:
  // The passes themselves (eager and captured alike): drafts i32 [passes, S_rows] (into
  // `drafts_out` [passes * S_rows] when given).
  Tensor passes(StepInputs& first, const Tensor& hidden, std::vector<StepInputs>& chained, int64_t S_rows,
                const Tensor* drafts_out = nullptr);
  // The drafting after a step as one graph: inputs laid out at init (first_, chained_, orders).
  bool graphable(const MtpDraftInput& in, int& b, int& q) const;
  Tensor draft_graph(const MtpDraftInput& in, int b, int q);
  // run_with_step's device buffer: per call, one i32 region laid out for W sequences of up to Q
  // rows and P passes (a graph's W, Q, P are the largest it may take, so its offsets stay put).
  struct FusedLayout {
    int64_t ids = 0, rows = 0, drafts = 0, order1 = 0, order2 = 0, qsl = 0, lidx = 0, chain = 0, end = 0;
  };
  static FusedLayout fused_layout(int64_t W, int64_t Q, int64_t P);
  // Sizes fused_buf_ for L and uploads the arrays that follow from the shape (W, q) alone.
  void prepare_fused(const FusedLayout& L, int64_t W, int q);
  // The device work after the step's sampling, for W rows of q (host_copies: fill the chained
  // passes' host arrays from the device, eager runs only).
  Tensor fused_drafting(const StepInputs& step, const FusedLayout& L, int64_t W, int q, int passes, bool host_copies);
  // The result of a fused step from fused_buf_ (one download).
  void download_fused(const FusedLayout& L, int64_t W, int S, int T, int q, int passes, MtpStepResult& result);
  void reserve_hidden(int64_t rows);

  ModelRunner& runner_;
  Model& model_;
  Backend& backend_;
  // The drafting after a step: batches up to max_b_; pass 1 (q rows a sequence), then the chained
  // passes (positions, KV slots, lengths; pass 1's block tables), the fc orders of both, pass 1's
  // block tables last, in one buffer; graphs by (bucket, q, passes).
  int max_b_ = 0;
  ModelRunner::GraphLayout first_;
  std::vector<ModelRunner::GraphLayout> chained_;
  int64_t order_first_ = 0, order_chained_ = 0;
  Tensor buf_;
  std::vector<int32_t> h_buf_;
  ModelRunner::GraphFamily graphs_;
  // The drafting with a step: its buffer (FusedLayout) and graphs by (bucket, q, passes).
  Tensor fused_buf_;
  ModelRunner::GraphFamily fused_graphs_;
  std::vector<int32_t> h_fused_;           // host side of its uploads and of its download
  std::array<int64_t, 5> fused_consts_{};  // (W, q, offsets) of the shape constants on the device
  // The last step's final hidden states ([hidden_rows_, H]), last_tokens_ of them real.
  Tensor hidden_;
  int64_t hidden_rows_ = 0, last_tokens_ = 0;
};

}  // namespace tessera
