#include "cli/engine_flags.h"

#include "loader/hf_cache.h"

#include <unistd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>

#include "cli/flag_parsing.h"
#include "core/error.h"
#include "core/logging.h"
#include "engine/memory_plan.h"
#include "plan/planner.h"

namespace tessera::cli {

std::string default_model_dir(const char* verb) {
  namespace fs = std::filesystem;
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) fail(ErrorKind::kInternal, "cannot find this binary (/proc/self/exe): {}", std::strerror(errno));
  exe[n] = 0;
  std::vector<std::string> tried;
  fs::path dir = fs::path(exe).parent_path();
  for (int up = 0; up < 5 && !dir.empty(); ++up) {
    const fs::path cand = dir / "models" / kDemoModelName;
    tried.push_back(cand.string());
    if (fs::exists(cand / "config.json")) return cand.lexically_normal().string();
    if (dir == dir.parent_path()) break;
    dir = dir.parent_path();
  }
  fail(ErrorKind::kNotFound,
       "no MODEL given, and the demo model models/{} was not found beside this binary ({}); pass a model directory "
       "(tessera {} DIR), or run the binary built in a tessera checkout, which ships models/{}",
       kDemoModelName, fmt::join(tried, ", "), verb, kDemoModelName);
}

namespace {

// A token count in vLLM's human-readable form (flag_parsing.h), at least 1.
int positive_tokens(const std::string& text, const char* flag) {
  const int64_t v = parse_human_int(text, flag);
  if (v < 1)
    throw FlagError(
        fmt::format("argument {}: must be a positive number of tokens, got {} (leave the flag out for the "
                    "default)",
                    flag, text));
  if (v > std::numeric_limits<int>::max())
    throw FlagError(fmt::format("argument {}: {} tokens is more than tessera supports", flag, text));
  return static_cast<int>(v);
}

constexpr const char* kKvCacheMemoryFlag = "--kv-cache-memory-bytes";

// An option holding a token count in vLLM's human-readable form (flag_parsing.h), at least 1.
void add_tokens_option(CLI::App& app, const char* flag, int& out, const char* help) {
  app.add_option_function<std::string>(
         flag, [flag, &out](const std::string& v) { out = positive_tokens(v, flag); }, help)
      ->type_name("TOKENS");
}

}  // namespace

size_t parse_kv_cache_memory_bytes(const std::string& text) {
  std::string t = text;
  // The IEC spellings: 8GiB is vLLM's 8G (powers of 1024).
  if (t.size() > 3 && t.ends_with("iB") && std::string("KMGT").find(t[t.size() - 3]) != std::string::npos)
    t.resize(t.size() - 2);
  const int64_t v = parse_human_int(t, kKvCacheMemoryFlag);
  if (v < 1)
    throw FlagError(
        fmt::format("argument {}: must be a positive number of bytes, got {} (leave the flag out to size "
                    "the cache from --gpu-memory-utilization)",
                    kKvCacheMemoryFlag, text));
  return static_cast<size_t>(v);
}

std::string cluster_token_or_env(const std::string& flag_value) {
  if (!flag_value.empty()) return flag_value;
  const char* t = std::getenv("TESSERA_CLUSTER_TOKEN");
  return t ? t : "";
}

std::string required_cluster_token(const std::string& flag_value, int nnodes, const char* peers) {
  std::string token = cluster_token_or_env(flag_value);
  if (token.empty())
    fail(ErrorKind::kInvalidArgument,
         "{} nodes need a shared secret: pass the same --cluster-token (or TESSERA_CLUSTER_TOKEN) {}", nnodes, peers);
  return token;
}

