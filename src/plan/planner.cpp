#include "plan/planner.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>

#include "core/error.h"
#include "distributed/meta_communicator.h"
#include "engine/executor.h"
#include "loader/checkpoint.h"
#include "model/registry.h"
#include "plan/meta_backend.h"

namespace tessera::plan {

namespace {

namespace fs = std::filesystem;
constexpr size_t kMiB = size_t{1} << 20;
constexpr double kGiB = 1073741824.0;

using dist::MetaCommunicator;  // the groups a sharded model expects, every call a no-op

std::string gib(size_t b) { return fmt::format("{:.2f} GiB", static_cast<double>(b) / kGiB); }
std::string gib1(size_t b) { return fmt::format("{:.1f} GiB", static_cast<double>(b) / kGiB); }

// One step of `tokens` tokens over `seqs` sequences of at most `max_len` tokens each, run on
// the meta backend: the activation arena's peak for that step.
size_t step_activation_peak(Model& model, MetaBackend& be, const std::vector<LayerCacheSpec>& specs, int tokens,
                            int seqs, int context, int block_size, StateDtypes state_dtypes) {
  seqs = std::max(1, std::min(seqs, tokens));
  ModelInput in;
  const int vocab = model.config().vocab_size;
  in.token_ids.assign(static_cast<size_t>(tokens), 0);
  in.positions.resize(static_cast<size_t>(tokens));
  AttentionLayout& a = in.attention;
  a.block_size = block_size;
  a.query_start_loc.push_back(0);
  int next = 0;
  int max_blocks = 0;
  for (int s = 0; s < seqs; ++s) {
    const int q = tokens / seqs + (s < tokens % seqs ? 1 : 0);
    const int len = std::max(q, std::min(context, q + context - 1));  // context: tokens the sequence holds
    for (int i = 0; i < q; ++i) in.positions[static_cast<size_t>(next + i)] = std::min(len - q + i, context - 1);
    next += q;
    a.query_start_loc.push_back(next);
    a.seq_lens.push_back(len);
    max_blocks = std::max(max_blocks, (len + block_size - 1) / block_size);
    in.logits_indices.push_back(next - 1);
  }
  a.max_blocks_per_seq = max_blocks;
  a.block_tables.assign(static_cast<size_t>(seqs) * max_blocks, 0);
  a.slot_mapping.assign(static_cast<size_t>(tokens), 0);
  (void)vocab;
  // The cache's tensors come from a second meta backend: they are not activations.
  MetaBackend cache_be({be.device().type, be.compute_dtype(), 256, 0});
  CacheInit init;
  init.num_blocks = std::max(1, max_blocks);
  init.block_size = block_size;
  init.dtype = be.compute_dtype();
  init.conv_dtype = state_dtypes.conv;
  init.ssm_dtype = state_dtypes.ssm;
  const bool linear =
      std::any_of(specs.begin(), specs.end(), [](const LayerCacheSpec& s) { return s.kind == CacheKind::kStateSlot; });
  if (linear) {
    init.num_state_slots = seqs;
    in.linear.query_start_loc = a.query_start_loc;
    for (int s = 0; s < seqs; ++s) {
      in.linear.state_slots.push_back(s);
      in.linear.has_initial_state.push_back(1);
    }
  }
  KvCache cache = allocate_kv_cache(cache_be, specs, init);
  be.reset_scratch();
  be.reset_peak();
  (void)model.forward(in, cache);
  // The executor gathers the sampled rows' logits ([rows, vocab] f32) and their ids on top.
  const size_t sampling = static_cast<size_t>(seqs) * (static_cast<size_t>(model.config().vocab_size) * 4 + 4);
  return be.scratch_peak() + sampling;
}

struct StageModel {
  std::unique_ptr<MetaBackend> backend;
  std::unique_ptr<MetaCommunicator> tp, pp;
  std::unique_ptr<Model> model;
};

StageModel build_stage(const ModelConfig& config, const PlanInputs& in, int max_len, int pp_rank, DType compute,
                       DeviceType device) {
  StageModel s;
  s.backend = std::make_unique<MetaBackend>(
      MetaBackendOptions{device, compute, device == DeviceType::kCUDA ? size_t{256} : size_t{64}, 0});
  ModelOptions mo;
  mo.max_positions = max_len;
  mo.parallel.tp_size = in.tensor_parallel_size;
  mo.parallel.pp_size = in.pipeline_parallel_size;
  mo.parallel.pp_rank = pp_rank;
  mo.parallel.expert_parallel = in.enable_expert_parallel;
  mo.quantization = in.quantization;
  mo.mtp = in.mtp;
  if (in.tensor_parallel_size > 1) {
    s.tp = std::make_unique<MetaCommunicator>("tp", in.tensor_parallel_size, 0);
    mo.runtime.tp = s.tp.get();
  }
  if (in.pipeline_parallel_size > 1) {
    s.pp = std::make_unique<MetaCommunicator>("pp", in.pipeline_parallel_size, pp_rank);
    mo.runtime.pp = s.pp.get();
  }
  s.model = create_model(config, mo, *s.backend);
  return s;
}

}  // namespace

const std::vector<GpuSpec>& gpu_table() {
  // Totals as the driver reports them (nvidia-smi memory.total, MiB), or the nominal size
  // where the device reports system memory (GB10: 128 GB LPDDR5x shared with the CPU).
  // Bandwidth: the vendor's memory bandwidth (decimal units; H100 and A100 are the SXM parts).
  static const std::vector<GpuSpec> t = {
      {"h200", "NVIDIA H200 (141 GB HBM3e)", 143771 * kMiB, false, 4.8e12, ""},
      {"h100", "NVIDIA H100 80GB", 81559 * kMiB, false, 3.35e12, ""},
      {"h20", "NVIDIA H20 (96 GB)", 97871 * kMiB, false, 4.0e12, ""},
      {"a100", "NVIDIA A100 80GB", 81920 * kMiB, false, 2.039e12, ""},
      {"a100-40gb", "NVIDIA A100 40GB", 40960 * kMiB, false, 1.555e12, ""},
      {"l40s", "NVIDIA L40S (48 GB)", 46068 * kMiB, false, 864e9, ""},
      {"l40", "NVIDIA L40 (48 GB)", 46068 * kMiB, false, 864e9, ""},
      {"a10", "NVIDIA A10 (24 GB)", 23028 * kMiB, false, 600e9, ""},
      {"rtx4090", "NVIDIA GeForce RTX 4090 (24 GB)", 24564 * kMiB, false, 1.008e12, ""},
      {"rtx5090", "NVIDIA GeForce RTX 5090 (32 GB)", 32607 * kMiB, false, 1.792e12, ""},
      {"rtx5090d", "NVIDIA GeForce RTX 5090 D (32 GB)", 32607 * kMiB, false, 1.792e12, ""},
      {"rtx6000ada", "NVIDIA RTX 6000 Ada (48 GB)", 49140 * kMiB, false, 960e9, ""},
      {"rtxpro6000", "NVIDIA RTX PRO 6000 Blackwell (96 GB)", 97887 * kMiB, false, 1.792e12, ""},
      {"b200", "NVIDIA B200 (180 GB HBM3e)", 183359 * kMiB, false, 8.0e12, ""},
      {"gb10", "NVIDIA GB10 / DGX Spark (128 GB unified)", size_t{128} * 1000 * 1000 * 1000, true, 273e9, "dgx-spark"},
  };
  return t;
}

std::optional<GpuSpec> find_gpu(const std::string& name) {
  std::string n;
  for (char c : name)
    if (c != '-' && c != '_' && c != ' ') n.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  auto key = [](const std::string& name) {
    std::string k;
    for (char c : name)
      if (c != '-') k.push_back(c);
    return k;
  };
  for (const auto& g : gpu_table())
    if (key(g.name) == n || (!g.alias.empty() && key(g.alias) == n)) return g;
  return std::nullopt;
}

size_t parse_memory_size(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  double v = 0;
  try {
    if (i == 0) throw std::invalid_argument("no number");
    v = std::stod(text.substr(0, i));
  } catch (const std::exception&) {
    fail(ErrorKind::kInvalidArgument, "'{}' is not a memory size (e.g. 32GiB, 24GB, 80G)", text);
  }
  std::string unit;
  for (size_t j = i; j < text.size(); ++j)
    if (text[j] != ' ') unit.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(text[j]))));
  double mult = 0;
  if (unit.empty() || unit == "b")
    mult = 1;
  else if (unit == "k" || unit == "kib")
    mult = 1024.0;
  else if (unit == "kb")
    mult = 1e3;
  else if (unit == "m" || unit == "mib")
    mult = 1024.0 * 1024;
  else if (unit == "mb")
    mult = 1e6;
  else if (unit == "g" || unit == "gib")
    mult = kGiB;
  else if (unit == "gb")
    mult = 1e9;
  else if (unit == "t" || unit == "tib")
    mult = kGiB * 1024;
  else if (unit == "tb")
    mult = 1e12;
  else
    fail(ErrorKind::kInvalidArgument, "'{}': unknown unit '{}' (B, KiB, MiB, GiB, TiB, or KB, MB, GB, TB)", text, unit);
  if (!(v > 0)) fail(ErrorKind::kInvalidArgument, "'{}' is not a positive memory size", text);
  return static_cast<size_t>(v * mult);
}

