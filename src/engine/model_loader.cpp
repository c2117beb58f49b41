#include "engine/model_loader.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "core/logging.h"
#include "core/progress.h"
#include "loader/checkpoint.h"
#include "model/registry.h"

namespace tessera {

namespace {

// The checkpoint's bytes over the whole load (conversion and upload included) and over the reads
// alone, which is what the disk gives; and how they were read.
void log_read_speed(const StagedReader& r, std::chrono::steady_clock::duration took) {
  const StagedReadStats& s = r.stats();
  const double secs = std::chrono::duration<double>(took).count();
  auto gbps = [](size_t bytes, double t) { return t > 0 ? bytes / t / 1e9 : 0.0; };
  TLOG_INFO(
      "Read {:.2f} GiB of safetensors ({:.2f} GiB from the disk) at {:.2f} GB/s over the load ({:.2f} GB/s inside "
      "the reads), through two {} MiB buffers: {} file(s) with O_DIRECT ({} reads served from the buffer read ahead, "
      "{} from the current one), {} buffered with their pages dropped (the page cache does not keep them)",
      s.bytes / 1073741824.0, s.device_bytes / 1073741824.0, gbps(s.bytes, secs), gbps(s.device_bytes, s.read_seconds),
      r.chunk_bytes() >> 20, s.direct_files, s.read_ahead_hits, s.buffer_hits, s.buffered_files);
}

}  // namespace

std::unique_ptr<Model> load_model(const LoadOptions& o, Backend& backend) {
  ModelConfig config = load_model_config(o.model_dir, o.hf_overrides);
  TLOG_INFO("Model {}: {} ({} layers, hidden {}, {} heads / {} kv heads, head_dim {}, vocab {}), device {}",
            o.model_dir, config.architecture, config.num_layers, config.hidden_size, config.num_heads,
            config.num_kv_heads, config.head_dim, config.vocab_size, backend.device().str());
  const MoeConfig& moe = config.moe;
  if (o.parallel.expert_parallel && moe.num_experts == 0) {
    TLOG_WARN("--enable-expert-parallel: {} has no experts, so the flag changes nothing", config.architecture);
  } else if (moe.num_experts > 0 && o.parallel.tp_size > 1) {
    const ExpertShard s = expert_shard(o.parallel, moe.num_experts, moe.moe_intermediate_size);
    if (o.parallel.expert_parallel)
      TLOG_INFO("Expert parallel: TP rank {} holds experts [{}, {}) of {}", o.parallel.tp_rank, s.expert_begin,
                s.expert_begin + s.local_experts, moe.num_experts);
    else
      TLOG_INFO(
          "Experts split by tensor parallelism: TP rank {} holds intermediate rows [{}, {}) of each of {} experts",
          o.parallel.tp_rank, s.inter_begin, s.inter_begin + s.local_intermediate, moe.num_experts);
  }
  ModelOptions mo;
  mo.max_positions = o.max_model_len > 0 ? o.max_model_len : config.max_position_embeddings;
  mo.parallel = o.parallel;
  mo.runtime = o.runtime;
  mo.quantization = o.quantization;
  mo.mtp = o.mtp;
  mo.disable_sliding_window = o.disable_sliding_window;
  auto model = create_model(config, mo, backend);
  WeightStore& w = model->weights();
  auto start = std::chrono::steady_clock::now();
  ProgressBar bar(o.load_format == "dummy" ? "Initialising dummy weights" : "Loading safetensors checkpoint",
                  w.count());
  auto progress = [&](size_t done, size_t, size_t) { bar.update(done); };
  if (o.load_format == "dummy") {
    w.load_dummy(backend, o.seed, progress);
  } else if (o.load_format == "auto" || o.load_format == "safetensors") {
    Checkpoint ckpt(o.model_dir);
    if (o.mtp)
      for (const char* name : {"mtp.fc.weight", "mtp.norm.weight", "mtp.layers.0.self_attn.q_proj.weight"})
        if (!ckpt.contains(name))
          fail(ErrorKind::kNotFound,
               "{}: --speculative-config method 'mtp' needs the checkpoint's multi-token-prediction weights, but "
               "there is no tensor '{}' (config.json says mtp_num_hidden_layers / num_nextn_predict_layers {}); use a "
               "checkpoint that has its mtp.* tensors, {{\"method\": \"ngram\", ...}}, or no --speculative-config",
               o.model_dir, name, config.num_mtp_layers);
    w.load(ckpt, backend, progress);
    log_read_speed(ckpt.reader(), std::chrono::steady_clock::now() - start);
  } else {
    fail(ErrorKind::kInvalidArgument, "--load-format {} is not supported (auto, safetensors, dummy)", o.load_format);
  }
  bar.finish();
  w.log_summary(backend);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  TLOG_INFO("Loading weights took {:.2f} seconds; model weights take {:.2f} GiB", secs,
            w.param_bytes(backend.compute_dtype()) / 1073741824.0);
  if (o.check_weights) check_weights(w, backend, o.model_dir);
  return model;
}

NonFiniteWeights find_nonfinite_weights(const WeightStore& weights, Backend& backend) {
  constexpr size_t kChunkBytes = size_t{16} << 20;
  NonFiniteWeights r;
  std::vector<char> host;
  auto nonfinite = [&](const Tensor& t) {
    const size_t esize = dtype_size(t.dtype()), chunk = std::max<size_t>(1, kChunkBytes / esize);
    const int64_t n = t.numel();
    if (n == 0) return false;
    const Tensor flat = t.view({n});
    host.resize(std::min(static_cast<size_t>(n), chunk) * esize);
    for (int64_t b = 0; b < n; b += static_cast<int64_t>(chunk)) {
      const int64_t e = std::min(n, b + static_cast<int64_t>(chunk));
      backend.copy_to_host(host.data(), flat.rows(b, e));
      if (count_nonfinite_host(host.data(), t.dtype(), static_cast<size_t>(e - b)) > 0) return true;
    }
    return false;
  };
  weights.for_each_tensor([&](const std::string& name, const Tensor& t) {
    ++r.tensors_checked;
    if (nonfinite(t))
      r.names.push_back(name);
    else if (t.block_scaled() && nonfinite(*t.block_scale()))
      r.names.push_back(name + " (its FP8 block scales)");
  });
  return r;
}

void check_weights(const WeightStore& weights, Backend& backend, const std::string& model_dir) {
  const auto start = std::chrono::steady_clock::now();
  const NonFiniteWeights r = find_nonfinite_weights(weights, backend);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (r.names.empty()) {
    TLOG_INFO("--check-weights: none of the {} weight tensors holds NaN or Inf ({:.2f} seconds)", r.tensors_checked,
              secs);
    return;
  }
  constexpr size_t kNamed = 5;
  const size_t named = std::min(kNamed, r.names.size());
  fail(ErrorKind::kCorrupt,
       "{}: --check-weights found NaN or Inf in {} of {} weight tensors: {}{}; such weights give NaN logits and no "
       "usable output. The checkpoint is damaged (an interrupted download, a broken conversion or fine-tune): "
       "download or convert it again",
       model_dir, r.names.size(), r.tensors_checked,
       fmt::join(r.names.begin(), r.names.begin() + static_cast<std::ptrdiff_t>(named), ", "),
       r.names.size() > named ? fmt::format(" (and {} more)", r.names.size() - named) : "");
}

}  // namespace tessera