namespace {

// --disable-sliding-window (vLLM's flag): the windowed layers attend the whole context, which computes
// what the window would only while a sequence fits the window; so, as vLLM does, max_model_len is capped
// at it.
void cap_max_model_len_at_window(EngineFlags& f) {
  const ModelConfig c = load_model_config(f.model, hf_overrides_json(f));
  if (c.sliding_window == 0) {
    TLOG_INFO("--disable-sliding-window: {} has no sliding-window layers; the flag changes nothing", f.model);
    return;
  }
  const int cap = std::min(c.sliding_window, c.max_position_embeddings);
  if (f.max_model_len > cap)
    fail(ErrorKind::kInvalidArgument,
         "--max-model-len {} is larger than the model's sliding window ({} tokens, config.json's sliding_window): "
         "with --disable-sliding-window every layer attends the whole context, which matches the model only within "
         "its window; lower --max-model-len to {} or less, or leave out --disable-sliding-window",
         f.max_model_len, c.sliding_window, cap);
  if (f.max_model_len == 0) {
    f.max_model_len = cap;
    TLOG_INFO("--disable-sliding-window: full attention on every layer, max_model_len {} (the sliding window)", cap);
  }
}

}  // namespace

std::string resolve_model(EngineFlags& f) {
  const std::string given = f.model;
  f.model = resolve_model_dir(f.model, HubCacheLookup{f.download_dir, f.revision, {}});
  if (f.model != given) TLOG_INFO("Model {}: {}", given, f.model);
  if (f.disable_sliding_window) cap_max_model_len_at_window(f);
  return given;
}

