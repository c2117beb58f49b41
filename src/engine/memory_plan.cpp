#include "engine/memory_plan.h"

#include <algorithm>

#include "core/error.h"
#include "core/logging.h"
#include "engine/cache_groups.h"

namespace tessera {

DType parse_kv_cache_dtype(const std::string& s, DType compute) {
  if (s == "auto") return compute;
  if (s == "fp8" || s == "fp8_e4m3") return DType::kF8E4M3;
  if (s == "fp8_e5m2") return DType::kF8E5M2;
  if (s == "bf16" || s == "bfloat16") return DType::kBF16;
  if (s == "f16" || s == "float16" || s == "half") return DType::kF16;
  if (s == "f32" || s == "float32" || s == "float") return DType::kF32;
  fail(ErrorKind::kInvalidArgument,
       "--kv-cache-dtype {} is not supported (auto, bfloat16, float16, fp8, fp8_e4m3, "
       "fp8_e5m2, float32)",
       s);
}

StateDtypes parse_mamba_cache_dtypes(const std::string& cache, const std::string& ssm, DType compute) {
  auto parse = [](const std::string& v, const char* flag) -> DType {
    if (v == "float32" || v == "f32" || v == "float") return DType::kF32;
    if (v == "bfloat16" || v == "bf16") return DType::kBF16;
    fail(ErrorKind::kInvalidArgument, "{} {} is not supported (auto, float32, bfloat16)", flag, v);
  };
  StateDtypes d;
  d.conv = cache == "auto" ? compute : parse(cache, "--mamba-cache-dtype");
  if (d.conv != DType::kF32 && d.conv != DType::kBF16) d.conv = DType::kF32;  // e.g. an f16 compute dtype
  if (ssm != "auto")
    d.ssm = parse(ssm, "--mamba-ssm-cache-dtype");
  else
    d.ssm = cache == "auto" ? DType::kF32 : d.conv;
  return d;
}

int checkpoint_state_slots(int max_num_seqs, bool enable_prefix_caching) {
  return enable_prefix_caching ? std::max(1, max_num_seqs / 4) : 0;
}

CacheFootprint cache_footprint(const std::vector<LayerCacheSpec>& specs, DType dt, int bs, DType conv_dt, DType ssm_dt,
                               const std::vector<int>& layer_groups) {
  CacheFootprint f;
  const std::vector<int> tensor = kv_tensor_of_layers(specs, layer_groups);
  std::vector<size_t> page;  // per KV tensor: its K and V bytes of one block (the largest layer's)
  for (size_t i = 0; i < specs.size(); ++i) {
    const LayerCacheSpec& s = specs[i];
    if (s.kind == CacheKind::kPagedKv) {
      ++f.paged_layers;
      const size_t t = static_cast<size_t>(tensor[i]);
      if (page.size() <= t) page.resize(t + 1, 0);
      page[t] = std::max(page[t], size_t{2} * static_cast<size_t>(bs) * s.num_kv_heads * s.head_dim * dtype_size(dt));
    } else {
      ++f.state_layers;
      f.state_bytes_per_seq += s.state_bytes(conv_dt, ssm_dt);
    }
  }
  for (size_t p : page) f.kv_bytes_per_block += p;
  return f;
}

KvBudget plan_kv_budget(const KvBudgetInputs& in, const CacheFootprint& fp) {
  KvBudget b;
  const int bs = std::max(1, in.block_size);
  b.usable = static_cast<size_t>(in.utilization * static_cast<double>(in.total));
  b.max_num_seqs = std::max(1, in.max_num_seqs);
  if (in.explicit_budget > 0) {
    b.budget = in.explicit_budget;
  } else {
    const size_t taken = in.used + in.reserved;
    b.budget = b.usable > taken ? b.usable - taken : 0;
    if (in.cpu) b.budget = std::min(b.budget, kCpuKvCacheCap);
  }
  const int64_t seq_blocks =
      in.blocks_per_seq > 0 ? in.blocks_per_seq : (static_cast<int64_t>(std::max(1, in.max_model_len)) + bs - 1) / bs;
  if (fp.state_bytes_per_seq > 0) {
    const int64_t per = std::max(1, in.state_slots_per_seq);
    const int64_t want = static_cast<int64_t>(b.max_num_seqs) * per + std::max(0, in.extra_state_slots);
    int64_t slots = want;
    if (in.num_blocks_override <= 0) {
      // Leave the KV of one max_model_len sequence next to the slots (at most half the budget:
      // when even that does not fit, the engine's own check says so).
      const size_t one_seq = std::min(static_cast<size_t>(seq_blocks) * fp.kv_bytes_per_block, b.budget / 2);
      const int64_t fit =
          b.budget > one_seq ? static_cast<int64_t>((b.budget - one_seq) / fp.state_bytes_per_seq) : int64_t{0};
      if (fit < want) {  // sequences first; checkpoints keep at least one slot of their own
        slots = std::max<int64_t>(per, fit);
        const int64_t extra =
            in.extra_state_slots > 0
                ? std::max<int64_t>(1, std::min<int64_t>(in.extra_state_slots, slots - b.max_num_seqs * per))
                : 0;
        b.max_num_seqs =
            static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(b.max_num_seqs, (slots - extra) / per)));
        slots = static_cast<int64_t>(b.max_num_seqs) * per + extra;
      }
    }
    b.num_state_slots = static_cast<int>(std::min<int64_t>(slots, int64_t{1} << 30));
    b.state_bytes = fp.state_bytes_per_seq * static_cast<size_t>(b.num_state_slots);
  }
  if (in.num_blocks_override > 0) {
    b.num_blocks = in.num_blocks_override;
    return b;
  }
  // No mix of requests can hold more than max_num_seqs full-length sequences.
  const int64_t useful = in.blocks_per_seq > 0
                             ? static_cast<int64_t>(b.max_num_seqs) * in.blocks_per_seq
                             : (static_cast<int64_t>(b.max_num_seqs) * in.max_model_len + bs - 1) / bs;
  if (fp.kv_bytes_per_block == 0) {  // no paged layer here: blocks are free on this rank
    b.num_blocks = static_cast<int>(std::min<int64_t>(useful, int64_t{1} << 30));
    b.capped_by_seqs = true;
    return b;
  }
  const size_t for_blocks = b.budget > b.state_bytes ? b.budget - b.state_bytes : 0;
  int64_t blocks = static_cast<int64_t>(std::min<size_t>(for_blocks / fp.kv_bytes_per_block, size_t{1} << 30));
  if (blocks > useful) {
    blocks = useful;
    b.capped_by_seqs = true;
  }
  b.num_blocks = static_cast<int>(blocks);
  return b;
}

