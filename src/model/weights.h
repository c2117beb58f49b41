// Model code declares every parameter with its checkpoint name, full shape and
// parallel style; the store then loads each rank's slice (or dummy values) into
// backend memory. Names come from the module path, so loading cannot drift from
// the model.
#pragma once
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "loader/model_config.h"

namespace tessera {

class Checkpoint;

enum class ParallelStyle {
  kReplicated,  // every rank holds the whole tensor
  kColumn,      // split along dim 0 (output features)
  kRow,         // split along dim 1 (input features); the layer all-reduces its output
  kVocab,       // split along dim 0 over the vocabulary, padded to a multiple of the TP size
  kExpert,      // a layer's experts stacked (declare_experts)
};

struct ParallelContext {
  int tp_rank = 0, tp_size = 1;
  int pp_rank = 0, pp_size = 1;
  // --enable-expert-parallel: each TP rank holds whole experts (a contiguous range) instead of
  // a slice of every expert's intermediate dimension.
  bool expert_parallel = false;
};

// Rows a vocab-parallel table holds on each rank: the vocabulary padded up to a multiple of
// the TP size, split evenly (rank r: rows [r * rows, (r + 1) * rows); rows past the
// vocabulary are zeros and their logits are never returned).
int64_t vocab_rows_per_rank(int64_t vocab, int tp_size);

// This rank's part of a layer's experts (see WeightStore::declare_experts).
struct ExpertShard {
  int64_t num_experts = 0, intermediate = 0;  // full sizes
  int64_t expert_begin = 0, local_experts = 0;
  int64_t inter_begin = 0, local_intermediate = 0;
};
ExpertShard expert_shard(const ParallelContext& pc, int64_t num_experts, int64_t intermediate);

enum class DummyInit { kUniform, kOnes };

// What the weight store reads from a checkpoint tensor: its stored elements converted to the
// destination dtype; or, of an FP8 tensor and into f32, each element's value (e4m3 times its
// block's scale) or the scale of the checkpoint block it lies in (what re-blocking needs).
enum class CheckpointRead : uint8_t { kStored, kValue, kScale };

// Quantises a row-major f32 matrix [rows, cols] to e4m3 per 128 x 128 block (edge blocks
// partial): scale[rb, cb] = amax / 448 (1 for an all-zero block), dst = fp8(src / scale),
// scale f32 [ceil(rows / 128), ceil(cols / 128)]. What --quantization fp8 does while loading.
void quantize_fp8_blocks(const float* src, int64_t rows, int64_t cols, uint8_t* dst, float* scale);

class WeightStore {
 public:
  struct Part {
    std::string name;  // checkpoint tensor name
    int64_t rows;      // its full dim-0 size
  };

  explicit WeightStore(ParallelContext pc) : pc_(pc) {}

  // Quantised weights (QuantConfig::format; FP8 blocks the one with kernels): linear weights
  // are held as e4m3 tensors carrying their f32 block scales (Tensor::format, block_scale),
  // which the backends' linear and moe_experts ops dispatch on; model code sees the same
  // `const Tensor&`. Which weights are FP8:
  //  - load(): those the checkpoint stores as F8_E4M3 with a `<name>_scale_inv` beside them
  //    (weight_scale_inv for `.weight` tensors, gate_up_proj_scale_inv for fused experts);
  //    with from_checkpoint == false (--quantization fp8 on a bf16 checkpoint) the candidates
  //    below are quantised while loading (scale = amax / 448 per 128 x 128 block);
  //  - load_dummy(): the candidates, as FP8 with scales, when the config is quantised.
  // Candidates: 2-D projections whose checkpoint names end in "proj.weight" and every layer's
  // experts, unless modules_to_not_convert names them. A rank's slice whose pieces start and end
  // on the checkpoint's 128-row/column block edges keeps its e4m3 bytes and scales. One that
  // cuts a block is re-blocked: its values (e4m3 times their checkpoint scale) are re-quantised
  // into fresh 128 x 128 blocks over the slice, each block's scale the largest of its values'
  // checkpoint scales, so values from that block keep their bytes and the others are rounded once
  // more to e4m3. A slice where no block mixes two checkpoint scales is re-blocked exactly (a
  // 64-row KV head replicated over TP ranks); one that would be rounded is accepted where the
  // model's layout cuts the blocks (assembled pieces such as gated attention's 64-row query and
  // gate rows, experts or stacked parts of sizes that are not whole blocks) and refused where a
  // tensor-parallel split does, naming the layer and the --tensor-parallel-size values that keep
  // the checkpoint's blocks. Quantising while loading (and dummies) makes blocks over each rank's
  // slice.
  // Fails (kUnsupported) for a format without kernels (QuantConfig names only FP8 blocks).
  void set_quantization(const QuantConfig& q);
  const QuantConfig& quantization() const { return quant_; }

