// CudaDevice (cuda_device.h): memory, transfers, graphs and error checks of one device.
#include "backend/cuda/cuda_device.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>

#include "backend/cuda/cuda_ops.h"
#include "backend/host_memory.h"
#include "core/logging.h"

namespace tessera::cuda {

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

namespace {

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
      return "the fused MoE decode kernel's grid barrier timed out (not all of its blocks became resident); run with "
             "TESSERA_CUDA_OPTIONS=moe_decode=split and report the GPU model";
    default:
      return "unknown device error";
  }
}

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

}  // namespace

CudaDevice::CudaDevice(int index, CudaArch arch, size_t initial_scratch_bytes)
    : index_(index), arch_(std::move(arch)), initial_scratch_(std::max<size_t>(16 << 20, initial_scratch_bytes)) {
  TCUDA_CHECK(cudaSetDevice(index_));
  if (!arch_.integrated) {  // before this process takes anything: its later use is the growth from here
    size_t total = 0;
    TCUDA_CHECK(cudaMemGetInfo(&free_at_start_, &total));
  }
  TCUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  TCUDA_CHECK(cudaMalloc(&dev_err_, sizeof(int)));
  TCUDA_CHECK(cudaMemsetAsync(dev_err_, 0, sizeof(int), stream_));
  TCUDA_CHECK(cudaMallocHost(&upload_ring_, kUploadRingBytes));
  TCUDA_CHECK(cudaMallocHost(&download_, kDownloadBytes));
  TCUDA_CHECK(cudaMallocHost(&host_err_, sizeof(int)));
  TCUDA_CHECK(cudaStreamSynchronize(stream_));
}

CudaDevice::~CudaDevice() {
  cudaSetDevice(index_);
  cudaStreamSynchronize(stream_);
  for (auto& p : inflight_) cudaEventDestroy(p.event);
  for (auto e : free_events_) cudaEventDestroy(e);
  chunks_.clear();
  cudaFree(dev_err_);
  cudaFreeHost(upload_ring_);
  cudaFreeHost(download_);
  cudaFreeHost(host_err_);
  cudaStreamDestroy(stream_);
}

void CudaDevice::bind() const {
  thread_local int current = -1;
  if (current != index_) {
    TCUDA_CHECK(cudaSetDevice(index_));
    current = index_;
  }
}

// ---------------------------------------------------------------- memory
Tensor CudaDevice::alloc(Shape shape, DType dtype) {
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

Tensor CudaDevice::scratch(Shape shape, DType dtype) {
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

void CudaDevice::reset_scratch() {
  // Merge into one chunk that holds the step's peak. Also when the last step grew the arena
  // only inside a scratch_mark/scratch_rewind span (a layer): the rewind dropped the extra
  // chunk, and without this every layer of every step would cudaMalloc and cudaFree it again
  // (cudaFree synchronizes the device: ~0.5 ms idle per layer in a long prefill).
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
size_t CudaDevice::scratch_mark() {
  marks_.push_back({chunks_.size(), used_, in_use_});
  return marks_.size() - 1;
}

void CudaDevice::scratch_rewind(size_t mark) {
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

// A GPU that shares the host's memory (integrated: DGX Spark's GB10) sizes by the host's
// MemAvailable within its cgroup (device_memory, backend/host_memory.h): cudaMemGetInfo there
// counts the page cache the kernel would give back as used, so a machine that has read a
// checkpoint once would look full.
static DeviceMemory cuda_mem_info(const CudaDevice& d) {
  d.bind();
  size_t f = 0, t = 0;
  TCUDA_CHECK(cudaMemGetInfo(&f, &t));
  return DeviceMemory{f, t};
}

size_t CudaDevice::free_memory() const {
  return device_memory(arch_.integrated, read_host_memory, [this] { return cuda_mem_info(*this); }).free;
}

size_t CudaDevice::total_memory() const {
  return device_memory(arch_.integrated, read_host_memory, [this] { return cuda_mem_info(*this); }).total;
}

// ---------------------------------------------------------------- transfers
void CudaDevice::copy_from_host(const Tensor& dst, const void* src) {
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

void CudaDevice::copy_to_host(void* dst, const Tensor& src) {
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

void CudaDevice::copy(const Tensor& dst, const Tensor& src) {
  CUDA_REQUIRE(dst.nbytes() == src.nbytes(), "copy", dst.str() + " <- " + src.str());
  need_cuda(dst, "copy");
  need_cuda(src, "copy");
  bind();
  if (dst.nbytes() == 0 || dst.raw() == src.raw()) return;
  TCUDA_CHECK(cudaMemcpyAsync(dst.raw(), src.raw(), src.nbytes(), cudaMemcpyDeviceToDevice, stream_));
}

void CudaDevice::synchronize() {
  bind();
  TESSERA_CHECK(!capturing_, "synchronize while capturing a graph");
  TCUDA_CHECK(cudaStreamSynchronize(stream_));
  check_device_errors();
}

// A region of the pinned ring that no queued copy still reads.
char* CudaDevice::stage_region(size_t len) {
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

void CudaDevice::record_inflight(size_t begin, size_t len) {
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

void CudaDevice::check_device_errors() {
  TCUDA_CHECK(cudaMemcpyAsync(host_err_, dev_err_, sizeof(int), cudaMemcpyDeviceToHost, stream_));
  TCUDA_CHECK(cudaStreamSynchronize(stream_));
  if (*host_err_ != kErrNone) {
    int code = *host_err_;
    TCUDA_CHECK(cudaMemsetAsync(dev_err_, 0, sizeof(int), stream_));
    fail(ErrorKind::kInvalidArgument, "CUDA backend: {}", device_error_text(code));
  }
}

// ---------------------------------------------------------------- graphs
void CudaDevice::begin_capture() {
  bind();
  TESSERA_CHECK(!capturing_, "begin_capture while already capturing");
  // Relaxed: a first-time cuBLASLt call may allocate on the side; nothing else may.
  TCUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
  capturing_ = true;
  capture_chunks_ = chunks_.size();
}

std::unique_ptr<CapturedGraph> CudaDevice::end_capture() {
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

void CudaDevice::replay(const CapturedGraph& graph) {
  bind();
  const auto* g = dynamic_cast<const Graph*>(&graph);
  TESSERA_CHECK(g && g->device == index_, "replay of a graph from another backend");
  TCUDA_CHECK(cudaGraphLaunch(g->exec, stream_));
}

// ---------------------------------------------------------------- checks
void CudaDevice::need_cuda(const Tensor& t, const char* op) const {
  if (t.numel() > 0 && t.device().type != DeviceType::kCUDA)
    fail(ErrorKind::kInternal, "cuda {}: tensor {} lives on {}, not on the GPU", op, t.str(), t.device().str());
}

void CudaDevice::need_float(const Tensor& t, const char* op) const {
  need_cuda(t, op);
  CUDA_REQUIRE(is_float_dtype(t.dtype()), op, "expects a float tensor, got " + t.str());
}

}  // namespace tessera::cuda
