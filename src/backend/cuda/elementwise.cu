// Memory-bound ops: fill, cast, gather, norms, SiLU-and-mul, add, RoPE, KV write.
// Each is a static kernel plus a launcher; CudaBackend checks shapes and dtypes.
#include <algorithm>
#include <atomic>

#include "backend/cuda/device_utils.cuh"

namespace tessera::cuda {

namespace {

constexpr int kThreads = 256;

int grid_for(int64_t n, int threads = kThreads) {
  int64_t blocks = (n + threads - 1) / threads;
  return static_cast<int>(std::min<int64_t>(std::max<int64_t>(blocks, 1), 65535LL * 16));
}

template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

__device__ __forceinline__ uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// ---------------------------------------------------------------- fill / random / cast
__global__ void fill_kernel(void* dst, DType t, int64_t n, float value) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    store_from_float(dst, t, i, value);
}

// Same generator as CpuBackend::fill_random, rounding step by step as the host does,
// so both backends produce identical values.
__global__ void fill_random_kernel(void* dst, DType t, int64_t n, uint64_t seed, float low, float high) {
  float range = __fsub_rn(high, low);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t r = splitmix64(seed * 0x100000001b3ull + static_cast<uint64_t>(i));
    float u = __fmul_rn(static_cast<float>(r >> 40), 1.0f / 16777216.0f);
    store_from_float(dst, t, i, __fadd_rn(low, __fmul_rn(range, u)));
  }
}

__global__ void cast_kernel(const void* src, DType st, void* dst, DType dt, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    store_from_float(dst, dt, i, load_as_float(src, st, i));
}

// ---------------------------------------------------------------- gather rows (embedding)
template <typename Chunk>
__global__ void gather_rows_kernel(const Chunk* __restrict__ x, const int32_t* __restrict__ idx,
                                   Chunk* __restrict__ out, int64_t chunks_per_row, int64_t num_rows, int64_t begin,
                                   bool zero_outside, int err_code, int* err) {
  int64_t i = blockIdx.x;
  int64_t r = static_cast<int64_t>(idx[i]) - begin;
  Chunk* dst = out + i * chunks_per_row;
  if (r < 0 || r >= num_rows) {
    if (zero_outside) {
      for (int64_t c = threadIdx.x; c < chunks_per_row; c += blockDim.x) dst[c] = Chunk{};
    } else if (threadIdx.x == 0) {
      raise_error(err, err_code);
    }
    return;
  }
  const Chunk* src = x + r * chunks_per_row;
  for (int64_t c = threadIdx.x; c < chunks_per_row; c += blockDim.x) dst[c] = src[c];
}

// ---------------------------------------------------------------- RMSNorm
template <typename T, typename W, int N>
__global__ void rms_norm_kernel(const T* __restrict__ x, const W* __restrict__ w, T* __restrict__ out, int64_t D,
                                float eps) {
  pdl_launch_dependents();  // programmatic dependent launch: see device_utils.cuh
  pdl_wait();
  using V = Vec<T, N>;
  const V* xr = reinterpret_cast<const V*>(x + blockIdx.x * D);
  V* orow = reinterpret_cast<V*>(out + blockIdx.x * D);
  int64_t nv = D / N;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < nv; i += blockDim.x) {
    V v = xr[i];
#pragma unroll
    for (int k = 0; k < N; ++k) {
      float f = to_float(v.v[k]);
      ss += f * f;
    }
  }
  float inv = rsqrtf(block_sum(ss) / static_cast<float>(D) + eps);
  for (int64_t i = threadIdx.x; i < nv; i += blockDim.x) {
    V v = xr[i], o;
#pragma unroll
    for (int k = 0; k < N; ++k) o.v[k] = from_float<T>(to_float(v.v[k]) * inv * to_float(w[i * N + k]));
    orow[i] = o;
  }
}

