// The CUDA backend's entry points. Everything else of it stays in src/backend/cuda/.
#pragma once
#include <cstddef>
#include <memory>

#include "backend/backend.h"
#include "backend/cuda/cuda_arch.h"
#include "backend/cuda/cuda_options.h"
#include "backend/devices.h"

namespace tessera {

// cuda_device_count, make_cuda_backend(int) and cuda_backend_stream: backend/devices.h.
// make_cuda_backend with these kernel choices (cuda_options.h) instead of the row's defaults;
// TESSERA_CUDA_OPTIONS still applies over them (its arch= profile too).
std::unique_ptr<Backend> make_cuda_backend(int device_index, const CudaOptions& options);
// The architecture record a CUDA backend chooses its kernels by; nullptr for other backends.
const CudaArch* cuda_backend_arch(const Backend& backend);

}  // namespace tessera