size_t memory_in_use(size_t total, size_t free_now, size_t free_at_start) {
  if (free_at_start == 0) return total - std::min(total, free_now);
  return free_at_start > free_now ? free_at_start - free_now : 0;
}

double max_start_utilization(const StartMemory& m) {
  if (m.total == 0) return 0;
  const size_t free = std::min(m.free_at_start, m.total);
  return static_cast<double>(static_cast<uint64_t>(free) * 100 / m.total) / 100.0;
}

void check_memory_at_start(const StartMemory& m) {
  if (m.free_at_start == 0 || m.total == 0) return;
  const size_t others = m.total - std::min(m.total, m.free_at_start);
  if (m.kv_cache_memory_bytes > 0) {
    if (m.kv_cache_memory_bytes <= m.free_at_start) return;
    fail(ErrorKind::kOutOfMemory,
         "--kv-cache-memory-bytes {} ({}) is more than the free memory on device {} ({} of {}) on startup: other "
         "processes hold {}. Lower --kv-cache-memory-bytes, or free the memory the other processes hold.",
         m.kv_cache_memory_bytes, format_gib(m.kv_cache_memory_bytes), m.device, format_gib(m.free_at_start),
         format_gib(m.total), format_gib(others));
  }
  const double asked = m.utilization * static_cast<double>(m.total);
  if (static_cast<double>(m.free_at_start) >= asked) return;
  const double fits = max_start_utilization(m);
  const std::string what_fits =
      fits >= 0.01 ? fmt::format(
                         "use --gpu-memory-utilization {:.2f} or less (the largest share that fits beside them; two "
                         "processes on one GPU take e.g. 0.45 each), set the cache's size with "
                         "--kv-cache-memory-bytes, or free the memory the other processes hold",
                         fits)
                   : std::string("no --gpu-memory-utilization fits beside them: free the memory they hold");
  fail(ErrorKind::kOutOfMemory,
       "Free memory on device {} ({:.2f}/{:.2f} GiB) on startup is less than desired GPU memory utilization ({:.2f}, "
       "{:.2f} GiB): other processes hold {}. --gpu-memory-utilization is this process's share of the device; {}.",
       m.device, m.free_at_start / 1073741824.0, m.total / 1073741824.0, m.utilization, asked / 1073741824.0,
       format_gib(others), what_fits);
}

std::string format_gib(size_t bytes) { return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / 1073741824.0); }

std::string with_thousands(int64_t v) {
  std::string s = std::to_string(v < 0 ? -v : v), out;
  int n = 0;
  for (auto it = s.rbegin(); it != s.rend(); ++it) {
    if (n && n % 3 == 0) out.push_back(',');
    out.push_back(*it);
    ++n;
  }
  if (v < 0) out.push_back('-');
  return {out.rbegin(), out.rend()};
}

}  // namespace tessera