// residual += x (rounded to T, as stored); x = rms_norm(residual) * w.
template <typename T, typename W, int N>
__global__ void add_rms_norm_kernel(T* __restrict__ x, T* __restrict__ residual, const W* __restrict__ w, int64_t D,
                                    float eps) {
  using V = Vec<T, N>;
  const int64_t nv = D / N;
  // The norm weight is a model constant (no kernel before writes it): this thread's first kPreW
  // vectors of it load before the PDL wait, instead of after the reduction, where their round trip
  // (from DRAM: the expert weights stream through L2 every step) was on the critical path.
  constexpr int kPreW = 2;
  float wpre[kPreW][N];
#pragma unroll
  for (int j = 0; j < kPreW; ++j) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(j) * blockDim.x;
#pragma unroll
    for (int k = 0; k < N; ++k) wpre[j][k] = i < nv ? to_float(w[i * N + k]) : 0.0f;
  }
  pdl_wait();
  // The next kernel may launch once this one's inputs are done, not at its start: the kernel
  // before it (an MoE down GEMV or combine) lets this one launch early, and a GEMV launched behind
  // it then would take SM slots from that kernel's blocks (programmatic dependent launch:
  // device_utils.cuh).
  pdl_launch_dependents();
  V* xr = reinterpret_cast<V*>(x + blockIdx.x * D);
  V* rr = reinterpret_cast<V*>(residual + blockIdx.x * D);
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < nv; i += blockDim.x) {
    V a = xr[i], r = rr[i];
#pragma unroll
    for (int k = 0; k < N; ++k) {
      r.v[k] = from_float<T>(to_float(r.v[k]) + to_float(a.v[k]));
      float f = to_float(r.v[k]);
      ss += f * f;
    }
    rr[i] = r;
  }
  const float inv = rsqrtf(block_sum(ss) / static_cast<float>(D) + eps);
  auto normed = [&](int64_t i, auto&& weight) {  // rr[i] was written by this same thread above
    V r = rr[i], o;
#pragma unroll
    for (int k = 0; k < N; ++k) o.v[k] = from_float<T>(to_float(r.v[k]) * inv * weight(k));
    xr[i] = o;
  };
#pragma unroll
  for (int j = 0; j < kPreW; ++j) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(j) * blockDim.x;
    if (i < nv) normed(i, [&](int k) { return wpre[j][k]; });
  }
  for (int64_t i = threadIdx.x + static_cast<int64_t>(kPreW) * blockDim.x; i < nv; i += blockDim.x)
    normed(i, [&](int k) { return to_float(w[i * N + k]); });
}

// ---------------------------------------------------------------- SiLU-and-mul, add, bias
template <typename T, int N>
__global__ void silu_mul_kernel(const T* __restrict__ gu, T* __restrict__ out, int64_t T_, int64_t I) {
  pdl_launch_dependents();  // programmatic dependent launch: see device_utils.cuh
  pdl_wait();
  using V = Vec<T, N>;
  int64_t per_row = I / N, total = T_ * per_row;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t t = i / per_row, c = i % per_row;
    V g = reinterpret_cast<const V*>(gu + t * 2 * I)[c];
    V u = reinterpret_cast<const V*>(gu + t * 2 * I + I)[c];
    V o;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      float a = to_float(g.v[k]);
      o.v[k] = from_float<T>(a / (1.0f + __expf(-a)) * to_float(u.v[k]));
    }
    reinterpret_cast<V*>(out + t * I)[c] = o;
  }
}

// out = x * sigmoid(gate[i / row]) (a gate per row of `row` elements; row = 1: elementwise).
// out may alias x (no __restrict__ on them).
template <typename T>
__global__ void sigmoid_mul_kernel(const T* x, const T* __restrict__ gate, T* out, int64_t n, int64_t row) {
  pdl_launch_dependents();
  pdl_wait();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float g = to_float(gate[row == 1 ? i : i / row]);
    out[i] = from_float<T>(to_float(x[i]) / (1.0f + __expf(-g)));
  }
}

