// bf16 GEMM through cuBLASLt: out[M,N] = x[M,K] @ w[N,K]^T with f32 accumulation.
// Row-major x and w are column-major x^T [K,M] and w^T [K,N], so cuBLASLt computes
// D[N,M] = op(w^T)=T applied to A, times B = x^T; D is out^T in column-major, i.e.
// out row-major. The descriptors and the algorithm are cached per shape. The
// algorithm is cuBLASLt's first heuristic choice. Timing its top 16 candidates per shape
// (measured on H200, 2026-11-29, Qwen3-8B shapes) gained 2-6% at M >= 2048 but lost 3-8% at
// decode shapes and cost ~100 ms of first use per large shape, so it was removed.

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>

#include "backend/cuda/cuda_ops.h"
#include "core/error.h"

namespace tessera::cuda {

namespace {
constexpr size_t kWorkspaceBytes = size_t{64} << 20;

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

// The descriptor and layouts of out[M,N] = x[M,K] @ w[N,K]^T (the header's layout note) with
// inputs of type `in` and output `out_t`.
Plan make_plan(cudaDataType_t in, DType out_t, int64_t M, int64_t N, int64_t K) {
  Plan p;
  cudaDataType_t dt = out_t == DType::kF32 ? CUDA_R_32F : CUDA_R_16BF;
  TCUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  TCUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  TCUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  TCUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, in, K, N, K));  // w^T stored [K,N]
  TCUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, in, K, M, K));  // x^T stored [K,M]
  TCUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.d, dt, N, M, N));  // out^T [N,M]
  return p;
}

void destroy(Plan& p) {
  cublasLtMatrixLayoutDestroy(p.a);
  cublasLtMatrixLayoutDestroy(p.b);
  cublasLtMatrixLayoutDestroy(p.d);
  cublasLtMatmulDescDestroy(p.desc);
}

// cuBLASLt's first `max` algorithms for `p` within the workspace; their number in *n.
cublasStatus_t heuristic(cublasLtHandle_t handle, const Plan& p, int max, cublasLtMatmulHeuristicResult_t* res,
                         int* n) {
  cublasLtMatmulPreference_t pref;
  TCUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  size_t ws = kWorkspaceBytes;
  TCUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle, p.desc, p.a, p.b, p.d, p.d, pref, max, res, n);
  cublasLtMatmulPreferenceDestroy(pref);
  return st;
}
}  // namespace

struct Gemm::Impl {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::map<std::tuple<int64_t, int64_t, int64_t, int>, Plan> plans;
  // FP8 plans by (M, N, K, out dtype, scale kind); a plan without an algorithm (ok == false)
  // remembers that cuBLASLt has none for the shape.
  struct Fp8Plan {
    Plan p;
    bool ok = false;
  };
  std::map<std::tuple<int64_t, int64_t, int64_t, int, int>, Fp8Plan> fp8_plans;

