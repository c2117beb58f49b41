// bf16 GEMM through cuBLASLt: out[M,N] = x[M,K] @ w[N,K]^T with f32 accumulation.
// Row-major x and w are column-major x^T [K,M] and w^T [K,N], so cuBLASLt computes
// D[N,M] = op(w^T)=T applied to A, times B = x^T; D is out^T in column-major, i.e.
// out row-major. The heuristic's choice and the descriptors are cached per shape.
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
}  // namespace

struct Gemm::Impl {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::map<std::tuple<int64_t, int64_t, int64_t, int>, Plan> plans;
  std::mutex mu;

  Plan& plan(int64_t M, int64_t N, int64_t K, DType out_t) {
    auto key = std::make_tuple(M, N, K, static_cast<int>(out_t));
    auto it = plans.find(key);
    if (it != plans.end()) return it->second;
    Plan p;
    cudaDataType_t dt = out_t == DType::kF32 ? CUDA_R_32F : CUDA_R_16BF;
    TCUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    TCUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    TCUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    TCUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, K, N, K));  // w^T stored [K,N]
    TCUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, K, M, K));  // x^T stored [K,M]
    TCUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.d, dt, N, M, N));           // out^T [N,M]
    cublasLtMatmulPreference_t pref;
    TCUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = kWorkspaceBytes;
    TCUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    cublasLtMatmulHeuristicResult_t res[4];
    int n = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle, p.desc, p.a, p.b, p.d, p.d, pref, 4, res, &n);
    cublasLtMatmulPreferenceDestroy(pref);
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
  for (auto& [k, p] : impl_->plans) {
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.d);
    cublasLtMatmulDescDestroy(p.desc);
  }
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

}  // namespace tessera::cuda