template <typename T, int N>
__global__ void add_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out, int64_t nv) {
  using V = Vec<T, N>;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < nv; i += int64_t(gridDim.x) * blockDim.x) {
    V x = reinterpret_cast<const V*>(a)[i], y = reinterpret_cast<const V*>(b)[i], o;
#pragma unroll
    for (int k = 0; k < N; ++k) o.v[k] = from_float<T>(to_float(x.v[k]) + to_float(y.v[k]));
    reinterpret_cast<V*>(out)[i] = o;
  }
}

__global__ void add_bias_kernel(void* out, DType ot, const void* bias, DType bt, int64_t M, int64_t N) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < M * N; i += int64_t(gridDim.x) * blockDim.x)
    store_from_float(out, ot, i, load_as_float(out, ot, i) + load_as_float(bias, bt, i % N));
}

// ---------------------------------------------------------------- RoPE
template <typename T>
__global__ void rope_kernel(T* __restrict__ q, T* __restrict__ k, const int32_t* __restrict__ positions,
                            const float* __restrict__ cos_sin, int Hq, int Hk, int D, int rd, bool neox,
                            int64_t max_pos, int* err) {
  int64_t t = blockIdx.x;
  int32_t pos = positions[t];
  if (pos < 0 || pos >= max_pos) {
    if (threadIdx.x == 0) raise_error(err, kErrRopePosition);
    return;
  }
  int half = rd / 2;
  const float* c = cos_sin + static_cast<int64_t>(pos) * rd;
  const float* s = c + half;
  int total = (Hq + Hk) * half;
  for (int i = threadIdx.x; i < total; i += blockDim.x) {
    int h = i / half, j = i % half;
    T* base = h < Hq ? q + (t * Hq + h) * D : k + (t * Hk + (h - Hq)) * D;
    int i1 = neox ? j : 2 * j, i2 = neox ? j + half : 2 * j + 1;
    float x1 = to_float(base[i1]), x2 = to_float(base[i2]);
    float cj = c[j], sj = s[j];
    base[i1] = from_float<T>(x1 * cj - x2 * sj);
    base[i2] = from_float<T>(x2 * cj + x1 * sj);
  }
}

// ---------------------------------------------------------------- paged KV write
__global__ void write_kv_kernel(const void* __restrict__ k, const void* __restrict__ v, DType in_t, void* k_cache,
                                void* v_cache, DType ct, const int32_t* __restrict__ slots, int64_t row,
                                int64_t num_slots, float k_scale, float v_scale, int* err) {
  int64_t t = blockIdx.x;
  int32_t slot = slots[t];
  if (slot < 0) return;
  if (slot >= num_slots) {
    if (threadIdx.x == 0) raise_error(err, kErrKvSlot);
    return;
  }
  int64_t src = t * row, dst = static_cast<int64_t>(slot) * row;
  for (int64_t i = threadIdx.x; i < row; i += blockDim.x) {
    store_from_float(k_cache, ct, dst + i, load_as_float(k, in_t, src + i) / k_scale);
    store_from_float(v_cache, ct, dst + i, load_as_float(v, in_t, src + i) / v_scale);
  }
}

// bf16 -> bf16 with unit scales: 16-byte copies.
__global__ void write_kv_copy_kernel(const uint4* __restrict__ k, const uint4* __restrict__ v, uint4* k_cache,
                                     uint4* v_cache, const int32_t* __restrict__ slots, int64_t chunks,
                                     int64_t num_slots, int* err) {
  int64_t t = blockIdx.x;
  int32_t slot = slots[t];
  if (slot < 0) return;
  if (slot >= num_slots) {
    if (threadIdx.x == 0) raise_error(err, kErrKvSlot);
    return;
  }
  for (int64_t i = threadIdx.x; i < chunks; i += blockDim.x) {
    k_cache[slot * chunks + i] = k[t * chunks + i];
    v_cache[slot * chunks + i] = v[t * chunks + i];
  }
}

