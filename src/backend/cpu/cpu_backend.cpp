#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_check.h"
#include "backend/sampling.h"

#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"

namespace tessera {

namespace {

using cpu::require;

void require_f32(const Tensor& t, const char* op) {
  require(t.dtype() == DType::kF32, op, "expects f32, got " + t.str());
}

ThreadPool& pool() { return ThreadPool::global(); }

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Loads element i of a cache row of dtype `t` as f32 (scale applied).
inline float load_elem(const void* base, DType t, size_t i) {
  switch (t) {
    case DType::kF32:
      return static_cast<const float*>(base)[i];
    case DType::kBF16:
      return bf16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::kF16:
      return f16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::kF8E4M3:
      return fp8e4m3_to_f32(static_cast<const uint8_t*>(base)[i]);
    case DType::kF8E5M2:
      return fp8e5m2_to_f32(static_cast<const uint8_t*>(base)[i]);
    default:
      return 0;
  }
}

}  // namespace

CpuBackend::CpuBackend(int num_threads) {
  if (num_threads > 0) openblas_set_num_threads(num_threads);
}

Tensor CpuBackend::alloc(Shape shape, DType dtype) { return host_empty(shape, dtype); }

Tensor CpuBackend::scratch(Shape shape, DType dtype) {
  size_t bytes = (static_cast<size_t>(shape.numel()) * dtype_size(dtype) + 63) / 64 * 64;
  if (chunks_.empty() || chunk_used_ + bytes > chunks_.back().nbytes()) {
    size_t want = std::max<size_t>(bytes, std::max<size_t>(scratch_high_water_, size_t{1} << 20));
    chunks_.push_back(host_empty({static_cast<int64_t>(want)}, DType::kU8));
    chunk_used_ = 0;
  }
  Tensor& c = chunks_.back();
  Tensor t(c.storage(), chunk_used_, shape, dtype);
  chunk_used_ += bytes;
  scratch_in_use_ += bytes;
  scratch_high_water_ = std::max(scratch_high_water_, scratch_in_use_);
  return t;
}

void CpuBackend::reset_scratch() {
  // Tensors handed out earlier keep their chunk alive through the shared storage,
  // so merging is safe; after the first steps there is a single chunk that fits.
  // scratch_rewind drops overflow chunks, so a lone chunk may also be too small.
  if (chunks_.size() > 1 || (chunks_.size() == 1 && chunks_[0].nbytes() < scratch_high_water_)) {
    chunks_.clear();
    chunks_.push_back(host_empty({static_cast<int64_t>(scratch_high_water_)}, DType::kU8));
  }
  chunk_used_ = 0;
  scratch_in_use_ = 0;
  marks_.clear();
}

// A mark is (chunk index, bytes used in it, bytes in use overall).
size_t CpuBackend::scratch_mark() {
  marks_.push_back({chunks_.size(), chunk_used_, scratch_in_use_});
  return marks_.size() - 1;
}

void CpuBackend::scratch_rewind(size_t mark) {
  TESSERA_CHECK(mark < marks_.size(), "scratch_rewind to an unknown mark");
  Mark m = marks_[mark];
  marks_.resize(mark);
  if (m.chunks == 0) {
    chunk_used_ = 0;
  } else {
    // Newer chunks stay alive as long as tensors reference them (shared storage).
    chunks_.resize(m.chunks);
    chunk_used_ = m.used;
  }
  scratch_in_use_ = m.in_use;
}

size_t CpuBackend::free_memory() const {
  // MemAvailable (free pages plus the page cache the kernel would give back), as `free` shows;
  // MemFree alone counts the page cache of every file read as used.
  if (std::FILE* f = std::fopen("/proc/meminfo", "r")) {
    char line[256];
    unsigned long long kib = 0;
    bool found = false;
    while (!found && std::fgets(line, sizeof line, f)) found = std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1;
    std::fclose(f);
    if (found) return static_cast<size_t>(kib) * 1024;
  }
  long pages = sysconf(_SC_AVPHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && size > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(size) : 0;
}

size_t CpuBackend::total_memory() const {
  long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && size > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(size) : 0;
}

// Empty copies return early: an empty std::vector's data() may be null, and memcpy
// with a null pointer is undefined even for zero bytes.
void CpuBackend::copy_from_host(const Tensor& dst, const void* src) {
  if (dst.nbytes() > 0) std::memcpy(dst.raw(), src, dst.nbytes());
}
void CpuBackend::copy_to_host(void* dst, const Tensor& src) {
  if (src.nbytes() > 0) std::memcpy(dst, src.raw(), src.nbytes());
}
void CpuBackend::copy(const Tensor& dst, const Tensor& src) {
  require(dst.nbytes() == src.nbytes(), "copy", dst.str() + " <- " + src.str());
  if (src.nbytes() > 0) std::memmove(dst.raw(), src.raw(), src.nbytes());
}

void CpuBackend::fill_random(const Tensor& dst, uint64_t seed, float low, float high) {
  int64_t n = dst.numel();
  DType dt = dst.dtype();
  void* base = dst.raw();
  pool().parallel_for(n, 1 << 16, [&](int64_t b, int64_t e) {
    float buf[1024];
    for (int64_t i = b; i < e; i += 1024) {
      const int64_t m = std::min<int64_t>(1024, e - i);
      for (int64_t j = 0; j < m; ++j) {
        uint64_t r = splitmix64(seed * 0x100000001b3ull + static_cast<uint64_t>(i + j));
        buf[j] = low + (high - low) * (static_cast<float>(r >> 40) * (1.0f / 16777216.0f));
      }
      convert_host(buf, DType::kF32, static_cast<char*>(base) + i * dtype_size(dt), dt, static_cast<size_t>(m));
    }
  });
}

void CpuBackend::fill(const Tensor& dst, float value) {
  int64_t n = dst.numel();
  if (dst.dtype() == DType::kF32) {
    std::fill_n(dst.data<float>(), n, value);
    return;
  }
  for (int64_t i = 0; i < n; ++i)
    convert_host(&value, DType::kF32, static_cast<char*>(dst.raw()) + i * dtype_size(dst.dtype()), dst.dtype(), 1);
}

void CpuBackend::embedding(const Tensor& ids, const Tensor& table, const Tensor& out) {
  require_f32(table, "embedding");
  require(ids.dtype() == DType::kI32, "embedding", "ids must be i32");
  int64_t T = ids.numel(), H = table.dim(1), V = table.dim(0);
  const int32_t* id = ids.data<int32_t>();
  for (int64_t t = 0; t < T; ++t) {
    require(id[t] >= 0 && id[t] < V, "embedding", "token id " + std::to_string(id[t]) + " outside the vocabulary");
    std::memcpy(out.data<float>() + t * H, table.data<float>() + static_cast<int64_t>(id[t]) * H, H * 4);
  }
}

void CpuBackend::embedding_slice(const Tensor& ids, const Tensor& table, int64_t begin, const Tensor& out) {
  require_f32(table, "embedding_slice");
  require(ids.dtype() == DType::kI32, "embedding_slice", "ids must be i32");
  int64_t T = ids.numel(), H = table.dim(1), rows = table.dim(0);
  const int32_t* id = ids.data<int32_t>();
  for (int64_t t = 0; t < T; ++t) {
    const int64_t r = static_cast<int64_t>(id[t]) - begin;
    if (r >= 0 && r < rows)
      std::memcpy(out.data<float>() + t * H, table.data<float>() + r * H, H * 4);
    else
      std::memset(out.data<float>() + t * H, 0, H * 4);
  }
}

// Splits qkv into contiguous q (= q_out), k and v, then the separate ops: the same numbers as
// the unfused path.
void CpuBackend::qkv_prologue(const Tensor& qkv, const Tensor* q_norm, const Tensor* k_norm, float eps,
                              const Tensor& positions, const RopeTable& table, const Tensor& k_cache,
                              const Tensor& v_cache, const AttentionMetadata& meta, float k_scale, float v_scale,
                              const Tensor& q_out) {
  require_f32(qkv, "qkv_prologue");
  const int64_t T = q_out.dim(0), Hq = q_out.dim(1), D = q_out.dim(2);
  const int64_t Hk = k_cache.dim(2);
  require(qkv.numel() == T * (Hq + 2 * Hk) * D && k_cache.dim(3) == D, "qkv_prologue",
          qkv.str() + " -> " + q_out.str() + ", cache " + k_cache.str());
  Tensor k = scratch({T, Hk, D}, DType::kF32), v = scratch({T, Hk, D}, DType::kF32);
  const int64_t row = (Hq + 2 * Hk) * D;
  for (int64_t t = 0; t < T; ++t) {
    const float* src = qkv.data<float>() + t * row;
    std::memcpy(q_out.data<float>() + t * Hq * D, src, Hq * D * 4);
    std::memcpy(k.data<float>() + t * Hk * D, src + Hq * D, Hk * D * 4);
    std::memcpy(v.data<float>() + t * Hk * D, src + (Hq + Hk) * D, Hk * D * 4);
  }
  if (q_norm) {
    Tensor qv = q_out.view({T * Hq, D}), kv = k.view({T * Hk, D});
    rms_norm(qv, *q_norm, eps, qv);
    rms_norm(kv, *k_norm, eps, kv);
  }
  rope(q_out, k, positions, table);
  write_kv(k, v, k_cache, v_cache, meta, k_scale, v_scale);
}

void CpuBackend::sample(const Tensor& logits, const std::vector<SamplingRow>& rows, const Tensor& out) {
  require(logits.dtype() == DType::kF32 && logits.ndim() == 2 && out.dtype() == DType::kI32 &&
              out.numel() == logits.dim(0) && static_cast<int64_t>(rows.size()) == logits.dim(0),
          "sample", logits.str() + " -> " + out.str());
  const int64_t n = logits.dim(0), V = logits.dim(1);
  pool().parallel_for(n, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      out.data<int32_t>()[i] = sample_row_host(logits.data<float>() + i * V, V, rows[static_cast<size_t>(i)]);
  });
}

void CpuBackend::rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& out) {
  require_f32(x, "rms_norm");
  int64_t D = w.numel(), rows = x.numel() / D;
  const float* wp = w.data<float>();
  const float* xp = x.data<float>();
  float* op = out.data<float>();
  pool().parallel_for(rows, 16, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* xr = xp + r * D;
      float* orow = op + r * D;
      double ss = 0;
      for (int64_t i = 0; i < D; ++i) ss += static_cast<double>(xr[i]) * xr[i];
      float inv = 1.0f / std::sqrt(static_cast<float>(ss / D) + eps);
      for (int64_t i = 0; i < D; ++i) orow[i] = xr[i] * inv * wp[i];
    }
  });
}