double decode_step_bytes(const DecodeReads& r, int num_experts, int top_k, int batch, int64_t context) {
  const int b = std::max(1, batch);
  // Share of this rank's experts that b tokens reach: 1 - (1 - k/E)^b (k/E at one token).
  const double hit = num_experts > 0 && top_k > 0
                         ? 1.0 - std::pow(1.0 - std::min(1.0, static_cast<double>(top_k) / num_experts), b)
                         : 0.0;
  const double per_seq =
      static_cast<double>(r.kv_bytes_per_token) * static_cast<double>(std::max<int64_t>(0, context)) +
      static_cast<double>(r.state_bytes_per_seq);
  return static_cast<double>(r.dense_bytes) + static_cast<double>(r.expert_bytes) * hit + b * per_seq;
}

DecodeCeiling decode_ceiling(const std::vector<DecodeReads>& stages, int num_experts, int top_k, int batch,
                             int64_t context, double bandwidth) {
  if (!(bandwidth > 0)) fail(ErrorKind::kInvalidArgument, "decode ceiling: no memory bandwidth");
  DecodeCeiling d;
  d.batch = std::max(1, batch);
  for (const auto& r : stages) {
    d.stage_bytes.push_back(decode_step_bytes(r, num_experts, top_k, d.batch, context));
    d.step_seconds += d.stage_bytes.back() / bandwidth;
  }
  d.steps_per_second = d.step_seconds > 0 ? 1.0 / d.step_seconds : 0.0;
  d.tokens_per_second = d.steps_per_second * d.batch;
  return d;
}

int ranks_sharing_memory(const PlanInputs& in) {
  if (in.target.device == DeviceType::kCUDA) return 1;
  const int world = std::max(1, in.tensor_parallel_size * in.pipeline_parallel_size);
  const int nodes = std::max(1, in.target.nodes);
  return (world + nodes - 1) / nodes;
}

size_t rank_memory_bytes(const PlanInputs& in) {
  return in.target.memory_bytes / static_cast<size_t>(ranks_sharing_memory(in));
}

size_t Plan::usable() const {
  return static_cast<size_t>(in.gpu_memory_utilization * static_cast<double>(rank_memory_bytes(in)));
}

