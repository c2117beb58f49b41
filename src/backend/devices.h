// What this build and this machine offer beyond the Backend interface, for the layers above the
// backends (the CLI, the distributed layer, the doctor): the CUDA devices a process can see, the
// CUDA backend's factory and stream, and which GPU architectures the binary's CUDA code carries.
// The CUDA backend defines the device functions; a build without it defines them in backend.cpp
// (no devices, no backend). Only src/backend/cuda/ includes the CUDA backend's own headers.
#pragma once
#include <memory>
#include <string>
#include <string_view>

namespace tessera {

class Backend;

// Number of CUDA devices this process can see (0 when there is no driver or device, or the build
// has no CUDA backend).
int cuda_device_count();
// The bf16 CUDA backend on device `device_index`, with its architecture row's option defaults and
// TESSERA_CUDA_OPTIONS over them; throws tessera::Error when the device is missing or this build
// carries no code it can run (or no CUDA backend at all).
std::unique_ptr<Backend> make_cuda_backend(int device_index);
// The cudaStream_t (as void*) a CUDA backend queues its work on, for communicators that queue on
// it and benchmarks that time with CUDA events; nullptr for other backends.
void* cuda_backend_stream(Backend& backend);

// How a binary whose CUDA code was built for `archs` (CMake's CUDA_ARCHITECTURES list, e.g.
// "90a-real;120a-real;121a-real;120-virtual") runs on a device of compute capability
// major.minor: a cubin for it (native), PTX it can compile at first start (jit), or neither.
enum class CudaBinarySupport { kNative, kJit, kNone };
struct CudaBinaryMatch {
  CudaBinarySupport support = CudaBinarySupport::kNone;
  std::string detail;  // "sm_90a cubin", "compute_120 PTX, compiled by the driver at first start"
  // The code that runs is an architecture-specific ("a") cubin for this device: only such code
  // holds wgmma (a PTX or plain sm_90 build compiles the wgmma kernels empty).
  bool arch_specific = false;
};
CudaBinaryMatch cuda_binary_support(std::string_view archs, int major, int minor);
// The architectures this binary's CUDA code carries, as built ("" in a build without CUDA).
std::string_view cuda_built_architectures();
// "sm_90a, sm_120a, sm_121a cubins; compute_120 PTX" for --version and the doctor.
std::string describe_cuda_architectures(std::string_view archs);

}  // namespace tessera
