// Block-scaled FP8 (W8A8) GEMM on mma.sync tensor cores (m16n8k32, e4m3 x e4m3 -> f32): the
// W8A8 linear where cuBLASLt has no 128 x 128 block-scaled FP8 GEMM and wgmma does not exist
// (sm_120 RTX 50xx, sm_121 DGX Spark). fp8_mma_gemm.h gives the contract.
//
// A block computes a BM x BN tile of out. The k walk goes one 128-column scale block a step: a
// pipeline stage holds the block's 128 e4m3 columns of BM activation rows and BN weight rows (a
// tile row is 128 bytes, its eight 16-byte chunks XOR-swizzled by row so that the cp.async
// stores and the ldmatrix reads are free of bank conflicts), filled by cp.async kStages - 1 steps
// ahead. For the MMAs an e4m3 fragment is a bf16 fragment's bytes (m16n8k32's 4 x 8-bit values a
// register sit where m16n8k16's 2 x 16-bit ones do), so ldmatrix.b16 loads both operands as it
// would a bf16 tile 64 columns wide. Each warp sums a step's four k32 MMAs of its fragments into
// f32 block sums, multiplies them by x_scale[kb][row] * w_scale[n / 128][kb] (a column tile lies
// in one 128-row weight block) and adds them to its f32 accumulators: the "fine-grained" scaling
// of DeepSeek-V3's FP8 GEMM (each block's sum scaled and added once, no long f32 run of unscaled
// products). The step's scales are read at its start, through L1, and used after its MMAs.
// Hopper (sm_90, no e4m3 mma.sync) widens the fragments to f16 once and runs f16 MMAs (mma_k32).
//
// Tiles (Tile below; all within sm_120's 99 KiB of shared memory a block, one block a
// multiprocessor there):
//   large  128 x 128, 8 warps of 64 x 32, 3 stages of 32 KiB: many tiles (prefill).
//   medium  64 x 128, 4 warps of 32 x 64, 4 stages of 24 KiB: too few large tiles for the SMs.
//   small   32 x  64, 4 warps of 32 x 16, 4 stages of 12 KiB: M <= 32, or too few medium tiles,
//           where the weight reads bound the time and more, smaller tiles keep more of them in
//           flight.
// Consecutive blocks take kGroupM row tiles of one column tile before the next, so the tiles
// running at once share activation rows and weight rows in L2.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/fp8_mma_gemm.h"
#include "backend/cuda/mma_utils.cuh"