void add_engine_flags(CLI::App& app, EngineFlags& f) {
  app.add_option("--download-dir", f.download_dir,
                 "a Hugging Face cache folder searched first when the model is an org/name id (then HF_HUB_CACHE, "
                 "HF_HOME/hub, ~/.cache/huggingface/hub); tessera never downloads");
  app.add_option("--revision", f.revision,
                 "the snapshot of an org/name model id in the Hugging Face cache: a branch, tag or commit (default "
                 "main)");
  app.add_option("--load-format", f.load_format,
                 "auto|safetensors: read the checkpoint; dummy: random weights from config.json alone (benchmarks)")
      ->capture_default_str();
  app.add_option("--quantization,-q", f.quantization,
                 "fp8: store the weights of a bf16 checkpoint as FP8 e4m3 with one scale per 128x128 block "
                 "(quantised while loading; a checkpoint with an FP8 quantization_config needs no flag); other "
                 "methods (awq, gptq, ...) are refused");
  app.add_option("--hf-overrides", f.hf_overrides,
                 "a JSON object of config.json fields to change, as vLLM's (e.g. '{\"rope_scaling\": {\"rope_type\": "
                 "\"yarn\", \"factor\": 4.0, \"original_max_position_embeddings\": 32768}}'); objects merge field "
                 "by field");
  app.add_option("--rope-scaling", f.rope_scaling,
                 "JSON: config.json's rope_scaling (older vLLM's flag; --hf-overrides '{\"rope_scaling\": ...}')");
  app.add_option("--rope-theta", f.rope_theta, "config.json's rope_theta (older vLLM's flag)");
  app.add_option("--device", f.device, "auto|cpu|cuda: where the model runs (auto: CUDA when a GPU is visible)")
      ->capture_default_str();
  add_tokens_option(app, "--max-model-len", f.max_model_len,
                    "longest sequence (prompt + output) in tokens, as vLLM reads it: 32768, 32k (= 32000), 32K (= "
                    "32768), 1m, 1M; default: the model's max_position_embeddings");
  app.add_option("--max-num-seqs", f.max_num_seqs, "most sequences in one step (batch size cap)")
      ->capture_default_str();
  add_tokens_option(app, "--max-num-batched-tokens", f.max_num_batched_tokens,
                    "token budget of one step; long prompts are prefilled in chunks of this size (default 8192; 8k, 8K "
                    "as --max-model-len)");
  app.add_option("--dtype", f.dtype,
                 "auto | bfloat16 | half | float16: the compute dtype; tessera computes in bfloat16 on GPUs (half "
                 "and float16 are accepted and computed in bfloat16: the same width, float32's range, fewer "
                 "mantissa bits) and in float32 on CPUs; float32 is refused")
      ->capture_default_str();
  app.add_option("--data-parallel-size", f.data_parallel_size,
                 "engine replicas (-dp; vLLM's name): 1 only, as tessera runs one engine per server; run one server "
                 "per replica behind a load balancer instead")
      ->capture_default_str();
  app.add_option("--block-size", f.block_size, "tokens per KV cache block")->capture_default_str();
  app.add_option("--num-gpu-blocks-override", f.num_gpu_blocks_override,
                 "use exactly this many KV cache blocks instead of planning from memory");
  app.add_option("--gpu-memory-utilization", f.gpu_memory_utilization,
                 "fraction of device memory this process may use (weights + activations + KV cache), as vLLM's: "
                 "per process, so two servers on one GPU take e.g. 0.45 each; a start on a GPU where others "
                 "already hold more than the rest fails before loading, naming the largest share that fits")
      ->capture_default_str();
  app.add_option_function<std::string>(
         kKvCacheMemoryFlag, [&f](const std::string& v) { f.kv_cache_memory_bytes = parse_kv_cache_memory_bytes(v); },
         "size of the KV cache (with the linear-attention state slots) of each GPU, instead of what "
         "--gpu-memory-utilization leaves after the weights and activations; the utilization is then not used "
         "(vLLM's flag): 8589934592, 8G or 8GiB (8 x 1024^3), 8g (8 x 10^9), 512M. Processes that share a GPU "
         "each size the cache from their own growth since they started; two that load at the same moment see "
         "each other's, and an explicit size avoids that race")
      ->type_name("BYTES");
  app.add_option("--gpu-memory", f.gpu_memory,
                 "memory of each device to plan with, e.g. 32GiB (default: what the device reports; the smaller "
                 "wins)");
  app.add_option("--kv-cache-dtype", f.kv_cache_dtype,
                 "auto (model dtype), bfloat16, fp8 (e4m3: twice the tokens), fp8_e5m2, float32")
      ->capture_default_str();
  app.add_option("--mamba-cache-dtype", f.mamba_cache_dtype,
                 "linear-attention (Qwen3.5 / Qwen3-Next) state slots: dtype of the conv state, and of the recurrent "
                 "state unless --mamba-ssm-cache-dtype is given: auto (the model dtype), float32, bfloat16")
      ->capture_default_str();
  app.add_option("--mamba-ssm-cache-dtype", f.mamba_ssm_cache_dtype,
                 "dtype of the linear-attention recurrent state: auto (--mamba-cache-dtype when set, else float32), "
                 "float32, bfloat16 (half the bytes per sequence)")
      ->capture_default_str();
  app.add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", f.enable_prefix_caching,
               "reuse the KV cache of shared prompt prefixes (default on)");
  app.add_flag("--enable-chunked-prefill,!--no-enable-chunked-prefill", f.enable_chunked_prefill,
               "split long prompts across steps so decodes keep flowing (default on)");
  app.add_option("--seed", f.seed, "seed for requests without their own seed and for dummy weights")
      ->capture_default_str();
  app.add_flag("--check-weights", f.check_weights,
               "after loading, read every weight tensor back and refuse to start if any holds NaN or Inf, naming "
               "them (costs one pass over the weights; off by default; sampling fails a request whose logits turn "
               "out NaN either way)");
  app.add_flag("--disable-custom-all-reduce", f.disable_custom_all_reduce,
               "use NCCL for every tensor-parallel all-reduce (by default small ones, as in decode, take a one-shot "
               "kernel over CUDA IPC when the GPUs of a TP group share a host with peer access)");
  app.add_flag("--disable-hybrid-kv-cache-manager", f.disable_hybrid_kv_cache_manager,
               "a model mixing full-attention and sliding-window layers keeps one KV cache group, its windowed layers "
               "keeping every block (by default each kind has its own group and windowed layers give back the blocks "
               "before their window; vLLM's flag)");
  app.add_flag("--disable-sliding-window", f.disable_sliding_window,
               "sliding-window layers (Mistral, Qwen2 with use_sliding_window) attend the whole context instead, "
               "and max_model_len is capped at the window (vLLM's flag); no effect on other models");
  app.add_flag("--enforce-eager", f.enforce_eager,
               "never replay CUDA graphs (decode batches up to min(--max-num-seqs, 256) are captured on first use "
               "otherwise)");
  app.add_option("--speculative-config", f.speculative_config,
                 "speculative decoding, vLLM's JSON: {\"method\": \"ngram\", \"num_speculative_tokens\": 3, "
                 "\"prompt_lookup_max\": 4, \"prompt_lookup_min\": 2} (prompt lookup) or {\"method\": \"mtp\", "
                 "\"num_speculative_tokens\": 2} (the checkpoint's multi-token-prediction layer, Qwen3-Next / "
                 "Qwen3.5); \"disable_by_batch_size\": N drafts nothing while N or more sequences run (0: "
                 "always drafts; absent, MTP: startup measures a step with drafts against one without at batch 1, "
                 "2, 4, ... and drafts while the mean acceptance length pays for it); greedy output unchanged, sampled "
                 "output keeps its distribution and seeds");
  app.add_option("--tensor-parallel-size", f.tensor_parallel_size, "GPUs (ranks) each layer is split across (-tp)")
      ->capture_default_str();
  app.add_option("--pipeline-parallel-size", f.pipeline_parallel_size, "stages the layers are split into (-pp)")
      ->capture_default_str();
  app.add_flag("--enable-expert-parallel", f.enable_expert_parallel,
               "mixture-of-experts models: each tensor-parallel rank holds whole experts (rank r of N: experts "
               "[r*E/N, (r+1)*E/N)) instead of a slice of every expert's intermediate dimension");
}

