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

namespace tessera {

class Checkpoint;

enum class ParallelStyle {
  kReplicated,  // every rank holds the whole tensor
  kColumn,      // split along dim 0 (output features)
  kRow,         // split along dim 1 (input features); the layer all-reduces its output
  kVocab,       // split along dim 0 over the vocabulary
};

struct ParallelContext {
  int tp_rank = 0, tp_size = 1;
  int pp_rank = 0, pp_size = 1;
};

enum class DummyInit { kUniform, kOnes };

class WeightStore {
 public:
  struct Part {
    std::string name;  // checkpoint tensor name
    int64_t rows;      // its full dim-0 size
  };

  explicit WeightStore(ParallelContext pc) : pc_(pc) {}

  // A parameter read from one checkpoint tensor. The returned reference is stable.
  const Tensor& declare(const std::string& name, Shape full_shape, ParallelStyle style,
                        DummyInit init = DummyInit::kUniform);
  // Column-parallel parameter made of several checkpoint tensors stacked along dim 0
  // (gate+up), each sharded on its own so that every rank gets matching slices.
  const Tensor& declare_stacked(const std::string& label, std::vector<Part> parts, int64_t cols);
  // Rows [row_begin, row_begin + rows) of a checkpoint tensor, whatever the TP rank
  // (KV heads replicated when --tensor-parallel-size exceeds num_key_value_heads).
  const Tensor& declare_row_block(const std::string& name, Shape full_shape, int64_t row_begin, int64_t rows);
  // `alias` becomes the same tensor as `target` (tied embeddings).
  const Tensor& declare_tied(const std::string& alias, const std::string& target);

  using Progress = std::function<void(size_t done, size_t total, size_t bytes)>;
  // Loads every declared parameter in the backend's compute dtype.
  void load(const Checkpoint& ckpt, Backend& backend, const Progress& progress = nullptr);
  void load_dummy(Backend& backend, uint64_t seed, const Progress& progress = nullptr);

  size_t param_bytes(DType dtype) const;  // bytes this rank holds, stored in `dtype`
  size_t count() const { return entries_.size(); }

 private:
  struct Entry {
    std::string name;
    Shape full_shape, local_shape;
    ParallelStyle style;
    std::vector<Part> parts;  // stacked parameters
    DummyInit init;
    std::string tied_to;
    Tensor tensor;
    int64_t row_begin = -1;  // declare_row_block: first row read (>= 0)
  };
  Shape local_shape(const Shape& full, ParallelStyle style, const std::string& name) const;
  Entry& find(const std::string& name);
  std::deque<Entry> entries_;
  ParallelContext pc_;
};

}  // namespace tessera
