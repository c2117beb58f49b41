// Per-row sampling controls (Backend::sample); plain data, also read by CUDA kernels.
#pragma once
#include <cstdint>

namespace tessera {

// One row's sampling controls for Backend::sample. Order as vLLM: temperature, then
// top-k, then top-p over what top-k kept, then min-p; a greedy row takes the argmax.
struct SamplingRow {
  float temperature = 0.0f;  // < 1e-5: greedy (lowest token id among equal maxima)
  int32_t top_k = 0;         // <= 0 or >= vocab: off
  float top_p = 1.0f;        // >= 1: off
  float min_p = 0.0f;        // <= 0: off
  uint64_t seed = 0;         // the draw is a function of (seed, position, token id) only,
  uint64_t position = 0;     // so a request samples the same whatever else is in the batch
};

}  // namespace tessera