template <typename T, typename W, int N>
void rms_norm_t(const void* x, const void* w, void* out, int64_t rows, int64_t D, float eps, cudaStream_t s) {
  int threads = static_cast<int>(std::min<int64_t>(1024, std::max<int64_t>(32, (D / N + 31) / 32 * 32)));
  launch_pdl(rms_norm_kernel<T, W, N>, static_cast<unsigned>(rows), threads, 0, s, static_cast<const T*>(x),
             static_cast<const W*>(w), static_cast<T*>(out), D, eps);
}
template <typename T, typename W, int N>
void add_rms_norm_t(void* x, void* r, const void* w, int64_t rows, int64_t D, float eps, cudaStream_t s) {
  int threads = static_cast<int>(std::min<int64_t>(1024, std::max<int64_t>(32, (D / N + 31) / 32 * 32)));
  launch_pdl(add_rms_norm_kernel<T, W, N>, static_cast<unsigned>(rows), threads, 0, s, static_cast<T*>(x),
             static_cast<T*>(r), static_cast<const W*>(w), D, eps);
}

}  // namespace

namespace {
std::atomic<bool> g_pdl{false};
}  // namespace

bool pdl_enabled() { return g_pdl.load(std::memory_order_relaxed); }
void set_pdl_enabled(bool on) { g_pdl.store(on, std::memory_order_relaxed); }

void launch_fill(void* dst, DType t, int64_t n, float value, cudaStream_t s) {
  if (n == 0) return;
  fill_kernel<<<grid_for(n), kThreads, 0, s>>>(dst, t, n, value);
  TCUDA_LAUNCH_CHECK();
}

void launch_fill_random(void* dst, DType t, int64_t n, uint64_t seed, float low, float high, cudaStream_t s) {
  if (n == 0) return;
  fill_random_kernel<<<grid_for(n), kThreads, 0, s>>>(dst, t, n, seed, low, high);
  TCUDA_LAUNCH_CHECK();
}

void launch_cast(const void* src, DType st, void* dst, DType dt, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  cast_kernel<<<grid_for(n), kThreads, 0, s>>>(src, st, dst, dt, n);
  TCUDA_LAUNCH_CHECK();
}

void launch_gather_rows(const void* x, const int32_t* idx, void* out, int64_t n, int64_t row_bytes, int64_t num_rows,
                        int err_code, int* err, cudaStream_t s, int64_t begin, bool zero_outside) {
  if (n == 0) return;
  if (row_bytes % 16 == 0 && aligned16(x) && aligned16(out)) {
    int64_t chunks = row_bytes / 16;
    int threads = static_cast<int>(std::min<int64_t>(256, (chunks + 31) / 32 * 32));
    gather_rows_kernel<uint4><<<static_cast<unsigned>(n), threads, 0, s>>>(static_cast<const uint4*>(x), idx,
                                                                           static_cast<uint4*>(out), chunks, num_rows,
                                                                           begin, zero_outside, err_code, err);
  } else {
    gather_rows_kernel<uint8_t><<<static_cast<unsigned>(n), 256, 0, s>>>(static_cast<const uint8_t*>(x), idx,
                                                                         static_cast<uint8_t*>(out), row_bytes,
                                                                         num_rows, begin, zero_outside, err_code, err);
  }
  TCUDA_LAUNCH_CHECK();
}

