#pragma once
#include <cstdint>
#include <vector>

#include "engine/spec/proposer.h"

namespace tessera {

class Executor;

// Multi-token prediction (vLLM's mtp method for Qwen3-Next / Qwen3.5): the checkpoint's MTP layer
// (Model::run_mtp) drafts from the target's hidden states. After each step, one pass runs the
// layer over every position the step computed (token after each position, the target's final
// hidden state there), which writes the layer's KV for those positions (its cache holds every
// position the target has, prompt included) and gives each decoding sequence its first draft
// (greedy) at its last position; passes 2..k chain one token each on the previous draft and the
// layer's own normed output hidden state, writing KV at the draft positions (overwritten by a
// later pass once those positions are computed). The executor runs the passes on the device;
// only the drafts come back.
class MtpProposer : public Proposer {
 public:
  MtpProposer(Executor& executor, int block_size) : executor_(executor), block_size_(block_size) {}
  void observe_step(const std::vector<ComputedSpan>& spans) override { spans_ = spans; }
  bool needs_lookahead_slots() const override { return true; }
  bool needs_every_step() const override { return true; }
  void propose(const std::vector<Request*>& requests, const std::vector<int>& max_tokens) override;
  bool drafts_in_step() const override { return true; }
  void take_step_drafts(std::vector<const Request*> sequences, std::vector<int32_t> drafts, int passes) override;

 private:
  Executor& executor_;
  int block_size_;
  std::vector<ComputedSpan> spans_;
  std::vector<int32_t> drafts_;
  // take_step_drafts's, until the next propose().
  std::vector<const Request*> step_sequences_;
  int step_passes_ = -1;  // -1: none
};

}  // namespace tessera