  // A parameter read from one checkpoint tensor. The returned reference is stable.
  const Tensor& declare(const std::string& name, Shape full_shape, ParallelStyle style,
                        DummyInit init = DummyInit::kUniform);
  // Column-parallel parameter made of several checkpoint tensors stacked along dim 0
  // (gate+up), each sharded on its own so that every rank gets matching slices.
  const Tensor& declare_stacked(const std::string& label, std::vector<Part> parts, int64_t cols);
  // Rows [row_begin, row_begin + rows) of a checkpoint tensor, whatever the TP rank
  // (KV heads replicated when --tensor-parallel-size exceeds num_key_value_heads).
  const Tensor& declare_row_block(const std::string& name, Shape full_shape, int64_t row_begin, int64_t rows);
  // Whole dim-0 rows [row_begin, row_begin + rows) of checkpoint tensor `name` (of shape
  // `full_shape`), one piece of a parameter assembled by declare_row_blocks.
  struct RowBlock {
    std::string name;
    Shape full_shape;
    int64_t row_begin, rows;
  };
  // A parameter of shape `local_shape` whose rows are `blocks` in order: a rank's slice of
  // several parts (q | k | v | z of a Gated DeltaNet projection), or rows regrouped from an
  // interleaved checkpoint layout. The caller picks the rows for its TP rank.
  const Tensor& declare_row_blocks(const std::string& label, std::vector<RowBlock> blocks, Shape local_shape);
  // A replicated parameter stored as checkpoint + `offset` (the (1 + w) zero-centred RMSNorm
  // weights of Qwen3-Next / Qwen3.5, added in f32 before the conversion to the compute
  // dtype, or kept in f32 with `f32`: the layer norms, whose kernels take f32 weights, so
  // 1 + w is not rounded to bf16); dummy weights are `offset` + 0.
  const Tensor& declare_offset(const std::string& name, Shape shape, float offset, bool f32 = false);
  // A parameter kept in f32 whatever the compute dtype (Gated DeltaNet's A_log and dt_bias,
  // whose rounding to bf16 would compound in the recurrent state's decay over many tokens).
  const Tensor& declare_f32(const std::string& name, Shape full_shape, ParallelStyle style);
  // A MoE layer's experts under `prefix` ("model.layers.3.mlp.experts"), stacked:
  // gate_up [E_local, 2 * I_local, H] (each expert's gate rows, then its up rows) and
  // down [E_local, H, I_local]. Read from per-expert tensors (prefix.{e}.gate_proj.weight,
  // .up_proj.weight, .down_proj.weight) or from the fused 3-D ones (prefix.gate_up_proj
  // [E, 2I, H], prefix.down_proj [E, H, I]), whichever the checkpoint has. TP splits each
  // expert's intermediate dimension; with expert_parallel each rank takes whole experts.
  struct Experts {
    const Tensor* gate_up = nullptr;
    const Tensor* down = nullptr;
    ExpertShard shard;
  };
  Experts declare_experts(const std::string& prefix, int64_t num_experts, int64_t intermediate, int64_t hidden);
  // `alias` becomes the same tensor as `target` (tied embeddings).
  const Tensor& declare_tied(const std::string& alias, const std::string& target);

  using Progress = std::function<void(size_t done, size_t total, size_t bytes)>;
  // Loads every declared parameter in the backend's compute dtype. Host conversions are
  // staged in a shared buffer and uploaded without waiting; the backend is synchronised only
  // when that buffer must be reused (every few hundred MiB) and once at the end.
  void load(const Checkpoint& ckpt, Backend& backend, const Progress& progress = nullptr);
  void load_dummy(Backend& backend, uint64_t seed, const Progress& progress = nullptr);

