// What the driver reports of a CUDA device, read once per use here and nowhere else in the
// backend (cuda_arch.h: the record and the table built from these facts). Its own small library
// (tessera_cuda_facts), so that the custom all-reduce links it without the backend.
#pragma once
#include "backend/cuda/cuda_arch.h"

namespace tessera::cuda {

// Throws Error(kInvalidArgument) for a device that does not exist and Error(kInternal) naming
// the driver's error otherwise.
CudaDeviceFacts read_cuda_device_facts(int index);

}  // namespace tessera::cuda
