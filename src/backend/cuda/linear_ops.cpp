// LinearOps (linear_ops.h).
#include "backend/cuda/linear_ops.h"

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/fp8_mma_gemm.h"

namespace tessera::cuda {

LinearOps::LinearOps(CudaDevice& dev, const CudaOptions& options)
    : dev_(dev), options_(options), gemm_(std::make_unique<Gemm>(dev.index())) {}

LinearOps::~LinearOps() = default;

void LinearOps::linear(const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& out) {
  CUDA_REQUIRE(w.ndim() == 2, "linear", "weight must be 2-D, got " + w.str());
  const int64_t N = w.dim(0), K = w.dim(1), M = K ? x.numel() / K : 0;
  if (!w.format().supported()) fail_unsupported_format("CUDA linear", w.str(), w.format());
  const bool fp8 = w.format().kind == WeightFormatKind::kFp8Block;
  if (fp8) {
    CUDA_REQUIRE(x.dtype() == DType::kBF16 && x.numel() == M * K && out.numel() == M * N &&
                     (out.dtype() == DType::kBF16 || out.dtype() == DType::kF32),
                 "linear", x.str() + " @ " + w.str() + "^T -> " + out.str());
  } else {
    CUDA_REQUIRE(x.dtype() == DType::kBF16 && w.dtype() == DType::kBF16, "linear",
                 "expects bf16 x and w, got " + x.str() + " @ " + w.str() + " (cast the weights to bf16 when loading)");
    CUDA_REQUIRE(out.dtype() == DType::kBF16 || out.dtype() == DType::kF32, "linear", "out must be bf16 or f32");
    CUDA_REQUIRE(x.numel() == M * K && out.numel() == M * N, "linear",
                 x.str() + " @ " + w.str() + "^T -> " + out.str());
  }
  dev_.need_cuda(x, "linear");
  dev_.need_cuda(w, "linear");
  dev_.need_cuda(out, "linear");
  dev_.bind();
  if (fp8) {
    linear_fp8(x, w, out, M, N, K);
  } else if (!(M <= kMaxGemvRows &&
               launch_gemv(x.raw(), w.raw(), out.raw(), out.dtype(), M, N, K, dev_.arch().sms, dev_.stream()))) {
    gemm_->run(x.raw(), w.raw(), out.raw(), out.dtype(), M, N, K, dev_.stream());
  }
  if (bias) {
    CUDA_REQUIRE(bias->numel() == N && act(*bias), "linear", "bias must have N elements, got " + bias->str());
    launch_add_bias(out.raw(), out.dtype(), bias->raw(), bias->dtype(), M, N, dev_.stream());
  }
}

// FP8 block-scaled weights (Tensor::block_scale). bf16 activations (W8A16): the FP8 GEMV for
// M <= 16; the small-M kernel up to 64 rows for weights of at most
// CudaOptions::fp8_small_max_weights (faster there than quantising the activations) and for any
// weight below CudaOptions::fp8_w8a8_min_rows; the W8A16 tensor-core GEMM for larger M below
// that. From fp8_w8a8_min_rows the activations are quantised per token and 128 columns and a
// block-scaled FP8 GEMM runs (fp8_w8a8); where none takes the shape, the weight is dequantised
// to bf16 in scratch and the bf16 GEMM runs. CudaOptions::fp8_gemm_dequant forces that fallback
// above the GEMV.
void LinearOps::linear_fp8(const Tensor& x, const Tensor& w, const Tensor& out, int64_t M, int64_t N, int64_t K) {
  const Tensor& sc = *w.block_scale();
  CUDA_REQUIRE(w.dtype() == DType::kF8E4M3 && sc.dtype() == DType::kF32 && act(sc), "linear",
               "FP8 weights must be e4m3 with f32 block scales, got " + w.str() + " scales " + sc.str());
  const auto* wscale = sc.data<float>();
  cudaStream_t s = dev_.stream();
  if (M <= kMaxFp8GemvRows && launch_fp8_gemv(x.raw(), w.raw(), wscale, out.raw(), out.dtype(), M, N, K, s)) return;
  if (!options_.fp8_gemm_dequant && M <= kMaxFp8SmallRows &&
      (M < options_.fp8_w8a8_min_rows || N * K <= options_.fp8_small_max_weights)) {
    const int splits = fp8_w16_small_splits(N, K);
    const size_t mark = dev_.scratch_mark();
    Tensor part = dev_.scratch({splits, M, N}, DType::kF32);
    const bool done =
        launch_fp8_w16_small(x.raw(), w.raw(), wscale, out.raw(), out.dtype(), M, N, K, splits, part.data<float>(), s);
    dev_.scratch_rewind(mark);
    if (done) return;
  }
  if (!options_.fp8_gemm_dequant && M < options_.fp8_w8a8_min_rows) {
    const int splits = fp8_w16_gemm_splits(M, N, K, dev_.arch().sms);
    const size_t mark = dev_.scratch_mark();
    Tensor part = splits > 1 ? dev_.scratch({splits, M, N}, DType::kF32) : Tensor();
    const bool done =
        launch_fp8_w16_gemm(x.raw(), w.raw(), wscale, out.raw(), out.dtype(), M, N, K, splits,
                            splits > 1 ? part.data<float>() : nullptr, s, dev_.arch().smem_per_block_optin);
    dev_.scratch_rewind(mark);
    if (done) return;
  }
  if (!options_.fp8_gemm_dequant && fp8_w8a8(x, wscale, w, out, M, N, K)) return;
  const size_t mark = dev_.scratch_mark();
  Tensor wb = dev_.scratch({N, K}, DType::kBF16);
  launch_dequant_fp8(w.raw(), wscale, wb.raw(), N, K, s);
  gemm_->run(x.raw(), wb.raw(), out.raw(), out.dtype(), M, N, K, s);
  dev_.scratch_rewind(mark);
}

// W8A8: the activations quantised per token and 128 columns, then a block-scaled FP8 GEMM:
// cuBLASLt's where the architecture has it (sm_90), else tessera's mma.sync e4m3 kernel
// (fp8_mma_gemm.h: sm_120, sm_121, and the sm_120 profile on Hopper). Both take the same shapes,
// K a multiple of 512 (cuBLASLt's block-scaled GEMM needs K/128 a multiple of 4), so a model's
// numbers do not depend on which tier runs: e4m3 activations cost ~2-3% per product, and below
// that K the weight is dequantised and the bf16 GEMM runs with the activations as they are. False
// where the shape is not taken (nothing is queued then).
bool LinearOps::fp8_w8a8(const Tensor& x, const float* wscale, const Tensor& w, const Tensor& out, int64_t M, int64_t N,
                         int64_t K) {
  const CudaArch& arch = dev_.arch();
  if (K % 512 != 0 || !(arch.cublaslt_block_fp8 || arch.fp8_mma)) return false;
  const bool cublaslt = arch.cublaslt_block_fp8;
  const size_t mark = dev_.scratch_mark();
  Tensor xq = dev_.scratch({M, K}, DType::kF8E4M3);
  Tensor xs = dev_.scratch({K / 128, M}, DType::kF32);
  cudaStream_t s = dev_.stream();
  launch_quantize_act_fp8(x.raw(), xq.raw(), xs.data<float>(), M, K, s);
  const bool done =
      cublaslt ? gemm_->run_fp8_block(xq.raw(), xs.data<float>(), w.raw(), wscale, out.raw(), out.dtype(), M, N, K, s)
               : launch_fp8_block_mma_gemm(xq.raw(), xs.data<float>(), w.raw(), wscale, out.raw(), out.dtype(), M, N, K,
                                           arch.smem_per_block_optin, arch.sms, s);
  dev_.scratch_rewind(mark);
  return done;
}

}  // namespace tessera::cuda
