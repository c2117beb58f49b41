// The CUDA backend's entry points. Everything else of it stays in src/backend/cuda/.
#pragma once
#include <cstddef>
#include <memory>

#include "backend/backend.h"
#include "backend/cuda/cuda_options.h"

namespace tessera {

// Number of CUDA devices this process can see (0 when there is no driver or device).
int cuda_device_count();
// The bf16 CUDA backend on device `device_index`; throws tessera::Error when the
// device is missing or too old (needs compute capability 9.0 for this build). `options`
// selects kernel variants (cuda_options.h; the defaults are the production choice).
std::unique_ptr<Backend> make_cuda_backend(int device_index, const CudaOptions& options = {});
// The cudaStream_t (as void*) a CUDA backend queues its work on, for benchmarks
// that time with CUDA events; nullptr for other backends.
void* cuda_backend_stream(Backend& backend);

}  // namespace tessera
