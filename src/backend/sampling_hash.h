// The counter-based random numbers of the sampling rule (backend/sampling.h): usable from
// host code and from CUDA kernels, so every backend draws the same numbers.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define TESSERA_HD __host__ __device__ __forceinline__
#else
#define TESSERA_HD inline
#endif

namespace tessera {

// SplitMix64's finaliser: a bijective 64-bit mix with good avalanche.
TESSERA_HD uint64_t sampling_mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Row key: one per (seed, position); then one uniform in (0, 1) per token id.
TESSERA_HD uint64_t sampling_row_key(uint64_t seed, uint64_t position) {
  return sampling_mix64(seed ^ sampling_mix64(position + 0x632be59bd9b4e019ull));
}
TESSERA_HD float sampling_uniform(uint64_t row_key, uint32_t id) {
  const uint64_t h = sampling_mix64(row_key + id);
  return (static_cast<float>(h >> 40) + 0.5f) * (1.0f / 16777216.0f);  // 24 bits, never 0 or 1
}

// Orders floats as unsigned integers (larger float -> larger key; -0 < +0).
TESSERA_HD uint32_t sampling_float_key(uint32_t bits) { return (bits & 0x80000000u) ? ~bits : bits | 0x80000000u; }
TESSERA_HD uint32_t sampling_key_bits(uint32_t key) { return (key & 0x80000000u) ? key & 0x7fffffffu : ~key; }

}  // namespace tessera
