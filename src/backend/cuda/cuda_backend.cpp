// CudaBackend: the Backend interface on one CUDA device. Host code only; the
// kernels live in the .cu files behind the launchers of cuda_ops.h.
//
// Memory: `alloc` is one cudaMalloc per persistent buffer (weights, KV cache);
// `scratch` bumps through an arena that grows only while it is too small (the
// first, profiling steps) and is merged into one block at reset_scratch, so a
// steady step loop never calls the allocator. Work is queued on one stream;
// host->device copies go through a pinned staging ring (the caller's buffer is
// free again on return, and copies overlap the memcpy into the ring); kernels that
// meet bad input raise a device flag that synchronize() turns into an Error.
#include "backend/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <iterator>
#include <limits>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_ops.h"
#include "core/env.h"
#include "core/error.h"
#include "core/logging.h"

namespace tessera {

namespace cuda {

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line) {
  const char* base = std::strrchr(file, '/');
  base = base ? base + 1 : file;
  if (err == cudaErrorMemoryAllocation)
    fail(ErrorKind::kOutOfMemory,
         "CUDA out of memory ({} at {}:{}); lower --gpu-memory-utilization, --max-model-len or --max-num-seqs, or use "
         "more GPUs (--tensor-parallel-size)",
         what, base, line);
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver)
    fail(ErrorKind::kUnsupported,
         "no usable CUDA device ({}: {}); check nvidia-smi and the driver, or run with --device cpu", what,
         cudaGetErrorString(err));
  fail(ErrorKind::kInternal, "CUDA error {} ({}) in {} at {}:{}; rerun with CUDA_LAUNCH_BLOCKING=1 to locate it",
       cudaGetErrorName(err), cudaGetErrorString(err), what, base, line);
}

[[noreturn]] void throw_cublas_error(cublasStatus_t st, const char* what, const char* file, int line) {
  const char* base = std::strrchr(file, '/');
  base = base ? base + 1 : file;
  if (st == CUBLAS_STATUS_ALLOC_FAILED)
    fail(ErrorKind::kOutOfMemory, "cuBLAS out of memory ({} at {}:{}); lower --gpu-memory-utilization", what, base,
         line);
  fail(ErrorKind::kInternal, "cuBLAS error {} in {} at {}:{}", static_cast<int>(st), what, base, line);
}

}  // namespace cuda

namespace {

using namespace cuda;

// Shape and dtype checks run on every op: the message (which formats tensors) is
// built only when the check fails, so a passing check costs a comparison.
#define CUDA_REQUIRE(cond, op, what)                                             \
  do {                                                                           \
    if (!(cond)) ::tessera::fail(ErrorKind::kInternal, "cuda {}: {}", op, what); \
  } while (0)

constexpr size_t kAlign = 256;
constexpr size_t kUploadRingBytes = size_t{64} << 20;
constexpr size_t kUploadPiece = size_t{16} << 20;
constexpr size_t kDownloadBytes = size_t{16} << 20;

size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

const char* device_error_text(int code) {
  switch (code) {
    case kErrTokenId:
      return "a token id outside the vocabulary reached the embedding";
    case kErrGatherIndex:
      return "gather_rows got an index outside the source rows";
    case kErrRopePosition:
      return "a position beyond the rotary table (raise max_position_embeddings or lower --max-model-len)";
    case kErrKvSlot:
      return "a KV slot outside the cache";
    case kErrMoeGridBarrier:
      return "the fused MoE decode kernel's grid barrier timed out (not all of its blocks became resident); build "
             "the backend with CudaOptions::moe_decode = CudaMoeDecode::kSplit and report the GPU model";
    default:
      return "unknown device error";
  }
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device_index, const CudaOptions& options) : index_(device_index), options_(options) {
    int count = 0;
    TCUDA_CHECK(cudaGetDeviceCount(&count));
    if (device_index < 0 || device_index >= count)
      fail(ErrorKind::kInvalidArgument, "CUDA device {} does not exist: this machine shows {} device(s)", device_index,
           count);
    TCUDA_CHECK(cudaSetDevice(index_));
    TCUDA_CHECK(cudaGetDeviceProperties(&props_, index_));
    if (props_.major < 9)
      fail(ErrorKind::kUnsupported,
           "CUDA device {} ({}) has compute capability {}.{}; this build targets sm_90 (Hopper) and newer", index_,
           props_.name, props_.major, props_.minor);
    TCUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    TCUDA_CHECK(cudaMalloc(&dev_err_, sizeof(int)));
    TCUDA_CHECK(cudaMemsetAsync(dev_err_, 0, sizeof(int), stream_));
    // The fused MoE decode kernel's barrier and counters: zero now, left zero by every launch.
    TCUDA_CHECK(cudaMalloc(&moe_sync_, kMoeSyncInts * sizeof(unsigned)));
    TCUDA_CHECK(cudaMemsetAsync(moe_sync_, 0, kMoeSyncInts * sizeof(unsigned), stream_));
    TCUDA_CHECK(cudaMallocHost(&upload_ring_, kUploadRingBytes));
    TCUDA_CHECK(cudaMallocHost(&download_, kDownloadBytes));
    TCUDA_CHECK(cudaMallocHost(&host_err_, sizeof(int)));
    gemm_ = std::make_unique<Gemm>(index_);
    initial_scratch_ = std::max<size_t>(16, options_.initial_scratch_mib) << 20;
    TCUDA_CHECK(cudaStreamSynchronize(stream_));
    TLOG_INFO("CUDA device {}: {}, {} SMs, {:.1f} GiB, compute capability {}.{}", index_, props_.name,
              props_.multiProcessorCount, props_.totalGlobalMem / 1073741824.0, props_.major, props_.minor);
  }

  ~CudaBackend() override {
    cudaSetDevice(index_);
    cudaStreamSynchronize(stream_);
    for (auto& p : inflight_) cudaEventDestroy(p.event);
    for (auto e : free_events_) cudaEventDestroy(e);
    chunks_.clear();
    gemm_.reset();
    cudaFree(dev_err_);
    cudaFree(moe_sync_);
    cudaFreeHost(upload_ring_);
    cudaFreeHost(download_);
    cudaFreeHost(host_err_);
    cudaStreamDestroy(stream_);
  }

  Device device() const override { return {DeviceType::kCUDA, index_}; }
  std::string name() const override { return std::string("cuda:") + std::to_string(index_) + " (" + props_.name + ")"; }
  DType compute_dtype() const override { return DType::kBF16; }
  cudaStream_t stream() const { return stream_; }

