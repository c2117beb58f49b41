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
// decisions from the same plan, so their graphs (with the collectives inside) pair up.
#pragma once
#include <array>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <tuple>

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
  // the greedy drafts, i32 [passes, W] in scratch memory: row j, column i < in.num_drafting is
  // draft j + 1 of drafting sequence i (W >= num_drafting: a graph's bucket). After a step
  // whose sequences all had q rows and all draft (MtpProposer's uniform pass 1), the passes
  // replay a captured graph where the step's graphs are on.
  Tensor run_mtp(const MtpDraftInput& in);
  // Speculative decoding with MTP, the step and its drafting with no host round trip between
  // them (MtpStepResult). `in` must pass mtp_step_fusable: every sequence q rows (decode, or the
  // verification of q - 1 drafts), the logits of every row. After the step, `sample` draws the
  // rows' tokens into the tensor it is given; then, on the device: accept_drafts, the MTP pass
  // over every row of the step (its tokens: the sampled ones; a row past a sequence's accepted
  // ones computes what a later pass overwrites) and `passes` - 1 chained passes from each
  // sequence's accepted row (draft_positions), with one download of the tokens, the accepted
  // counts and the drafts at the end. Graphed steps replay one captured graph for the drafting
  // per (bucket, q, passes), up to the MTP graph batch; other steps run the same ops eagerly.
  bool mtp_step_fusable(const ModelInput& in) const;
  using SampleFn = std::function<void(const Tensor& logits, const Tensor& ids)>;
  void run_with_mtp(const ModelInput& in, int passes, const SampleFn& sample, MtpStepResult& result);
  // Communicators whose collectives run inside the graphs: a replay is put under their
  // watchdog (a peer stuck mid-replay then ends the rank instead of hanging it).
  void watch(std::vector<dist::Communicator*> comms) { watched_ = std::move(comms); }

 private:
  struct Graph {
    std::unique_ptr<CapturedGraph> graph;
    Tensor out;  // the logits (run) or the drafts (run_mtp)
    size_t scratch_bytes = 0;
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
  // Writes `in` padded to bucket b (q tokens a sequence) into `mirror`; returns the end used.
  int64_t fill(const GraphLayout& g, const ModelInput& in, int b, int q, std::vector<int32_t>& mirror) const;
  // The pass's device views of `buf` (and the host copies the backends read, from `mirror`).
  StepInputs views(const GraphLayout& g, const ModelInput& in, int b, int q, const Tensor& buf,
                   const std::vector<int32_t>& mirror) const;
  int bucket_for(int batch) const;  // 0: no bucket
  // The tokens per sequence of a graphable step (0: not graphable).
  int graph_query_len(const ModelInput& input) const;
  // Replays the graph of `key`, or runs `body` eagerly and captures it for the next time
  // (`fallback`: where a failed capture leaves the key). Returns body's tensor.
  template <typename Key, typename Body>
  Tensor run_graph(std::map<Key, Graph>& graphs, std::set<Key>& eager, const Key& key, bool decode, Body body);
  // MTP passes as one graph: inputs laid out at init (mtp_*), key (bucket, q, passes).
  bool mtp_graphable(const MtpDraftInput& in, int& b, int& q) const;
  Tensor run_mtp_graph(const MtpDraftInput& in, int b, int q);
  // The passes themselves (eager and captured alike): drafts i32 [passes, S_rows] (into
  // `drafts_out` [passes * S_rows] when given).
  Tensor mtp_passes(StepInputs& first, const Tensor& hidden, std::vector<StepInputs>& chained, int64_t S_rows,
                    const Tensor* drafts_out = nullptr);
  // run_with_mtp's device buffer: per call, one i32 region laid out for W sequences of up to Q
  // rows and P passes (a graph's W, Q, P are the largest it may take, so its offsets stay put).
  struct FusedLayout {
    int64_t ids = 0, rows = 0, drafts = 0, order1 = 0, order2 = 0, qsl = 0, lidx = 0, chain = 0, end = 0;
  };
  static FusedLayout fused_layout(int64_t W, int64_t Q, int64_t P);
  // The device work after the step's sampling, for W rows of q (host_copies: fill the chained
  // passes' host arrays from the device, eager runs only).
  Tensor fused_drafting(const StepInputs& step, const FusedLayout& L, int64_t W, int q, int passes, bool host_copies);
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
  // Step graph inputs: one device buffer laid out by step_layout_; each step fills its host
  // mirror h_step_ (no allocation per step) and copies the prefix it used.
  GraphLayout step_layout_;
  Tensor graph_buf_;
  std::vector<int32_t> h_step_;
  std::map<std::pair<int, int>, Graph> graphs_;  // by (bucket, q)
  std::set<std::pair<int, int>> eager_shapes_;   // verification shapes whose capture failed
  // MTP drafting graphs (models with an MTP layer and speculation): batches up to mtp_max_b_;
  // pass 1 (q rows a sequence), then the chained passes (positions, KV slots, lengths; pass 1's
  // block tables), the fc orders of both, pass 1's block tables last.
  int mtp_max_b_ = 0;
  GraphLayout mtp_first_;
  std::vector<GraphLayout> mtp_chained_;
  int64_t mtp_order_first_ = 0, mtp_order_chained_ = 0;
  Tensor mtp_buf_;
  std::vector<int32_t> h_mtp_;
  std::map<std::tuple<int, int, int>, Graph> mtp_graphs_;  // by (bucket, q, passes)
  std::set<std::tuple<int, int, int>> mtp_eager_;
  // run_with_mtp: its buffer (FusedLayout) and graphs by (bucket, q, passes); the last run's
  // bucket (0: it ran eagerly) and step inputs.
  Tensor fused_buf_;
  std::map<std::tuple<int, int, int>, Graph> fused_graphs_;
  std::set<std::tuple<int, int, int>> fused_eager_;
  int last_bucket_ = 0;
  StepInputs last_inputs_;
  std::vector<int32_t> h_fused_;           // host side of its uploads and of its download
  std::array<int64_t, 5> fused_consts_{};  // (W, q, offsets) of the shape constants on the device
  // Models with an MTP layer: the last run's final hidden states ([hidden_rows_, H]; growing it
  // drops the captured graphs, which write into it).
  Tensor hidden_;
  int64_t hidden_rows_ = 0, last_tokens_ = 0;
  void reserve_hidden(int64_t rows);
  std::vector<dist::Communicator*> watched_;
};

}  // namespace tessera
