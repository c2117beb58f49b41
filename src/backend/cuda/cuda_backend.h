// The CUDA backend's entry points. Everything else of it stays in src/backend/cuda/.
#pragma once
#include <cstddef>
#include <memory>

#include "backend/backend.h"
#include "backend/cuda/cuda_arch.h"
#include "backend/cuda/cuda_options.h"

namespace tessera {

// Number of CUDA devices this process can see (0 when there is no driver or device).
int cuda_device_count();
// The bf16 CUDA backend on device `device_index`, with its architecture row's option defaults
// (cuda_arch.h) and TESSERA_CUDA_OPTIONS over them; throws tessera::Error when the device is
// missing or this build carries no code it can run.
std::unique_ptr<Backend> make_cuda_backend(int device_index);
// The same with these kernel choices (cuda_options.h) instead of the row's defaults;
// TESSERA_CUDA_OPTIONS still applies over them (its arch= profile too).
std::unique_ptr<Backend> make_cuda_backend(int device_index, const CudaOptions& options);
// The cudaStream_t (as void*) a CUDA backend queues its work on, for benchmarks
// that time with CUDA events; nullptr for other backends.
void* cuda_backend_stream(Backend& backend);
// The architecture record a CUDA backend chooses its kernels by; nullptr for other backends.
const CudaArch* cuda_backend_arch(const Backend& backend);

}  // namespace tessera
