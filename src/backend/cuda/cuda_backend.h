// The CUDA backend's entry points. Everything else of it stays in src/backend/cuda/.
#pragma once
#include <cstddef>
#include <memory>

#include "backend/backend.h"

namespace tessera {

// Number of CUDA devices this process can see (0 when there is no driver or device).
int cuda_device_count();
// Choices that stay configurable for tests and benchmarks; every default is the measured-best
// setting the server runs with.
struct CudaBackendOptions {
  // Decode steps run the attention prologue (q/k norm, RoPE, KV write) inside the decode
  // attention kernel; false: two kernels (the op test compares both).
  bool fused_decode_attention = true;
  // Prefill of the gated delta rule through the chunked tensor-core kernel where the head
  // dims allow; false: the recurrent kernel, token by token.
  bool chunked_gated_delta = true;
  // FP8 linear layers above the GEMV size through a dequantised bf16 weight copy instead of
  // cuBLASLt's block-scaled FP8 GEMM (the fallback where that has no algorithm).
  bool fp8_gemm_dequant = false;
  // The scratch arena's first chunk (it grows on demand); at least 16.
  size_t initial_scratch_mib = 256;
};

// The bf16 CUDA backend on device `device_index`; throws tessera::Error when the
// device is missing or too old (needs compute capability 9.0 for this build).
std::unique_ptr<Backend> make_cuda_backend(int device_index, const CudaBackendOptions& options = {});
// The cudaStream_t (as void*) a CUDA backend queues its work on, for benchmarks
// that time with CUDA events; nullptr for other backends.
void* cuda_backend_stream(Backend& backend);

}  // namespace tessera
