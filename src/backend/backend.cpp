#include "backend/backend.h"

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"

#ifdef TESSERA_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace tessera {

void Backend::argmax(const Tensor& logits, const Tensor& out) {
  TESSERA_CHECK(logits.ndim() == 2, "argmax of {}", logits.str());
  sample(logits, std::vector<SamplingRow>(static_cast<size_t>(logits.dim(0))), out);
}

bool cuda_backend_available() {
#ifdef TESSERA_HAVE_CUDA
  return cuda_device_count() > 0;
#else
  return false;
#endif
}

std::unique_ptr<Backend> make_backend(const BackendOptions& opts) {
  if (opts.type == DeviceType::kCPU) return std::make_unique<CpuBackend>(opts.num_threads);
#ifdef TESSERA_HAVE_CUDA
  return make_cuda_backend(opts.device_index);
#else
  fail(ErrorKind::kUnsupported,
       "this tessera build has no CUDA backend; rebuild with -DTESSERA_CUDA=ON (cmake --preset cuda) or run with "
       "--device cpu");
#endif
}

}  // namespace tessera
