// Runs a model's steps on one rank: owns the rank's KV cache, and on backends that capture
// graphs replays one captured graph per decode batch size (vLLM's CUDA graph runner), so a
// decode step costs one launch instead of hundreds.
//
// A step is "graphable" when every sequence brings exactly one new token (pure decode), the
// batch fits the largest bucket, and the model says its forward is graph-safe. The batch is
// padded to the next bucket (1, 2, 4, 8, 16, 24, ... every 8 up to max_graph_batch); padded
// rows write no KV (slot -1) and read one cached key of block 0, and their logits are not
// used. Hybrid models' decode graphs also read each sequence's state slot and has-initial-state
// flag from the buffers (padding rows: slot -1, which the linear-attention ops skip).
// Inputs live in fixed device buffers that each step rewrites before the replay. The
// first step of a bucket runs eagerly over those buffers (its result is the step's result),
// then the bucket is captured for the next time. Every rank of a TP group takes the same
// decisions from the same plan, so their graphs (with the collectives inside) pair up.
#pragma once
#include <map>
#include <memory>

#include "engine/step_plan.h"
#include "model/model.h"

namespace tessera {

namespace dist {
class Communicator;
}

class ModelRunner {
 public:
  ModelRunner(Model& model, Backend& backend);
  ~ModelRunner();
  // Allocates the cache; graphs when init.max_graph_batch > 0 and the backend and model allow.
  void init_cache(const CacheInit& init);
  bool cache_ready() const { return kv_.num_blocks > 0; }
  // The step's logits (undefined on ranks that do not return them), valid until the next run.
  Tensor run(const ModelInput& input);
  int graphs_captured() const { return static_cast<int>(graphs_.size()); }
  const KvCache& cache() const { return kv_; }
  // Communicators whose collectives run inside the graphs: a replay is put under their
  // watchdog (a peer stuck mid-replay then ends the rank instead of hanging it).
  void watch(std::vector<dist::Communicator*> comms) { watched_ = std::move(comms); }

 private:
  struct Graph {
    std::unique_ptr<CapturedGraph> graph;
    Tensor logits;
    size_t scratch_bytes = 0;
  };
  int bucket_for(int batch) const;  // 0: no bucket
  StepInputs fill_graph_inputs(const ModelInput& input, int bucket);
  // Copies the (src, dst) state-slot pairs of every linear-attention layer, in order.
  void apply_state_copies(const std::vector<int32_t>& pairs);

  Model& model_;
  Backend& backend_;
  int max_model_len_ = 0;
  KvCache kv_;
  bool graphs_enabled_ = false;
  std::vector<int> buckets_;
  int max_blocks_ = 0;  // block-table width of the graph inputs
  // Graph inputs: views into one device buffer; g_step_ is the part each step rewrites, from
  // its host mirror h_step_ (no allocation per step).
  Tensor g_qsl_, g_logits_idx_, g_step_, g_tokens_, g_positions_, g_seq_lens_, g_slots_, g_state_slots_, g_has_initial_,
      g_block_tables_;
  std::vector<int32_t> h_step_;
  std::map<int, Graph> graphs_;
  std::vector<dist::Communicator*> watched_;
};

}  // namespace tessera
