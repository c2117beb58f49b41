// The one place the CUDA backend reads the driver's device properties (cuda_facts.h).
#include "backend/cuda/cuda_facts.h"

#include <cuda_runtime.h>

#include "core/error.h"

namespace tessera::cuda {

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail(ErrorKind::kInternal, "{}: {}", what, cudaGetErrorString(e));
}

}  // namespace

CudaDeviceFacts read_cuda_device_facts(int index) {
  int count = 0;
  check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  if (index < 0 || index >= count)
    fail(ErrorKind::kInvalidArgument, "CUDA device {} does not exist: this machine shows {} device(s)", index, count);
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, index), "cudaGetDeviceProperties");
  CudaDeviceFacts f;
  f.name = p.name;
  f.major = p.major;
  f.minor = p.minor;
  f.sms = p.multiProcessorCount;
  f.smem_per_block_optin = p.sharedMemPerBlockOptin;
  f.smem_per_sm = p.sharedMemPerMultiprocessor;
  f.max_threads_per_sm = p.maxThreadsPerMultiProcessor;
  f.total_memory = p.totalGlobalMem;
  f.integrated = p.integrated != 0;
  return f;
}

}  // namespace tessera::cuda
