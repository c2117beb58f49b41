// ElementwiseOps (elementwise_ops.h).
#include "backend/cuda/elementwise_ops.h"

#include <string>

#include "backend/cuda/cuda_ops.h"

namespace tessera::cuda {

void ElementwiseOps::fill_random(const Tensor& dst, uint64_t seed, float low, float high) {
  dev_.need_float(dst, "fill_random");
  dev_.bind();
  launch_fill_random(dst.raw(), dst.dtype(), dst.numel(), seed, low, high, dev_.stream());
}
void ElementwiseOps::fill(const Tensor& dst, float value) {
  dev_.need_cuda(dst, "fill");
  dev_.bind();
  if (dst.dtype() == DType::kI32 || dst.dtype() == DType::kU8 || dst.dtype() == DType::kI64) {
    CUDA_REQUIRE(value == 0.0f, "fill", "integer tensors can only be filled with 0");
    TCUDA_CHECK(cudaMemsetAsync(dst.raw(), 0, dst.nbytes(), dev_.stream()));
    return;
  }
  launch_fill(dst.raw(), dst.dtype(), dst.numel(), value, dev_.stream());
}
void ElementwiseOps::embedding(const Tensor& ids, const Tensor& table, const Tensor& out) {
  CUDA_REQUIRE(ids.dtype() == DType::kI32, "embedding", "ids must be i32, got " + ids.str());
  CUDA_REQUIRE(table.ndim() == 2 && table.dtype() == out.dtype() && out.numel() == ids.numel() * table.dim(1),
               "embedding", table.str() + "[" + ids.str() + "] -> " + out.str());
  dev_.need_cuda(ids, "embedding");
  dev_.need_cuda(table, "embedding");
  dev_.bind();
  launch_gather_rows(table.raw(), ids.data<int32_t>(), out.raw(), ids.numel(), table.nbytes() / table.dim(0),
                     table.dim(0), kErrTokenId, dev_.error_flag(), dev_.stream());
}
void ElementwiseOps::rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& out) {
  int64_t D = w.numel();
  CUDA_REQUIRE(D > 0 && x.numel() % D == 0 && x.numel() == out.numel() && x.dtype() == out.dtype() && act(x) && act(w),
               "rms_norm", x.str() + " * " + w.str() + " -> " + out.str());
  dev_.bind();
  launch_rms_norm(x.raw(), x.dtype(), w.raw(), w.dtype(), out.raw(), x.numel() / D, D, eps, dev_.stream());
}
void ElementwiseOps::add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& w, float eps) {
  int64_t D = w.numel();
  CUDA_REQUIRE(
      D > 0 && x.numel() % D == 0 && x.numel() == residual.numel() && x.dtype() == residual.dtype() && act(x) && act(w),
      "add_rms_norm", x.str() + " + " + residual.str() + " * " + w.str());
  dev_.bind();
  launch_add_rms_norm(x.raw(), residual.raw(), x.dtype(), w.raw(), w.dtype(), x.numel() / D, D, eps, dev_.stream());
}
void ElementwiseOps::silu_mul(const Tensor& gate_up, const Tensor& out) {
  int64_t I = out.dim(-1), T = I ? out.numel() / I : 0;
  CUDA_REQUIRE(gate_up.numel() == 2 * T * I && gate_up.dtype() == out.dtype() && act(out), "silu_mul",
               gate_up.str() + " -> " + out.str());
  dev_.bind();
  launch_silu_mul(gate_up.raw(), out.raw(), out.dtype(), T, I, dev_.stream());
}
void ElementwiseOps::add(const Tensor& a, const Tensor& b, const Tensor& out) {
  CUDA_REQUIRE(a.numel() == out.numel() && b.numel() == out.numel() && a.dtype() == out.dtype() &&
                   b.dtype() == out.dtype() && act(out),
               "add", a.str() + " + " + b.str() + " -> " + out.str());
  dev_.bind();
  launch_add(a.raw(), b.raw(), out.raw(), out.dtype(), out.numel(), dev_.stream());
}
void ElementwiseOps::gather_rows(const Tensor& x, const Tensor& indices, const Tensor& out) {
  CUDA_REQUIRE(indices.dtype() == DType::kI32 && x.ndim() >= 1 && x.dim(0) > 0 && x.dtype() == out.dtype() &&
                   out.nbytes() == static_cast<size_t>(indices.numel()) * (x.nbytes() / x.dim(0)),
               "gather_rows", x.str() + "[" + indices.str() + "] -> " + out.str());
  dev_.need_cuda(x, "gather_rows");
  dev_.bind();
  launch_gather_rows(x.raw(), indices.data<int32_t>(), out.raw(), indices.numel(), x.nbytes() / x.dim(0), x.dim(0),
                     kErrGatherIndex, dev_.error_flag(), dev_.stream());
}
void ElementwiseOps::embedding_slice(const Tensor& ids, const Tensor& table, int64_t begin, const Tensor& out) {
  CUDA_REQUIRE(ids.dtype() == DType::kI32, "embedding_slice", "ids must be i32, got " + ids.str());
  CUDA_REQUIRE(table.ndim() == 2 && table.dtype() == out.dtype() && out.numel() == ids.numel() * table.dim(1),
               "embedding_slice", table.str() + "[" + ids.str() + "] -> " + out.str());
  dev_.need_cuda(ids, "embedding_slice");
  dev_.need_cuda(table, "embedding_slice");
  dev_.bind();
  launch_gather_rows(table.raw(), ids.data<int32_t>(), out.raw(), ids.numel(), table.nbytes() / table.dim(0),
                     table.dim(0), kErrTokenId, dev_.error_flag(), dev_.stream(), begin, /*zero_outside=*/true);
}
void ElementwiseOps::cast(const Tensor& src, const Tensor& dst) {
  CUDA_REQUIRE(src.numel() == dst.numel() && is_float_dtype(src.dtype()) && is_float_dtype(dst.dtype()), "cast",
               src.str() + " -> " + dst.str());
  dev_.need_cuda(src, "cast");
  dev_.need_cuda(dst, "cast");
  dev_.bind();
  if (src.dtype() == dst.dtype()) {
    dev_.copy(dst, src);
    return;
  }
  launch_cast(src.raw(), src.dtype(), dst.raw(), dst.dtype(), src.numel(), dev_.stream());
}

void ElementwiseOps::sigmoid_mul(const Tensor& x, const Tensor& gate, const Tensor& out) {
  const int64_t n = x.numel(), row = x.ndim() >= 1 ? x.dim(-1) : 1, T = row > 0 ? n / row : 0;
  CUDA_REQUIRE(out.numel() == n && x.dtype() == out.dtype() && gate.dtype() == x.dtype() && act(x) &&
                   (gate.numel() == n || gate.numel() == T),
               "sigmoid_mul",
               "x " + x.str() + ", gate " + gate.str() + " (x's shape or one per row), out " + out.str());
  dev_.need_cuda(x, "sigmoid_mul");
  dev_.need_cuda(gate, "sigmoid_mul");
  dev_.need_cuda(out, "sigmoid_mul");
  dev_.bind();
  launch_sigmoid_mul(x.raw(), gate.raw(), out.raw(), x.dtype(), n, gate.numel() == n ? 1 : row, dev_.stream());
}

}  // namespace tessera::cuda
