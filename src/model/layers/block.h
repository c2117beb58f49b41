// What every model block is built from: the config, the backend, the weight store it
// declares its parameters in (under a name prefix, with their parallel styles) and the
// collectives of its rank.
#pragma once
#include "model/layers/comm.h"

namespace tessera {

struct BlockContext {
  const ModelConfig& config;
  Backend& backend;
  WeightStore& weights;
  ModelComm& comm;
};

// The position-wise half of a decoder layer: a dense MLP or a mixture of experts.
class FeedForward {
 public:
  virtual ~FeedForward() = default;
  // out[T,H] (complete on every TP rank) from the normed x[T,H].
  virtual void forward(const Tensor& x, const Tensor& out) = 0;
};

}  // namespace tessera
