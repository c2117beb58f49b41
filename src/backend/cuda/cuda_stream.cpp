#include "backend/cuda/cuda_stream.h"

#include <cuda_runtime.h>

#include "core/error.h"

namespace tessera::cuda {

namespace {
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail(ErrorKind::kInternal, "{}: {}", what, cudaGetErrorString(e));
}
}  // namespace

StreamHandle create_stream() {
  cudaStream_t s = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  return s;
}

void destroy_stream(StreamHandle s) noexcept {
  if (s) cudaStreamDestroy(s);
}

EventHandle create_event() {
  cudaEvent_t e = nullptr;
  check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  return e;
}

void destroy_event(EventHandle e) noexcept {
  if (e) cudaEventDestroy(e);
}

std::string record_event(EventHandle e, StreamHandle s) {
  cudaError_t r = cudaEventRecord(e, s);
  return r == cudaSuccess ? std::string() : std::string("cudaEventRecord: ") + cudaGetErrorString(r);
}

EventQuery query_event(EventHandle e) {
  cudaError_t q = cudaEventQuery(e);
  if (q == cudaSuccess) return {EventState::kDone, {}};
  if (q == cudaErrorNotReady) return {EventState::kPending, {}};
  return {EventState::kFailed, cudaGetErrorString(q)};
}

bool stream_is_capturing(StreamHandle s) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(s, &capture) != cudaSuccess || capture != cudaStreamCaptureStatusNone;
}

void* device_alloc(size_t bytes) {
  void* p = nullptr;
  check(cudaMalloc(&p, bytes), "cudaMalloc");
  return p;
}

void device_free(void* p) noexcept {
  if (p) cudaFree(p);
}

bool copy_device_async(void* dst, const void* src, size_t bytes, StreamHandle s) {
  return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s) == cudaSuccess;
}

void set_device(int index) { check(cudaSetDevice(index), "cudaSetDevice"); }

bool try_set_device(int index) noexcept { return cudaSetDevice(index) == cudaSuccess; }

void relax_capture_mode_for_this_thread() noexcept {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
}

}  // namespace tessera::cuda
