#include "cli/plan_flags.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "core/logging.h"

namespace tessera::cli {

plan::PlanInputs plan_inputs(const EngineFlags& f) {
  plan::PlanInputs in;
  in.model_dir = f.model;
  in.tensor_parallel_size = f.tensor_parallel_size;
  in.pipeline_parallel_size = f.pipeline_parallel_size;
  in.enable_expert_parallel = f.enable_expert_parallel;
  in.max_model_len = f.max_model_len;
  in.max_num_seqs = f.max_num_seqs;
  in.max_num_batched_tokens = f.max_num_batched_tokens > 0 ? f.max_num_batched_tokens : 8192;
  in.block_size = f.block_size;
  in.gpu_memory_utilization = f.gpu_memory_utilization;
  in.kv_cache_dtype = f.kv_cache_dtype;
  in.mamba_cache_dtype = f.mamba_cache_dtype;
  in.mamba_ssm_cache_dtype = f.mamba_ssm_cache_dtype;
  in.enable_prefix_caching = f.enable_prefix_caching;
  in.hybrid_kv_cache_manager = !f.disable_hybrid_kv_cache_manager;
  in.enforce_eager = f.enforce_eager;
  in.disable_custom_all_reduce = f.disable_custom_all_reduce;
  in.num_gpu_blocks_override = f.num_gpu_blocks_override;
  in.load_format = f.load_format;
  in.quantization = f.quantization;
  in.hf_overrides = hf_overrides_json(f);
  const SpeculativeConfig spec = parse_speculative_config(f.speculative_config);
  in.state_slots_per_seq = spec.enabled() ? 1 + spec.num_speculative_tokens : 1;
  in.mtp = spec.enabled() && spec.method == "mtp";
  return in;
}

plan::Target local_target(const EngineFlags& f, const Backend& backend) {
  plan::Target t = plan::measured_target(backend);
  if (!f.gpu_memory.empty()) {
    t.memory_bytes = std::min(t.memory_bytes, plan::parse_memory_size(f.gpu_memory));
    t.description += ", --gpu-memory " + f.gpu_memory;
  }
  return t;
}

namespace {

plan::Plan plan_here(const EngineFlags& f, const Backend& backend) {
  plan::PlanInputs in = plan_inputs(f);
  in.target = local_target(f, backend);
  const int world = f.tensor_parallel_size * f.pipeline_parallel_size;
  in.target.nodes = 1;
  in.target.gpus_per_node = world;
  plan::Plan p = plan::make_plan(in);
  if (!p.fits)
    fail(ErrorKind::kOutOfMemory, "this configuration cannot fit ({}; `tessera plan` shows the details): {}",
         in.target.description, p.verdict);
  return p;
}

}  // namespace

void plan_or_fail(const EngineFlags& f) {
  auto backend = make_backend_for(f);
  (void)plan_here(f, *backend);
}

void plan_or_fail(const EngineFlags& f, const Backend& backend, EngineConfig& ec, int nodes) {
  const auto start = std::chrono::steady_clock::now();
  const plan::Plan p = plan_here(f, backend);
  const plan::PlanInputs& in = p.in;
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  const plan::StagePlan& s0 = p.stages.front();
  TLOG_INFO(
      "Plan ({:.0f} ms, before loading): {:.2f} GiB of weights per rank, {:.2f} GiB in use before the cache, {:.2f} "
      "GiB reserved for activations; {} KV blocks ({} tokens, {:.2f} sequences of {})",
      ms, s0.weight_bytes / 1073741824.0, s0.used_before_cache / 1073741824.0, s0.activation_bytes / 1073741824.0,
      p.num_blocks, with_thousands(p.kv_tokens), p.max_concurrency, p.max_model_len);
  if (!p.full_concurrency) TLOG_WARN("{}", p.verdict);
  const int world = f.tensor_parallel_size * f.pipeline_parallel_size;
  if (nodes > 1 && world % nodes == 0) {
    const plan::NetworkStep n = plan::network_step_at(p, 1, world / nodes);
    if (n.traffic.messages() > 0)
      TLOG_INFO(
          "Network per batch-1 decode step between the {} nodes: {} (`tessera plan MODEL --nodes {} --gpus-per-node "
          "{} --link GBIT,US` prices it; `tessera doctor` measures the link)",
          nodes, plan::describe_traffic(n.traffic), nodes, world / nodes);
  }
  if (!f.gpu_memory.empty()) ec.device_memory = in.target.memory_bytes;
  ec.reserved_bytes = s0.activation_bytes;
  ec.planned_blocks = p.num_blocks;
  ec.planned_used_bytes = s0.used_before_cache;
}

}  // namespace tessera::cli