void add_cluster_flags(CLI::App& app, ClusterFlags& c) {
  const char* g = "Several nodes";
  app.add_option("--nnodes", c.nnodes, "nodes in the job (default 1; or from mpirun/Slurm/LeaderWorkerSet)")->group(g);
  app.add_option("--node-rank", c.node_rank, "this node's rank, 0 = the head (runs the engine and the server)")
      ->group(g);
  app.add_option("--master-addr", c.master_addr, "the head's IP on the network the nodes share (or $MASTER_ADDR)")
      ->group(g);
  app.add_option("--master-port", c.master_port, "the head's control-channel port (default 29500, or $MASTER_PORT)")
      ->group(g);
  app.add_option("--nic", c.nic,
                 "network interface(s) for the control channel and Gloo/NCCL, NCCL_SOCKET_IFNAME syntax (eth,ib / "
                 "=eth0 / ^docker,lo); default: the one that routes to --master-addr")
      ->group(g);
  app.add_option("--node-ip-address", c.node_ip_address,
                 "this node's address (default: $VLLM_HOST_IP, else the chosen NIC's)")
      ->group(g);
  app.add_option("--cluster-token", c.cluster_token,
                 "shared secret every node authenticates with (default $TESSERA_CLUSTER_TOKEN); required with "
                 "several nodes")
      ->group(g);
  app.add_option("--join-timeout", c.join_timeout_s, "seconds for every node to join the head")
      ->capture_default_str()
      ->group(g);
  app.add_option("--distributed-executor-backend", c.distributed_executor_backend,
                 "mp: tessera spawns and supervises its rank processes on this node; ray: on the nodes of the "
                 "cluster started here with `tessera node start --head` (without one, as mp); default: mp, or the "
                 "cluster's nodes when the ranks do not fit this one");
}

std::unique_ptr<Backend> make_backend_for(const EngineFlags& f) {
  BackendOptions o;
  if (f.device == "cpu")
    o.type = DeviceType::kCPU;
  else if (f.device == "cuda")
    o.type = DeviceType::kCUDA;
  else if (f.device == "auto")
    o.type = cuda_backend_available() ? DeviceType::kCUDA : DeviceType::kCPU;
  else
    fail(ErrorKind::kInvalidArgument, "--device {} is not one of auto, cpu, cuda", f.device);
  auto backend = make_backend(o);
  check_start_memory(f, *backend);
  return backend;
}

