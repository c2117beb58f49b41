// The step plan rank 0 broadcasts to every other rank each step (docs/distributed.md,
// "Execution"): a compact, fixed binary format. Nothing in it is a pointer or code; the
// decoder checks every count against the bytes that remain and every index against the
// limits the receiving rank knows (vocabulary, cache blocks), so a damaged plan is refused
// with Error(kCorrupt) before anything is allocated or indexed.
//
//   u32 magic 0x504c5354 ("TSLP"), u8 version 5, u8 kind, u16 reserved (0)
//   kind 1 step:        u64 step, i32 block_size, i32 max_blocks_per_seq, i32 num_kv_groups,
//                       then every array of kStepArrays (model/step_inputs.h), in its order,
//                       as u32 count + count x i32 (today: token_ids, positions,
//                       query_start_loc, seq_lens, block_tables and slot_mapping (one of each
//                       per KV cache group, one after the other), logits_indices,
//                       and, empty for models without state slots, linear query_start_loc,
//                       state_slots, has_initial_state, token_state_slots (speculative
//                       decoding; else empty), state_copies as (src, dst) pairs),
//                       u32 count + count x sampling row (f32 temperature, i32 top_k, f32 top_p,
//                       f32 min_p, u64 seed, u64 position), one per logits index,
//                       then the host_rows array (ascending logits-row numbers), the
//                       constrained_rows array, the mask_rows array, i32 mask_words and the
//                       masks array (StepSampling; structured output)
//   kind 2 init cache:  i32 num_blocks, i32 block_size, u8 dtype, f32 k_scale, f32 v_scale,
//                       i32 max_model_len, i32 max_graph_batch, i32 graph_query_len, i32 num_state_slots,
//                       u8 conv state dtype, u8 ssm state dtype, u32 count + count x i32 layer groups
//   kind 3 shutdown:    nothing
//   kind 4 MTP drafts:  u64 step, the first pass's input (i32 block_size, i32 max_blocks_per_seq,
//                       i32 num_kv_groups, the
//                       arrays of kStepArrays as in a step), the hidden_rows array, i32 num_drafting,
//                       u32 count of chained passes, each pass's input as the first's
//                       (MtpDraftInput: the MTP passes after a step, run on the last pipeline stage)
// All integers little-endian, written and read with dist::WireWriter / WireReader; trailing
// bytes are an error.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "model/model.h"

