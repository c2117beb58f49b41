// The model interface the engine drives. A model knows its layers and weights; it
// knows nothing of requests, HTTP or scheduling.
#pragma once
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/attention_metadata.h"
#include "backend/backend.h"
#include "loader/model_config.h"
#include "model/step_inputs.h"
#include "model/weights.h"

namespace tessera {

namespace dist {
class Communicator;
}

// What each layer keeps per sequence between steps.
enum class CacheKind {
  kPagedKv,    // attention: K and V in blocks of block_size tokens
  kStateSlot,  // linear attention (Qwen3.5 / Qwen3-Next): a fixed-size state per sequence
};

struct LayerCacheSpec {
  CacheKind kind = CacheKind::kPagedKv;
  int num_kv_heads = 0;  // kPagedKv: on this rank
  int head_dim = 0;
  // kStateSlot (a Gated DeltaNet layer), per sequence, on this rank: the causal-conv state
  // [K-1, C] and the recurrent state [Hv, Dk, Dv]. The engine picks their dtypes (CacheInit).
  Shape conv_state_shape, ssm_state_shape;
  // kPagedKv: the layer's sliding window W (it reads only the keys of the last W positions of each
  // query, and no block wholly before them); 0: full attention, every block of the sequence.
  int sliding_window = 0;
  // Bytes per sequence of both states at the given dtypes.
  size_t state_bytes(DType conv_dtype, DType ssm_dtype) const {
    return static_cast<size_t>(conv_state_shape.numel()) * dtype_size(conv_dtype) +
           static_cast<size_t>(ssm_state_shape.numel()) * dtype_size(ssm_dtype);
  }
};

// Device memory for every layer's cache, owned by the engine's cache manager.
struct KvCache {
  int block_size = 16;
  int num_blocks = 0;
  DType dtype = DType::kF32;
  float k_scale = 1.0f, v_scale = 1.0f;
  // Indexed by this stage's layer (cache_specs() order); a layer of the other kind has
  // undefined tensors in these vectors.
  std::vector<Tensor> k, v;  // kPagedKv layers: [num_blocks, block_size, kv_heads, head_dim]
  // kPagedKv layers: the KV cache group whose block tables and slots (AttentionMetadata) the layer
  // reads; empty: every layer group 0. With several groups, layers at one place in their groups
  // share their k and v tensors (a block belongs to one group at a time).
  std::vector<int> layer_group;
  int num_state_slots = 0;
  std::vector<Tensor> conv_state;  // kStateSlot layers: [num_state_slots, K-1, C]
  std::vector<Tensor> ssm_state;   // kStateSlot layers: [num_state_slots, Hv, Dk, Dv]
};

// The data-plane groups a sharded model talks through (owned by the executor). The model
// only calls collectives on them; it never starts processes or opens connections.
struct ParallelRuntime {
  dist::Communicator* tp = nullptr;  // this stage's TP group; required when parallel.tp_size > 1
  dist::Communicator* pp = nullptr;  // this shard's pipeline group; required when parallel.pp_size > 1
};

// The contiguous layer range pipeline stage `pp_rank` owns (vLLM's split: the stages before
// the last take the remainder, since the last one also runs the final norm and lm_head).
struct LayerRange {
  int begin = 0, end = 0;
  int size() const { return end - begin; }
};
LayerRange pipeline_layer_range(int num_layers, int pp_rank, int pp_size);

struct ModelOptions {
  int max_positions = 0;  // rotary table length; 0 = config.max_position_embeddings
  ParallelContext parallel;
  ParallelRuntime runtime;
  // --quantization (vLLM's flag): "" (the checkpoint's own format) or "fp8" (block-scaled FP8
  // weights; a bf16 checkpoint is quantised while loading).
  std::string quantization;
  // Speculative decoding with method mtp: also build the checkpoint's multi-token-prediction
  // layer (config.num_mtp_layers > 0, weights under "mtp."); without it those weights are never
  // read.
  bool mtp = false;
  // vLLM's --disable-sliding-window: every layer attends the whole context (disable_sliding_window
  // on the config; the caller caps max_model_len at the window).
  bool disable_sliding_window = false;
};

// The weight format a model's WeightStore loads: the checkpoint's quantization_config, or FP8
// quantisation at load when --quantization fp8 names it for an unquantised checkpoint.
QuantConfig weight_quantization(const ModelConfig& config, const ModelOptions& options);

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelConfig& config() const = 0;
  virtual std::vector<LayerCacheSpec> cache_specs() const = 0;
  virtual WeightStore& weights() = 0;
  // Runs one step; returns f32 logits [logits_indices.size(), vocab] in scratch memory.
  // Sharded (TP/PP): every rank of the step calls it with the same input; the full logits
  // come back on TP rank 0 of the last pipeline stage only (see returns_logits); the other
  // ranks return an undefined tensor. cache holds this stage's layers only.
  virtual Tensor forward(const ModelInput& input, KvCache& cache) = 0;
  // forward() where the caller reads only the greedy pick of the rows `argmax_rows` lists
  // (StepInputs::argmax_rows); a model that does not shard its logits returns every row whole.
  virtual Tensor forward_argmax_rows(const ModelInput& input, KvCache& cache, std::span<const int32_t> argmax_rows) {
    (void)argmax_rows;
    return forward(input, cache);
  }
  // The same step from inputs already on the device. Queues device work only (no host
  // transfer, no synchronize) when graph_safe(), so it can be captured and replayed.
  virtual Tensor run(const StepInputs& input, KvCache& cache) = 0;
  virtual bool graph_safe() const { return false; }
  // Whether forward() returns the logits on this rank.
  virtual bool returns_logits() const { return true; }
  // Whether the logits are gathered from vocabulary shards (tensor parallelism): then the rows
  // StepInputs::argmax_rows names cost a (max, id) pair per shard instead of a slice, and come
  // back as stand-in rows that hold only their greedy pick.
  virtual bool shards_logits() const { return false; }

  // Multi-token prediction (ModelOptions::mtp): whether this model holds an MTP layer. Its
  // attention's paged KV is the last entry of cache_specs(); run() then writes the step's final
  // hidden states (after the final norm) to StepInputs::hidden_states when that is defined.
  virtual bool has_mtp() const { return false; }
  // One pass of the MTP layer over `input`'s tokens: at row i, token_ids[i] is the token that
  // follows position positions[i] and hidden[i] [H] the hidden state at that position (the
  // target's after its final norm, or this layer's own output for a chained draft). Writes the
  // layer's K/V at the input's slots, `hidden_out` [T, H] gets the layer's normed output, and
  // the f32 logits [logits_indices.size(), vocab] (of the token after next) come back in scratch
  // memory. The drafts are greedy: every row is an argmax row (StepInputs::argmax_rows), so
  // under tensor parallelism the rows hold only their greedy pick. Queues device work only.
  virtual Tensor run_mtp(const StepInputs& input, const Tensor& hidden, const Tensor& hidden_out, KvCache& cache);
  // Token ids (i32) picked from the logits on the rank that holds them (TP rank 0; the MTP
  // drafts' argmax), copied in place to every rank of its TP group, so that the next pass embeds
  // the same tokens everywhere. Queues device work only (a TP broadcast); no-op at TP 1.
  virtual void share_sampled(const Tensor& ids) { (void)ids; }
};

}  // namespace tessera