void launch_rms_norm(const void* x, DType xt, const void* w, DType wt, void* out, int64_t rows, int64_t D, float eps,
                     cudaStream_t s) {
  if (rows == 0) return;
  bool vec = D % 8 == 0 && aligned16(x) && aligned16(out);
  if (xt == DType::kBF16) {
    if (wt == DType::kBF16)
      vec ? rms_norm_t<__nv_bfloat16, __nv_bfloat16, 8>(x, w, out, rows, D, eps, s)
          : rms_norm_t<__nv_bfloat16, __nv_bfloat16, 1>(x, w, out, rows, D, eps, s);
    else
      vec ? rms_norm_t<__nv_bfloat16, float, 8>(x, w, out, rows, D, eps, s)
          : rms_norm_t<__nv_bfloat16, float, 1>(x, w, out, rows, D, eps, s);
  } else {
    if (wt == DType::kBF16)
      rms_norm_t<float, __nv_bfloat16, 1>(x, w, out, rows, D, eps, s);
    else
      rms_norm_t<float, float, 1>(x, w, out, rows, D, eps, s);
  }
  TCUDA_LAUNCH_CHECK();
}

void launch_add_rms_norm(void* x, void* residual, DType t, const void* w, DType wt, int64_t rows, int64_t D, float eps,
                         cudaStream_t s) {
  if (rows == 0) return;
  bool vec = D % 8 == 0 && aligned16(x) && aligned16(residual);
  if (t == DType::kBF16) {
    if (wt == DType::kBF16)
      vec ? add_rms_norm_t<__nv_bfloat16, __nv_bfloat16, 8>(x, residual, w, rows, D, eps, s)
          : add_rms_norm_t<__nv_bfloat16, __nv_bfloat16, 1>(x, residual, w, rows, D, eps, s);
    else
      vec ? add_rms_norm_t<__nv_bfloat16, float, 8>(x, residual, w, rows, D, eps, s)
          : add_rms_norm_t<__nv_bfloat16, float, 1>(x, residual, w, rows, D, eps, s);
  } else {
    if (wt == DType::kBF16)
      add_rms_norm_t<float, __nv_bfloat16, 1>(x, residual, w, rows, D, eps, s);
    else
      add_rms_norm_t<float, float, 1>(x, residual, w, rows, D, eps, s);
  }
  TCUDA_LAUNCH_CHECK();
}

void launch_silu_mul(const void* gate_up, void* out, DType t, int64_t T, int64_t I, cudaStream_t s) {
  if (T * I == 0) return;
  if (t == DType::kBF16) {
    if (I % 8 == 0 && aligned16(gate_up) && aligned16(out))
      launch_pdl(silu_mul_kernel<__nv_bfloat16, 8>, grid_for(T * I / 8), kThreads, 0, s,
                 static_cast<const __nv_bfloat16*>(gate_up), static_cast<__nv_bfloat16*>(out), T, I);
    else
      silu_mul_kernel<__nv_bfloat16, 1><<<grid_for(T * I), kThreads, 0, s>>>(static_cast<const __nv_bfloat16*>(gate_up),
                                                                             static_cast<__nv_bfloat16*>(out), T, I);
  } else {
    silu_mul_kernel<float, 1>
        <<<grid_for(T * I), kThreads, 0, s>>>(static_cast<const float*>(gate_up), static_cast<float*>(out), T, I);
  }
  TCUDA_LAUNCH_CHECK();
}

void launch_sigmoid_mul(const void* x, const void* gate, void* out, DType t, int64_t n, int64_t row, cudaStream_t s) {
  if (n == 0) return;
  if (t == DType::kBF16)
    launch_pdl(sigmoid_mul_kernel<__nv_bfloat16>, grid_for(n), kThreads, 0, s, static_cast<const __nv_bfloat16*>(x),
               static_cast<const __nv_bfloat16*>(gate), static_cast<__nv_bfloat16*>(out), n, row);
  else
    launch_pdl(sigmoid_mul_kernel<float>, grid_for(n), kThreads, 0, s, static_cast<const float*>(x),
               static_cast<const float*>(gate), static_cast<float*>(out), n, row);
  TCUDA_LAUNCH_CHECK();
}