namespace tessera {

enum class PlanKind : uint8_t { kStep = 1, kInitCache = 2, kShutdown = 3, kMtpDraft = 4 };

struct CacheInit {
  int num_blocks = 0;
  int block_size = 16;
  DType dtype = DType::kF32;
  float k_scale = 1.0f, v_scale = 1.0f;
  int max_model_len = 0;    // positions a step may reach (sizes the graph inputs)
  int max_graph_batch = 0;  // decode batches up to this replay CUDA graphs; 0 = never (--enforce-eager)
  // Tokens per sequence of the graphed steps: 1 (decode), and with speculative decoding up to
  // 1 + num_speculative_tokens (verification steps whose sequences all bring as many).
  int graph_query_len = 1;
  // kStateSlot layers (linear attention): slots per layer and the dtypes of the conv and
  // recurrent states (--mamba-cache-dtype, --mamba-ssm-cache-dtype).
  int num_state_slots = 0;
  DType conv_dtype = DType::kF32, ssm_dtype = DType::kF32;
  // Per layer (cache_specs() order), the KV cache group whose block table and slots it reads in a
  // step (-1: no paged KV); the layers at one place in their groups share a KV tensor
  // (engine/cache_groups.h, cache_layer_groups). Empty: one group, every paged layer its own tensor.
  std::vector<int> layer_groups;
};

// How the rank that holds a step's logits turns them into tokens: one SamplingRow per logits
// row, sampled on that rank's device; the rows listed in host_rows also travel to the engine
// in full (their requests need penalties, logit bias or logprobs, which the host applies).
struct StepSampling {
  std::vector<SamplingRow> rows;
  std::vector<int32_t> host_rows;
  // Structured output on the device: row mask_rows[k] (ascending, none a host row) is sampled only among
  // the tokens whose bit is set in words [k * mask_words, (k + 1) * mask_words) of masks (token t: bit
  // t % 32 of word t / 32; Backend::apply_token_mask).
  // mask_words > 0: the step has masked rows (set when the step is planned, even while the masks are
  // still being filled).
  std::vector<int32_t> mask_rows;
  std::vector<int32_t> masks;
  int32_t mask_words = 0;
  // The rows of constrained sequences (ascending; none a host row): the rows mask_rows may hold, known
  // when the step is planned (mask_rows is known only once the masks are filled, and only the sampling
  // rank receives it). Every rank reads them for argmax_rows.
  std::vector<int32_t> constrained_rows;
  // Set while the engine fills mask_rows and masks on other threads, overlapping the forward: whoever
  // reads them calls wait_masks() first (right before apply_token_mask), which returns once they are
  // complete. Null: they are complete. Not part of the step plan.
  std::function<void()> await_masks;
  void wait_masks() const {
    if (await_masks) await_masks();
  }
};

// The rows of `s` whose token is the greedy pick of their logits and that need nothing else of
// them: temperature 0 (SamplingRow's rule), not a host row (logprobs, penalties, logit bias and
// the like are applied to the whole row there), not a row of a constrained sequence (structured
// output: it may be masked). Ascending.
// Every rank computes them from the plan alike: under tensor parallelism the lm_head gathers only
// each shard's (max, id) for them (StepInputs::argmax_rows).
std::vector<int32_t> argmax_rows(const StepSampling& s);

// What comes back: a token per logits row (unspecified for host rows) and the host rows'
// f32 logits, host_rows.size() x vocab.
struct StepOutput {
  std::vector<int32_t> tokens;
  std::vector<float> host_logits;
};

// Speculative decoding with method mtp (engine/spec/mtp_proposer.h, MtpProposer): the MTP layer's
// passes after a step, run by the ranks of the last pipeline stage (which holds the step's hidden
// states); with several ranks it travels as a plan of kind kMtpDraft.
struct MtpDraftInput {
  // One pass over every position the step computed (rejected drafts excluded), sequence by
  // sequence: token_ids[i] is the token after positions[i], KV goes to the layer's slot of that
  // position, and logits_indices names the last row of each sequence that gets drafts (its
  // first draft; one unused row when none does).
  ModelInput prefill;
  std::vector<int32_t> hidden_rows;  // [T]: the row of the step's hidden states at each position
  int num_drafting = 0;              // sequences that get drafts (their logits rows, in order)
  // Passes 2..k, one token per drafting sequence (same order): positions, KV slots (-1: this
  // sequence needs no more drafts), seq lens and block tables; the token ids (placeholders
  // here) are the previous pass's drafts, and the hidden states its output, on the device.
  std::vector<ModelInput> chained;
};

// What a step fused with its MTP drafting gives back (MtpDrafter::run_with_step): the step's
// tokens (one a row), for each sequence the drafts the device accepted, and the drafts of each
// pass from the accepted row: drafts[j * S + s] is draft j + 1 of sequence s.
struct MtpStepResult {
  std::vector<int32_t> tokens;
  std::vector<int32_t> accepted;
  std::vector<int32_t> drafts;
  int passes = 0;
};

struct StepPlan {
  PlanKind kind = PlanKind::kStep;
  uint64_t step = 0;
  ModelInput input;       // kStep
  StepSampling sampling;  // kStep
  CacheInit cache;        // kInitCache
  MtpDraftInput mtp;      // kMtpDraft
};

// What the receiver knows, to bound-check indices. 0 = unchecked.
struct PlanLimits {
  int vocab_size = 0;
  int num_blocks = 0;       // the cache this rank allocated
  int num_state_slots = 0;  // its state slots (0: unchecked, like the other limits)
  size_t max_tokens = 1u << 24;
  int max_mtp_passes = 16;  // chained MTP passes of a kMtpDraft plan, at most this many - 1
};

std::vector<uint8_t> encode_step_plan(const StepPlan& plan);
StepPlan decode_step_plan(std::span<const uint8_t> bytes, const PlanLimits& limits);

}  // namespace tessera