  // ---------------------------------------------------------------- memory
  Tensor alloc(Shape shape, DType dtype) override {
    bind();
    size_t bytes = std::max<size_t>(align_up(static_cast<size_t>(shape.numel()) * dtype_size(dtype)), kAlign);
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, bytes);
    if (err != cudaSuccess) {
      cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      fail(ErrorKind::kOutOfMemory,
           "CUDA out of memory allocating {} {} ({:.2f} GiB; {:.2f} GiB free of {:.2f} GiB on device {}); lower "
           "--gpu-memory-utilization or --max-model-len, or use more GPUs",
           dtype_name(dtype), shape.str(), bytes / 1073741824.0, free_b / 1073741824.0, total_b / 1073741824.0, index_);
    }
    int dev = index_;
    auto storage = std::make_shared<Storage>(p, bytes, device(), [dev](void* q) {
      cudaSetDevice(dev);
      cudaFree(q);
    });
    return Tensor(storage, 0, shape, dtype);
  }

  Tensor scratch(Shape shape, DType dtype) override {
    size_t bytes = align_up(static_cast<size_t>(shape.numel()) * dtype_size(dtype));
    if (chunks_.empty() || used_ + bytes > chunks_.back().nbytes()) {
      size_t want = std::max({bytes, high_water_, initial_scratch_});
      if (!chunks_.empty())
        TLOG_DEBUG("CUDA scratch arena grows by {:.1f} MiB (in use {:.1f} MiB)", want / 1048576.0, in_use_ / 1048576.0);
      chunks_.push_back(alloc({static_cast<int64_t>(want)}, DType::kU8));
      used_ = 0;
    }
    Tensor& c = chunks_.back();
    Tensor t(c.storage(), used_, shape, dtype);
    used_ += bytes;
    in_use_ += bytes;
    high_water_ = std::max(high_water_, in_use_);
    return t;
  }

  void reset_scratch() override {
    // Merge into one chunk that holds the step's peak. Also when the last step grew the
    // arena only inside a scratch_mark/scratch_rewind span (a layer): the rewind dropped the
    // extra chunk, and without this every layer of every step would cudaMalloc and cudaFree
    // it again (cudaFree synchronizes the device: ~0.5 ms idle per layer in a long prefill).
    if (chunks_.size() > 1 || (!chunks_.empty() && chunks_.back().nbytes() < high_water_)) {
      // Tensors handed out earlier keep their chunk alive through the shared storage.
      chunks_.clear();
      chunks_.push_back(alloc({static_cast<int64_t>(high_water_)}, DType::kU8));
    }
    used_ = 0;
    in_use_ = 0;
    marks_.clear();
  }

  // A mark is (chunk count, bytes used in the last chunk, bytes in use overall).
  size_t scratch_mark() override {
    marks_.push_back({chunks_.size(), used_, in_use_});
    return marks_.size() - 1;
  }

  void scratch_rewind(size_t mark) override {
    TESSERA_CHECK(mark < marks_.size(), "scratch_rewind to an unknown mark");
    Mark m = marks_[mark];
    marks_.resize(mark);
    if (m.chunks == 0) {
      used_ = 0;
    } else {
      chunks_.resize(m.chunks);  // newer chunks live on while tensors reference them
      used_ = m.used;
    }
    in_use_ = m.in_use;
  }

  size_t free_memory() const override {
    bind();
    size_t f = 0, t = 0;
    TCUDA_CHECK(cudaMemGetInfo(&f, &t));
    return f;
  }
  size_t total_memory() const override {
    bind();
    size_t f = 0, t = 0;
    TCUDA_CHECK(cudaMemGetInfo(&f, &t));
    return t;
  }

  // ---------------------------------------------------------------- transfers
  void copy_from_host(const Tensor& dst, const void* src) override {
    need_cuda(dst, "copy_from_host");
    TESSERA_CHECK(!capturing_, "copy_from_host while capturing a graph (its source would be replayed stale)");
    bind();
    size_t n = dst.nbytes();
    const char* s = static_cast<const char*>(src);
    char* d = static_cast<char*>(dst.raw());
    for (size_t off = 0; off < n; off += kUploadPiece) {
      size_t len = std::min(kUploadPiece, n - off);
      char* stage = stage_region(len);
      std::memcpy(stage, s + off, len);
      TCUDA_CHECK(cudaMemcpyAsync(d + off, stage, len, cudaMemcpyHostToDevice, stream_));
      record_inflight(stage - upload_ring_, len);
    }
  }

  void copy_to_host(void* dst, const Tensor& src) override {
    need_cuda(src, "copy_to_host");
    bind();
    size_t n = src.nbytes();
    const char* s = static_cast<const char*>(src.raw());
    for (size_t off = 0; off < n; off += kDownloadBytes) {
      size_t len = std::min(kDownloadBytes, n - off);
      TCUDA_CHECK(cudaMemcpyAsync(download_, s + off, len, cudaMemcpyDeviceToHost, stream_));
      TCUDA_CHECK(cudaStreamSynchronize(stream_));
      std::memcpy(static_cast<char*>(dst) + off, download_, len);
    }
    check_device_errors();
  }

  void copy(const Tensor& dst, const Tensor& src) override {
    CUDA_REQUIRE(dst.nbytes() == src.nbytes(), "copy", dst.str() + " <- " + src.str());
    need_cuda(dst, "copy");
    need_cuda(src, "copy");
    bind();
    if (dst.nbytes() == 0 || dst.raw() == src.raw()) return;
    TCUDA_CHECK(cudaMemcpyAsync(dst.raw(), src.raw(), src.nbytes(), cudaMemcpyDeviceToDevice, stream_));
  }

  void fill_random(const Tensor& dst, uint64_t seed, float low, float high) override {
    need_float(dst, "fill_random");
    bind();
    launch_fill_random(dst.raw(), dst.dtype(), dst.numel(), seed, low, high, stream_);
  }

  void fill(const Tensor& dst, float value) override {
    need_cuda(dst, "fill");
    bind();
    if (dst.dtype() == DType::kI32 || dst.dtype() == DType::kU8 || dst.dtype() == DType::kI64) {
      CUDA_REQUIRE(value == 0.0f, "fill", "integer tensors can only be filled with 0");
      TCUDA_CHECK(cudaMemsetAsync(dst.raw(), 0, dst.nbytes(), stream_));
      return;
    }
    launch_fill(dst.raw(), dst.dtype(), dst.numel(), value, stream_);
  }

  void synchronize() override {
    bind();
    TESSERA_CHECK(!capturing_, "synchronize while capturing a graph");
    TCUDA_CHECK(cudaStreamSynchronize(stream_));
    check_device_errors();
  }

  // ---------------------------------------------------------------- ops
  void embedding(const Tensor& ids, const Tensor& table, const Tensor& out) override {
    CUDA_REQUIRE(ids.dtype() == DType::kI32, "embedding", "ids must be i32, got " + ids.str());
    CUDA_REQUIRE(table.ndim() == 2 && table.dtype() == out.dtype() && out.numel() == ids.numel() * table.dim(1),
                 "embedding", table.str() + "[" + ids.str() + "] -> " + out.str());
    need_cuda(ids, "embedding");
    need_cuda(table, "embedding");
    bind();
    launch_gather_rows(table.raw(), ids.data<int32_t>(), out.raw(), ids.numel(), table.nbytes() / table.dim(0),
                       table.dim(0), kErrTokenId, dev_err_, stream_);
  }

  void rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& out) override {
    int64_t D = w.numel();
    CUDA_REQUIRE(
        D > 0 && x.numel() % D == 0 && x.numel() == out.numel() && x.dtype() == out.dtype() && act(x) && act(w),
        "rms_norm", x.str() + " * " + w.str() + " -> " + out.str());
    bind();
    launch_rms_norm(x.raw(), x.dtype(), w.raw(), w.dtype(), out.raw(), x.numel() / D, D, eps, stream_);
  }

  void add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& w, float eps) override {
    int64_t D = w.numel();
    CUDA_REQUIRE(D > 0 && x.numel() % D == 0 && x.numel() == residual.numel() && x.dtype() == residual.dtype() &&
                     act(x) && act(w),
                 "add_rms_norm", x.str() + " + " + residual.str() + " * " + w.str());
    bind();
    launch_add_rms_norm(x.raw(), residual.raw(), x.dtype(), w.raw(), w.dtype(), x.numel() / D, D, eps, stream_);
  }

  // FP8 block-scaled weights (Tensor::block_scale). bf16 activations (W8A16): the FP8 GEMV for
  // M <= 16; the small-M kernel up to 64 rows for weights of at most
  // CudaOptions::fp8_small_max_weights (faster there than the W8A8 path's quantisation +
  // cuBLASLt, measured) and for any weight
  // below CudaOptions::fp8_w8a8_min_rows; the W8A16 tensor-core GEMM for larger M below that.
  // From fp8_w8a8_min_rows the activations are quantised per token and 128 columns and
  // cuBLASLt's block-scaled FP8 GEMM runs (Hopper); where it has no algorithm (shape, GPU), the
  // weight is dequantised to bf16 in scratch and the bf16 GEMM runs. CudaOptions::fp8_gemm_dequant
  // forces that fallback above the GEMV.
  void linear_fp8(const Tensor& x, const Tensor& w, const Tensor& out, int64_t M, int64_t N, int64_t K) {
    const Tensor& sc = *w.block_scale();
    CUDA_REQUIRE(w.dtype() == DType::kF8E4M3 && sc.dtype() == DType::kF32 && act(sc), "linear",
                 "FP8 weights must be e4m3 with f32 block scales, got " + w.str() + " scales " + sc.str());
    const auto* wscale = sc.data<float>();
    if (M <= kMaxFp8GemvRows && launch_fp8_gemv(x.raw(), w.raw(), wscale, out.raw(), out.dtype(), M, N, K, stream_))
      return;
    if (!options_.fp8_gemm_dequant && M <= kMaxFp8SmallRows &&
        (M < options_.fp8_w8a8_min_rows || N * K <= options_.fp8_small_max_weights)) {
      const int splits = fp8_w16_small_splits(N, K);
      const size_t mark = scratch_mark();
      Tensor part = scratch({splits, M, N}, DType::kF32);
      const bool done = launch_fp8_w16_small(x.raw(), w.raw(), wscale, out.raw(), out.dtype(), M, N, K, splits,
                                             part.data<float>(), stream_);
      scratch_rewind(mark);
      if (done) return;
    }
    if (!options_.fp8_gemm_dequant && M < options_.fp8_w8a8_min_rows) {
      const int splits = fp8_w16_gemm_splits(M, N, K, props_.multiProcessorCount);
      const size_t mark = scratch_mark();
      Tensor part = splits > 1 ? scratch({splits, M, N}, DType::kF32) : Tensor();
      const bool done = launch_fp8_w16_gemm(x.raw(), w.raw(), wscale, out.raw(), out.dtype(), M, N, K, splits,
                                            splits > 1 ? part.data<float>() : nullptr, stream_);
      scratch_rewind(mark);
      if (done) return;
    }
    if (!options_.fp8_gemm_dequant && K % 128 == 0 && (K / 128) % 4 == 0) {  // run_fp8_block's shapes
      const size_t mark = scratch_mark();
      Tensor xq = scratch({M, K}, DType::kF8E4M3);
      Tensor xs = scratch({K / 128, M}, DType::kF32);
      launch_quantize_act_fp8(x.raw(), xq.raw(), xs.data<float>(), M, K, stream_);
      const bool done =
          gemm_->run_fp8_block(xq.raw(), xs.data<float>(), w.raw(), wscale, out.raw(), out.dtype(), M, N, K, stream_);
      scratch_rewind(mark);
      if (done) return;
    }
    const size_t mark = scratch_mark();
    Tensor wb = scratch({N, K}, DType::kBF16);
    launch_dequant_fp8(w.raw(), wscale, wb.raw(), N, K, stream_);
    gemm_->run(x.raw(), wb.raw(), out.raw(), out.dtype(), M, N, K, stream_);
    scratch_rewind(mark);
  }

  void linear(const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& out) override {
    CUDA_REQUIRE(w.ndim() == 2, "linear", "weight must be 2-D, got " + w.str());
    if (w.block_scaled()) {
      const int64_t N = w.dim(0), K = w.dim(1), M = K ? x.numel() / K : 0;
      CUDA_REQUIRE(x.dtype() == DType::kBF16 && x.numel() == M * K && out.numel() == M * N &&
                       (out.dtype() == DType::kBF16 || out.dtype() == DType::kF32),
                   "linear", x.str() + " @ " + w.str() + "^T -> " + out.str());
      need_cuda(x, "linear");
      need_cuda(w, "linear");
      need_cuda(out, "linear");
      bind();
      linear_fp8(x, w, out, M, N, K);
      if (bias) {
        CUDA_REQUIRE(bias->numel() == N && act(*bias), "linear", "bias must have N elements, got " + bias->str());
        launch_add_bias(out.raw(), out.dtype(), bias->raw(), bias->dtype(), M, N, stream_);
      }
      return;
    }
    int64_t N = w.dim(0), K = w.dim(1);
    int64_t M = K ? x.numel() / K : 0;
    CUDA_REQUIRE(x.dtype() == DType::kBF16 && w.dtype() == DType::kBF16, "linear",
                 "expects bf16 x and w, got " + x.str() + " @ " + w.str() + " (cast the weights to bf16 when loading)");
    CUDA_REQUIRE(out.dtype() == DType::kBF16 || out.dtype() == DType::kF32, "linear", "out must be bf16 or f32");
    CUDA_REQUIRE(x.numel() == M * K && out.numel() == M * N, "linear",
                 x.str() + " @ " + w.str() + "^T -> " + out.str());
    need_cuda(x, "linear");
    need_cuda(w, "linear");
    need_cuda(out, "linear");
    bind();
    if (!(M <= kMaxGemvRows &&
          launch_gemv(x.raw(), w.raw(), out.raw(), out.dtype(), M, N, K, props_.multiProcessorCount, stream_)))
      gemm_->run(x.raw(), w.raw(), out.raw(), out.dtype(), M, N, K, stream_);
    if (bias) {
      CUDA_REQUIRE(bias->numel() == N && act(*bias), "linear", "bias must have N elements, got " + bias->str());
      launch_add_bias(out.raw(), out.dtype(), bias->raw(), bias->dtype(), M, N, stream_);
    }
  }

  void silu_mul(const Tensor& gate_up, const Tensor& out) override {
    int64_t I = out.dim(-1), T = I ? out.numel() / I : 0;
    CUDA_REQUIRE(gate_up.numel() == 2 * T * I && gate_up.dtype() == out.dtype() && act(out), "silu_mul",
                 gate_up.str() + " -> " + out.str());
    bind();
    launch_silu_mul(gate_up.raw(), out.raw(), out.dtype(), T, I, stream_);
  }

  void add(const Tensor& a, const Tensor& b, const Tensor& out) override {
    CUDA_REQUIRE(a.numel() == out.numel() && b.numel() == out.numel() && a.dtype() == out.dtype() &&
                     b.dtype() == out.dtype() && act(out),
                 "add", a.str() + " + " + b.str() + " -> " + out.str());
    bind();
    launch_add(a.raw(), b.raw(), out.raw(), out.dtype(), out.numel(), stream_);
  }

  void rope(const Tensor& q, const Tensor& k, const Tensor& positions, const RopeTable& table) override {
    CUDA_REQUIRE(q.ndim() == 3 && k.ndim() == 3 && q.dim(0) == k.dim(0) && q.dim(2) == k.dim(2) &&
                     q.dtype() == k.dtype() && act(q),
                 "rope", q.str() + ", " + k.str());
    CUDA_REQUIRE(positions.dtype() == DType::kI32 && positions.numel() == q.dim(0), "rope",
                 "positions must be i32 [T]");
    CUDA_REQUIRE(table.cos_sin.dtype() == DType::kF32 && table.cos_sin.dim(1) == table.rotary_dim &&
                     table.rotary_dim <= q.dim(2) && table.rotary_dim % 2 == 0,
                 "rope", "cos_sin table must be f32 [max_positions, rotary_dim]");
    need_cuda(table.cos_sin, "rope (cos/sin table)");
    need_cuda(positions, "rope");
    bind();
    launch_rope(q.raw(), k.raw(), q.dtype(), positions.data<int32_t>(), table.cos_sin.data<float>(), q.dim(0),
                static_cast<int>(q.dim(1)), static_cast<int>(k.dim(1)), static_cast<int>(q.dim(2)), table.rotary_dim,
                table.neox_style, table.cos_sin.dim(0), dev_err_, stream_);
  }

  void write_kv(const Tensor& k, const Tensor& v, const Tensor& k_cache, const Tensor& v_cache,
                const AttentionMetadata& meta, float k_scale, float v_scale) override {
    CUDA_REQUIRE(k.ndim() == 3 && k.numel() == v.numel() && k_cache.ndim() == 4 &&
                     k_cache.dim(2) * k_cache.dim(3) == k.dim(1) * k.dim(2) && k_cache.numel() == v_cache.numel() &&
                     k_cache.dtype() == v_cache.dtype(),
                 "write_kv", k.str() + " -> " + k_cache.str());
    CUDA_REQUIRE(is_float_dtype(k_cache.dtype()) && act(k), "write_kv", "unsupported cache dtype " + k_cache.str());
    need_cuda(meta.slot_mapping, "write_kv (slot_mapping)");
    bind();
    launch_write_kv(k.raw(), v.raw(), k.dtype(), k_cache.raw(), v_cache.raw(), k_cache.dtype(),
                    meta.slot_mapping.data<int32_t>(), k.dim(0), k.dim(1) * k.dim(2), k_cache.dim(0) * k_cache.dim(1),
                    k_scale, v_scale, dev_err_, stream_);
  }

  // The prologue's arguments, checked; q_out is null for the fused decode path.
  QkvPrologueArgs prologue_args(const Tensor& qkv, const Tensor* q_norm, const Tensor* k_norm, float eps,
                                const Tensor& positions, const RopeTable& table, const Tensor& k_cache,
                                const Tensor& v_cache, const AttentionMetadata& meta, float k_scale, float v_scale,
                                const Tensor& q_out) {
    CUDA_REQUIRE(q_out.ndim() == 3 && k_cache.ndim() == 4 && qkv.dtype() == DType::kBF16 &&
                     q_out.dtype() == DType::kBF16 && k_cache.dim(3) == q_out.dim(2) &&
                     qkv.numel() == q_out.dim(0) * (q_out.dim(1) + 2 * k_cache.dim(2)) * q_out.dim(2) &&
                     k_cache.dtype() == v_cache.dtype() && is_float_dtype(k_cache.dtype()),
                 "qkv_prologue", qkv.str() + " -> " + q_out.str() + ", cache " + k_cache.str());
    CUDA_REQUIRE((!q_norm || (q_norm->numel() == q_out.dim(2) && q_norm->dtype() == DType::kBF16)) &&
                     (!k_norm || (k_norm->numel() == q_out.dim(2) && k_norm->dtype() == DType::kBF16)) &&
                     (q_norm == nullptr) == (k_norm == nullptr),
                 "qkv_prologue", "q_norm and k_norm must both be bf16 [head_dim], or both absent");
    CUDA_REQUIRE(positions.dtype() == DType::kI32 && positions.numel() == q_out.dim(0) &&
                     table.cos_sin.dtype() == DType::kF32 && table.rotary_dim <= q_out.dim(2) &&
                     table.rotary_dim % 2 == 0,
                 "qkv_prologue", "positions i32 [T] and an f32 cos/sin table");
    need_cuda(meta.slot_mapping, "qkv_prologue (slot_mapping)");
    QkvPrologueArgs a{};
    a.qkv = qkv.raw();
    a.q_norm = q_norm ? q_norm->raw() : nullptr;
    a.k_norm = k_norm ? k_norm->raw() : nullptr;
    a.eps = eps;
    a.positions = positions.data<int32_t>();
    a.cos_sin = table.cos_sin.data<float>();
    a.rotary_dim = table.rotary_dim;
    a.neox = table.neox_style;
    a.max_pos = table.cos_sin.dim(0);
    a.k_cache = k_cache.raw();
    a.v_cache = v_cache.raw();
    a.slots = meta.slot_mapping.data<int32_t>();
    a.num_slots = k_cache.dim(0) * k_cache.dim(1);
    a.inv_k_scale = 1.0f / k_scale;
    a.inv_v_scale = 1.0f / v_scale;
    a.q_out = q_out.raw();
    a.Hq = static_cast<int>(q_out.dim(1));
    a.Hk = static_cast<int>(k_cache.dim(2));
    a.D = static_cast<int>(q_out.dim(2));
    a.err = dev_err_;
    return a;
  }

  void qkv_prologue(const Tensor& qkv, const Tensor* q_norm, const Tensor* k_norm, float eps, const Tensor& positions,
                    const RopeTable& table, const Tensor& k_cache, const Tensor& v_cache, const AttentionMetadata& meta,
                    float k_scale, float v_scale, const Tensor& q_out) override {
    QkvPrologueArgs a =
        prologue_args(qkv, q_norm, k_norm, eps, positions, table, k_cache, v_cache, meta, k_scale, v_scale, q_out);
    bind();
    launch_qkv_prologue(a, q_out.dim(0), k_cache.dtype(), stream_);
  }

  void qkv_attention(const Tensor& qkv, const Tensor* q_norm, const Tensor* k_norm, float eps, const Tensor& positions,
                     const RopeTable& table, const Tensor& k_cache, const Tensor& v_cache,
                     const AttentionMetadata& meta, float scale, float k_scale, float v_scale,
                     const Tensor& out) override {
    const int D = out.ndim() == 3 ? static_cast<int>(out.dim(2)) : 0;
    const bool fused = options_.fused_decode_attention && meta.max_query_len == 1 && out.ndim() == 3 &&
                       out.dim(0) > 0 && meta.num_seqs > 0 && fast_attention_supported(D, k_cache.dtype());
    if (!fused) {
      Backend::qkv_attention(qkv, q_norm, k_norm, eps, positions, table, k_cache, v_cache, meta, scale, k_scale,
                             v_scale, out);
      return;
    }
    // One kernel: q from the QKV row, the newest key and value into the cache, attention.
    QkvPrologueArgs pro =
        prologue_args(qkv, q_norm, k_norm, eps, positions, table, k_cache, v_cache, meta, k_scale, v_scale, out);
    pro.q_out = nullptr;
    PagedAttentionArgs a = attention_args(out, k_cache, v_cache, meta, scale, k_scale, v_scale, out);
    a.q = nullptr;
    bind();
    decode_attention(a, meta, kAnyQuery, &pro);
  }

  // Whether the split-K decode and the tensor-core prefill kernels both take this head size
  // and cache dtype (else paged attention runs the exact, slow generic kernel).
  static bool fast_attention_supported(int D, DType cache_dtype) {
    return decode_attention_supported(D, cache_dtype) && prefill_attention_supported(D, cache_dtype);
  }

  // The split-K decode kernel (and its merge) over `a`, its workspace from scratch.
  // max_query: the decode kernel takes the sequences of at most this many query tokens.
  static constexpr int kAnyQuery = std::numeric_limits<int>::max();
  void decode_attention(const PagedAttentionArgs& a, const AttentionMetadata& meta, int max_query,
                        const QkvPrologueArgs* fused) {
    const int splits =
        decode_attention_num_splits(a.num_tokens, a.Hk, a.Hq / a.Hk, meta.max_seq_len, props_.multiProcessorCount);
    float* ws = nullptr;
    if (splits > 1)
      ws = scratch({static_cast<int64_t>(a.num_tokens) * a.Hq * splits * (a.D + 2)}, DType::kF32).data<float>();
    launch_decode_attention(a, splits, max_query, ws, fused, stream_, options_.decode_heads_per_block,
                            options_.decode_early_merge);
  }

  // Paged attention's arguments, checked (q's shape is out's).
  PagedAttentionArgs attention_args(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                    const AttentionMetadata& meta, float scale, float k_scale, float v_scale,
                                    const Tensor& out) {
    CUDA_REQUIRE(q.ndim() == 3 && k_cache.ndim() == 4 && q.dtype() == DType::kBF16 && out.dtype() == DType::kBF16 &&
                     out.numel() == q.numel() && k_cache.dim(3) == q.dim(2) && q.dim(1) % k_cache.dim(2) == 0,
                 "paged_attention", "q " + q.str() + ", cache " + k_cache.str() + ", out " + out.str());
    const int T = static_cast<int>(q.dim(0));
    CUDA_REQUIRE(meta.num_tokens == T, "paged_attention",
                 "metadata has " + std::to_string(meta.num_tokens) + " tokens, q has " + std::to_string(T));
    PagedAttentionArgs a{};
    a.q = q.raw();
    a.k_cache = k_cache.raw();
    a.v_cache = v_cache.raw();
    a.out = out.raw();
    a.query_start_loc = meta.query_start_loc.data<int32_t>();
    a.seq_lens = meta.seq_lens.data<int32_t>();
    a.block_tables = meta.block_tables.data<int32_t>();
    a.num_seqs = meta.num_seqs;
    a.num_tokens = T;
    a.Hq = static_cast<int>(q.dim(1));
    a.Hk = static_cast<int>(k_cache.dim(2));
    a.D = static_cast<int>(q.dim(2));
    a.block_size = static_cast<int>(k_cache.dim(1));
    a.max_blocks_per_seq = static_cast<int>(meta.block_tables.numel() / std::max(1, meta.num_seqs));
    a.scale = scale;
    a.k_scale = k_scale;
    a.v_scale = v_scale;
    a.cache_dtype = k_cache.dtype();
    return a;
  }

  void paged_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const AttentionMetadata& meta,
                       float scale, float k_scale, float v_scale, const Tensor& out) override {
    CUDA_REQUIRE(q.ndim() == 3 && k_cache.ndim() == 4, "paged_attention",
                 "q " + q.str() + ", cache " + k_cache.str() + ", out " + out.str());
    const int T = static_cast<int>(q.dim(0)), D = static_cast<int>(q.dim(2));
    if (T == 0 || meta.num_seqs == 0) return;
    const bool fast = fast_attention_supported(D, k_cache.dtype());
    if (!fast && !generic_attention_supported(D))
      fail(ErrorKind::kUnsupported, "CUDA paged attention supports head_dim up to 512, not {}", D);
    PagedAttentionArgs a = attention_args(q, k_cache, v_cache, meta, scale, k_scale, v_scale, out);
    bind();

    if (!fast) {  // unusual head_dim or cache dtype: the exact, slow kernel
      launch_generic_attention(a, stream_);
      return;
    }
    // Sequences of up to decode_attention_max_query query tokens (decode, speculative
    // verification) take the split-K decode kernel, each token over its own causal range; longer
    // ones the prefill kernel. A step whose longest query is that short reads no host metadata.
    const int short_q = std::max(1, options_.decode_attention_max_query);
    bool any_long = meta.max_query_len > short_q, any_short = !any_long;
    if (any_long)
      for (int s = 0; s < meta.num_seqs && !any_short; ++s)
        any_short = meta.host_query_start_loc[s + 1] - meta.host_query_start_loc[s] <= short_q;
    if (any_long) launch_prefill_attention(a, meta.max_query_len, any_short ? short_q : 0, stream_);
    if (any_short) decode_attention(a, meta, any_long ? short_q : kAnyQuery, nullptr);
  }

  // ---------------------------------------------------------------- mixture of experts
  void moe_topk(const Tensor& router_logits, int k, bool renormalize, const Tensor& topk_ids,
                const Tensor& topk_weights) override {
    CUDA_REQUIRE(router_logits.dtype() == DType::kF32 && router_logits.ndim() == 2, "moe_topk",
                 "router logits must be f32 [T, E], got " + router_logits.str());
    const int64_t T = router_logits.dim(0), E = router_logits.dim(1);
    CUDA_REQUIRE(topk_ids.dtype() == DType::kI32 && topk_ids.numel() == T * k && topk_weights.dtype() == DType::kF32 &&
                     topk_weights.numel() == T * k,
                 "moe_topk", "outputs " + topk_ids.str() + ", " + topk_weights.str() + " for " + router_logits.str());
    if (k < 1 || k > 32 || k > E || E > kMoeMaxExperts || T >= (int64_t{1} << 31))
      fail(ErrorKind::kUnsupported,
           "CUDA moe_topk takes up to {} experts, k from 1 to min(32, experts) and fewer than 2^31 tokens, not E={} "
           "k={} T={}",
           kMoeMaxExperts, E, k, T);
    need_cuda(router_logits, "moe_topk");
    need_cuda(topk_ids, "moe_topk");
    need_cuda(topk_weights, "moe_topk");
    bind();
    launch_moe_topk(router_logits.data<float>(), T, static_cast<int>(E), k, renormalize, topk_ids.data<int32_t>(),
                    topk_weights.data<float>(), stream_);
  }

  // Decode (T * k <= kMoeDecodeMaxPairs): grouped GEMVs reading each selected expert once.
  // Prefill: routing, permutation and tile offsets on the device, grouped GEMMs on tensor cores.
  // FP8 block-scaled experts take the same two paths (dequantised in registers / shared memory).
  // Neither reads the routing on the host, so both run inside captured graphs.
  void moe_experts(const Tensor& x, const Tensor& gate_up, const Tensor& down, const Tensor& topk_ids,
                   const Tensor& topk_weights, int expert_begin, const Tensor& out) override {
    moe_experts_impl(x, gate_up, down, topk_ids, topk_weights, expert_begin, out, nullptr, nullptr);
  }

  // The fused decode variants fold the top-k and the shared expert into their kernel
  // (CudaMoeDecode); otherwise (and where that kernel does not apply) moe_topk, moe_experts and
  // the shared expert's ops.
  // The decode variant of a T-token call (CudaOptions::moe_decode; kAuto picks by the measured rule).
  // At one token the split path's two one-token kernels beat the fused kernel where reading the k
  // experts dominates (Qwen3.5-35B-A3B: 8 x 6.3 MB); where they are small (the demo model's 8 x 74
  // KB) the layer is bound by kernel latency, and the fused kernel, which folds the shared expert's
  // five ops in, stays the choice it was measured to be before the one-token kernels existed.
  static constexpr int64_t kOneTokenSplitMinBytes = int64_t{8} << 20;
  CudaMoeDecode moe_decode_for(int64_t T, bool shared, int64_t routed_bytes) const {
    if (options_.moe_decode != CudaMoeDecode::kAuto) return options_.moe_decode;
    const bool one_token =
        T == 1 && options_.moe_one_token != CudaMoeOneToken::kGrouped && routed_bytes >= kOneTokenSplitMinBytes;
    return shared && T <= 2 && !one_token ? CudaMoeDecode::kFusedTopkKernel : CudaMoeDecode::kSplit;
  }
  // The bytes of the k experts a token reads (bf16 gate_up and down of [E, 2I, H] / [E, H, I]).
  static int64_t routed_expert_bytes(const Tensor& gate_up, int k) {
    return gate_up.ndim() == 3 ? int64_t{k} * 3 * (gate_up.dim(1) / 2) * gate_up.dim(2) * 2 : 0;
  }

  void moe_topk_experts(const Tensor& router_logits, int k, bool renormalize, const Tensor& x, const Tensor& gate_up,
                        const Tensor& down, const Tensor& topk_ids, const Tensor& topk_weights, int expert_begin,
                        const Tensor& out, const MoeSharedExpert* shared) override {
    const bool fold = moe_decode_for(x.ndim() == 2 ? x.dim(0) : 0, shared != nullptr,
                                     routed_expert_bytes(gate_up, k)) != CudaMoeDecode::kSplit &&
                      moe_gemv_ && router_logits.ndim() == 2 && router_logits.dtype() == DType::kF32 && x.ndim() == 2 &&
                      router_logits.dim(0) == x.dim(0) && x.dim(0) * k <= kMoeDecodeMaxPairs &&
                      topk_ids.numel() == x.dim(0) * k && topk_weights.numel() == x.dim(0) * k &&
                      topk_ids.dtype() == DType::kI32 && topk_weights.dtype() == DType::kF32 &&
                      moe_decode_fused_topk_supported(static_cast<int>(router_logits.dim(1)), k) &&
                      !gate_up.block_scaled() && !down.block_scaled();
    if (!fold) {
      if (shared && one_token_folds_shared(x, gate_up, k, *shared)) {  // the shared expert in the one-token kernels
        moe_topk(router_logits, k, renormalize, topk_ids, topk_weights);
        moe_experts_impl(x, gate_up, down, topk_ids, topk_weights, expert_begin, out, nullptr, shared);
        return;
      }
      Backend::moe_topk_experts(router_logits, k, renormalize, x, gate_up, down, topk_ids, topk_weights, expert_begin,
                                out, shared);
      return;
    }
    need_cuda(router_logits, "moe_topk_experts");
    const MoeFusedTopk topk{router_logits.data<float>(), static_cast<int>(router_logits.dim(1)), renormalize};
    moe_experts_impl(x, gate_up, down, topk_ids, topk_weights, expert_begin, out, &topk, shared);
  }

  // Whether the fused decode kernel can take this shared expert: bf16, the routed experts' I,
  // 16-byte aligned, on this device.
  static bool fusable_shared(const MoeSharedExpert& s, int64_t H, int64_t I) {
    auto ok = [](const Tensor& t) {
      return t.dtype() == DType::kBF16 && !t.block_scaled() && t.device().type == DeviceType::kCUDA &&
             reinterpret_cast<uintptr_t>(t.raw()) % 16 == 0;
    };
    return s.gate_up && s.down && ok(*s.gate_up) && ok(*s.down) && s.gate_up->ndim() == 2 &&
           s.gate_up->dim(0) == 2 * I && s.gate_up->dim(1) == H && s.down->ndim() == 2 && s.down->dim(0) == H &&
           s.down->dim(1) == I && (!s.gate || (ok(*s.gate) && s.gate->numel() == H));
  }

  // Whether a one-token split step takes the shared expert as one more pair of its kernels
  // (CudaOptions::moe_one_token_shared), k <= 32: bf16 experts and shared expert of the same I on the
  // bf16 one-token kernels, or FP8 ones on the FP8 one-token kernels (CudaMoeFp8OneToken).
  bool one_token_folds_shared(const Tensor& x, const Tensor& gate_up, int64_t k, const MoeSharedExpert& shared) const {
    if (!options_.moe_one_token_shared || !moe_gemv_ || x.ndim() != 2 || x.dim(0) != 1 || gate_up.ndim() != 3 || k > 32)
      return false;
    const int64_t H = x.dim(1), I = gate_up.dim(1) / 2;
    if (gate_up.block_scaled())
      return options_.moe_fp8_decode == CudaMoeFp8Decode::kMma &&
             options_.moe_fp8_one_token != CudaMoeFp8OneToken::kGrouped && fusable_fp8_shared(shared, H, I);
    if (options_.moe_one_token == CudaMoeOneToken::kGrouped ||
        moe_decode_for(1, true, routed_expert_bytes(gate_up, static_cast<int>(k))) != CudaMoeDecode::kSplit)
      return false;
    return fusable_shared(shared, H, I);
  }
  // An FP8 shared expert the FP8 one-token kernels take as one expert: e4m3 gate_up [2I, H] and down
  // [H, I] with f32 block scales, the routed experts' I; the gate bf16 [1, H] or none.
  static bool fusable_fp8_shared(const MoeSharedExpert& s, int64_t H, int64_t I) {
    auto fp8 = [](const Tensor* t, int64_t rows, int64_t cols) {
      return t && t->dtype() == DType::kF8E4M3 && t->block_scaled() && t->ndim() == 2 && t->dim(0) == rows &&
             t->dim(1) == cols && t->device().type == DeviceType::kCUDA && t->block_scale()->dtype() == DType::kF32 &&
             t->block_scale()->ndim() == 2 && t->block_scale()->dim(0) == (rows + 127) / 128 &&
             t->block_scale()->dim(1) == (cols + 127) / 128;
    };
    const bool gate_ok =
        !s.gate || (s.gate->dtype() == DType::kBF16 && !s.gate->block_scaled() && s.gate->numel() == H &&
                    s.gate->device().type == DeviceType::kCUDA && reinterpret_cast<uintptr_t>(s.gate->raw()) % 16 == 0);
    return fp8(s.gate_up, 2 * I, H) && fp8(s.down, H, I) && gate_ok;
  }

  // moe_experts; with `fold`, the routing is computed from its logits into topk_ids / topk_weights
  // first (inside the fused decode kernel, or by the top-k kernel on the other paths).
  void moe_experts_impl(const Tensor& x, const Tensor& gate_up, const Tensor& down, const Tensor& topk_ids,
                        const Tensor& topk_weights, int expert_begin, const Tensor& out, const MoeFusedTopk* fold,
                        const MoeSharedExpert* shared) {
    CUDA_REQUIRE(x.ndim() == 2 && gate_up.ndim() == 3 && down.ndim() == 3, "moe_experts",
                 "x " + x.str() + ", gate_up " + gate_up.str() + ", down " + down.str());
    const int64_t T = x.dim(0), H = x.dim(1), E_local = gate_up.dim(0), I = gate_up.dim(1) / 2;
    // FP8 experts: e4m3 with f32 scales per 128 x 128 block (Tensor::block_scale), both matrices.
    const bool fp8 = gate_up.block_scaled();
    CUDA_REQUIRE(
        down.block_scaled() == fp8, "moe_experts",
        "gate_up and down must both be FP8 block-scaled or both bf16, got " + gate_up.str() + " and " + down.str());
    const DType wt = fp8 ? DType::kF8E4M3 : DType::kBF16;
    CUDA_REQUIRE(
        x.dtype() == DType::kBF16 && gate_up.dtype() == wt && down.dtype() == wt && out.dtype() == DType::kBF16,
        "moe_experts",
        "expects bf16 x and out with bf16 or block-scaled e4m3 weights, got " + x.str() + ", " + gate_up.str() + ", " +
            down.str());
    if (fp8)
      CUDA_REQUIRE(gate_up.block_scale()->dtype() == DType::kF32 && down.block_scale()->dtype() == DType::kF32 &&
                       gate_up.block_scale()->ndim() == 3 && down.block_scale()->ndim() == 3,
                   "moe_experts",
                   "FP8 experts need f32 block scales, got " + gate_up.block_scale()->str() + " and " +
                       down.block_scale()->str());
    CUDA_REQUIRE(gate_up.dim(1) == 2 * I && gate_up.dim(2) == H && down.dim(0) == E_local && down.dim(1) == H &&
                     down.dim(2) == I && out.numel() == T * H,
                 "moe_experts",
                 "x " + x.str() + ", gate_up " + gate_up.str() + ", down " + down.str() + ", out " + out.str());
    CUDA_REQUIRE(topk_ids.dtype() == DType::kI32 && topk_weights.dtype() == DType::kF32 && topk_ids.ndim() == 2 &&
                     topk_ids.dim(0) == T && topk_weights.numel() == topk_ids.numel(),
                 "moe_experts", "routing " + topk_ids.str() + ", " + topk_weights.str() + " for " + x.str());
    if (T == 0) return;
    const int64_t k = topk_ids.dim(1);
    if (fold) CUDA_REQUIRE(topk_ids.dim(1) == topk_weights.dim(1), "moe_topk_experts", "routing " + topk_ids.str());
    const bool aligned = ((reinterpret_cast<uintptr_t>(x.raw()) | reinterpret_cast<uintptr_t>(gate_up.raw()) |
                           reinterpret_cast<uintptr_t>(down.raw()) | reinterpret_cast<uintptr_t>(out.raw())) &
                          15) == 0;
    const int64_t mult = fp8 ? 16 : 8;  // 16-byte loads of the weights: 8 bf16 or 16 e4m3
    if (H % mult != 0 || I % mult != 0 || E_local > kMoeMaxExperts || !aligned || T * k > (int64_t{1} << 30) ||
        (fp8 && std::max(H, I) > kMaxFp8GemmK))
      fail(ErrorKind::kUnsupported,
           "CUDA moe_experts needs hidden and intermediate sizes that are multiples of {} ({} experts{}), 16-byte "
           "aligned tensors and at most {} experts per rank (got H={}, I={}, {} experts)",
           mult, fp8 ? "FP8" : "bf16", fp8 ? ", at most " + std::to_string(kMaxFp8GemmK) : "", kMoeMaxExperts, H, I,
           E_local);
    for (const Tensor* t : {&x, &gate_up, &down, &topk_ids, &topk_weights, &out}) need_cuda(*t, "moe_experts");
    bind();
    MoeArgs a{};
    a.x = x.raw();
    a.gate_up = gate_up.raw();
    a.down = down.raw();
    a.ids = topk_ids.data<int32_t>();
    a.weights = topk_weights.data<float>();
    a.out = out.raw();
    a.T = static_cast<int>(T);
    a.k = static_cast<int>(k);
    a.H = static_cast<int>(H);
    a.I = static_cast<int>(I);
    a.E_local = static_cast<int>(E_local);
    a.expert_begin = expert_begin;
    if (fp8) {
      need_cuda(*gate_up.block_scale(), "moe_experts");
      need_cuda(*down.block_scale(), "moe_experts");
      a.gate_up_scale = gate_up.block_scale()->data<float>();
      a.down_scale = down.block_scale()->data<float>();
    }
    const int64_t P = T * k;
    const bool decode = moe_gemv_ && P <= kMoeDecodeMaxPairs;
    const CudaMoeDecode variant =
        moe_decode_for(T, shared != nullptr, routed_expert_bytes(gate_up, static_cast<int>(k)));
    const bool fused = decode && !fp8 && variant != CudaMoeDecode::kSplit &&
                       moe_decode_sync_ints(H) <= kMoeSyncInts;  // the fused kernel reads bf16 experts
    const bool fold_shared =
        fused && shared && fusable_shared(*shared, H, I) && moe_decode_fused_shared_supported(variant, a.T, a.k);
    const bool one_token_shared = !fused && decode && shared && one_token_folds_shared(x, gate_up, k, *shared);
    const int64_t rows = P + (fold_shared || one_token_shared ? T : 0);  // the shared expert's pairs last
    Tensor act = scratch({rows, I}, DType::kBF16), y = scratch({rows, H}, DType::kBF16);
    if (fused) {
      const MoeFusedShared sh{fold_shared ? shared->gate_up->raw() : nullptr,
                              fold_shared ? shared->down->raw() : nullptr,
                              fold_shared && shared->gate ? shared->gate->raw() : nullptr};
      launch_moe_decode_fused(a, MoeDecodeWorkspace{act.raw(), y.raw(), moe_sync_, dev_err_}, variant,
                              props_.multiProcessorCount, stream_, fold, fold_shared ? &sh : nullptr);
      if (shared && !fold_shared) moe_shared_expert_add(x, *shared, out);
      return;
    }
    if (fold)
      launch_moe_topk(fold->logits, T, fold->E, static_cast<int>(k), fold->renormalize, topk_ids.data<int32_t>(),
                      topk_weights.data<float>(), stream_);
    bool shared_done = false;
    if (decode) {
      MoeFusedShared sh{one_token_shared ? shared->gate_up->raw() : nullptr,
                        one_token_shared ? shared->down->raw() : nullptr,
                        one_token_shared && shared->gate ? shared->gate->raw() : nullptr};
      if (one_token_shared && fp8) {
        sh.gate_up_scale = shared->gate_up->block_scale()->data<float>();
        sh.down_scale = shared->down->block_scale()->data<float>();
      }
      shared_done = launch_moe_decode(a, act.raw(), y.raw(), stream_, options_.moe_fp8_decode, options_.moe_one_token,
                                      options_.moe_fp8_one_token, one_token_shared ? &sh : nullptr);
    } else {
      Tensor route = scratch({2 * (E_local + 1) + 2 * P}, DType::kI32);
      int32_t* r = route.data<int32_t>();
      MoePrefillWorkspace ws{r, r + E_local + 1, r + 2 * (E_local + 1), r + 2 * (E_local + 1) + P, act.raw(), y.raw()};
      launch_moe_prefill(a, ws, options_.moe_prefill_wgmma && props_.major == 9 && props_.minor == 0, stream_);
    }
    if (shared && !shared_done) moe_shared_expert_add(x, *shared, out);
  }

  void sigmoid_mul(const Tensor& x, const Tensor& gate, const Tensor& out) override {
    const int64_t n = x.numel(), row = x.ndim() >= 1 ? x.dim(-1) : 1, T = row > 0 ? n / row : 0;
    CUDA_REQUIRE(out.numel() == n && x.dtype() == out.dtype() && gate.dtype() == x.dtype() && act(x) &&
                     (gate.numel() == n || gate.numel() == T),
                 "sigmoid_mul",
                 "x " + x.str() + ", gate " + gate.str() + " (x's shape or one per row), out " + out.str());
    need_cuda(x, "sigmoid_mul");
    need_cuda(gate, "sigmoid_mul");
    need_cuda(out, "sigmoid_mul");
    bind();
    launch_sigmoid_mul(x.raw(), gate.raw(), out.raw(), x.dtype(), n, gate.numel() == n ? 1 : row, stream_);
  }

  // ---------------------------------------------------------------- linear attention
  void check_linear_meta(const LinearAttnMetadata& m, int64_t T, const char* op) const {
    CUDA_REQUIRE(m.num_tokens == T && static_cast<int>(m.host_query_start_loc.size()) == m.num_seqs + 1 &&
                     m.state_slots.dtype() == DType::kI32 && m.has_initial_state.dtype() == DType::kI32,
                 op, "metadata has " + std::to_string(m.num_tokens) + " tokens, the input " + std::to_string(T));
  }

  bool supports_token_state_slots() const override { return true; }
  void causal_conv1d(const Tensor& x, int64_t x_col, const Tensor& weight, const Tensor& conv_state,
                     const LinearAttnMetadata& meta, const Tensor& out) override {
    CUDA_REQUIRE(x.ndim() == 2 && out.ndim() == 2 && x.dtype() == DType::kBF16 && out.dtype() == DType::kBF16,
                 "causal_conv1d", "x and out must be bf16 [T, *], got " + x.str() + ", " + out.str());
    CUDA_REQUIRE(conv_state.ndim() == 3 && (conv_state.dtype() == DType::kF32 || conv_state.dtype() == DType::kBF16),
                 "causal_conv1d", "conv_state must be f32 or bf16 [num_slots, K-1, C], got " + conv_state.str());
    const int64_t T = x.dim(0), X = x.dim(1), C = out.dim(1), K = conv_state.dim(1) + 1;
    CUDA_REQUIRE(out.dim(0) == T && conv_state.dim(2) == C && weight.dim(0) == C && weight.numel() == C * K &&
                     act(weight) && x_col >= 0 && x_col + C <= X,
                 "causal_conv1d",
                 "shapes " + x.str() + " (column " + std::to_string(x_col) + "), " + weight.str() + ", " +
                     conv_state.str() + " -> " + out.str());
    if (K != 4)
      fail(ErrorKind::kUnsupported, "CUDA causal_conv1d supports kernel size 4 (linear_conv_kernel_dim), not {}", K);
    check_linear_meta(meta, T, "causal_conv1d");
    need_cuda(x, "causal_conv1d");
    need_cuda(conv_state, "causal_conv1d");
    bind();
    launch_causal_conv1d(x.raw(), X, x_col, weight.raw(), weight.dtype(), conv_state.raw(), conv_state.dtype(),
                         meta.query_start_loc.data<int32_t>(), meta.state_slots.data<int32_t>(),
                         meta.has_initial_state.data<int32_t>(),
                         meta.token_state_slots.defined() ? meta.token_state_slots.data<int32_t>() : nullptr, out.raw(),
                         static_cast<int>(C), meta.num_seqs, meta.max_query_len, stream_);
  }

  void gated_delta_rule(const Tensor& qkv, const Tensor& ba, int64_t ba_col, const Tensor& A_log, const Tensor& dt_bias,
                        const Tensor& state, const LinearAttnMetadata& meta, const Tensor& out) override {
    CUDA_REQUIRE(qkv.ndim() == 2 && ba.ndim() == 2 && out.ndim() == 3 && qkv.dtype() == DType::kBF16 &&
                     ba.dtype() == DType::kBF16 && out.dtype() == DType::kBF16,
                 "gated_delta_rule", "qkv [T, C], ba [T, X], out [T, Hv, Dv] must be bf16");
    CUDA_REQUIRE(state.ndim() == 4 && (state.dtype() == DType::kF32 || state.dtype() == DType::kBF16),
                 "gated_delta_rule", "state must be f32 or bf16 [num_slots, Hv, Dk, Dv], got " + state.str());
    const int64_t T = qkv.dim(0), Hv = state.dim(1), Dk = state.dim(2), Dv = state.dim(3), C = qkv.dim(1);
    const int64_t Hk = Dk > 0 ? (C - Hv * Dv) / (2 * Dk) : 0;
    CUDA_REQUIRE(Hk > 0 && 2 * Hk * Dk + Hv * Dv == C && Hv % Hk == 0 && out.dim(0) == T && out.dim(1) == Hv &&
                     out.dim(2) == Dv && ba.dim(0) == T && ba_col >= 0 && ba_col + 2 * Hv <= ba.dim(1) &&
                     A_log.numel() == Hv && dt_bias.numel() == Hv && act(A_log) && A_log.dtype() == dt_bias.dtype(),
                 "gated_delta_rule",
                 "shapes qkv " + qkv.str() + ", ba " + ba.str() + " (column " + std::to_string(ba_col) + "), A_log " +
                     A_log.str() + ", dt_bias " + dt_bias.str() + ", state " + state.str() + " -> " + out.str());
    if (!gdr_recurrent_supported(static_cast<int>(Dk)))
      fail(ErrorKind::kUnsupported, "CUDA gated_delta_rule supports key head dims 16, 32, 64, 128 and 256, not {}", Dk);
    check_linear_meta(meta, T, "gated_delta_rule");
    need_cuda(qkv, "gated_delta_rule");
    need_cuda(state, "gated_delta_rule");
    bind();
    GatedDeltaRuleArgs a{};
    a.qkv = qkv.raw();
    a.ba = ba.raw();
    a.ba_stride = ba.dim(1);
    a.ba_col = ba_col;
    a.A_log = A_log.raw();
    a.dt_bias = dt_bias.raw();
    a.param_t = A_log.dtype();
    a.state = state.raw();
    a.state_t = state.dtype();
    a.qsl = meta.query_start_loc.data<int32_t>();
    a.slots = meta.state_slots.data<int32_t>();
    a.has_init = meta.has_initial_state.data<int32_t>();
    a.token_slots = meta.token_state_slots.defined() ? meta.token_state_slots.data<int32_t>() : nullptr;
    a.out = out.raw();
    a.num_seqs = meta.num_seqs;
    a.Hk = static_cast<int>(Hk);
    a.Hv = static_cast<int>(Hv);
    a.Dk = static_cast<int>(Dk);
    a.Dv = static_cast<int>(Dv);
    a.scale = 1.0f / std::sqrt(static_cast<float>(Dk));
    // Several tokens in a sequence: the chunked tensor-core path where the head dims allow it
    // (CudaOptions::chunked_gated_delta = false keeps the recurrent kernel, which walks the
    // tokens one by one). Speculative decoding: in a step whose sequences have different token
    // counts (a prompt chunk beside verification chunks; never graph-captured, which takes equal
    // counts only) the prompt chunks still take the chunked path, so a prompt's chunk gives the
    // same numbers whether or not a verification shares its step, and the recurrent kernel takes
    // the rest: the chunks that keep a state per token, and the one-token rows, which then get
    // the numbers of a decode step. A step of equal counts with per-token states (verification
    // only) is all recurrent.
    const int S = meta.num_seqs;
    std::vector<int32_t> chunked_seq;  // per sequence: 1 = the chunked path takes it (the recurrent kernel skips it)
    if (meta.max_query_len > 1 && options_.chunked_gated_delta && gdr_chunked_supported(a.Dk, a.Dv) && S > 0) {
      const auto& qsl = meta.host_query_start_loc;  // (check_linear_meta: S + 1 entries)
      const auto other_count = [&](int32_t x, int32_t y) { return y - x != qsl[1] - qsl[0]; };
      const bool equal_counts = std::adjacent_find(qsl.begin(), qsl.end(), other_count) == qsl.end();
      if (!a.token_slots) {
        chunked_seq.assign(S, 1);
      } else if (!equal_counts && static_cast<int>(meta.host_state_slots.size()) == S &&
                 static_cast<int64_t>(meta.host_token_state_slots.size()) == T) {
        chunked_seq.resize(S);
        for (int s = 0; s < S; ++s) chunked_seq[s] = qsl[s + 1] - qsl[s] > 1 && !per_token_states(meta, s);
      }
    }
    const int n_chunked = static_cast<int>(std::count(chunked_seq.begin(), chunked_seq.end(), 1));
    if (n_chunked > 0) {
      std::vector<int32_t> chunks, seq_chunks = {0};
      for (int s = 0; s < S; ++s) {
        const int t0 = meta.host_query_start_loc[s], t1 = meta.host_query_start_loc[s + 1];
        if (chunked_seq[s])
          for (int t = t0; t < t1; t += 64) chunks.insert(chunks.end(), {t, std::min(64, t1 - t), s});
        seq_chunks.push_back(static_cast<int32_t>(chunks.size() / 3));
      }
      GatedDeltaRuleArgs c = a;
      c.token_slots = nullptr;  // its sequences write their final state in place
      c.num_chunks = static_cast<int>(chunks.size() / 3);
      if (c.num_chunks > 0) {
        Tensor chunk_table = scratch({static_cast<int64_t>(chunks.size())}, DType::kI32);
        Tensor seq_table = scratch({static_cast<int64_t>(seq_chunks.size())}, DType::kI32);
        copy_from_host(chunk_table, chunks.data());
        copy_from_host(seq_table, seq_chunks.data());
        Tensor ws = scratch({static_cast<int64_t>(gdr_chunked_workspace_bytes(c.num_chunks, c.Hk, c.Hv, c.Dk, c.Dv))},
                            DType::kU8);
        c.chunks = chunk_table.data<int32_t>();
        c.seq_chunks = seq_table.data<int32_t>();
        gdr_carve_workspace(c, ws.raw());
        launch_gated_delta_rule(c, true, stream_);
      }
      if (n_chunked == S) return;
      Tensor skip = scratch({S}, DType::kI32);
      copy_from_host(skip, chunked_seq.data());
      a.skip_seqs = skip.data<int32_t>();
    }
    launch_gated_delta_rule(a, false, stream_);
  }

  void gated_rms_norm(const Tensor& x, const Tensor& z, int64_t z_col, const Tensor& w, float eps,
                      const Tensor& out) override {
    CUDA_REQUIRE(x.ndim() == 3 && z.ndim() == 2 && out.shape() == x.shape() && x.dtype() == DType::kBF16 &&
                     z.dtype() == DType::kBF16 && out.dtype() == DType::kBF16 && act(w),
                 "gated_rms_norm", "x, out bf16 [T, H, D] and z bf16 [T, Z], got " + x.str() + ", " + z.str());
    const int64_t T = x.dim(0), H = x.dim(1), D = x.dim(2);
    CUDA_REQUIRE(w.numel() == D && z.dim(0) == T && z_col >= 0 && z_col + H * D <= z.dim(1), "gated_rms_norm",
                 "shapes " + x.str() + ", z " + z.str() + " (column " + std::to_string(z_col) + "), w " + w.str());
    bind();
    launch_gated_rms_norm(x.raw(), z.raw(), z.dim(1), z_col, w.raw(), w.dtype(), out.raw(), T, static_cast<int>(H),
                          static_cast<int>(D), eps, stream_);
  }

  void gather_rows(const Tensor& x, const Tensor& indices, const Tensor& out) override {
    CUDA_REQUIRE(indices.dtype() == DType::kI32 && x.ndim() >= 1 && x.dim(0) > 0 && x.dtype() == out.dtype() &&
                     out.nbytes() == static_cast<size_t>(indices.numel()) * (x.nbytes() / x.dim(0)),
                 "gather_rows", x.str() + "[" + indices.str() + "] -> " + out.str());
    need_cuda(x, "gather_rows");
    bind();
    launch_gather_rows(x.raw(), indices.data<int32_t>(), out.raw(), indices.numel(), x.nbytes() / x.dim(0), x.dim(0),
                       kErrGatherIndex, dev_err_, stream_);
  }

  void embedding_slice(const Tensor& ids, const Tensor& table, int64_t begin, const Tensor& out) override {
    CUDA_REQUIRE(ids.dtype() == DType::kI32, "embedding_slice", "ids must be i32, got " + ids.str());
    CUDA_REQUIRE(table.ndim() == 2 && table.dtype() == out.dtype() && out.numel() == ids.numel() * table.dim(1),
                 "embedding_slice", table.str() + "[" + ids.str() + "] -> " + out.str());
    need_cuda(ids, "embedding_slice");
    need_cuda(table, "embedding_slice");
    bind();
    launch_gather_rows(table.raw(), ids.data<int32_t>(), out.raw(), ids.numel(), table.nbytes() / table.dim(0),
                       table.dim(0), kErrTokenId, dev_err_, stream_, begin, /*zero_outside=*/true);
  }

  void sample(const Tensor& logits, const std::vector<SamplingRow>& rows, const Tensor& out) override {
    CUDA_REQUIRE(logits.dtype() == DType::kF32 && logits.ndim() == 2 && out.dtype() == DType::kI32 &&
                     out.numel() == logits.dim(0) && static_cast<int64_t>(rows.size()) == logits.dim(0),
                 "sample", logits.str() + " -> " + out.str());
    need_cuda(logits, "sample");
    need_cuda(out, "sample");
    bind();
    if (rows.empty()) return;
    Tensor dev_rows = scratch({static_cast<int64_t>(rows.size() * sizeof(SamplingRow))}, DType::kU8);
    copy_from_host(dev_rows, rows.data());
    launch_sample(logits.data<float>(), logits.dim(0), logits.dim(1), dev_rows.raw(), out.data<int32_t>(), stream_);
  }

  void argmax(const Tensor& logits, const Tensor& out) override {
    CUDA_REQUIRE(logits.dtype() == DType::kF32 && logits.ndim() == 2 && out.dtype() == DType::kI32 &&
                     out.numel() == logits.dim(0),
                 "argmax", logits.str() + " -> " + out.str());
    need_cuda(logits, "argmax");
    need_cuda(out, "argmax");
    bind();
    const int64_t n = logits.dim(0);
    if (n == 0) return;
    if (greedy_rows_n_ < n) {  // greedy sampling rows kept on the device (grown outside graphs)
      TESSERA_CHECK(!capturing_, "argmax: {} rows while capturing a graph, {} prepared", n, greedy_rows_n_);
      const int64_t rows = std::max<int64_t>(n, 256);
      greedy_rows_ = alloc({rows * static_cast<int64_t>(sizeof(SamplingRow))}, DType::kU8);
      const std::vector<SamplingRow> greedy(static_cast<size_t>(rows));
      copy_from_host(greedy_rows_, greedy.data());
      greedy_rows_n_ = rows;
    }
    launch_sample(logits.data<float>(), n, logits.dim(1), greedy_rows_.raw(), out.data<int32_t>(), stream_);
  }

  void accept_drafts(const Tensor& sampled, const Tensor& tokens, int q, const Tensor& rows) override {
    const int64_t S = rows.numel();
    CUDA_REQUIRE(q >= 1 && sampled.dtype() == DType::kI32 && tokens.dtype() == DType::kI32 &&
                     rows.dtype() == DType::kI32 && sampled.numel() >= S * q && tokens.numel() >= S * q,
                 "accept_drafts", sampled.str() + ", " + tokens.str() + " -> " + rows.str());
    for (const Tensor* t : {&sampled, &tokens, &rows}) need_cuda(*t, "accept_drafts");
    bind();
    launch_accept_drafts(sampled.data<int32_t>(), tokens.data<int32_t>(), static_cast<int>(S), q, rows.data<int32_t>(),
                         stream_);
  }

  void draft_positions(const Tensor& rows, const Tensor& positions, const Tensor& slot_mapping,
                       const Tensor& block_tables, int q, int block_size, int ahead, const Tensor& out_positions,
                       const Tensor& out_slots, const Tensor& out_seq_lens) override {
    const int64_t S = rows.numel();
    CUDA_REQUIRE(q >= 1 && block_size > 0 && block_tables.ndim() == 2 && block_tables.dim(0) >= S &&
                     positions.numel() >= S * q && slot_mapping.numel() >= S * q && out_positions.numel() == S &&
                     out_slots.numel() == S && out_seq_lens.numel() == S,
                 "draft_positions", rows.str() + ", " + positions.str() + ", " + block_tables.str());
    for (const Tensor* t : {&rows, &positions, &slot_mapping, &block_tables, &out_positions, &out_slots, &out_seq_lens})
      need_cuda(*t, "draft_positions");
    bind();
    launch_draft_positions(rows.data<int32_t>(), positions.data<int32_t>(), slot_mapping.data<int32_t>(),
                           block_tables.data<int32_t>(), static_cast<int>(S), q, static_cast<int>(block_tables.dim(1)),
                           block_size, ahead, out_positions.data<int32_t>(), out_slots.data<int32_t>(),
                           out_seq_lens.data<int32_t>(), stream_);
  }

  size_t scratch_in_use() const override { return in_use_; }

  // ---------------------------------------------------------------- graphs
  bool supports_graphs() const override { return true; }

  void begin_capture() override {
    bind();
    TESSERA_CHECK(!capturing_, "begin_capture while already capturing");
    // Relaxed: a first-time cuBLASLt call may allocate on the side; nothing else may.
    TCUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
    capturing_ = true;
    capture_chunks_ = chunks_.size();
  }

  std::unique_ptr<CapturedGraph> end_capture() override {
    bind();
    TESSERA_CHECK(capturing_, "end_capture without begin_capture");
    capturing_ = false;
    cudaGraph_t graph = nullptr;
    cudaError_t err = cudaStreamEndCapture(stream_, &graph);
    if (err != cudaSuccess || !graph) {
      cudaGetLastError();
      if (graph) cudaGraphDestroy(graph);
      fail(ErrorKind::kInternal, "CUDA graph capture failed: {}", cudaGetErrorString(err));
    }
    if (chunks_.size() != capture_chunks_) {
      cudaGraphDestroy(graph);
      fail(ErrorKind::kInternal, "CUDA graph capture: the scratch arena grew while capturing");
    }
    cudaGraphExec_t exec = nullptr;
    err = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    if (err != cudaSuccess) {
      cudaGetLastError();
      fail(ErrorKind::kInternal, "CUDA graph instantiation failed: {}", cudaGetErrorString(err));
    }
    auto g = std::make_unique<Graph>();
    g->exec = exec;
    g->device = index_;
    g->arena = chunks_;  // the graph's pointers stay valid however the arena changes later
    return g;
  }

  void replay(const CapturedGraph& graph) override {
    bind();
    const auto* g = dynamic_cast<const Graph*>(&graph);
    TESSERA_CHECK(g && g->device == index_, "replay of a graph from another backend");
    TCUDA_CHECK(cudaGraphLaunch(g->exec, stream_));
  }

  void cast(const Tensor& src, const Tensor& dst) override {
    CUDA_REQUIRE(src.numel() == dst.numel() && is_float_dtype(src.dtype()) && is_float_dtype(dst.dtype()), "cast",
                 src.str() + " -> " + dst.str());
    need_cuda(src, "cast");
    need_cuda(dst, "cast");
    bind();
    if (src.dtype() == dst.dtype()) {
      copy(dst, src);
      return;
    }
    launch_cast(src.raw(), src.dtype(), dst.raw(), dst.dtype(), src.numel(), stream_);
  }

 private:
  struct Graph final : CapturedGraph {
    cudaGraphExec_t exec = nullptr;
    int device = 0;
    std::vector<Tensor> arena;
    ~Graph() override {
      if (exec) {
        cudaSetDevice(device);
        cudaGraphExecDestroy(exec);
      }
    }
  };
  struct Mark {
    size_t chunks, used, in_use;
  };
  struct Inflight {
    size_t begin, end;
    cudaEvent_t event;
  };

  static bool act(const Tensor& t) { return t.dtype() == DType::kBF16 || t.dtype() == DType::kF32; }
  void need_cuda(const Tensor& t, const char* op) const {
    if (t.numel() > 0 && t.device().type != DeviceType::kCUDA)
      fail(ErrorKind::kInternal, "cuda {}: tensor {} lives on {}, not on the GPU", op, t.str(), t.device().str());
  }
  void need_float(const Tensor& t, const char* op) const {
    need_cuda(t, op);
    CUDA_REQUIRE(is_float_dtype(t.dtype()), op, "expects a float tensor, got " + t.str());
  }

  // Makes this backend's device current on the calling thread.
  void bind() const {
    thread_local int current = -1;
    if (current != index_) {
      TCUDA_CHECK(cudaSetDevice(index_));
      current = index_;
    }
  }

  // A region of the pinned ring that no queued copy still reads.
  char* stage_region(size_t len) {
    if (ring_head_ + len > kUploadRingBytes) ring_head_ = 0;
    size_t b = ring_head_, e = b + len;
    int last = -1;
    for (int i = 0; i < static_cast<int>(inflight_.size()); ++i)
      if (inflight_[i].begin < e && b < inflight_[i].end) last = i;
    if (last >= 0) {
      // Copies complete in stream order: waiting for the last overlapping one frees all before it.
      TCUDA_CHECK(cudaEventSynchronize(inflight_[last].event));
      for (int i = 0; i <= last; ++i) {
        free_events_.push_back(inflight_.front().event);
        inflight_.pop_front();
      }
    }
    ring_head_ = e;
    return upload_ring_ + b;
  }

  void record_inflight(size_t begin, size_t len) {
    cudaEvent_t ev;
    if (free_events_.empty()) {
      TCUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    } else {
      ev = free_events_.back();
      free_events_.pop_back();
    }
    TCUDA_CHECK(cudaEventRecord(ev, stream_));
    inflight_.push_back({begin, begin + len, ev});
    // Retire finished copies so the list stays short.
    while (inflight_.size() > 64 || (!inflight_.empty() && cudaEventQuery(inflight_.front().event) == cudaSuccess)) {
      if (inflight_.size() > 64) TCUDA_CHECK(cudaEventSynchronize(inflight_.front().event));
      free_events_.push_back(inflight_.front().event);
      inflight_.pop_front();
    }
  }

  void check_device_errors() {
    TCUDA_CHECK(cudaMemcpyAsync(host_err_, dev_err_, sizeof(int), cudaMemcpyDeviceToHost, stream_));
    TCUDA_CHECK(cudaStreamSynchronize(stream_));
    if (*host_err_ != kErrNone) {
      int code = *host_err_;
      TCUDA_CHECK(cudaMemsetAsync(dev_err_, 0, sizeof(int), stream_));
      fail(ErrorKind::kInvalidArgument, "CUDA backend: {}", device_error_text(code));
    }
  }

  int index_;
  CudaOptions options_;
  cudaDeviceProp props_{};
  cudaStream_t stream_ = nullptr;
  int* dev_err_ = nullptr;
  static constexpr int64_t kMoeSyncInts = 2 + 16384;  // the fused MoE decode path up to H = 65536
  unsigned* moe_sync_ = nullptr;
  Tensor greedy_rows_;  // argmax: default SamplingRows (temperature 0)
  int64_t greedy_rows_n_ = 0;
  int* host_err_ = nullptr;
  std::unique_ptr<Gemm> gemm_;
  // staging
  char* upload_ring_ = nullptr;
  char* download_ = nullptr;
  size_t ring_head_ = 0;
  std::deque<Inflight> inflight_;
  std::vector<cudaEvent_t> free_events_;
  // scratch arena
  std::vector<Tensor> chunks_;
  size_t used_ = 0, in_use_ = 0, high_water_ = 0, initial_scratch_ = 0;
  std::vector<Mark> marks_;
  bool capturing_ = false;
  // TESSERA_MOE_GEMV=0: the grouped-GEMM (prefill) path of moe_experts at every T (A/B runs).
  bool moe_gemv_ = env_switch("TESSERA_MOE_GEMV", true);
  size_t capture_chunks_ = 0;
};

}  // namespace

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: report none
    return 0;
  }
  return n;
}