namespace {

// What a decode step reads on a rank of stage `s`: every weight but the routed experts (read
// for the experts a token is routed to) and an embedding table only gathered from (one row per
// token: the first stage's, unless the same stage's lm_head is tied to it, and with MTP under
// PP the last stage's copy, unless tied); the cache's bytes.
DecodeReads stage_reads(const ModelConfig& c, const StagePlan& s, size_t expert_bytes, int tp, int pp, bool mtp,
                        DType compute, int block_size) {
  DecodeReads r;
  r.expert_bytes = expert_bytes;
  size_t gathered = 0;
  const bool embeds = s.pp_rank == 0 || (mtp && s.pp_rank == pp - 1);
  if (embeds && !(c.tie_word_embeddings && (pp == 1 || s.pp_rank == pp - 1)))
    gathered = static_cast<size_t>(vocab_rows_per_rank(c.vocab_size, tp)) * static_cast<size_t>(c.hidden_size) *
               dtype_size(compute);
  r.dense_bytes = s.weight_bytes - std::min(s.weight_bytes, expert_bytes + gathered);
  r.kv_bytes_per_token = s.cache.kv_bytes_per_token(block_size);
  r.state_bytes_per_seq = s.cache.state_bytes_per_seq;
  return r;
}

// The decode ceiling at batch 1 and at the planned concurrency, at --max-model-len.
void add_ceilings(Plan& p) {
  const MoeConfig& moe = p.config.moe;
  std::vector<DecodeReads> reads;
  for (const auto& s : p.stages) reads.push_back(s.reads);
  const int batch = std::max(1, std::min(p.max_num_seqs, static_cast<int>(std::floor(p.max_concurrency + 1e-9))));
  const double bw = p.in.target.bandwidth;
  p.ceiling_one = decode_ceiling(reads, moe.num_experts, moe.num_experts_per_tok, 1, p.max_model_len, bw);
  p.ceiling_batch = decode_ceiling(reads, moe.num_experts, moe.num_experts_per_tok, batch, p.max_model_len, bw);
}

// The decode step's traffic between nodes at `batch`, and its time on the target's link.
NetworkStep network_step(const Plan& p, int batch, const std::optional<DecodeCeiling>& ceiling, int gpus_per_node) {
  const PlanInputs& in = p.in;
  TrafficLayout l;
  l.tensor_parallel = in.tensor_parallel_size;
  l.pipeline_parallel = in.pipeline_parallel_size;
  l.gpus_per_node = gpus_per_node;
  l.batch = batch;
  l.draft_tokens = in.state_slots_per_seq - 1;
  l.mtp = in.mtp;
  l.activation_bytes = static_cast<int>(dtype_size(p.compute_dtype));
  for (const auto& s : p.stages) l.stage_layers.push_back(s.layers.end - s.layers.begin);
  l.context = p.max_model_len;
  l.block_size = in.block_size;
  NetworkStep n;
  n.batch = batch;
  n.traffic = decode_step_traffic(p.config, l);
  if (in.target.link) {
    n.seconds = n.traffic.seconds(*in.target.link);
    if (ceiling) n.step_seconds = ceiling->step_seconds + n.seconds;
  }
  return n;
}

void add_network(Plan& p) {
  const PlanInputs& in = p.in;
  const int per_node = in.target.gpus_per_node;
  if (per_node <= 0 || in.tensor_parallel_size * in.pipeline_parallel_size <= per_node) return;
  p.network_one = network_step(p, 1, p.ceiling_one, per_node);
  const int batch = p.ceiling_batch ? p.ceiling_batch->batch : 1;
  if (batch > 1) p.network_batch = network_step(p, batch, p.ceiling_batch, per_node);
}

// The plan's numbers without the advice (which re-plans other configurations).
Plan compute(const PlanInputs& in) {
  Plan p;
  p.in = in;
  const int tp = in.tensor_parallel_size, pp = in.pipeline_parallel_size;
  if (tp < 1 || pp < 1)
    fail(ErrorKind::kInvalidArgument, "--tensor-parallel-size and --pipeline-parallel-size must be at least 1");
  if (!(in.gpu_memory_utilization > 0 && in.gpu_memory_utilization <= 1))
    fail(ErrorKind::kInvalidArgument, "--gpu-memory-utilization must be in (0, 1], got {}", in.gpu_memory_utilization);
  if (in.target.memory_bytes == 0) fail(ErrorKind::kInvalidArgument, "no memory size for the target device");
  if (in.max_num_seqs < 1) fail(ErrorKind::kInvalidArgument, "--max-num-seqs must be at least 1");
  if (in.block_size < 1) fail(ErrorKind::kInvalidArgument, "--block-size must be at least 1");
  p.config = load_model_config(in.model_dir, in.hf_overrides);
  const ModelConfig& c = p.config;
  p.max_model_len = in.max_model_len > 0 ? in.max_model_len : c.max_position_embeddings;
  if (p.max_model_len > c.max_position_embeddings)
    fail(ErrorKind::kInvalidArgument,
         "--max-model-len {} is larger than the model's max_position_embeddings ({}); lower --max-model-len",
         p.max_model_len, c.max_position_embeddings);
  const bool cuda = in.target.device == DeviceType::kCUDA;
  p.compute_dtype = cuda ? DType::kBF16 : DType::kF32;  // what each backend computes and loads in
  p.kv_dtype = parse_kv_cache_dtype(in.kv_cache_dtype, p.compute_dtype);
  const StateDtypes sdt = parse_mamba_cache_dtypes(in.mamba_cache_dtype, in.mamba_ssm_cache_dtype, p.compute_dtype);
  p.conv_state_dtype = sdt.conv;
  p.ssm_state_dtype = sdt.ssm;
  if (in.load_format != "dummy") {
    bool any = false;
    for (const auto& e : fs::directory_iterator(in.model_dir))
      if (e.path().extension() == ".safetensors") any = true;
    if (any) {  // headers only: the files are mapped, no tensor data is read
      Checkpoint ckpt(in.model_dir);
      for (const auto& f : ckpt.files()) {
        p.checkpoint_tensors += f->tensors().size();
        for (const auto& [name, t] : f->tensors()) p.checkpoint_bytes += t.bytes;
      }
    }
  }
  const int graph_batch = in.enforce_eager || !cuda ? 0 : std::min(in.max_num_seqs, 256);
  const int batched = std::max(1, in.max_num_batched_tokens);
  for (int stage = 0; stage < pp; ++stage) {
    StageModel sm = build_stage(c, in, p.max_model_len, stage, p.compute_dtype, in.target.device);
    StagePlan s;
    s.pp_rank = stage;
    s.layers = pipeline_layer_range(c.num_layers, stage, pp);
    const size_t model_allocs = sm.backend->allocated_bytes();
    sm.model->weights().load_dummy(*sm.backend, 0);  // allocates every parameter as load() would
    s.weight_bytes = sm.backend->allocated_bytes() - model_allocs;
    s.weight_tensors = sm.model->weights().count();
    s.fp8_weight_bytes = sm.model->weights().fp8_bytes() + sm.model->weights().fp8_scale_bytes();
    s.other_bytes = model_allocs;
    const auto specs = sm.model->cache_specs();
    // As the engine groups them: the whole model only without pipeline stages.
    s.cache_groups = engine_cache_groups(specs, in.block_size, pp == 1, in.hybrid_kv_cache_manager);
    const std::vector<int> layer_groups = cache_layer_groups(s.cache_groups, static_cast<int>(specs.size()));
    s.cache = cache_footprint(specs, p.kv_dtype, in.block_size, sdt.conv, sdt.ssm, layer_groups);
    // Activations: a full prefill step, and the largest decode step (graphs replay inside the arena).
    const int prefill_tokens = std::min<int64_t>(batched, static_cast<int64_t>(in.max_num_seqs) * p.max_model_len);
    size_t act =
        step_activation_peak(*sm.model, *sm.backend, specs, prefill_tokens, std::min(in.max_num_seqs, prefill_tokens),
                             std::min(batched, p.max_model_len), in.block_size, sdt);
    const int decode_batch = std::min(in.max_num_seqs, 256);
    act = std::max(act, step_activation_peak(*sm.model, *sm.backend, specs, decode_batch, decode_batch, p.max_model_len,
                                             in.block_size, sdt));
    if (cuda) act = std::max(act, kCudaMinScratch);
    s.activation_bytes = act;
    // Runtime and communicators.
    if (in.target.baseline_used) {
      s.runtime_bytes = *in.target.baseline_used / static_cast<size_t>(ranks_sharing_memory(in));
    } else {
      s.runtime_bytes = cuda ? kCudaRuntimeEstimate : 0;
      s.runtime_estimated = cuda;
    }
    if (cuda) {
      s.comm_bytes = (tp > 1 ? kNcclCommEstimate : 0) + (pp > 1 ? kNcclCommEstimate : 0);
      const int gpus_per_node = in.target.gpus_per_node > 0 ? in.target.gpus_per_node : tp * pp / in.target.nodes;
      if (tp > 1 && !in.disable_custom_all_reduce && tp <= gpus_per_node) s.comm_bytes += kCustomAllReduceBytes;
    }
    s.used_before_cache = s.runtime_bytes + s.weight_bytes + s.other_bytes + s.comm_bytes;
    KvBudgetInputs kin;
    kin.total = rank_memory_bytes(in);
    kin.used = s.used_before_cache;
    kin.reserved = s.activation_bytes;
    kin.utilization = in.gpu_memory_utilization;
    kin.cpu = !cuda;
    kin.num_blocks_override = in.num_gpu_blocks_override;
    kin.block_size = in.block_size;
    kin.max_num_seqs = in.max_num_seqs;
    kin.max_model_len = p.max_model_len;
    if (!layer_groups.empty() || s.cache_groups.front().spec.kind == CacheGroupKind::kSlidingWindow)
      kin.blocks_per_seq = max_blocks_per_seq(s.cache_groups, p.max_model_len, batched);
    if (s.cache.state_layers > 0)
      kin.extra_state_slots = checkpoint_state_slots(in.max_num_seqs, in.enable_prefix_caching);
    kin.state_slots_per_seq = in.state_slots_per_seq;
    s.kv = plan_kv_budget(kin, s.cache);
    s.reads = stage_reads(c, s, sm.model->weights().expert_bytes(), tp, pp, in.mtp, p.compute_dtype, in.block_size);
    (void)graph_batch;
    p.stages.push_back(s);
  }
  // The engine plans from stage 0 and every stage allocates that many blocks.
  p.num_blocks = p.stages.front().kv.num_blocks;
  const KvCapacity capacity = kv_capacity(p.stages.front().cache_groups, p.num_blocks, p.max_model_len, batched);
  p.kv_tokens = capacity.tokens;
  p.max_concurrency = capacity.max_concurrency;
  p.num_state_slots = p.stages.front().kv.num_state_slots;
  p.max_num_seqs = p.stages.front().kv.max_num_seqs;
  if (p.num_state_slots > 0) p.max_concurrency = std::min(p.max_concurrency, static_cast<double>(p.max_num_seqs));
  // Every stage must hold its weights and activations, and stage 0's block count (the engine
  // allocates that many on every stage).
  bool stages_hold = true;
  for (const auto& s : p.stages) {
    if (s.used_before_cache + s.activation_bytes > s.kv.usable) stages_hold = false;
    if (in.num_gpu_blocks_override <= 0 && s.kv.num_blocks < p.num_blocks) stages_hold = false;
  }
  p.fits = stages_hold && p.kv_tokens >= p.max_model_len;
  p.full_concurrency = p.fits && p.max_concurrency + 1e-9 >= in.max_num_seqs;
  if (in.target.bandwidth > 0) add_ceilings(p);
  add_network(p);
  return p;
}

// The largest max_model_len (a multiple of 1024, or of the block size below that) whose `seqs`
// sequences fit in `tokens` cache tokens.
int fitting_len(int64_t tokens, int seqs, int block_size) {
  int64_t per = tokens / std::max(1, seqs);
  if (per >= 1024) return static_cast<int>(per / 1024 * 1024);
  return static_cast<int>(per / block_size * block_size);
}

std::optional<Plan> try_plan(PlanInputs in) {
  try {
    return compute(in);
  } catch (const Error&) {
    return std::nullopt;  // e.g. a TP that does not divide the heads
  }
}

// The smallest TP (above the current one) that makes `ok` true: within the GPUs of a cluster
// (--nodes N > 1 x --gpus-per-node G, all there is), else within one node of up to 8 GPUs
// (serve plans with gpus_per_node = its own TP x PP, not the machine's GPU count).
std::optional<Plan> larger_tp(const PlanInputs& in, bool (*ok)(const Plan&)) {
  const int gpus = in.target.gpus_per_node > 0 ? in.target.gpus_per_node * std::max(1, in.target.nodes) : 8;
  const int limit = in.target.nodes > 1 ? gpus : std::max(gpus, 8);
  for (int tp = in.tensor_parallel_size * 2; tp * in.pipeline_parallel_size <= limit; tp *= 2) {
    PlanInputs t = in;
    t.tensor_parallel_size = tp;
    if (auto p = try_plan(t); p && ok(*p)) return p;
  }
  return std::nullopt;
}

bool fits(const Plan& p) { return p.fits; }
bool fits_fully(const Plan& p) { return p.full_concurrency; }

std::string layout_flag(const Plan& p) {
  return fmt::format("--tensor-parallel-size {}{}", p.in.tensor_parallel_size,
                     p.in.pipeline_parallel_size > 1
                         ? fmt::format(" --pipeline-parallel-size {}", p.in.pipeline_parallel_size)
                         : std::string());
}

void advise(Plan& p) {
  const PlanInputs& in = p.in;
  const StagePlan& s0 = p.stages.front();
  const bool fp8 = p.kv_dtype == DType::kF8E4M3 || p.kv_dtype == DType::kF8E5M2;
  const std::string kvname(dtype_name(p.kv_dtype));
  // 1. The model itself does not fit (weights + activations beyond the usable memory).
  for (const auto& s : p.stages) {
    const size_t fixed = s.used_before_cache + s.activation_bytes;
    if (fixed <= s.kv.usable) continue;
    std::string what = fmt::format(
        "the model does not fit: rank {} needs {} for weights and {} for runtime, communicators and activations, but "
        "--gpu-memory-utilization {:.2f} of {} allows {}",
        s.pp_rank * in.tensor_parallel_size, gib(s.weight_bytes + s.other_bytes),
        gib(s.runtime_bytes + s.comm_bytes + s.activation_bytes), in.gpu_memory_utilization, gib(rank_memory_bytes(in)),
        gib(s.kv.usable));
    std::vector<std::string> fixes;
    if (auto t = larger_tp(in, fits))
      fixes.push_back(fmt::format("use {} ({} per rank, {} KV tokens)", layout_flag(*t),
                                  gib(t->stages.front().weight_bytes), with_thousands(t->kv_tokens)));
    else
      fixes.push_back("use more GPUs (--tensor-parallel-size / --pipeline-parallel-size)");
    const double need_util = static_cast<double>(fixed) / static_cast<double>(rank_memory_bytes(in)) + 0.01;
    if (need_util < 0.99) fixes.push_back(fmt::format("raise --gpu-memory-utilization to at least {:.2f}", need_util));
    p.flag_to_change = fixes.front().find("--tensor-parallel-size") != std::string::npos ? "--tensor-parallel-size"
                                                                                         : "--gpu-memory-utilization";
    p.verdict = what + "; " + fmt::format("{}", fmt::join(fixes, ", or "));
    return;
  }
  for (const auto& s : p.stages)
    if (in.num_gpu_blocks_override <= 0 && s.kv.num_blocks < p.num_blocks) {
      p.flag_to_change = "--gpu-memory-utilization";
      p.verdict = fmt::format(
          "does not fit: pipeline stage {} holds only {} KV blocks, but every stage allocates stage 0's {}; lower "
          "--gpu-memory-utilization or --max-model-len, or use another --pipeline-parallel-size",
          s.pp_rank, s.kv.num_blocks, p.num_blocks);
      return;
    }
  const size_t per_seq =
      s0.cache.kv_bytes_per_token(in.block_size) * static_cast<size_t>(p.max_model_len) + s0.cache.state_bytes_per_seq;
  if (p.fits && p.full_concurrency) {
    p.verdict = fmt::format(
        "fits: {} KV tokens per rank, {:.2f} sequences of --max-model-len {} at once (--max-num-seqs {}); {} of KV "
        "per full-length sequence at {}",
        with_thousands(p.kv_tokens), p.max_concurrency, p.max_model_len, in.max_num_seqs, gib1(per_seq), kvname);
    return;
  }
  // 2. Not even one sequence of max_model_len, or fewer than max_num_seqs at once.
  std::vector<std::string> fixes;
  // The longest --max-model-len that gives --max-num-seqs sequences, offered only when the
  // re-plan confirms it (a hybrid model's state slots grow into what a shorter length frees).
  const int len = fitting_len(p.kv_tokens, in.max_num_seqs, in.block_size);
  if (len > 0 && len < p.max_model_len) {
    PlanInputs l = in;
    l.max_model_len = len;
    if (auto q = try_plan(l); q && q->full_concurrency)
      fixes.push_back(fmt::format("at --max-num-seqs {} lower it to {}", in.max_num_seqs, len));
  }
  // Hybrid models: every --max-num-seqs sequence holds a linear-attention state slot, and the
  // slots come off the cache before the KV blocks, so fewer sequences give each one more KV.
  // The largest --max-num-seqs whose sequences all fit at --max-model-len (re-planned).
  if (s0.cache.state_layers > 0 && in.max_num_seqs > 1) {
    std::optional<Plan> best;
    int lo = 1, hi = in.max_num_seqs - 1;
    // S sequences of max_model_len need S x their KV out of the cache budget, state aside.
    const size_t seq_kv = s0.cache.kv_bytes_per_token(in.block_size) * static_cast<size_t>(p.max_model_len);
    if (seq_kv > 0) hi = static_cast<int>(std::min<size_t>(static_cast<size_t>(hi), s0.kv.budget / seq_kv));
    while (lo <= hi) {
      const int mid = lo + (hi - lo) / 2;
      PlanInputs f = in;
      f.max_num_seqs = mid;
      if (auto q = try_plan(f); q && q->full_concurrency) {
        best = std::move(q);
        lo = mid + 1;
      } else {
        hi = mid - 1;
      }
    }
    if (best)
      fixes.push_back(
          fmt::format("lower --max-num-seqs to {} ({} state slots, {} KV tokens: {} sequences of {} at once)",
                      best->in.max_num_seqs, best->num_state_slots, with_thousands(best->kv_tokens),
                      best->in.max_num_seqs, p.max_model_len));
  }
  if (!fp8) {
    PlanInputs f = in;
    f.kv_cache_dtype = "fp8";
    if (auto q = try_plan(f); q && q->kv_tokens > p.kv_tokens && (p.fits || q->fits))
      fixes.push_back(fmt::format("add --kv-cache-dtype fp8 ({} tokens, {:.2f} sequences)",
                                  with_thousands(q->kv_tokens), q->max_concurrency));
  }
  if (auto t = larger_tp(in, p.fits ? fits_fully : fits))
    fixes.push_back(fmt::format("use {} ({} tokens)", layout_flag(*t), with_thousands(t->kv_tokens)));
  const std::string head = fmt::format(
      "--max-model-len {} needs {} of KV per sequence at {}; the cache holds {} "
      "tokens ({:.2f} sequences)",
      p.max_model_len, gib1(per_seq), kvname, with_thousands(p.kv_tokens), p.max_concurrency);
  if (!p.fits) {
    p.flag_to_change = fixes.empty() || fixes.front().find("--max-num-seqs to") == std::string::npos ? "--max-model-len"
                                                                                                     : "--max-num-seqs";
    if (fixes.empty()) fixes.push_back("use more GPUs or raise --gpu-memory-utilization");
    p.verdict = "does not fit: " + head + "; " + fmt::format("{}", fmt::join(fixes, ", or "));
  } else {
    if (fixes.empty())
      fixes.push_back(fmt::format("lower --max-num-seqs to {}", std::max(1, static_cast<int>(p.max_concurrency))));
    p.verdict = fmt::format(
        "fits, but only {:.2f} of --max-num-seqs {} full-length sequences at once (the rest wait "
        "or are preempted): {}; {}",
        p.max_concurrency, in.max_num_seqs, head, fmt::join(fixes, ", or "));
  }
}

// Unified memory: the utilizations that fit between what the model needs and what leaves the
// OS kUnifiedOsReserve, each re-planned; an ask above the highest does not fit.
void unified_range(Plan& p) {
  const PlanInputs& in = p.in;
  const double total = static_cast<double>(in.target.memory_bytes);
  p.max_utilization = std::floor(std::max(0.0, total - static_cast<double>(kUnifiedOsReserve)) / total * 100) / 100;
  // Lower bound: every stage's weights, buffers, activations and one sequence of --max-model-len.
  double need = 0;
  for (const auto& s : p.stages)
    need = std::max(
        need, static_cast<double>(s.used_before_cache + s.activation_bytes +
                                  s.cache.kv_bytes_per_token(in.block_size) * static_cast<size_t>(p.max_model_len) +
                                  s.cache.state_bytes_per_seq));
  for (int u = static_cast<int>(std::ceil(need / total * 100 - 1e-9)); u <= std::lround(p.max_utilization * 100); ++u) {
    PlanInputs t = in;
    t.gpu_memory_utilization = u / 100.0;
    if (auto q = try_plan(t); q && q->fits) {
      p.min_utilization = u / 100.0;
      break;
    }
  }
  const std::string range =
      p.min_utilization > 0
          ? fmt::format("--gpu-memory-utilization {:.2f} to {:.2f} fits on this unified memory", p.min_utilization,
                        p.max_utilization)
          : fmt::format("no --gpu-memory-utilization up to {:.2f} fits on this unified memory", p.max_utilization);
  if (in.gpu_memory_utilization > p.max_utilization + 1e-9) {
    p.fits = p.full_concurrency = false;
    p.flag_to_change = "--gpu-memory-utilization";
    p.verdict = fmt::format(
        "does not fit: --gpu-memory-utilization {:.2f} of {} of unified memory leaves the OS {}, less than the {} the "
        "plan keeps for it ({}); {}{}",
        in.gpu_memory_utilization, gib(in.target.memory_bytes), gib(in.target.memory_bytes - p.usable()),
        gib(kUnifiedOsReserve),
        in.target.measured && in.target.baseline_used
            ? fmt::format("the OS, the page cache it cannot give back and other processes hold {} now",
                          gib(*in.target.baseline_used))
            : std::string("no other process assumed"),
        range,
        p.min_utilization > 0 ? fmt::format(": use --gpu-memory-utilization {:.2f}", p.max_utilization)
                              : std::string(": use more nodes"));
  } else if (!p.fits) {
    p.verdict += "; " + range;
  }
}

}  // namespace

