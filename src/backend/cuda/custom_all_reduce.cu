// Kernels of the custom all-reduce (design in custom_all_reduce.h). Data moves in 16-byte
// packs (4 f32 or 8 bf16); the last pack may be partial and a pointer that is not 16-byte
// aligned is read and written element by element, but the partition of packs among threads
// is the same on every rank, which is what the per-block barriers rely on. Each pack of the
// caller's tensor is touched by one thread in every phase (copy-in, reduce, write-out), so
// in-place use needs no ordering between blocks of one rank.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>

#include "backend/cuda/custom_all_reduce_kernels.h"

namespace tessera::cuda::car {

namespace {

__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void st_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

enum Phase { kStart = 0, kMid = 1 };

// Block-wide barrier among the same block of every rank. Thread p < N publishes `flag` into
// slot [block][rank] of rank p's flags (release: the block's earlier writes, ordered before it
// by __syncthreads, become visible to rank p first), then waits until slot [block][p] of my
// flags reaches `flag` (acquire). Counters only grow, and a peer may already be one call
// ahead, so "reached" is a wrap-safe >=.
template <int N>
__device__ __forceinline__ void block_barrier(const KernelArgs& a, Phase phase, uint32_t flag) {
  __syncthreads();
  if (threadIdx.x < N) {
    const int peer = threadIdx.x;
    Flags* theirs = a.flags[peer];
    Flags* mine = a.flags[a.rank];
    st_release_sys(phase == kStart ? &theirs->start[blockIdx.x][a.rank] : &theirs->mid[blockIdx.x][a.rank], flag);
    const uint32_t* slot = phase == kStart ? &mine->start[blockIdx.x][peer] : &mine->mid[blockIdx.x][peer];
    uint32_t seen;
    uint32_t spins = 0;
    uint64_t t0 = 0;
    while (static_cast<int32_t>((seen = ld_acquire_sys(slot)) - flag) < 0) {
      if (a.timeout_ns == 0 || (++spins & 1023u) != 0) continue;
      uint64_t now = global_ns();
      if (t0 == 0) {
        t0 = now;
      } else if (now - t0 > a.timeout_ns) {
        // Record who we waited for (racy among blocks, any one report is right), say it once
        // from block 0 (a line per block would flood the log), and abort the kernel.
        FailureRecord* f = a.failure;
        if (f && f->set == 0) {
          f->rank = a.rank;
          f->waiting_for = peer;
          f->block = blockIdx.x;
          f->phase = phase;
          f->flag = flag;
          f->seen = seen;
          f->waited_ns = now - t0;
          __threadfence_system();
          f->set = 1;
          __threadfence_system();
        }
        if (blockIdx.x == 0)
          printf(
              "tessera custom all-reduce: rank %d waited %llu ms at the %s barrier for rank %d (call %u, it is "
              "at %u); aborting the kernel\n",
              a.rank, static_cast<unsigned long long>((now - t0) / 1000000), phase == kStart ? "start" : "middle", peer,
              flag, seen);
        __trap();
      }
    }
  }
  __syncthreads();
}

// 16-byte pack <-> f32 accumulators.
template <typename T>
struct PackOf;

template <>
struct PackOf<float> {
  static constexpr int E = 4;
  __device__ __forceinline__ static void load(float (&acc)[E], const uint4& v) {
    acc[0] = __uint_as_float(v.x);
    acc[1] = __uint_as_float(v.y);
    acc[2] = __uint_as_float(v.z);
    acc[3] = __uint_as_float(v.w);
  }
  __device__ __forceinline__ static void add(float (&acc)[E], const uint4& v) {
    acc[0] += __uint_as_float(v.x);
    acc[1] += __uint_as_float(v.y);
    acc[2] += __uint_as_float(v.z);
    acc[3] += __uint_as_float(v.w);
  }
  __device__ __forceinline__ static uint4 store(const float (&acc)[E]) {
    return make_uint4(__float_as_uint(acc[0]), __float_as_uint(acc[1]), __float_as_uint(acc[2]),
                      __float_as_uint(acc[3]));
  }
};

template <>
struct PackOf<__nv_bfloat16> {
  static constexpr int E = 8;
  __device__ __forceinline__ static float2 two(uint32_t w) {
    __nv_bfloat162 h;
    memcpy(&h, &w, 4);
    return __bfloat1622float2(h);
  }
  __device__ __forceinline__ static uint32_t pack2(float a, float b) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    uint32_t w;
    memcpy(&w, &h, 4);
    return w;
  }
  __device__ __forceinline__ static void load(float (&acc)[E], const uint4& v) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float2 f = two(w[i]);
      acc[2 * i] = f.x;
      acc[2 * i + 1] = f.y;
    }
  }
  __device__ __forceinline__ static void add(float (&acc)[E], const uint4& v) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float2 f = two(w[i]);
      acc[2 * i] += f.x;
      acc[2 * i + 1] += f.y;
    }
  }
  __device__ __forceinline__ static uint4 store(const float (&acc)[E]) {
    return make_uint4(pack2(acc[0], acc[1]), pack2(acc[2], acc[3]), pack2(acc[4], acc[5]), pack2(acc[6], acc[7]));
  }
};