namespace tessera::cuda {

namespace {

constexpr int kBK = 128;    // k columns (bytes of e4m3) of a pipeline stage: one scale block
constexpr int kGroupM = 8;  // row tiles that consecutive blocks walk before the next column tile

template <int BM_, int BN_, int WM_, int WN_, int kStages_>
struct Tile {
  static constexpr int BM = BM_, BN = BN_, WM = WM_, WN = WN_, kStages = kStages_;
  static constexpr int kThreads = WM * WN * 32;
  static constexpr int kWarpM = BM / WM, kWarpN = BN / WN;  // a warp's rows and columns
  static constexpr int MT = kWarpM / 16, NT = kWarpN / 8;   // its m16 and n8 fragments
  static constexpr int kRowsPerPass = kThreads / 8;         // tile rows one pass of 16-byte copies fills
  static constexpr int kStageBytes = (BM + BN) * kBK;
  static constexpr size_t kSmem = size_t{kStages} * kStageBytes;
  static_assert(kWarpM % 16 == 0 && kWarpN % 16 == 0, "m16 fragments and pairs of n8 fragments");
  static_assert(BM % kRowsPerPass == 0 && BN % kRowsPerPass == 0, "whole copy passes");
  static_assert(128 % BN == 0, "a column tile lies in one 128-row weight scale block");
  static_assert(kStages >= 2, "a pipeline");
};
using LargeTile = Tile<128, 128, 2, 4, 3>;
using MediumTile = Tile<64, 128, 2, 2, 4>;
using SmallTile = Tile<32, 64, 1, 4, 4>;

struct Args {
  const uint8_t* xq;  // e4m3 [M, K]
  const float* xs;    // [K / 128][M]
  const uint8_t* w;   // e4m3 [N, K]
  const float* ws;    // [ceil(N / 128)][K / 128]
  void* out;          // [M, N]
  int M, N, K;
  int tiles_m, tiles_n;
  bool pairs;  // N even and out aligned: two adjacent outputs as one store
};

// Byte offset of (row, 16-byte chunk) in a [rows][128-byte] tile with swizzled chunks.
__device__ __forceinline__ int swz(int row, int chunk) { return row * kBK + ((chunk ^ (row & 7)) << 4); }

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900
// Four e4m3 values (a register, the lowest byte first) to two f16x2 registers: bytes 0, 1 in lo,
// bytes 2, 3 in hi.
__device__ __forceinline__ void e4m3x4_to_f16(uint32_t v, uint32_t& lo, uint32_t& hi) {
  asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(v));
}
#endif

// c[mt][nt] += a[mt] (16 x 32, row) * b[nt] (32 x 8, col) over a warp's fragments, e4m3 inputs,
// f32 accumulators. Hopper has no e4m3 mma.sync: ptxas would widen both operands at every MMA
// (and spill); there each fragment is widened once to f16 (exact: every e4m3 value is an f16
// value) and a k32 step is two m16n8k16 f16 MMAs. An e4m3 register's bytes k 4t .. 4t + 3 go to
// the f16 fragments' k 2t, 2t + 1 (low half) and 2t + 8, 2t + 9 (high half), for A and B alike:
// the same permutation of k on both sides leaves the sums as they are.
template <int MT, int NT>
__device__ __forceinline__ void mma_k32(float (&c)[MT][NT][4], const uint32_t (&a)[MT][4], const uint32_t (&b)[NT][2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900
  uint32_t ah[MT][2][4], bh[NT][2][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      e4m3x4_to_f16(a[mt][2 * j], ah[mt][j][0], ah[mt][j][2]);
      e4m3x4_to_f16(a[mt][2 * j + 1], ah[mt][j][1], ah[mt][j][3]);
    }
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int j = 0; j < 2; ++j) e4m3x4_to_f16(b[nt][j], bh[nt][j][0], bh[nt][j][1]);
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[mt][nt][0]), "+f"(c[mt][nt][1]), "+f"(c[mt][nt][2]), "+f"(c[mt][nt][3])
            : "r"(ah[mt][j][0]), "r"(ah[mt][j][1]), "r"(ah[mt][j][2]), "r"(ah[mt][j][3]), "r"(bh[nt][j][0]),
              "r"(bh[nt][j][1]));
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
      asm volatile(
          "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
          "{%0,%1,%2,%3};\n"
          : "+f"(c[mt][nt][0]), "+f"(c[mt][nt][1]), "+f"(c[mt][nt][2]), "+f"(c[mt][nt][3])
          : "r"(a[mt][0]), "r"(a[mt][1]), "r"(a[mt][2]), "r"(a[mt][3]), "r"(b[nt][0]), "r"(b[nt][1]));
#endif
}

__device__ __forceinline__ void store2(float* p, float a, float b) {
  *reinterpret_cast<float2*>(p) = make_float2(a, b);
}
__device__ __forceinline__ void store2(__nv_bfloat16* p, float a, float b) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(a, b);
}
__device__ __forceinline__ void store1(float* p, float a) { *p = a; }
__device__ __forceinline__ void store1(__nv_bfloat16* p, float a) { *p = __float2bfloat16_rn(a); }

template <class T, typename OutT>
__global__ void __launch_bounds__(T::kThreads, 1) fp8_block_mma_gemm_kernel(const Args g) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  constexpr int MT = T::MT, NT = T::NT, S = T::kStages;
  extern __shared__ __align__(128) uint8_t smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / T::WN, wn = warp % T::WN;
  // Block -> tile: groups of kGroupM row tiles, the row tile fastest within a group.
  const int per_group = kGroupM * g.tiles_n, first_m = (static_cast<int>(blockIdx.x) / per_group) * kGroupM;
  const int group_m = min(g.tiles_m - first_m, kGroupM), in_group = static_cast<int>(blockIdx.x) % per_group;
  const int m0 = (first_m + in_group % group_m) * T::BM, n0 = (in_group / group_m) * T::BN;
  const int M = g.M, N = g.N, K = g.K, KB = K / kBK;

  // This thread's copies: chunk tid % 8 of tile rows tid / 8 + kRowsPerPass i, zeros past M and N.
  const int crow = tid >> 3, cchunk = tid & 7;
  const int64_t pass_stride = static_cast<int64_t>(T::kRowsPerPass) * K;
  const uint8_t* const a_src = g.xq + static_cast<int64_t>(m0 + crow) * K + 16 * cchunk;
  const uint8_t* const b_src = g.w + static_cast<int64_t>(n0 + crow) * K + 16 * cchunk;
  auto load_stage = [&](int stage, int kb) {
    uint8_t* sa = smem + stage * T::kStageBytes;
    uint8_t* sb = sa + T::BM * kBK;
    const int64_t k0 = static_cast<int64_t>(kb) * kBK;
#pragma unroll
    for (int i = 0; i < T::BM / T::kRowsPerPass; ++i) {
      const bool ok = m0 + crow + i * T::kRowsPerPass < M;
      cp_async16_zfill(sa + swz(crow + i * T::kRowsPerPass, cchunk), ok ? a_src + i * pass_stride + k0 : g.xq,
                       ok ? 16 : 0);
    }
#pragma unroll
    for (int i = 0; i < T::BN / T::kRowsPerPass; ++i) {
      const bool ok = n0 + crow + i * T::kRowsPerPass < N;
      cp_async16_zfill(sb + swz(crow + i * T::kRowsPerPass, cchunk), ok ? b_src + i * pass_stride + k0 : g.w,
                       ok ? 16 : 0);
    }
  };

