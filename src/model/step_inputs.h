// One step's inputs, declared once (docs/engine.md, "Step inputs"). Every per-step array of a
// ModelInput is one row of kStepArrays, and the three places that move a step's data derive
// from that list: the step plan (engine/step_plan.cpp) writes and reads the arrays in this
// order, upload_step_inputs copies them to the device for an eager forward, and the engine's
// ModelRunner lays out its CUDA graph input buffer and fills it from them. A new per-step
// field is a member of ModelInput (and StepInputs, when the forward reads it on the device)
// and a row here.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/attention_metadata.h"
#include "backend/backend.h"

namespace tessera {

// One step's work: the tokens of every scheduled sequence, flattened.
struct ModelInput {
  std::vector<int32_t> token_ids;       // T
  std::vector<int32_t> positions;       // T
  AttentionLayout attention;            // per-sequence layout over the paged cache
  std::vector<int32_t> logits_indices;  // token rows whose next-token logits are wanted
  // Models with kStateSlot layers: each sequence's state slot and whether it continues from
  // the slot's state (same sequence order as `attention`); empty for the other models.
  LinearAttnLayout linear;
  // State-slot copies to make before the forward, as (src slot, dst slot) pairs flattened:
  // every kStateSlot layer's conv and recurrent state rows (prefix-cache checkpoints saved
  // and restored). The engine's ModelRunner applies them; forward() never sees them.
  std::vector<int32_t> state_copies;
};

// One step's inputs on the model's device: what forward() uploads from a ModelInput, and
// what a captured graph reads (the engine's ModelRunner keeps them in fixed buffers).
struct StepInputs {
  Tensor token_ids;       // i32 [T]
  Tensor positions;       // i32 [T]
  Tensor logits_indices;  // i32 [n]
  AttentionMetadata attention;
  LinearAttnMetadata linear;  // num_seqs == 0 for models without kStateSlot layers
  // An output, not an input: when defined ([T, H] in the compute dtype), a model with an MTP
  // layer writes the step's final hidden states (after the final norm) here (Model::has_mtp).
  Tensor hidden_states;
  // MTP passes (Model::run_mtp): i32 [2T], the rows (t, T + t) interleaved that make fc's input
  // of [normed embeddings; normed hidden states]; undefined: run_mtp uploads them.
  Tensor mtp_fc_order;
  // Logits rows whose caller reads only their greedy pick (argmax, or sampling at temperature 0:
  // no logprobs, penalties or masks): every row (argmax_all; a captured graph's steps), or those
  // listed (ascending row numbers of logits_indices, on the host). Where the model gathers its
  // logits from vocabulary shards (Model::shards_logits) such a row travels as each shard's
  // (max, id) instead of its slice and comes back as a stand-in row with the same greedy pick
  // (Backend::merge_shard_argmax); elsewhere every row is whole.
  bool argmax_all = false;
  std::vector<int32_t> argmax_rows;
};

// How many entries an array has, in the step's T tokens, S sequences (seq_lens) and the
// attention layout's max_blocks_per_seq and G KV cache groups (num_kv_groups).
enum class StepExtent : uint8_t {
  kTokens,       // T
  kGroupTokens,  // G x T (a slot per token in each KV cache group)
  kSeqs,         // S
  kSeqsPlusOne,  // S + 1 (query start offsets)
  kBlockTable,   // G x S x max_blocks_per_seq
  kAnyCount,     // a count of its own (logits rows)
  kPairs,        // an even count of its own (state copies)
};

// What a graph's input buffer holds for an array. A graphed step gives every sequence the same
// number q of new tokens and wants the logits of all of them: pure decode (q = 1) or the
// verification of q - 1 drafts per sequence (speculative decoding). At bucket B, T = n = B * q.
enum class GraphInput : uint8_t {
  kPerRow,      // a token's or a sequence's entry (B * q or B; per KV cache group: G of those one after the
                // other), rewritten every step; padding rows hold `pad`
  kBlockTable,  // G x B rows of the buffer's block-table width, rewritten every step; padding rows 0
  kShape,       // from the shape alone: query starts s * q, logits rows 0, 1, 2, ...
  kNone,        // not read by the forward (state copies, applied before it)
};
// StepArray::pad of seq_lens: a padding sequence is as long as its q query tokens (they read
// cached keys of block 0).
inline constexpr int32_t kPadQueryLen = -1000;

struct StepArray {
  const char* name;
  StepExtent extent;
  bool optional;  // empty for models that do not use it (the linear-attention layout)
  GraphInput graph;
  int32_t pad;  // GraphInput::kPerRow: a padding row's value (kPadQueryLen: the step's q)
  std::vector<int32_t>& (*host)(ModelInput&);
  Tensor* (*device)(StepInputs&);                   // nullptr: not a device input
  std::vector<int32_t>* (*host_copy)(StepInputs&);  // nullptr: the backends keep no host copy
};

// The per-step arrays, in step-plan order.
extern const std::array<StepArray, 12> kStepArrays;

inline const std::vector<int32_t>& host_array(const StepArray& a, const ModelInput& in) {
  return a.host(const_cast<ModelInput&>(in));
}

// "" when every array of `in` has the length its extent says (optional ones may be empty,
// the linear-attention layout is all there or all absent) and the query starts run from 0 to
// T; else what is wrong.
std::string step_input_layout_error(const ModelInput& in);

// Token ids in [0, vocab) and positions in [0, max_positions), one of each per token; else
// Error(kInvalidArgument) naming the bad value.
void check_step_input(const ModelInput& in, int vocab, int max_positions);
// Writes StepInputs::mtp_fc_order for T tokens into out[0, 2T): 0, T, 1, T + 1, ..., T - 1, 2T - 1.
void mtp_fc_order(int64_t T, int32_t* out);
// Checks `in`, then uploads every device array of kStepArrays into `backend`'s scratch memory.
StepInputs upload_step_inputs(Backend& backend, const ModelInput& in, int vocab, int max_positions);

}  // namespace tessera
