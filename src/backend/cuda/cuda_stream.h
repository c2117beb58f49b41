// Streams, events and device buffers for code outside the backend that enqueues work on a
// CUDA stream: the NCCL communicator (distributed/nccl_communicator.cpp) records an event after
// each call and polls it from its watchdog. No CUDA type appears here (CUstream_st* is what
// cudaStream_t and NCCL's stream argument are), so the distributed layer includes no CUDA
// header of its own. Its own small library (tessera_cuda_stream) on core and cudart.
#pragma once
#include <cstddef>
#include <string>

struct CUstream_st;
struct CUevent_st;

namespace tessera::cuda {

using StreamHandle = CUstream_st*;
using EventHandle = CUevent_st*;

// A non-blocking stream of the current device. Throws Error(kInternal) naming CUDA's error.
StreamHandle create_stream();
void destroy_stream(StreamHandle s) noexcept;

// An event without timing. Throws Error(kInternal) naming CUDA's error.
EventHandle create_event();
void destroy_event(EventHandle e) noexcept;

// Records `e` on `s`; the error text, empty on success.
std::string record_event(EventHandle e, StreamHandle s);

enum class EventState { kDone, kPending, kFailed };
struct EventQuery {
  EventState state = EventState::kDone;
  std::string error;  // kFailed: CUDA's error text
};
EventQuery query_event(EventHandle e);

// Whether `s` is being captured into a graph (true also when CUDA cannot say).
bool stream_is_capturing(StreamHandle s);

// Device memory of the current device. Throws Error(kInternal) naming CUDA's error.
void* device_alloc(size_t bytes);
void device_free(void* p) noexcept;

// An asynchronous device-to-device copy on `s`; false when CUDA refused it.
bool copy_device_async(void* dst, const void* src, size_t bytes, StreamHandle s);

// Makes `index` the calling thread's device. Throws Error(kInternal) naming CUDA's error.
void set_device(int index);
// The same without throwing: whether it succeeded.
bool try_set_device(int index) noexcept;

// Lets the calling thread query events while another thread captures a graph (the relaxed
// capture mode: a query from a thread in the global mode would invalidate that capture).
void relax_capture_mode_for_this_thread() noexcept;

}  // namespace tessera::cuda