// Pack p of the caller's tensor: elements [p*E, p*E + m), m <= E; zeros past m.
template <typename T>
__device__ __forceinline__ uint4 load_user(const T* data, int64_t p, int64_t n, bool aligned) {
  constexpr int E = PackOf<T>::E;
  const int64_t e0 = p * E;
  const int m = static_cast<int>(n - e0 < E ? n - e0 : E);
  if (aligned && m == E) return *reinterpret_cast<const uint4*>(data + e0);
  uint4 v = make_uint4(0, 0, 0, 0);
  T tmp[E];
  memcpy(tmp, &v, 16);
  // Unrolled over E with a predicate, so that tmp stays in registers (a loop to m would index
  // it at run time and put it on the stack).
#pragma unroll
  for (int i = 0; i < E; ++i)
    if (i < m) tmp[i] = data[e0 + i];
  memcpy(&v, tmp, 16);
  return v;
}

template <typename T>
__device__ __forceinline__ void store_user(T* data, int64_t p, int64_t n, bool aligned, const uint4& v) {
  constexpr int E = PackOf<T>::E;
  const int64_t e0 = p * E;
  const int m = static_cast<int>(n - e0 < E ? n - e0 : E);
  if (aligned && m == E) {
    *reinterpret_cast<uint4*>(data + e0) = v;
    return;
  }
  T tmp[E];
  memcpy(tmp, &v, 16);
#pragma unroll
  for (int i = 0; i < E; ++i)
    if (i < m) data[e0 + i] = tmp[i];
}

// Sum of pack p over the N staging buffers, in rank order (identical on every rank).
template <typename T, int N>
__device__ __forceinline__ uint4 reduce_pack(const uint4* const (&src)[N], int64_t p) {
  uint4 v[N];
#pragma unroll
  for (int r = 0; r < N; ++r) v[r] = src[r][p];
  float acc[PackOf<T>::E];
  PackOf<T>::load(acc, v[0]);
#pragma unroll
  for (int r = 1; r < N; ++r) PackOf<T>::add(acc, v[r]);
  return PackOf<T>::store(acc);
}

struct CallState {
  uint32_t flag;  // this call's number for this block (same on every rank)
  size_t half;    // byte offset of this call's staging half
};

__device__ __forceinline__ CallState begin_call(const KernelArgs& a) {
  uint32_t flag = a.flags[a.rank]->counter[blockIdx.x] + 1;
  return {flag, (flag & 1u) ? a.half_bytes : 0};
}

// After the start barrier (every thread of the block has read the counter by then).
__device__ __forceinline__ void end_call_counter(const KernelArgs& a, uint32_t flag) {
  if (threadIdx.x == 0) a.flags[a.rank]->counter[blockIdx.x] = flag;
}

template <typename T, int N>
__global__ void __launch_bounds__(kThreads) one_shot_kernel(KernelArgs a, T* __restrict__ data, int64_t n) {
  constexpr int E = PackOf<T>::E;
  const CallState call = begin_call(a);
  const bool aligned = (reinterpret_cast<uintptr_t>(data) & 15) == 0;
  const int64_t packs = (n + E - 1) / E;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const uint4* src[N];
#pragma unroll
  for (int r = 0; r < N; ++r) src[r] = reinterpret_cast<const uint4*>(a.bufs[r] + call.half);
  uint4* mine = reinterpret_cast<uint4*>(a.bufs[a.rank] + call.half);

  for (int64_t p = tid; p < packs; p += stride) mine[p] = load_user(data, p, n, aligned);
  block_barrier<N>(a, kStart, call.flag);
  end_call_counter(a, call.flag);
  for (int64_t p = tid; p < packs; p += stride) store_user(data, p, n, aligned, reduce_pack<T, N>(src, p));
}