#pragma unroll
  for (int st = 0; st < S - 1; ++st) {
    if (st < KB) load_stage(st, st);
    cp_async_commit();
  }

  // Fragment rows and columns of this lane. A (ldmatrix x4): rows lane % 16 of an m16
  // fragment, chunk 2 kk + lane / 16 of the k32 step kk. B (x4 over two n8 fragments): rows
  // (lane / 16) * 8 + lane % 8, chunk 2 kk + (lane / 8) % 2. Every such row is lane % 8 modulo 8,
  // so the swizzle XORs the chunk with lane % 8.
  const int a_row = wm * T::kWarpM + (lane & 15), a_hi = lane >> 4;
  const int b_row = wn * T::kWarpN + ((lane >> 4) << 3) + (lane & 7), b_hi = (lane >> 3) & 1;
  // Accumulator q of fragment (mt, nt): row 16 mt + lane / 4 + 8 (q / 2) of the warp's rows,
  // column 8 nt + 2 (lane % 4) + q % 2 of its columns.
  const int row0 = m0 + wm * T::kWarpM + (lane >> 2);
  const float* const ws_row = g.ws + static_cast<int64_t>(n0 / 128) * KB;

  float acc[MT][NT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[mt][nt][q] = 0.0f;

  int stage = 0;
  for (int kb = 0; kb < KB; ++kb) {
    cp_async_wait<S - 2>();  // this thread's copies of step kb
    __syncthreads();         // everyone's; every warp done with step kb - 1, whose stage is refilled now
    {
      const int next = kb + S - 1, nstage = stage == 0 ? S - 1 : stage - 1;
      if (next < KB) load_stage(nstage, next);
      cp_async_commit();
    }
    // The step's scales, used after its MMAs (rows past M: 0, their products are 0 too).
    float sx[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = row0 + 16 * mt + 8 * h;
        sx[mt][h] = row < M ? __ldg(g.xs + static_cast<int64_t>(kb) * M + row) : 0.0f;
      }
    const float sw = __ldg(ws_row + kb);

    const uint8_t* sa = smem + stage * T::kStageBytes;
    const uint8_t* sb = sa + T::BM * kBK;
    float part[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int q = 0; q < 4; ++q) part[mt][nt][q] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kBK / 32; ++kk) {
      uint32_t af[MT][4], bf[NT][2];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) ldmatrix_x4(af[mt], sa + swz(a_row + 16 * mt, 2 * kk + a_hi));
#pragma unroll
      for (int nj = 0; nj < NT / 2; ++nj) {
        uint32_t r[4];
        ldmatrix_x4(r, sb + swz(b_row + 16 * nj, 2 * kk + b_hi));
        bf[2 * nj][0] = r[0];
        bf[2 * nj][1] = r[1];
        bf[2 * nj + 1][0] = r[2];
        bf[2 * nj + 1][1] = r[3];
      }
      mma_k32<MT, NT>(part, af, bf);
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float s = sx[mt][h] * sw;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          acc[mt][nt][2 * h] = fmaf(part[mt][nt][2 * h], s, acc[mt][nt][2 * h]);
          acc[mt][nt][2 * h + 1] = fmaf(part[mt][nt][2 * h + 1], s, acc[mt][nt][2 * h + 1]);
        }
      }
    stage = stage + 1 == S ? 0 : stage + 1;
  }
  cp_async_wait<0>();

  OutT* const out = static_cast<OutT*>(g.out);
  const int col0 = n0 + wn * T::kWarpN + 2 * (lane & 3);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row0 + 16 * mt + 8 * h;
      if (row >= M) continue;
      OutT* const orow = out + static_cast<int64_t>(row) * N;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int col = col0 + 8 * nt;
        if (col >= N) continue;
        const float v0 = acc[mt][nt][2 * h], v1 = acc[mt][nt][2 * h + 1];
        if (g.pairs) {
          store2(orow + col, v0, v1);
        } else {
          store1(orow + col, v0);
          if (col + 1 < N) store1(orow + col + 1, v1);
        }
      }
    }