void CpuBackend::add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& w, float eps) {
  int64_t n = x.numel();
  float* xp = x.data<float>();
  float* rp = residual.data<float>();
  for (int64_t i = 0; i < n; ++i) rp[i] += xp[i];
  rms_norm(residual, w, eps, x);
}

void CpuBackend::linear(const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& out) {
  switch (w.format().kind) {
    case WeightFormatKind::kPlain:
      break;
    case WeightFormatKind::kFp8Block:  // the reference dequantises them (w = fp8 * block scale)
      linear(x, dequantize_block_scaled_host(w), bias, out);
      return;
    default:
      fail_unsupported_format("CPU linear", w.str(), w.format());
  }
  require_f32(x, "linear");
  require_f32(w, "linear");
  int64_t K = w.dim(1), N = w.dim(0), M = x.numel() / K;
  require(x.numel() % K == 0 && out.numel() == M * N, "linear", x.str() + " @ " + w.str() + " -> " + out.str());
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(M), static_cast<int>(N), static_cast<int>(K),
              1.0f, x.data<float>(), static_cast<int>(K), w.data<float>(), static_cast<int>(K), 0.0f, out.data<float>(),
              static_cast<int>(N));
  if (bias) {
    const float* b = bias->data<float>();
    float* o = out.data<float>();
    for (int64_t m = 0; m < M; ++m)
      for (int64_t j = 0; j < N; ++j) o[m * N + j] += b[j];
  }
}