template <typename T, int N>
__global__ void __launch_bounds__(kThreads) two_shot_kernel(KernelArgs a, T* __restrict__ data, int64_t n) {
  constexpr int E = PackOf<T>::E;
  const CallState call = begin_call(a);
  const bool aligned = (reinterpret_cast<uintptr_t>(data) & 15) == 0;
  const int64_t packs = (n + E - 1) / E;
  const int64_t part = packs / N;  // slice s = packs [s * part, (s + 1) * part); the last one takes the rest
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const uint4* src[N];
#pragma unroll
  for (int r = 0; r < N; ++r) src[r] = reinterpret_cast<const uint4*>(a.bufs[r] + call.half);
  uint4* mine = reinterpret_cast<uint4*>(a.bufs[a.rank] + call.half);
  auto slice_len = [&](int s) { return s == N - 1 ? packs - (N - 1) * part : part; };

  // Copy in slice by slice, with the same pack -> thread mapping as the later phases.
  for (int s = 0; s < N; ++s)
    for (int64_t j = tid; j < slice_len(s); j += stride) mine[s * part + j] = load_user(data, s * part + j, n, aligned);
  block_barrier<N>(a, kStart, call.flag);
  end_call_counter(a, call.flag);

  // Reduce-scatter: my slice from every rank; the result goes to my output and, for the
  // peers, back into my staging buffer (only I read my own slice before the next barrier).
  const int me = a.rank;
  for (int64_t j = tid; j < slice_len(me); j += stride) {
    const int64_t p = me * part + j;
    uint4 v = reduce_pack<T, N>(src, p);
    mine[p] = v;
    store_user(data, p, n, aligned, v);
  }
  block_barrier<N>(a, kMid, call.flag);

  // All-gather: the other ranks' reduced slices.
#pragma unroll 1
  for (int s = 0; s < N; ++s) {
    if (s == me) continue;
    const uint4* theirs = reinterpret_cast<const uint4*>(a.bufs[s] + call.half);  // (src[s] would go to local memory)
    for (int64_t j = tid; j < slice_len(s); j += stride) {
      const int64_t p = s * part + j;
      store_user(data, p, n, aligned, theirs[p]);
    }
  }
}

template <typename T, int N>
void launch_typed(const KernelArgs& a, void* data, int64_t n, CarAlgo algo, cudaStream_t s) {
  T* d = static_cast<T*>(data);
  if (algo == CarAlgo::kTwoShot)
    two_shot_kernel<T, N><<<a.blocks, kThreads, 0, s>>>(a, d, n);
  else
    one_shot_kernel<T, N><<<a.blocks, kThreads, 0, s>>>(a, d, n);
}

template <typename T>
cudaError_t launch_world(const KernelArgs& a, void* data, int64_t n, CarAlgo algo, cudaStream_t s) {
  switch (a.world) {
    case 2:
      launch_typed<T, 2>(a, data, n, algo, s);
      break;
    case 3:
      launch_typed<T, 3>(a, data, n, algo, s);
      break;
    case 4:
      launch_typed<T, 4>(a, data, n, algo, s);
      break;
    case 5:
      launch_typed<T, 5>(a, data, n, algo, s);
      break;
    case 6:
      launch_typed<T, 6>(a, data, n, algo, s);
      break;
    case 7:
      launch_typed<T, 7>(a, data, n, algo, s);
      break;
    case 8:
      launch_typed<T, 8>(a, data, n, algo, s);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_custom_all_reduce(const KernelArgs& args, void* data, DType dtype, int64_t n, CarAlgo algo,
                                     cudaStream_t stream) {
  if (dtype == DType::kF32) return launch_world<float>(args, data, n, algo, stream);
  if (dtype == DType::kBF16) return launch_world<__nv_bfloat16>(args, data, n, algo, stream);
  return cudaErrorInvalidValue;
}

}  // namespace tessera::cuda::car