#else
  __trap();  // never launched: the backend takes this kernel only where CudaArch::fp8_mma holds (8.9 and above)
#endif
}

template <class T, typename OutT>
void launch_tile(Args g, cudaStream_t s) {
  auto kernel = fp8_block_mma_gemm_kernel<T, OutT>;
  // More than 48 KiB of dynamic shared memory needs an opt-in, once per device and kernel.
  static std::atomic<uint64_t> configured{0};
  int dev = 0;
  TCUDA_CHECK(cudaGetDevice(&dev));
  const uint64_t bit = uint64_t{1} << (dev & 63);
  if (!(configured.load(std::memory_order_acquire) & bit)) {
    TCUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(T::kSmem)));
    configured.fetch_or(bit, std::memory_order_acq_rel);
  }
  g.tiles_m = ceil_div(g.M, T::BM);
  g.tiles_n = ceil_div(g.N, T::BN);
  const int64_t blocks = int64_t{g.tiles_m} * g.tiles_n;
  kernel<<<static_cast<unsigned>(blocks), T::kThreads, T::kSmem, s>>>(g);
  TCUDA_LAUNCH_CHECK();
}

template <class T>
bool launch_for(const Args& g, DType out_t, size_t max_smem, cudaStream_t s) {
  if (T::kSmem > max_smem) return false;
  if (int64_t{ceil_div(g.M, T::BM)} * ceil_div(g.N, T::BN) >= (int64_t{1} << 31)) return false;
  if (out_t == DType::kF32)
    launch_tile<T, float>(g, s);
  else
    launch_tile<T, __nv_bfloat16>(g, s);
  return true;
}

}  // namespace

bool launch_fp8_block_mma_gemm(const void* xq, const float* x_scale, const void* w, const float* w_scale, void* out,
                               DType out_t, int64_t M, int64_t N, int64_t K, size_t max_smem, int num_sms,
                               cudaStream_t s) {
  if (M < 0 || N < 0 || K < kBK || K % kBK != 0) return false;
  if (M >= (int64_t{1} << 31) || N >= (int64_t{1} << 31) || K >= (int64_t{1} << 31)) return false;
  if (out_t != DType::kF32 && out_t != DType::kBF16) return false;
  if ((reinterpret_cast<uintptr_t>(xq) | reinterpret_cast<uintptr_t>(w)) % 16 != 0 ||
      (reinterpret_cast<uintptr_t>(x_scale) | reinterpret_cast<uintptr_t>(w_scale)) % 4 != 0)
    return false;
  if (M == 0 || N == 0) return true;
  Args g{};
  g.xq = static_cast<const uint8_t*>(xq);
  g.xs = x_scale;
  g.w = static_cast<const uint8_t*>(w);
  g.ws = w_scale;
  g.out = out;
  g.M = static_cast<int>(M);
  g.N = static_cast<int>(N);
  g.K = static_cast<int>(K);
  const size_t pair_bytes = out_t == DType::kF32 ? 8 : 4;
  g.pairs = N % 2 == 0 && reinterpret_cast<uintptr_t>(out) % pair_bytes == 0;
  // The large tile where it alone fills the multiprocessors, else the medium one where it fills
  // half of them at least; else (and always at M <= 32) the small one, whose many blocks keep
  // more weight reads in flight where those bound the time.
  auto tiles = [&](int bm, int bn) { return int64_t{ceil_div(M, bm)} * ceil_div(N, bn); };
  if (M > SmallTile::BM) {
    if (tiles(LargeTile::BM, LargeTile::BN) >= num_sms) return launch_for<LargeTile>(g, out_t, max_smem, s);
    if (2 * tiles(MediumTile::BM, MediumTile::BN) >= num_sms) return launch_for<MediumTile>(g, out_t, max_smem, s);
  }
  return launch_for<SmallTile>(g, out_t, max_smem, s);
}

}  // namespace tessera::cuda