namespace {
// Sets *out to the variant of `all` named v, or fails naming `what` and the variants.
template <typename E, size_t N>
void set_variant(std::string_view what, std::string_view v, const E (&all)[N], const char* (*name)(E), E* out) {
  if (!pick_named(v, all, name, out))
    fail(ErrorKind::kInvalidArgument, "{}={} names no variant; use one of: {}", what, v, names_of(all, name));
}

// TESSERA_CUDA_OPTIONS="name=value,...": the CudaOptions members of the table below by name (bools
// as 0 / 1, integers, enums by their variant names), for whole-model A/B runs and for finding which
// kernel choice moves a model's numbers (e.g. chunked_gated_delta=0,fp8_w8a8_min_rows=1000000).
void env_options(CudaOptions& o) {
  const char* e = std::getenv("TESSERA_CUDA_OPTIONS");
  if (!e) return;
  using Setter = std::function<void(const std::string& what, std::string_view v)>;
  auto as_int = [](const std::string& what, std::string_view v) {
    int64_t n = 0;
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
    if (ec != std::errc() || end != v.data() + v.size())
      fail(ErrorKind::kInvalidArgument, "{}={} is not an integer", what, v);
    return n;
  };
  auto flag = [&](bool* out) -> Setter {
    return [=](const std::string& what, std::string_view v) {
      const int64_t n = as_int(what, v);
      if (n != 0 && n != 1) fail(ErrorKind::kInvalidArgument, "{}={} must be 0 or 1", what, v);
      *out = n == 1;
    };
  };
  auto integer = [&](auto* out) -> Setter {
    return [=](const std::string& what, std::string_view v) {
      *out = static_cast<std::remove_pointer_t<decltype(out)>>(as_int(what, v));
    };
  };
  auto variant = [](const auto& all, auto name, auto* out) -> Setter {
    return [&all, name, out](const std::string& what, std::string_view v) { set_variant(what, v, all, name, out); };
  };
  const std::pair<const char*, Setter> fields[] = {
      {"moe_decode", variant(kAllCudaMoeDecode, cuda_moe_decode_name, &o.moe_decode)},
      {"moe_fp8_decode", variant(kAllCudaMoeFp8Decode, cuda_moe_fp8_decode_name, &o.moe_fp8_decode)},
      {"moe_one_token", variant(kAllCudaMoeOneToken, cuda_moe_one_token_name, &o.moe_one_token)},
      {"moe_fp8_one_token", variant(kAllCudaMoeFp8OneToken, cuda_moe_fp8_one_token_name, &o.moe_fp8_one_token)},
      {"moe_prefill_wgmma", flag(&o.moe_prefill_wgmma)},
      {"moe_one_token_shared", flag(&o.moe_one_token_shared)},
      {"fused_decode_attention", flag(&o.fused_decode_attention)},
      {"decode_heads_per_block", integer(&o.decode_heads_per_block)},
      {"decode_early_merge", flag(&o.decode_early_merge)},
      {"decode_attention_max_query", integer(&o.decode_attention_max_query)},
      {"chunked_gated_delta", flag(&o.chunked_gated_delta)},
      {"fp8_gemm_dequant", flag(&o.fp8_gemm_dequant)},
      {"fp8_w8a8_min_rows", integer(&o.fp8_w8a8_min_rows)},
      {"fp8_small_max_weights", integer(&o.fp8_small_max_weights)},
  };
  std::string_view rest(e);
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos)
      fail(ErrorKind::kInvalidArgument, "TESSERA_CUDA_OPTIONS: '{}' is not name=value", item);
    const std::string_view k = item.substr(0, eq);
    const auto* f = std::find_if(std::begin(fields), std::end(fields), [&](const auto& f) { return k == f.first; });
    if (f == std::end(fields)) {
      std::string known;
      for (const auto& [name, set] : fields) known += (known.empty() ? "" : ", ") + std::string(name);
      fail(ErrorKind::kInvalidArgument, "TESSERA_CUDA_OPTIONS: unknown option '{}'; known: {}", k, known);
    }
    f->second("TESSERA_CUDA_OPTIONS: " + std::string(k), item.substr(eq + 1));
  }
}