void CpuBackend::silu_mul(const Tensor& gate_up, const Tensor& out) {
  int64_t I = out.dim(-1), T = out.numel() / I;
  const float* g = gate_up.data<float>();
  float* o = out.data<float>();
  pool().parallel_for(T, 1, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t)
      for (int64_t i = 0; i < I; ++i) {
        float a = g[t * 2 * I + i], u = g[t * 2 * I + I + i];
        o[t * I + i] = a / (1.0f + std::exp(-a)) * u;
      }
  });
}

void CpuBackend::add(const Tensor& a, const Tensor& b, const Tensor& out) {
  int64_t n = out.numel();
  const float *ap = a.data<float>(), *bp = b.data<float>();
  float* o = out.data<float>();
  for (int64_t i = 0; i < n; ++i) o[i] = ap[i] + bp[i];
}

void CpuBackend::rope(const Tensor& q, const Tensor& k, const Tensor& positions, const RopeTable& table) {
  int64_t T = q.dim(0), D = q.dim(2);
  int rd = table.rotary_dim, half = rd / 2;
  const int32_t* pos = positions.data<int32_t>();
  const float* cs = table.cos_sin.data<float>();
  int64_t max_pos = table.cos_sin.dim(0);
  auto rotate = [&](float* x, const float* c, const float* s) {
    if (table.neox_style) {
      for (int i = 0; i < half; ++i) {
        float x1 = x[i], x2 = x[i + half];
        x[i] = x1 * c[i] - x2 * s[i];
        x[i + half] = x2 * c[i] + x1 * s[i];
      }
    } else {
      for (int i = 0; i < half; ++i) {
        float x1 = x[2 * i], x2 = x[2 * i + 1];
        x[2 * i] = x1 * c[i] - x2 * s[i];
        x[2 * i + 1] = x2 * c[i] + x1 * s[i];
      }
    }
  };
  for (int64_t t = 0; t < T; ++t) {
    require(pos[t] >= 0 && pos[t] < max_pos, "rope", "position beyond the rotary table");
    const float* c = cs + static_cast<int64_t>(pos[t]) * rd;
    const float* s = c + half;
    for (int64_t h = 0; h < q.dim(1); ++h) rotate(q.data<float>() + (t * q.dim(1) + h) * D, c, s);
    for (int64_t h = 0; h < k.dim(1); ++h) rotate(k.data<float>() + (t * k.dim(1) + h) * D, c, s);
  }
}

