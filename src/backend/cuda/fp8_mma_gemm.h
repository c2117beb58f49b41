// Block-scaled FP8 (W8A8) GEMM on mma.sync e4m3 tensor cores (fp8_mma_gemm.cu): the W8A8
// linear for GPUs where cuBLASLt has no 128 x 128 block-scaled FP8 GEMM and there is no wgmma
// (Blackwell desktop parts, sm_120 / sm_121). Any GPU of compute capability 8.9 or newer runs it.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace tessera::cuda {

// out[M, N] (bf16 or f32, row-major) = sum over the 128-column blocks kb of K of
//   (xq[m, kb] . w[n, kb]) * x_scale[kb][m] * w_scale[n / 128][kb],
// each block's dot product summed in f32 on the tensor cores, then scaled and added in f32.
//   xq: e4m3 [M, K] row-major; x_scale: f32 [K / 128][M] (launch_quantize_act_fp8's layout);
//   w: e4m3 [N, K] row-major; w_scale: f32 [ceil(N / 128)][K / 128] (Tensor::block_scale).
// Takes any M and N below 2^31, K a positive multiple of 128 below 2^31, bf16 or f32 out, xq
// and w 16-byte aligned, x_scale and w_scale 4-byte aligned (out: any alignment of its type).
// max_smem: the dynamic shared memory a block may opt into on the current device
// (cudaDevAttrMaxSharedMemoryPerBlockOptin, bytes); num_sms: its multiprocessors, from which and
// M and N the tile size is chosen (every tile sums in the same order: the same result whatever
// the value). Queues the work on s and returns true (M or N of 0: nothing to queue); returns
// false, queuing nothing, for other shapes, dtypes and alignments, and where the chosen tile needs
// more shared memory than max_smem (at most 96 KiB). The device must have FP8 mma.sync (compute
// capability 8.9 and above: CudaArch::fp8_mma); the caller checks.
bool launch_fp8_block_mma_gemm(const void* xq, const float* x_scale, const void* w, const float* w_scale, void* out,
                               DType out_t, int64_t M, int64_t N, int64_t K, size_t max_smem, int num_sms,
                               cudaStream_t s);

}  // namespace tessera::cuda
