// Runs a model's steps on one rank: owns the rank's KV cache, and on backends that capture
// graphs replays one captured graph per decode batch size (vLLM's CUDA graph runner), so a
// decode step costs one launch instead of hundreds.
//
// A step is "graphable" when every sequence brings the same number q of new tokens and wants
// the logits of each: pure decode (q = 1), or speculative decoding's verification of q - 1
// drafts per sequence (q up to CacheInit::graph_query_len); the batch fits the largest bucket
// and the model says its forward is graph-safe. The batch is padded to the next bucket (1, 2,
// 4, 8, 16, 24, ... every 8 up to max_graph_batch); a padding row holds each array's `pad`
// (kStepArrays in model/step_inputs.h: no KV write, q cached keys of block 0, no state slot),
// and its logits are not used. Inputs live in one fixed device buffer laid out from
// kStepArrays, which each step rewrites before the replay. The first step of a (bucket, q)
// shape runs eagerly over those buffers (its result is the step's result), then the shape is
// captured for the next time; a verification shape whose capture fails runs eagerly from then
// on (a decode shape's failure turns graphs off). Every rank of a TP group takes the same
// decisions from the same plan, so their graphs (with the collectives inside) pair up. A model
// with an MTP layer brings its drafting too (MtpDrafter, engine/spec/mtp_drafter.h), whose graph
// families use the same layouts and capture.
#pragma once
#include <array>
#include <functional>
#include <map>
#include <memory>
#include <set>

#include "engine/step_plan.h"
#include "model/model.h"

namespace tessera {

namespace dist {
class Communicator;
}

class MtpDrafter;

class ModelRunner {
 public:
  ModelRunner(Model& model, Backend& backend);
  ~ModelRunner();
  // Allocates the cache; graphs when init.max_graph_batch > 0 and the backend and model allow.
  void init_cache(const CacheInit& init);
  bool cache_ready() const { return kv_.num_blocks > 0; }
  // The step's logits (undefined on ranks that do not return them), valid until the next run.
  // argmax_rows: the rows whose greedy pick alone is read (argmax_rows(StepSampling)); where the
  // model shards its logits (TP) they come back as stand-in rows (StepInputs::argmax_rows). A
  // graphed step takes them when they are every row (its graph is captured so, as a shape of its
  // own), else gathers every row whole.
  Tensor run(const ModelInput& input, const std::vector<int32_t>& argmax_rows = {});
  const KvCache& cache() const { return kv_; }
  // Models with an MTP layer (Model::has_mtp): their drafting, which every run() hands its final
  // hidden states (kept on the device). Fails on a model without the layer.
  MtpDrafter& mtp();
  // Communicators whose collectives run inside the graphs: a replay is put under their
  // watchdog (a peer stuck mid-replay then ends the rank instead of hanging it).
  void watch(std::vector<dist::Communicator*> comms) { watched_ = std::move(comms); }

 private:
  friend class MtpDrafter;  // (its graph families use the layouts, fill, views and run_graph below)
  struct Graph {
    std::unique_ptr<CapturedGraph> graph;
    Tensor out;  // the logits (run) or the drafts (MtpDrafter)
    size_t scratch_bytes = 0;
  };
  // Graphs of one kind by shape key (bucket, q, and for steps 1 when every row is an argmax row
  // (else 0), for MTP drafting the passes), and the keys whose capture failed (they run eagerly).
  using GraphKey = std::array<int, 3>;
  struct GraphFamily {
    std::map<GraphKey, Graph> graphs;
    std::set<GraphKey> eager;
    void clear() {
      graphs.clear();
      eager.clear();
    }
  };
  // Where one pass's step arrays live in a graph input buffer (i32 offsets; -1: absent).
  struct GraphLayout {
    std::vector<int64_t> offset;
    bool logits_per_seq = false;  // logits rows are data, one a sequence (MTP's first pass)
  };
  // Lays out the arrays of a pass at bucket B of up to Q tokens a sequence from `off` (block
  // tables apart: lay_out_table); returns the end.
  int64_t lay_out(GraphLayout& g, int64_t off, int64_t B, int64_t Q, bool with_tokens) const;
  int64_t lay_out_table(GraphLayout& g, int64_t off, int64_t B) const;
  static size_t table_index();  // the block table's row of kStepArrays
  // Writes `in` padded to bucket b (q tokens a sequence) into `mirror`; returns the end used.
  int64_t fill(const GraphLayout& g, const ModelInput& in, int b, int q, std::vector<int32_t>& mirror) const;
  // The pass's device views of `buf` (and the host copies the backends read, from `mirror`).
  StepInputs views(const GraphLayout& g, const ModelInput& in, int b, int q, const Tensor& buf,
                   const std::vector<int32_t>& mirror) const;
  // The buckets and the step graphs' input buffer (graphs on).
  void init_step_graphs(const CacheInit& init);
  int bucket_for(int batch) const;  // 0: no bucket
  // The tokens per sequence of a graphable step (0: not graphable).
  int graph_query_len(const ModelInput& input) const;
  // Replays the graph of `key`, or runs `body` eagerly and captures it for the next time (a
  // failed capture turns graphs off for a decode key, else leaves the key eager). Returns body's
  // tensor.
  Tensor run_graph(GraphFamily& family, const GraphKey& key, bool decode, const std::function<Tensor()>& body);
  // run(), with the bucket the step ran at (0: eagerly) and its step inputs (MtpDrafter reads them).
  struct StepRun {
    Tensor logits;
    int bucket = 0;
    StepInputs inputs;
  };
  StepRun run_step(const ModelInput& in, const std::vector<int32_t>& argmax_rows = {});
  // Copies the (src, dst) state-slot pairs of every linear-attention layer, in order.
  void apply_state_copies(const std::vector<int32_t>& pairs);

  Model& model_;
  Backend& backend_;
  int max_model_len_ = 0;
  KvCache kv_;
  bool graphs_enabled_ = false;
  std::vector<int> buckets_;
  int max_q_ = 1;       // CacheInit::graph_query_len
  int max_blocks_ = 0;  // block-table width of the graph inputs
  int kv_groups_ = 1;   // KV cache groups: block tables and slot mappings a step carries
  // Step graph inputs: one device buffer laid out by step_layout_; each step fills its host
  // mirror h_step_ (no allocation per step) and copies the prefix it used.
  GraphLayout step_layout_;
  Tensor graph_buf_;
  std::vector<int32_t> h_step_;
  GraphFamily step_graphs_;          // by (bucket, q, 0)
  std::unique_ptr<MtpDrafter> mtp_;  // models with an MTP layer
  std::vector<dist::Communicator*> watched_;
};

}  // namespace tessera