void check_start_memory(const EngineFlags& f, const Backend& backend) {
  StartMemory m;
  m.device = backend.name();
  m.total = backend.total_memory();
  if (!f.gpu_memory.empty()) m.total = std::min(m.total, plan::parse_memory_size(f.gpu_memory));
  m.free_at_start = backend.free_memory_at_start();
  m.utilization = f.gpu_memory_utilization;
  m.kv_cache_memory_bytes = f.kv_cache_memory_bytes;
  check_memory_at_start(m);
}

SpeculativeConfig parse_speculative_config(const std::string& text) {
  SpeculativeConfig c;
  if (text.empty()) return c;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    fail(ErrorKind::kInvalidArgument, "--speculative-config is not valid JSON ({}): {}", e.what(), text);
  }
  if (!j.is_object()) fail(ErrorKind::kInvalidArgument, "--speculative-config must be a JSON object, got: {}", text);
  auto get_int = [&](const char* key, int& out) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return;
    if (!it->is_number_integer())
      fail(ErrorKind::kInvalidArgument, "--speculative-config: {} must be an integer, got {}", key, it->dump());
    out = it->get<int>();
  };
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    if (k != "method" && k != "num_speculative_tokens" && k != "prompt_lookup_max" && k != "prompt_lookup_min" &&
        k != "disable_by_batch_size")
      fail(ErrorKind::kInvalidArgument,
           "--speculative-config: field '{}' is not supported (tessera reads method, num_speculative_tokens, "
           "prompt_lookup_max, prompt_lookup_min, disable_by_batch_size); use {{\"method\": \"ngram\", "
           "\"num_speculative_tokens\": 3}} or, with a checkpoint that has an MTP layer, {{\"method\": \"mtp\", "
           "\"num_speculative_tokens\": 2}}",
           k);
  }
  if (auto m = j.find("method"); m != j.end()) {
    if (!m->is_string()) fail(ErrorKind::kInvalidArgument, "--speculative-config: method must be a string");
    c.method = m->get<std::string>();
  }
  get_int("num_speculative_tokens", c.num_speculative_tokens);
  get_int("prompt_lookup_max", c.prompt_lookup_max);
  get_int("prompt_lookup_min", c.prompt_lookup_min);
  // Absent: MTP measures where drafting pays at startup (ngram: never off).
  c.disable_by_batch_size = SpeculativeConfig::kDisableAuto;
  get_int("disable_by_batch_size", c.disable_by_batch_size);
  if (c.method.empty())
    fail(ErrorKind::kInvalidArgument, "--speculative-config needs a method ('ngram' or 'mtp'), got: {}", text);
  if (c.num_speculative_tokens <= 0)
    fail(ErrorKind::kInvalidArgument, "--speculative-config needs num_speculative_tokens >= 1, got: {}", text);
  return validate_speculative_config(c);
}

EngineConfig engine_config(const EngineFlags& f) { return engine_config(f, false); }