void CpuBackend::write_kv(const Tensor& k, const Tensor& v, const Tensor& k_cache, const Tensor& v_cache,
                          const AttentionMetadata& meta, float k_scale, float v_scale) {
  int64_t T = k.dim(0), row = k.dim(1) * k.dim(2);
  int64_t block_size = k_cache.dim(1), num_blocks = k_cache.dim(0);
  DType ct = k_cache.dtype();
  size_t es = dtype_size(ct);
  std::vector<float> tmp(static_cast<size_t>(row));
  for (int64_t t = 0; t < T; ++t) {
    int32_t slot = meta.host_slot_mapping[t];
    if (slot < 0) continue;
    require(slot / block_size < num_blocks, "write_kv", "slot outside the cache");
    size_t off = static_cast<size_t>(slot) * row * es;
    auto put = [&](const float* src, const Tensor& cache, float scale) {
      if (ct == DType::kF32 && scale == 1.0f) {
        std::memcpy(static_cast<char*>(cache.raw()) + off, src, row * 4);
        return;
      }
      for (int64_t i = 0; i < row; ++i) tmp[i] = src[i] / scale;
      convert_host(tmp.data(), DType::kF32, static_cast<char*>(cache.raw()) + off, ct, row);
    };
    put(k.data<float>() + t * row, k_cache, k_scale);
    put(v.data<float>() + t * row, v_cache, v_scale);
  }
}