Target measured_target(const Backend& backend) {
  Target t;
  t.device = backend.device().type;
  const size_t total = backend.total_memory(), free = backend.free_memory();
  t.memory_bytes = total;
  // What the engine will count (memory_in_use): this process's own use where the backend recorded
  // its start (other processes on the GPU are the startup check's business), else all in use.
  t.baseline_used = memory_in_use(total, free, backend.free_memory_at_start());
  t.unified = backend.unified_memory();
  t.measured = true;
  t.description = "this machine: " + backend.name() + (t.unified ? " (memory shared with the host)" : "");
  return t;
}

// TP across nodes: the batch-1 step of TP inside a node and PP across the nodes instead.
void network_alternative(Plan& p) {
  const PlanInputs& in = p.in;
  const int per_node = in.target.gpus_per_node;
  if (!p.network_one || in.tensor_parallel_size <= per_node) return;
  PlanInputs alt = in;
  alt.tensor_parallel_size = per_node;
  alt.pipeline_parallel_size = in.tensor_parallel_size * in.pipeline_parallel_size / per_node;
  try {
    const Plan a = compute(alt);
    if (!a.network_one) return;
    p.network_alternative = a.network_one;
    p.alternative_tp = alt.tensor_parallel_size;
    p.alternative_pp = alt.pipeline_parallel_size;
  } catch (const Error&) {  // a layout the model does not allow (heads not divisible): no alternative
  }
}