  // block: A (the weight) BLK128x128_32F and B (the activations) VEC128_32F scales; else
  // per-tensor scalars. The scale pointers are set per call (they change with the weight).
  Fp8Plan& fp8_plan(int64_t M, int64_t N, int64_t K, DType out_t, bool block) {
    auto key = std::make_tuple(M, N, K, static_cast<int>(out_t), block ? 1 : 0);
    auto it = fp8_plans.find(key);
    if (it != fp8_plans.end()) return it->second;
    Fp8Plan f;
    f.p = make_plan(CUDA_R_8F_E4M3, out_t, M, N, K);
    Plan& p = f.p;
    if (block) {
      int32_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
      TCUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode, sizeof(a_mode)));
      TCUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode, sizeof(b_mode)));
    }
    // The heuristic needs scale pointers present to pick a scaled kernel; any device pointer serves.
    const void* dummy = workspace;
    TCUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &dummy, sizeof(dummy)));
    TCUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &dummy, sizeof(dummy)));
    cublasLtMatmulHeuristicResult_t res[1];
    int n = 0;
    f.ok = heuristic(handle, p, 1, res, &n) == CUBLAS_STATUS_SUCCESS && n > 0;
    if (f.ok) p.algo = res[0].algo;
    return fp8_plans.emplace(key, f).first->second;
  }

  bool run_fp8(bool block, const void* xq, const float* x_scale, const void* w, const float* w_scale, void* out,
               DType out_t, int64_t M, int64_t N, int64_t K, cudaStream_t s) {
    Fp8Plan& f = fp8_plan(M, N, K, out_t, block);
    if (!f.ok) return false;
    Plan& p = f.p;
    TCUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_scale, sizeof(w_scale)));
    TCUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x_scale, sizeof(x_scale)));
    float alpha = 1.0f, beta = 0.0f;
    return cublasLtMatmul(handle, p.desc, &alpha, w, p.a, xq, p.b, &beta, out, p.d, out, p.d, &p.algo, workspace,
                          kWorkspaceBytes, s) == CUBLAS_STATUS_SUCCESS;
  }
  std::mutex mu;

  // cuBLASLt's first heuristic choice (timing its top candidates gained nothing measurable:
  // docs/performance.md).
  Plan& plan(int64_t M, int64_t N, int64_t K, DType out_t) {
    auto key = std::make_tuple(M, N, K, static_cast<int>(out_t));
    auto it = plans.find(key);
    if (it != plans.end()) return it->second;
    Plan p = make_plan(CUDA_R_16BF, out_t, M, N, K);
    cublasLtMatmulHeuristicResult_t res[1];
    int n = 0;
    cublasStatus_t st = heuristic(handle, p, 1, res, &n);
    if (st != CUBLAS_STATUS_SUCCESS || n == 0)
      fail(ErrorKind::kUnsupported,
           "cuBLASLt has no bf16 GEMM for x[{},{}] @ w[{},{}]^T (status {}); dimensions that are multiples of 8 are "
           "needed for tensor cores",
           M, K, N, K, static_cast<int>(st));
    p.algo = res[0].algo;
    return plans.emplace(key, p).first->second;
  }
};

Gemm::Gemm(int device) : impl_(new Impl) {
  TCUBLAS_CHECK(cublasLtCreate(&impl_->handle));
  TCUDA_CHECK(cudaMalloc(&impl_->workspace, kWorkspaceBytes));
}

Gemm::~Gemm() {
  for (auto& [k, f] : impl_->fp8_plans) destroy(f.p);
  for (auto& [k, p] : impl_->plans) destroy(p);
  cudaFree(impl_->workspace);
  cublasLtDestroy(impl_->handle);
  delete impl_;
}

void Gemm::run(const void* x, const void* w, void* out, DType out_t, int64_t M, int64_t N, int64_t K, cudaStream_t s) {
  if (M == 0 || N == 0) return;
  std::lock_guard<std::mutex> lock(impl_->mu);
  Plan& p = impl_->plan(M, N, K, out_t);
  float alpha = 1.0f, beta = 0.0f;
  TCUBLAS_CHECK(cublasLtMatmul(impl_->handle, p.desc, &alpha, w, p.a, x, p.b, &beta, out, p.d, out, p.d, &p.algo,
                               impl_->workspace, kWorkspaceBytes, s));
}

bool Gemm::run_fp8_block(const void* xq, const float* x_scale, const void* w, const float* w_scale, void* out,
                         DType out_t, int64_t M, int64_t N, int64_t K, cudaStream_t s) {
  if (M == 0 || N == 0) return true;
  if (K % 128 != 0 || (K / 128) % 4 != 0) return false;
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->run_fp8(true, xq, x_scale, w, w_scale, out, out_t, M, N, K, s);
}

bool Gemm::run_fp8_tensor(const void* xq, const float* x_scale, const void* w, const float* w_scale, void* out,
                          DType out_t, int64_t M, int64_t N, int64_t K, cudaStream_t s) {
  if (M == 0 || N == 0) return true;
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->run_fp8(false, xq, x_scale, w, w_scale, out, out_t, M, N, K, s);
}

}  // namespace tessera::cuda
