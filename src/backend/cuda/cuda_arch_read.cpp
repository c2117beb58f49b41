// The architecture record of a device: its facts (cuda_facts.cpp) checked against the binary and the profile.
#include <cuda_runtime.h>

#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_facts.h"
#include "backend/cuda/cuda_ops.h"

namespace tessera::cuda {

CudaArch read_cuda_arch(int index, std::string_view profile) {
  const CudaDeviceFacts facts = read_cuda_device_facts(index);
  // A GPU this binary has no code for fails here, with its name, instead of at a launch later.
  const CudaBinaryMatch match = cuda_binary_support(cuda_built_architectures(), facts.major, facts.minor);
  if (match.support == CudaBinarySupport::kNone)
    fail(ErrorKind::kUnsupported,
         "CUDA device {} ({}, compute capability {}.{}) cannot run this build's kernels, which carry {}; rebuild with "
         "-DCMAKE_CUDA_ARCHITECTURES including {}{}-real (docs/cuda.md \"Architectures\")",
         index, facts.name, facts.major, facts.minor, describe_cuda_architectures(cuda_built_architectures()),
         facts.major * 10 + facts.minor, facts.major >= 9 ? "a" : "");
  if (facts.major < 8)
    fail(ErrorKind::kUnsupported,
         "CUDA device {} ({}) has compute capability {}.{}; tessera's kernels need 8.0 or newer (bf16 tensor cores)",
         index, facts.name, facts.major, facts.minor);
  CudaArch arch = profile_cuda_arch(facts, profile);
  // wgmma lives only in sm_90a code; the PTX and plain-cubin builds compile those kernels empty.
  if (!match.arch_specific) arch.wgmma = false;
  return arch;
}

}  // namespace tessera::cuda