  // Bytes this rank holds: loaded tensors (FP8 ones with their scales) at their size, the
  // others as if stored in `dtype` (f32 ones in f32).
  size_t param_bytes(DType dtype) const;
  // Of those, the FP8 weights and their f32 block scales (0 before load and without FP8).
  size_t fp8_bytes() const;
  size_t fp8_scale_bytes() const;
  // Of those, the routed experts' (declare_experts, FP8 ones with their scales): the part of
  // the weights a decode token reads only for the experts it is routed to.
  size_t expert_bytes() const;
  size_t count() const { return entries_.size(); }
  // FP8 parameters the last load() re-blocked (see set_quantization).
  size_t reblocked() const { return reblocked_; }
  // Logs the FP8 bytes, their scales and the rest, and how many parameters were re-blocked (nothing for
  // a model without FP8 weights). The model loader's, once per load; the planner's loads stay quiet.
  void log_summary(const Backend& backend) const;
  // The checkpoint tensors load() reads (every rank's: full shapes), each once, in declaration
  // order; experts as per-expert tensors. fp8: stored as e4m3 with a `<name>_scale_inv` tensor of
  // f32 128x128 block scales beside it (the FP8 candidates of a quantised config). What a tool
  // writes to make a checkpoint of a model's real layout (bench/load/make_checkpoint).
  struct SourceTensor {
    std::string name;
    Shape shape;
    bool fp8 = false;
  };
  std::vector<SourceTensor> checkpoint_layout() const;
  // Each loaded parameter once, with its name (a tied alias is its target's tensor: skipped).
  void for_each_tensor(const std::function<void(const std::string& name, const Tensor& t)>& fn) const;

 private:
  struct Entry {
    std::string name;
    Shape full_shape, local_shape;
    ParallelStyle style = ParallelStyle::kReplicated;
    std::vector<Part> parts;       // stacked parameters
    std::vector<RowBlock> blocks;  // declare_row_blocks
    float offset = 0.0f;           // declare_offset
    bool f32 = false;              // declare_f32: stored in f32, not the compute dtype
    DummyInit init = DummyInit::kUniform;
    std::string tied_to;
    Tensor tensor;
    int64_t row_begin = -1;  // declare_row_block: first row read (>= 0)
    enum class ExpertPart { kNone, kGateUp, kDown } expert_part = ExpertPart::kNone;
    ExpertShard expert;  // kExpert: which experts and which intermediate slice
  };
  class Stager;
  // Host images of this rank's slice: the weight converted to `dt`, or (fill_*_scale) its f32
  // block scales read from the checkpoint's `_scale_inv` tensors.
  void fill_entry(const Entry& e, const Checkpoint& ckpt, DType dt, char* dst,
                  CheckpointRead read = CheckpointRead::kStored) const;
  void fill_entry_scale(const Entry& e, const Checkpoint& ckpt, char* dst) const;
  void fill_expert(const Entry& e, const Checkpoint& ckpt, int64_t j, DType dt, char* dst,
                   CheckpointRead read = CheckpointRead::kStored) const;
  void fill_expert_scale(const Entry& e, const Checkpoint& ckpt, int64_t j, char* dst) const;
  void load_entry(Entry& e, const Checkpoint& ckpt, DType dt, Stager& stager);
  void load_experts(Entry& e, const Checkpoint& ckpt, DType dt, Stager& stager);
  enum class Format { kPlain, kFp8Checkpoint, kFp8Quantise };
  Format format_of(const Entry& e, const Checkpoint& ckpt) const;
  // The checkpoint tensors `e` is read from (experts: the first local expert's, for the others).
  std::vector<std::string> source_names(const Entry& e, const Checkpoint& ckpt) const;
  bool fp8_candidate(const Entry& e) const;
  std::string fp8_shard_problem(const Entry& e, ErrorKind& kind) const;
  bool may_reblock_with_rounding(const Entry& e) const;
  void load_fp8(Entry& e, const Checkpoint& ckpt, Format f, Backend& backend, Stager& stager);
  static Entry make_entry(const std::string& name, Shape full, Shape local, ParallelStyle style, DummyInit init);
  Shape local_shape(const Shape& full, ParallelStyle style, const std::string& name) const;
  Entry& find(const std::string& name);
  std::deque<Entry> entries_;
  ParallelContext pc_;
  QuantConfig quant_;
  size_t reblocked_ = 0;
};

}  // namespace tessera
