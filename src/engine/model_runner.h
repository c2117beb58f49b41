// Runs a model's steps on one rank: owns the rank's KV cache, and on backends that capture
// graphs replays one captured graph per decode batch size (vLLM's CUDA graph runner), so a
// decode step costs one launch instead of hundreds.
//
// A step is "graphable" when every sequence brings exactly one new token (pure decode), the
// batch fits the largest bucket, and the model says its forward is graph-safe. The batch is
// padded to the next bucket (1, 2, 4, 8, 16, 24, ... every 8 up to max_graph_batch); a
// padding row holds each array's `pad` (kStepArrays in model/step_inputs.h: no KV write, one
// cached key of block 0, no state slot), and its logits are not used. Inputs live in one
// fixed device buffer laid out from kStepArrays, which each step rewrites before the replay. The
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
  const KvCache& cache() const { return kv_; }
  // Models with an MTP layer (Model::has_mtp): every run() keeps the step's final hidden states
  // in a device buffer; this runs the MTP passes of `in` over them (MtpDraftInput) and returns
  // the greedy drafts, i32 [passes x in.num_drafting] in scratch memory.
  Tensor run_mtp(const MtpDraftInput& in);
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
  // Lays out the graph input buffer for buckets up to `B` from kStepArrays.
  void layout_graph_inputs(int64_t B);
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
  // Graph inputs: one device buffer, where kStepArrays[i] starts at graph_offset_[i] (i32
  // entries; -1: not a graph input). The arrays a step rewrites lie in [step_begin_, end)
  // and are filled in their host mirror h_step_ first (no allocation per step).
  Tensor graph_buf_;
  std::vector<int64_t> graph_offset_;
  int64_t step_begin_ = 0;
  std::vector<int32_t> h_step_;
  std::map<int, Graph> graphs_;
  // Models with an MTP layer: the last run's final hidden states ([hidden_rows_, H]; growing it
  // drops the captured graphs, which write into it).
  Tensor hidden_;
  int64_t hidden_rows_ = 0, last_tokens_ = 0;
  void reserve_hidden(int64_t rows);
  std::vector<dist::Communicator*> watched_;
};

}  // namespace tessera