NetworkStep network_step_at(const Plan& p, int batch, int gpus_per_node) {
  return network_step(p, batch, std::nullopt, gpus_per_node);
}

Plan make_plan(const PlanInputs& in) {
  Plan p = compute(in);
  advise(p);
  network_alternative(p);
  if (in.target.unified) unified_range(p);
  return p;
}

}  // namespace tessera::plan

namespace tessera::plan {

std::vector<Plan> suggest_layouts(const PlanInputs& in) {
  const int nodes = std::max(1, in.target.nodes);
  const int per_node = in.target.gpus_per_node > 0 ? in.target.gpus_per_node : 8;
  const int gpus = nodes * per_node;
  std::vector<Plan> out;
  // TP inside a node first (the chatty all-reduce stays on NVLink/PCIe), PP across nodes.
  for (int total = 1; total <= gpus; total *= 2) {
    for (int tp = std::min(total, per_node); tp >= 1; tp /= 2) {
      const int pp = total / tp;
      if (tp * pp != total) continue;
      if (nodes > 1 && total > per_node && (total % nodes != 0)) continue;
      PlanInputs t = in;
      t.tensor_parallel_size = tp;
      t.pipeline_parallel_size = pp;
      t.target.gpus_per_node = per_node;
      t.target.nodes = std::max(1, (total + per_node - 1) / per_node);
      try {
        Plan p = make_plan(t);
        if (p.fits) out.push_back(std::move(p));
      } catch (const Error&) {
      }
    }
  }
  // Layouts that also TP across nodes (allowed, slower over Ethernet) when nothing else fits.
  if (out.empty() && nodes > 1)
    for (int tp = per_node * 2; tp <= gpus; tp *= 2) {
      PlanInputs t = in;
      t.tensor_parallel_size = tp;
      t.pipeline_parallel_size = 1;
      t.target.gpus_per_node = per_node;
      t.target.nodes = tp / per_node;
      try {
        Plan p = make_plan(t);
        if (p.fits) out.push_back(std::move(p));
      } catch (const Error&) {
      }
    }
  return out;
}

namespace {

std::string megabytes(double bytes) { return fmt::format("{:.2f} MB", bytes / 1e6); }

}  // namespace

// "97 all-reduces + 1 logits gather + 2 broadcasts: 1.23 MB, 196 one-way latencies"
std::string describe_traffic(const CrossNodeTraffic& t) {
  std::vector<std::string> parts;
  auto add = [&](int n, const char* one, const char* many) {
    if (n > 0) parts.push_back(fmt::format("{} {}", n, n == 1 ? one : many));
  };
  add(t.all_reduces, "all-reduce", "all-reduces");
  add(t.gathers, "logits gather", "logits gathers");
  add(t.stage_sends, "stage send", "stage sends");
  add(t.broadcasts, "plan broadcast or token return", "plan broadcasts and token returns");
  return fmt::format("{}: {}, {:.0f} one-way latencies", fmt::join(parts, " + "), megabytes(t.bytes), t.latencies);
}

namespace {

// The traffic of a decode step between the nodes, priced on --link when given.
void render_network(const Plan& p, std::string& o) {
  if (!p.network_one) return;
  const auto& link = p.in.target.link;
  // Greedy rows send each rank's (max, id); a row sampled at a temperature (or with logprobs) its slice.
  const double whole = p.network_one->traffic.whole_row_bytes;
  const std::string rows = whole > 0 ? fmt::format("; greedy rows, a sampled row adds {}", megabytes(whole)) : "";
  if (link)
    o += fmt::format(
        "network    per decode step between the nodes (--link {:.0f} Gb/s, {:.0f} µs one way; alpha-beta estimate, "
        "messages one after another{}):\n",
        link->bytes_per_second * 8 / 1e9, link->latency_seconds * 1e6, rows);
  else
    o += fmt::format("network    per decode step between the nodes (--link GBIT,US prices it on a link{}):\n", rows);
  auto line = [&](const NetworkStep& n) {
    o += fmt::format("           batch {:<4} {}", n.batch, describe_traffic(n.traffic));
    if (link) {
      o += fmt::format(" -> {:.2f} ms", n.seconds * 1e3);
      if (n.step_seconds > 0)
        o += fmt::format("; with the reads {:.2f} ms a step, {:.1f} steps/s", n.step_seconds * 1e3,
                         1.0 / n.step_seconds);
    }
    o += "\n";
  };
  line(*p.network_one);
  if (p.network_batch) line(*p.network_batch);
}

// " (a batch-1 step: 0.08 ms on the link and 3.1 ms in all, against 4.3 ms and 5.9 ms)" for the advice.
std::string compare_alternative(const Plan& p) {
  if (!p.network_alternative || !p.network_one) return "";
  const NetworkStep &a = *p.network_alternative, &here = *p.network_one;
  if (!p.in.target.link)
    return fmt::format(" (a batch-1 step: {} and {:.0f} latencies over the link, against {} and {:.0f} here)",
                       megabytes(a.traffic.bytes), a.traffic.latencies, megabytes(here.traffic.bytes),
                       here.traffic.latencies);
  if (a.step_seconds > 0 && here.step_seconds > 0)
    return fmt::format(
        " (a batch-1 step: {:.2f} ms on the link and {:.2f} ms in all, against {:.2f} ms and {:.2f} ms here{})",
        a.seconds * 1e3, a.step_seconds * 1e3, here.seconds * 1e3, here.step_seconds * 1e3,
        here.step_seconds < a.step_seconds ? ": on this link TP across the nodes is the faster at batch 1" : "");
  return fmt::format(" (a batch-1 step: {:.2f} ms on the link, against {:.2f} ms here)", a.seconds * 1e3,
                     here.seconds * 1e3);
}

}  // namespace

std::string render_text(const Plan& p) {
  const PlanInputs& in = p.in;
  const ModelConfig& c = p.config;
  std::string o;
  o += fmt::format("model      {} ({}: {} layers, hidden {}, {} heads / {} KV heads, head_dim {}, vocab {})\n",
                   in.model_dir, c.architecture, c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim,
                   c.vocab_size);
  if (p.checkpoint_bytes > 0)
    o += fmt::format("checkpoint {} in {} tensors (safetensors headers; no tensor data read)\n",
                     gib(p.checkpoint_bytes), p.checkpoint_tensors);
  else
    o += "checkpoint none read (weights counted from the model's declarations)\n";
  o += fmt::format("target     {}: {} per {}, {} node(s){}\n", in.target.description, gib(in.target.memory_bytes),
                   in.target.device == DeviceType::kCUDA ? "GPU" : "node", in.target.nodes,
                   ranks_sharing_memory(in) > 1 ? fmt::format(", {} ranks per node: {} each", ranks_sharing_memory(in),
                                                              gib(rank_memory_bytes(in)))
                                                : std::string());
  o += fmt::format(
      "flags      --tensor-parallel-size {} --pipeline-parallel-size {} --max-model-len {} --max-num-seqs {} "
      "--max-num-batched-tokens {} --gpu-memory-utilization {:.2f} --kv-cache-dtype {} ({}), weights in {}\n\n",
      in.tensor_parallel_size, in.pipeline_parallel_size, p.max_model_len, in.max_num_seqs, in.max_num_batched_tokens,
      in.gpu_memory_utilization, in.kv_cache_dtype, dtype_name(p.kv_dtype),
      p.stages.front().fp8_weight_bytes > 0
          ? fmt::format("fp8_e4m3 with {}x{} {} block scales (the rest {})", fp8_block_format().block_rows,
                        fp8_block_format().block_cols, dtype_name(fp8_block_format().scale),
                        dtype_name(p.compute_dtype))
          : std::string(dtype_name(p.compute_dtype)));
  o += fmt::format("{:<30}", "per rank");
  for (const auto& s : p.stages)
    o += fmt::format("{:>20}", fmt::format("stage {} (L{}-{})", s.pp_rank, s.layers.begin, s.layers.end - 1));
  o += "\n";
  auto row = [&](const char* name, auto get) {
    o += fmt::format("{:<30}", name);
    for (const auto& s : p.stages) o += fmt::format("{:>20}", get(s));
    o += "\n";
  };
  row("weights", [](const StagePlan& s) { return gib(s.weight_bytes); });
  if (p.stages.front().fp8_weight_bytes > 0)
    row("  of which FP8 (with scales)", [](const StagePlan& s) { return gib(s.fp8_weight_bytes); });
  row("other model buffers (rope)", [](const StagePlan& s) { return gib(s.other_bytes); });
  row("runtime (context, others)",
      [](const StagePlan& s) { return gib(s.runtime_bytes) + (s.runtime_estimated ? "*" : ""); });
  row("communicator buffers", [](const StagePlan& s) { return gib(s.comm_bytes) + (s.comm_bytes ? "*" : ""); });
  row("activations (peak step)", [](const StagePlan& s) { return gib(s.activation_bytes); });
  row("usable (utilization x mem)", [](const StagePlan& s) { return gib(s.kv.usable); });
  row("left for the cache", [](const StagePlan& s) { return gib(s.kv.budget); });
  row("KV bytes per token", [&](const StagePlan& s) {
    return with_thousands(static_cast<int64_t>(s.cache.kv_bytes_per_token(in.block_size)));
  });
  row("KV bytes per block",
      [](const StagePlan& s) { return with_thousands(static_cast<int64_t>(s.cache.kv_bytes_per_block)); });
  row("state bytes per sequence",
      [](const StagePlan& s) { return with_thousands(static_cast<int64_t>(s.cache.state_bytes_per_seq)); });
  row("KV blocks (own budget)", [](const StagePlan& s) { return with_thousands(s.kv.num_blocks); });
  if (p.num_state_slots > 0) {
    row("state slots", [](const StagePlan& s) { return with_thousands(s.kv.num_state_slots); });
    row("state slots' memory", [](const StagePlan& s) { return gib(s.kv.state_bytes); });
  }
  o += "\n";
  o += fmt::format("KV cache   {} blocks of {} = {} tokens per rank{}\n", with_thousands(p.num_blocks), in.block_size,
                   with_thousands(p.kv_tokens),
                   p.stages.front().kv.capped_by_seqs ? " (capped at --max-num-seqs x --max-model-len)" : "");
  if (p.num_state_slots > 0)
    o += fmt::format(
        "state      {} linear-attention state slots per rank ({} for sequences, the rest for prefix-cache "
        "checkpoints; conv state {}, recurrent state {}){}\n",
        with_thousands(p.num_state_slots), std::min(p.num_state_slots, p.max_num_seqs), dtype_name(p.conv_state_dtype),
        dtype_name(p.ssm_state_dtype),
        p.max_num_seqs < in.max_num_seqs
            ? fmt::format("; --max-num-seqs {} is lowered to {} at startup", in.max_num_seqs, p.max_num_seqs)
            : std::string());
  o += fmt::format("concurrency {:.2f} sequences of {} tokens at once\n", p.max_concurrency,
                   with_thousands(p.max_model_len));
  if (p.ceiling_one) {
    const double bw = in.target.bandwidth;
    o += fmt::format(
        "decode     ceiling from memory bandwidth alone ({} per GPU; no compute, no communication), {} tokens of "
        "context:\n",
        bw >= 1e12 ? fmt::format("{:.2f} TB/s", bw / 1e12) : fmt::format("{:.0f} GB/s", bw / 1e9),
        with_thousands(p.max_model_len));
    auto line = [&](const DecodeCeiling& d) {
      double sum = 0;
      std::vector<std::string> parts;
      for (size_t i = 0; i < d.stage_bytes.size(); ++i) {
        sum += d.stage_bytes[i];
        parts.push_back(fmt::format("stage {} {:.2f} GB", i, d.stage_bytes[i] / 1e9));
      }
      o += fmt::format("           batch {:<4} {:.2f} GB read per rank per step{} -> {:.1f} steps/s, {:.1f} tok/s\n",
                       d.batch, sum / 1e9,
                       parts.size() > 1 ? fmt::format(" ({}, one after another)", fmt::join(parts, " + ")) : "",
                       d.steps_per_second, d.tokens_per_second);
    };
    line(*p.ceiling_one);
    if (p.ceiling_batch && p.ceiling_batch->batch > 1) line(*p.ceiling_batch);
  }
  render_network(p, o);
  if (in.target.unified)
    o += fmt::format(
        "unified    {} shared with the OS: the plan leaves it {} (no other process assumed to hold memory), "
        "so {}\n",
        gib(in.target.memory_bytes), gib(kUnifiedOsReserve),
        p.min_utilization > 0
            ? fmt::format("--gpu-memory-utilization {:.2f} to {:.2f} fits", p.min_utilization, p.max_utilization)
            : fmt::format("no --gpu-memory-utilization up to {:.2f} fits", p.max_utilization));
  bool est = false;
  for (const auto& s : p.stages) est |= s.runtime_estimated || s.comm_bytes > 0;
  if (est) o += "* estimated (not measured on the target)\n";
  const int per_node = in.target.gpus_per_node;
  if (per_node > 0 && in.tensor_parallel_size > per_node)
    o += fmt::format(
        "note: TP {} spans {} nodes of {} GPUs, so every layer's all-reduce crosses the network; "
        "--tensor-parallel-size {} --pipeline-parallel-size {} keeps it inside the nodes{}\n",
        in.tensor_parallel_size, (in.tensor_parallel_size + per_node - 1) / per_node, per_node, per_node,
        in.tensor_parallel_size * in.pipeline_parallel_size / per_node, compare_alternative(p));
  o += fmt::format("\n{} {}\n", p.fits ? (p.full_concurrency ? "OK  " : "WARN") : "FAIL", p.verdict);
  return o;
}

}  // namespace tessera::plan