EngineConfig engine_config(const EngineFlags& f, bool parallel_supported) {
  if (f.tensor_parallel_size < 1 || f.pipeline_parallel_size < 1)
    fail(ErrorKind::kInvalidArgument, "--tensor-parallel-size and --pipeline-parallel-size must be at least 1");
  if (!parallel_supported && (f.tensor_parallel_size != 1 || f.pipeline_parallel_size != 1))
    fail(ErrorKind::kUnsupported,
         "--tensor-parallel-size/--pipeline-parallel-size above 1 are not available for this command yet (tessera "
         "generate runs them)");
  if (f.dtype != "auto" && f.dtype != "bfloat16" && f.dtype != "half" && f.dtype != "float16")
    fail(ErrorKind::kUnsupported,
         "--dtype {}: tessera computes in bfloat16 (float32 on the CPU backend); use --dtype auto, bfloat16 or half",
         f.dtype);
  if (!f.quantization.empty() && f.quantization != "fp8")
    fail(ErrorKind::kUnsupported,
         "--quantization {}: tessera reads bf16 checkpoints and FP8 ones (their own quantization_config, no flag "
         "needed); serve a bf16 or FP8 checkpoint of the model (e.g. Qwen/Qwen3-8B-FP8), or give --quantization fp8 "
         "to store a bf16 checkpoint's weights in FP8 while loading",
         f.quantization);
  if (f.data_parallel_size != 1)
    fail(ErrorKind::kUnsupported,
         "--data-parallel-size {}: tessera runs one engine per server; start one server per replica (each with its "
         "own --port) behind a load balancer",
         f.data_parallel_size);
  if (!(f.gpu_memory_utilization > 0 && f.gpu_memory_utilization <= 1))
    fail(ErrorKind::kInvalidArgument, "--gpu-memory-utilization must be in (0, 1], got {}", f.gpu_memory_utilization);
  (void)parse_mamba_cache_dtypes(f.mamba_cache_dtype, f.mamba_ssm_cache_dtype, DType::kBF16);  // names checked
  EngineConfig c;
  c.scheduler.max_num_seqs = f.max_num_seqs;
  c.scheduler.max_num_batched_tokens = f.max_num_batched_tokens > 0 ? f.max_num_batched_tokens : 8192;
  c.scheduler.max_model_len = f.max_model_len;
  c.scheduler.enable_chunked_prefill = f.enable_chunked_prefill;
  c.block_size = f.block_size;
  c.num_blocks_override = f.num_gpu_blocks_override;
  c.gpu_memory_utilization = f.gpu_memory_utilization;
  c.kv_cache_memory_bytes = f.kv_cache_memory_bytes;
  c.kv_cache_dtype = f.kv_cache_dtype;
  c.mamba_cache_dtype = f.mamba_cache_dtype;
  c.mamba_ssm_cache_dtype = f.mamba_ssm_cache_dtype;
  c.enable_prefix_caching = f.enable_prefix_caching;
  c.hybrid_kv_cache_manager = !f.disable_hybrid_kv_cache_manager;
  c.seed = f.seed;
  c.enforce_eager = f.enforce_eager;
  c.warm_up = true;
  c.speculative = parse_speculative_config(f.speculative_config);
  return c;
}

nlohmann::json hf_overrides_json(const EngineFlags& f) {
  auto object = [](const std::string& text, const char* flag) {
    nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object())
      fail(ErrorKind::kInvalidArgument, "{} '{}': not a JSON object (quote it: {} '{{\"key\": value}}')", flag, text,
           flag);
    return j;
  };
  nlohmann::json o = f.hf_overrides.empty() ? nlohmann::json() : object(f.hf_overrides, "--hf-overrides");
  if (!f.rope_scaling.empty()) o["rope_scaling"] = object(f.rope_scaling, "--rope-scaling");
  if (f.rope_theta != 0) {
    if (!(f.rope_theta > 0)) fail(ErrorKind::kInvalidArgument, "--rope-theta must be positive, got {}", f.rope_theta);
    o["rope_theta"] = f.rope_theta;
  }
  return o;
}

LoadOptions load_options(const EngineFlags& f) {
  LoadOptions o;
  o.model_dir = f.model;
  o.hf_overrides = hf_overrides_json(f);
  o.load_format = f.load_format;
  o.quantization = f.quantization;
  o.max_model_len = f.max_model_len;
  o.seed = f.seed;
  o.check_weights = f.check_weights;
  o.disable_sliding_window = f.disable_sliding_window;
  o.parallel.expert_parallel = f.enable_expert_parallel;
  const SpeculativeConfig spec = parse_speculative_config(f.speculative_config);
  o.mtp = spec.enabled() && spec.method == "mtp";
  return o;
}

}  // namespace tessera::cli