void CpuBackend::paged_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                 const AttentionMetadata& meta, float scale, float k_scale, float v_scale,
                                 int sliding_window, const Tensor& out) {
  require(sliding_window >= 0, "paged_attention", "negative sliding window");
  int64_t Hq = q.dim(1), D = q.dim(2), Hk = k_cache.dim(2), bs = k_cache.dim(1);
  int64_t group = Hq / Hk;
  DType ct = k_cache.dtype();
  size_t es = dtype_size(ct);
  const char* kc = static_cast<const char*>(k_cache.raw());
  const char* vc = static_cast<const char*>(v_cache.raw());
  // One work item per (token, head).
  std::vector<int32_t> token_seq(static_cast<size_t>(meta.num_tokens));
  for (int s = 0; s < meta.num_seqs; ++s)
    for (int t = meta.host_query_start_loc[s]; t < meta.host_query_start_loc[s + 1]; ++t) token_seq[t] = s;
  int64_t items = static_cast<int64_t>(meta.num_tokens) * Hq;
  pool().parallel_for(items, 4, [&](int64_t b, int64_t e) {
    std::vector<float> scores(static_cast<size_t>(meta.max_seq_len));
    std::vector<float> acc(static_cast<size_t>(D));
    for (int64_t it = b; it < e; ++it) {
      int64_t t = it / Hq, h = it % Hq, kh = h / group;
      int s = token_seq[t];
      int qlen = meta.host_query_start_loc[s + 1] - meta.host_query_start_loc[s];
      int ctx = meta.host_seq_lens[s];
      int pos = ctx - qlen + (static_cast<int>(t) - meta.host_query_start_loc[s]);
      const int32_t* bt = meta.host_block_tables.data() + static_cast<size_t>(s) * meta.max_blocks_per_seq;
      const float* qp = q.data<float>() + (t * Hq + h) * D;
      // The keys this query attends: [first, pos]; a window reads nothing before its first key.
      const int first = sliding_window > 0 ? std::max(0, pos - sliding_window + 1) : 0;
      float mx = -INFINITY;
      for (int j = first; j <= pos; ++j) {
        int64_t slot = static_cast<int64_t>(bt[j / bs]) * bs + j % bs;
        size_t base = static_cast<size_t>((slot * Hk + kh) * D);
        float dot = 0;
        if (ct == DType::kF32) {
          const float* kp = reinterpret_cast<const float*>(kc) + base;
          for (int64_t d = 0; d < D; ++d) dot += qp[d] * kp[d];
        } else {
          for (int64_t d = 0; d < D; ++d) dot += qp[d] * load_elem(kc + base * es, ct, d) * k_scale;
        }
        scores[j] = dot * scale;
        mx = std::max(mx, scores[j]);
      }
      float sum = 0;
      for (int j = first; j <= pos; ++j) {
        scores[j] = std::exp(scores[j] - mx);
        sum += scores[j];
      }
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int j = first; j <= pos; ++j) {
        int64_t slot = static_cast<int64_t>(bt[j / bs]) * bs + j % bs;
        size_t base = static_cast<size_t>((slot * Hk + kh) * D);
        float p = scores[j] / sum;
        if (ct == DType::kF32) {
          const float* vp = reinterpret_cast<const float*>(vc) + base;
          for (int64_t d = 0; d < D; ++d) acc[d] += p * vp[d];
        } else {
          for (int64_t d = 0; d < D; ++d) acc[d] += p * load_elem(vc + base * es, ct, d) * v_scale;
        }
      }
      std::memcpy(out.data<float>() + (t * Hq + h) * D, acc.data(), D * 4);
    }
  });
}

void CpuBackend::gather_rows(const Tensor& x, const Tensor& indices, const Tensor& out) {
  int64_t n = indices.numel(), row_bytes = x.nbytes() / x.dim(0);
  const int32_t* idx = indices.data<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    require(idx[i] >= 0 && idx[i] < x.dim(0), "gather_rows", "index out of range");
    std::memcpy(static_cast<char*>(out.raw()) + i * row_bytes, static_cast<const char*>(x.raw()) + idx[i] * row_bytes,
                row_bytes);
  }
}

void CpuBackend::cast(const Tensor& src, const Tensor& dst) {
  require(src.numel() == dst.numel(), "cast", src.str() + " -> " + dst.str());
  convert_host(src.raw(), src.dtype(), dst.raw(), dst.dtype(), static_cast<size_t>(src.numel()));
}

}  // namespace tessera
