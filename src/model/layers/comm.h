// The collectives a model's blocks call, over this rank's TP and PP groups. Whether a
// communicator reads host-visible buffers (Gloo: the backend's queued work must finish
// first) or is ordered on the backend's stream (NCCL) is decided here, once: blocks never
// ask.
#pragma once
#include "model/model.h"

namespace tessera {

class ModelComm {
 public:
  // Checks that `rt` holds a communicator of the right size and rank for every group of
  // size > 1 in `pc`.
  ModelComm(Backend& backend, const ParallelContext& pc, const ParallelRuntime& rt);
  const ParallelContext& parallel() const { return pc_; }
  int tp_size() const { return pc_.tp_size; }
  int tp_rank() const { return pc_.tp_rank; }
  bool first_stage() const { return pc_.pp_rank == 0; }
  bool last_stage() const { return pc_.pp_rank == pc_.pp_size - 1; }

  // TP sum in place (a row-parallel output); no-op at TP 1.
  void all_reduce(const Tensor& t);
  // Each TP rank's `local`, stacked along dim 0 into `out` ([tp * rows, ...]) on TP rank 0;
  // `out` is unused (may be undefined) on the others.
  void gather_to_first(const Tensor& local, const Tensor& out);
  // TP rank 0's `t` to every rank of the TP group, in place; no-op at TP 1.
  void broadcast_from_first(const Tensor& t);
  // Pipeline: the activations to the next stage / from the previous one.
  void send_next_stage(const Tensor& t);
  void recv_prev_stage(const Tensor& t);
  // Whether a step's device work can be captured and replayed (one stage, and no
  // host-side TP communicator).
  bool graph_safe() const;

 private:
  void host_ready(const dist::Communicator& c);  // synchronises for a host-side communicator
  Backend& backend_;
  ParallelContext pc_;
  ParallelRuntime rt_;
};

}  // namespace tessera
