#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace tessera {

enum class DType : uint8_t { kF32, kBF16, kF16, kF8E4M3, kF8E5M2, kI32, kI64, kU8 };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);  // "f32", "bf16", ...
// Safetensors spells dtypes "F32", "BF16", "F8_E4M3"...; nullopt for ones we do not handle.
std::optional<DType> dtype_from_safetensors(std::string_view s);
std::optional<DType> dtype_from_name(std::string_view s);  // "bfloat16", "bf16", "float32", "fp8"...

// Scalar conversions. bf16/f16/fp8 are stored as raw bits.
inline float bf16_to_f32(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t f32_to_bf16(float f) {  // round to nearest even, NaN kept quiet
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
float fp8e4m3_to_f32(uint8_t v);
uint8_t f32_to_fp8e4m3(float f);  // saturating to +-448
float fp8e5m2_to_f32(uint8_t v);
uint8_t f32_to_fp8e5m2(float f);  // finite values saturate to +-57344; +-inf stays inf

// Converts n elements between any two float-like dtypes (f32, bf16, f16, fp8) on the host.
void convert_host(const void* src, DType src_type, void* dst, DType dst_type, size_t n);

// How many of n host elements of type t are NaN or +-inf, read from the bits (no compiler flag
// can fold the test away; data may be unaligned); 0 for the integer dtypes. E4M3 has no inf:
// its NaN is S.1111.111.
size_t count_nonfinite_host(const void* data, DType t, size_t n);

}  // namespace tessera
