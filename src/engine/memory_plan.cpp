#include "engine/memory_plan.h"

#include <algorithm>

#include "core/error.h"
#include "core/logging.h"

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

CacheFootprint cache_footprint(const std::vector<LayerCacheSpec>& specs, DType dt, int bs, DType conv_dt,
                               DType ssm_dt) {
  CacheFootprint f;
  for (const auto& s : specs) {
    if (s.kind == CacheKind::kPagedKv) {
      ++f.paged_layers;
      f.kv_bytes_per_block += 2ull * static_cast<size_t>(bs) * s.num_kv_heads * s.head_dim * dtype_size(dt);
    } else {
      ++f.state_layers;
      f.state_bytes_per_seq += s.state_bytes(conv_dt, ssm_dt);
    }
  }
  return f;
}

KvBudget plan_kv_budget(const KvBudgetInputs& in, const CacheFootprint& fp) {
  KvBudget b;
  const int bs = std::max(1, in.block_size);
  b.usable = static_cast<size_t>(in.utilization * static_cast<double>(in.total));
  b.state_bytes = fp.state_bytes_per_seq * static_cast<size_t>(std::max(0, in.max_num_seqs));
  if (in.explicit_budget > 0) {
    b.budget = in.explicit_budget;
  } else {
    const size_t taken = in.used + in.reserved;
    b.budget = b.usable > taken ? b.usable - taken : 0;
    if (in.cpu) b.budget = std::min(b.budget, kCpuKvCacheCap);
  }
  if (in.num_blocks_override > 0) {
    b.num_blocks = in.num_blocks_override;
    return b;
  }
  if (fp.kv_bytes_per_block == 0) return b;  // state slots only
  const size_t for_blocks = b.budget > b.state_bytes ? b.budget - b.state_bytes : 0;
  int64_t blocks = static_cast<int64_t>(std::min<size_t>(for_blocks / fp.kv_bytes_per_block, size_t{1} << 30));
  // No mix of requests can hold more than max_num_seqs full-length sequences.
  const int64_t useful = (static_cast<int64_t>(in.max_num_seqs) * in.max_model_len + bs - 1) / bs;
  if (blocks > useful) {
    blocks = useful;
    b.capped_by_seqs = true;
  }
  b.num_blocks = static_cast<int>(blocks);
  return b;
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