// Whole-model A/B runs of a kernel variant without a rebuild (the benchmarks set CudaOptions):
// TESSERA_MOE_ONE_TOKEN, TESSERA_MOE_FP8_ONE_TOKEN = a variant's name; TESSERA_CUDA_OPTIONS (above),
// applied after them.
CudaOptions with_env_overrides(CudaOptions o) {
  if (const char* e = std::getenv("TESSERA_MOE_ONE_TOKEN"))
    set_variant("TESSERA_MOE_ONE_TOKEN", e, kAllCudaMoeOneToken, cuda_moe_one_token_name, &o.moe_one_token);
  if (const char* e = std::getenv("TESSERA_MOE_FP8_ONE_TOKEN"))
    set_variant("TESSERA_MOE_FP8_ONE_TOKEN", e, kAllCudaMoeFp8OneToken, cuda_moe_fp8_one_token_name,
                &o.moe_fp8_one_token);
  env_options(o);
  return o;
}
}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int device_index, const CudaOptions& options) {
  return std::make_unique<CudaBackend>(device_index, with_env_overrides(options));
}

void* cuda_backend_stream(Backend& backend) {
  auto* b = dynamic_cast<CudaBackend*>(&backend);
  return b ? static_cast<void*>(b->stream()) : nullptr;
}

}  // namespace tessera
