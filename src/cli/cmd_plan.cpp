// tessera plan MODEL [the serve flags]: will it fit, and with how many KV tokens? Weights per
// rank as the loader places them, KV bytes per token and block, activations, communicators;
// the verdict says what to change, with numbers. No GPU needed, no weight read.
#include <algorithm>
#include <nlohmann/json.hpp>

#include <cstdio>

#include "cli/engine_flags.h"
#include "cli/flag_parsing.h"
#include "cli/plan_flags.h"
#include "cli/verbs.h"
#include "core/error.h"

namespace tessera::cli {

namespace {

nlohmann::json to_json(const plan::Plan& p) {
  nlohmann::json j;
  const plan::PlanInputs& in = p.in;
  j["model"] = in.model_dir;
  j["architecture"] = p.config.architecture;
  j["target"] = {{"description", in.target.description},
                 {"device", in.target.device == DeviceType::kCUDA ? "cuda" : "cpu"},
                 {"memory_bytes", in.target.memory_bytes},
                 {"unified", in.target.unified},
                 {"bandwidth_bytes_per_s", in.target.bandwidth},
                 {"nodes", in.target.nodes},
                 {"gpus_per_node", in.target.gpus_per_node}};
  j["tensor_parallel_size"] = in.tensor_parallel_size;
  j["pipeline_parallel_size"] = in.pipeline_parallel_size;
  j["max_model_len"] = p.max_model_len;
  j["max_num_seqs"] = in.max_num_seqs;
  j["gpu_memory_utilization"] = in.gpu_memory_utilization;
  const bool fp8 = std::any_of(p.stages.begin(), p.stages.end(), [](const auto& s) { return s.fp8_weight_bytes > 0; });
  // Weights: block-scaled FP8 where the model holds any (the rest, e.g. norms and embeddings, in
  // the compute dtype), else the compute dtype.
  j["weight_dtype"] = fp8 ? "fp8_e4m3 (block 128x128) + " + std::string(dtype_name(p.compute_dtype))
                          : std::string(dtype_name(p.compute_dtype));
  j["kv_cache_dtype"] = dtype_name(p.kv_dtype);
  j["block_size"] = in.block_size;
  j["checkpoint_bytes"] = p.checkpoint_bytes;
  j["stages"] = nlohmann::json::array();
  for (const auto& s : p.stages) {
    j["stages"].push_back({{"pp_rank", s.pp_rank},
                           {"layers", {s.layers.begin, s.layers.end}},
                           {"weight_bytes", s.weight_bytes},
                           {"fp8_weight_bytes", s.fp8_weight_bytes},
                           {"weight_tensors", s.weight_tensors},
                           {"other_model_bytes", s.other_bytes},
                           {"runtime_bytes", s.runtime_bytes},
                           {"runtime_estimated", s.runtime_estimated},
                           {"communicator_bytes", s.comm_bytes},
                           {"activation_bytes", s.activation_bytes},
                           {"used_before_cache", s.used_before_cache},
                           {"usable_bytes", s.kv.usable},
                           {"cache_budget_bytes", s.kv.budget},
                           {"kv_bytes_per_token", s.cache.kv_bytes_per_token(in.block_size)},
                           {"kv_bytes_per_block", s.cache.kv_bytes_per_block},
                           {"state_bytes_per_sequence", s.cache.state_bytes_per_seq},
                           {"paged_layers", s.cache.paged_layers},
                           {"state_layers", s.cache.state_layers},
                           {"num_blocks", s.kv.num_blocks},
                           {"num_state_slots", s.kv.num_state_slots},
                           {"state_bytes", s.kv.state_bytes}});
  }
  j["num_blocks"] = p.num_blocks;
  j["num_state_slots"] = p.num_state_slots;
  j["effective_max_num_seqs"] = p.max_num_seqs;
  j["conv_state_dtype"] = dtype_name(p.conv_state_dtype);
  j["ssm_state_dtype"] = dtype_name(p.ssm_state_dtype);
  j["kv_tokens"] = p.kv_tokens;
  j["max_concurrency"] = p.max_concurrency;
  auto ceiling = [](const plan::DecodeCeiling& d) {
    return nlohmann::json{{"batch", d.batch},
                          {"stage_bytes", d.stage_bytes},
                          {"step_seconds", d.step_seconds},
                          {"steps_per_second", d.steps_per_second},
                          {"tokens_per_second", d.tokens_per_second}};
  };
  if (p.ceiling_one) j["decode_ceiling"] = {{"batch_1", ceiling(*p.ceiling_one)}, {"batch", ceiling(*p.ceiling_batch)}};
  auto network = [](const plan::NetworkStep& n) {
    const plan::CrossNodeTraffic& t = n.traffic;
    return nlohmann::json{{"batch", n.batch},
                          {"all_reduces", t.all_reduces},
                          {"gathers", t.gathers},
                          {"stage_sends", t.stage_sends},
                          {"broadcasts", t.broadcasts},
                          {"bytes", t.bytes},
                          {"whole_row_bytes", t.whole_row_bytes},
                          {"latencies", t.latencies},
                          {"seconds", n.seconds},
                          {"step_seconds", n.step_seconds}};
  };
  if (p.network_one) {
    j["network"] = {{"batch_1", network(*p.network_one)}};
    if (p.network_batch) j["network"]["batch"] = network(*p.network_batch);
    if (p.network_alternative)
      j["network"]["alternative"] = {{"tensor_parallel_size", p.alternative_tp},
                                     {"pipeline_parallel_size", p.alternative_pp},
                                     {"batch_1", network(*p.network_alternative)}};
  }
  if (in.target.unified)
    j["unified_memory"] = {{"os_reserve_bytes", plan::kUnifiedOsReserve},
                           {"max_gpu_memory_utilization", p.max_utilization},
                           {"min_gpu_memory_utilization", p.min_utilization}};
  j["fits"] = p.fits;
  j["full_concurrency"] = p.full_concurrency;
  j["verdict"] = p.verdict;
  j["flag_to_change"] = p.flag_to_change;
  return j;
}

}  // namespace

int run_plan(int argc, char** argv) {
  CLI::App app{
      "Will MODEL fit with these serve flags? Per rank: weights, KV cache, activations; KV tokens and concurrency.\n"
      "  tessera plan configs/qwen3-8b --gpu h100 --max-model-len 32768 --max-num-seqs 64\n"
      "  tessera plan configs/qwen3-8b --gpu rtx4090 --nodes 2 --gpus-per-node 4 --suggest",
      "tessera plan"};
  use_vllm_conventions(app);
  app.allow_extras();
  EngineFlags ef;
  ClusterFlags cf;
  std::string gpu;
  int nodes = 0, gpus_per_node = 0;
  bool suggest = false, json = false;
  app.add_option("model,--model", ef.model, "model directory (config.json; safetensors optional)")->required();
  add_engine_flags(app, ef);
  add_cluster_flags(app, cf);
  std::string gpu_help = "the target GPU (default: this machine's device):";
  for (const auto& g : plan::gpu_table()) gpu_help += " " + g.name + (g.alias.empty() ? "" : " (" + g.alias + ")");
  app.add_option("--gpu", gpu, gpu_help);
  app.add_option("--nodes", nodes, "nodes of the target (default --nnodes, or 1)");
  app.add_option("--gpus-per-node", gpus_per_node, "GPUs per node of the target (default TP x PP / nodes)");
  app.add_flag("--suggest", suggest, "list the TP x PP layouts that fit (TP inside a node first)");
  std::string link;
  app.add_option("--link", link,
                 "the link between nodes, GBIT[,LATENCY_US] (e.g. 50,20; latency 25 µs when left out; tessera doctor "
                 "measures both): the network's time in a decode step");
  app.add_flag("--json", json, "print the plan as JSON");
  if (int rc = parse_flags(app, argc, argv); rc >= 0) return rc;
  resolve_model(ef);
  std::vector<std::string> ignored;
  for (const auto& extra : app.remaining())
    if (!extra.empty() && extra[0] == '-') ignored.push_back(extra.substr(0, extra.find('=')));
  if (!ignored.empty() && !json)
    std::fprintf(stderr, "note: not about memory, ignored: %s\n", fmt::format("{}", fmt::join(ignored, " ")).c_str());
  as_flag_errors([&] { (void)engine_config(ef, /*parallel_supported=*/true); });  // as serve
  plan::PlanInputs in = plan_inputs(ef);
  plan::Target& t = in.target;
  t.nodes = nodes > 0 ? nodes : cf.nnodes.value_or(1);
  if (t.nodes < 1) fail(ErrorKind::kInvalidArgument, "--nodes must be at least 1");
  t.gpus_per_node = gpus_per_node;
  std::optional<plan::LinkSpec> link_spec;
  if (!link.empty()) as_flag_errors([&] { link_spec = plan::parse_link(link); });
  if (!gpu.empty()) {
    auto g = plan::find_gpu(gpu);
    if (!g) {
      std::string names;
      for (const auto& e : plan::gpu_table()) names += (names.empty() ? "" : ", ") + e.name;
      fail(ErrorKind::kInvalidArgument, "--gpu {}: unknown GPU (known: {}); or give --gpu-memory SIZE", gpu, names);
    }
    t.device = DeviceType::kCUDA;
    t.memory_bytes = g->memory_bytes;
    t.unified = g->unified;
    t.bandwidth = g->bandwidth;
    t.description = "--gpu " + g->name + " (" + g->description + ")";
    if (!ef.gpu_memory.empty()) {
      t.memory_bytes = plan::parse_memory_size(ef.gpu_memory);
      t.description += ", --gpu-memory " + ef.gpu_memory;
    }
  } else if (!ef.gpu_memory.empty() && ef.device != "cpu") {
    t.device = DeviceType::kCUDA;
    t.memory_bytes = plan::parse_memory_size(ef.gpu_memory);
    t.description = "--gpu-memory " + ef.gpu_memory;
  } else {
    auto backend = make_backend_for(ef);  // this machine: its device and what is in use on it
    t = local_target(ef, *backend);
    t.nodes = nodes > 0 ? nodes : cf.nnodes.value_or(1);
    t.gpus_per_node = gpus_per_node;
  }
  t.link = link_spec;
  const int world = ef.tensor_parallel_size * ef.pipeline_parallel_size;
  if (!suggest && t.gpus_per_node > 0 && world > t.nodes * t.gpus_per_node)
    fail(ErrorKind::kInvalidArgument, "TP x PP = {} ranks, but the target has {} nodes x {} GPUs", world, t.nodes,
         t.gpus_per_node);
  if (suggest) {
    auto layouts = plan::suggest_layouts(in);
    if (json) {
      nlohmann::json j = nlohmann::json::array();
      for (const auto& p : layouts) j.push_back(to_json(p));
      std::printf("%s\n", j.dump(2).c_str());
    } else {
      std::printf("Layouts that fit %s (%d node(s) x %d GPUs), TP inside a node first:\n", t.description.c_str(),
                  t.nodes, t.gpus_per_node > 0 ? t.gpus_per_node : 8);
      // With --link: a batch-1 decode step's network time and its time with the reads.
      const bool timed = t.link.has_value() && t.bandwidth > 0;
      std::printf("  %-4s %-4s %-16s %-16s %-14s %s%s\n", "TP", "PP", "weights/rank", "KV tokens/rank", "concurrency",
                  timed ? "network b1  step b1     " : "", "verdict");
      for (const auto& p : layouts) {
        std::string times;
        if (timed) {
          // Within a node nothing crosses the link: the step is the ceiling's reads alone.
          const double net = p.network_one ? p.network_one->seconds : 0.0;
          const double step = p.network_one ? p.network_one->step_seconds : p.ceiling_one->step_seconds;
          times =
              fmt::format("{:<11} {:<12} ", fmt::format("{:.2f} ms", net * 1e3), fmt::format("{:.2f} ms", step * 1e3));
        }
        std::printf("  %-4d %-4d %-16s %-16s %-14s %s%s\n", p.in.tensor_parallel_size, p.in.pipeline_parallel_size,
                    format_gib(p.stages.front().weight_bytes).c_str(), with_thousands(p.kv_tokens).c_str(),
                    fmt::format("{:.2f}", p.max_concurrency).c_str(), times.c_str(),
                    p.full_concurrency ? "fits" : "fits (fewer seqs)");
      }
      if (layouts.empty()) std::printf("  none: use GPUs with more memory, or lower --max-model-len\n");
    }
    return layouts.empty() ? 1 : 0;
  }
  const plan::Plan p = plan::make_plan(in);
  if (json)
    std::printf("%s\n", to_json(p).dump(2).c_str());
  else
    std::printf("%s", plan::render_text(p).c_str());
  return p.fits ? 0 : 1;
}

}  // namespace tessera::cli