void launch_add(const void* a, const void* b, void* out, DType t, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  if (t == DType::kBF16) {
    if (n % 8 == 0 && aligned16(a) && aligned16(b) && aligned16(out))
      add_kernel<__nv_bfloat16, 8><<<grid_for(n / 8), kThreads, 0, s>>>(static_cast<const __nv_bfloat16*>(a),
                                                                        static_cast<const __nv_bfloat16*>(b),
                                                                        static_cast<__nv_bfloat16*>(out), n / 8);
    else
      add_kernel<__nv_bfloat16, 1><<<grid_for(n), kThreads, 0, s>>>(static_cast<const __nv_bfloat16*>(a),
                                                                    static_cast<const __nv_bfloat16*>(b),
                                                                    static_cast<__nv_bfloat16*>(out), n);
  } else {
    add_kernel<float, 1><<<grid_for(n), kThreads, 0, s>>>(static_cast<const float*>(a), static_cast<const float*>(b),
                                                          static_cast<float*>(out), n);
  }
  TCUDA_LAUNCH_CHECK();
}

void launch_add_bias(void* out, DType ot, const void* bias, DType bt, int64_t M, int64_t N, cudaStream_t s) {
  if (M * N == 0) return;
  add_bias_kernel<<<grid_for(M * N), kThreads, 0, s>>>(out, ot, bias, bt, M, N);
  TCUDA_LAUNCH_CHECK();
}

void launch_rope(void* q, void* k, DType t, const int32_t* positions, const float* cos_sin, int64_t T, int Hq, int Hk,
                 int D, int rotary_dim, bool neox, int64_t max_pos, int* err, cudaStream_t s) {
  if (T == 0) return;
  int work = (Hq + Hk) * rotary_dim / 2;
  int threads = std::min(512, std::max(32, (work + 31) / 32 * 32));
  if (t == DType::kBF16)
    rope_kernel<__nv_bfloat16>
        <<<static_cast<unsigned>(T), threads, 0, s>>>(static_cast<__nv_bfloat16*>(q), static_cast<__nv_bfloat16*>(k),
                                                      positions, cos_sin, Hq, Hk, D, rotary_dim, neox, max_pos, err);
  else
    rope_kernel<float><<<static_cast<unsigned>(T), threads, 0, s>>>(
        static_cast<float*>(q), static_cast<float*>(k), positions, cos_sin, Hq, Hk, D, rotary_dim, neox, max_pos, err);
  TCUDA_LAUNCH_CHECK();
}

void launch_write_kv(const void* k, const void* v, DType in_t, void* k_cache, void* v_cache, DType cache_t,
                     const int32_t* slot_mapping, int64_t T, int64_t row, int64_t num_slots, float k_scale,
                     float v_scale, int* err, cudaStream_t s) {
  if (T == 0) return;
  if (in_t == cache_t && k_scale == 1.0f && v_scale == 1.0f &&
      (row * static_cast<int64_t>(dtype_size(in_t))) % 16 == 0 && aligned16(k) && aligned16(v) && aligned16(k_cache) &&
      aligned16(v_cache)) {
    int64_t chunks = row * static_cast<int64_t>(dtype_size(in_t)) / 16;
    int threads = static_cast<int>(std::min<int64_t>(256, (chunks + 31) / 32 * 32));
    write_kv_copy_kernel<<<static_cast<unsigned>(T), threads, 0, s>>>(
        static_cast<const uint4*>(k), static_cast<const uint4*>(v), static_cast<uint4*>(k_cache),
        static_cast<uint4*>(v_cache), slot_mapping, chunks, num_slots, err);
  } else {
    int threads = static_cast<int>(std::min<int64_t>(512, (row + 31) / 32 * 32));
    write_kv_kernel<<<static_cast<unsigned>(T), threads, 0, s>>>(k, v, in_t, k_cache, v_cache, cache_t, slot_mapping,
                                                                 row, num_slots, k_scale, v_scale, err);
  }
  TCUDA_LAUNCH_CHECK();
}

}  // namespace tessera::cuda
