// One CUDA device as the op families see it: its architecture record, one stream, the memory
// (persistent allocations and the per-step scratch arena), host transfers through a pinned
// staging ring, graph capture and replay, and the device error flag. The op families
// (cuda_linear.cpp, cuda_attention.cpp, cuda_moe.cpp, ...) take it by reference and queue their
// kernels on its stream; CudaBackend forwards the Backend interface to them. Host code only.
//
// Memory: `alloc` is one cudaMalloc per persistent buffer (weights, KV cache); `scratch` bumps
// through an arena that grows only while it is too small (the first, profiling steps) and is
// merged into one block at reset_scratch, so a steady step loop never calls the allocator.
// Host->device copies go through a pinned staging ring (the caller's buffer is free again on
// return, and copies overlap the memcpy into the ring); kernels that meet bad input raise the
// device flag, which synchronize() turns into an Error.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_arch.h"
#include "backend/cuda/cuda_facts.h"
#include "core/error.h"
#include "core/tensor.h"

namespace tessera::cuda {

// Shape and dtype checks run on every op: the message (which formats tensors) is built only
// when the check fails, so a passing check costs a comparison.
#define CUDA_REQUIRE(cond, op, what)                                             \
  do {                                                                           \
    if (!(cond)) ::tessera::fail(ErrorKind::kInternal, "cuda {}: {}", op, what); \
  } while (0)

// bf16 or f32: the dtypes activations and norm weights may have.
inline bool act(const Tensor& t) { return t.dtype() == DType::kBF16 || t.dtype() == DType::kF32; }

class CudaDevice {
 public:
  CudaDevice(int index, CudaArch arch, size_t initial_scratch_bytes);
  ~CudaDevice();
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  int index() const { return index_; }
  const CudaArch& arch() const { return arch_; }
  cudaStream_t stream() const { return stream_; }
  int* error_flag() const { return dev_err_; }
  Device device() const { return {DeviceType::kCUDA, index_}; }
  // Makes this device current on the calling thread.
  void bind() const;

  // ---- memory
  Tensor alloc(Shape shape, DType dtype);
  Tensor scratch(Shape shape, DType dtype);
  void reset_scratch();
  size_t scratch_mark();
  void scratch_rewind(size_t mark);
  size_t scratch_in_use() const { return in_use_; }
  size_t free_memory() const;
  size_t total_memory() const;
  // cudaMemGetInfo's free memory when this device was opened (its context made, before this
  // object's first allocation); 0 on a GPU that shares the host's memory (Backend's contract).
  size_t free_memory_at_start() const { return free_at_start_; }

  // ---- transfers
  void copy_from_host(const Tensor& dst, const void* src);
  void copy_to_host(void* dst, const Tensor& src);
  void copy(const Tensor& dst, const Tensor& src);
  void synchronize();

  // ---- graphs (Backend's contract)
  bool capturing() const { return capturing_; }
  void begin_capture();
  std::unique_ptr<CapturedGraph> end_capture();
  void replay(const CapturedGraph& graph);

  // ---- checks
  void need_cuda(const Tensor& t, const char* op) const;
  void need_float(const Tensor& t, const char* op) const;

 private:
  struct Mark {
    size_t chunks, used, in_use;
  };
  struct Inflight {
    size_t begin, end;
    cudaEvent_t event;
  };
  char* stage_region(size_t len);
  void record_inflight(size_t begin, size_t len);
  void check_device_errors();

  int index_;
  CudaArch arch_;
  cudaStream_t stream_ = nullptr;
  int* dev_err_ = nullptr;
  int* host_err_ = nullptr;
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
  size_t capture_chunks_ = 0;
  size_t free_at_start_ = 0;
};

// The record of device `index` (its facts from read_cuda_device_facts, cuda_facts.h: the only
// reader of cudaDeviceProp) under a profile ("" = the device's own row).
CudaArch read_cuda_arch(int index, std::string_view profile);

}  // namespace tessera::cuda
