#include "core/dtype.h"

#include <cmath>
#include <string>

#include "core/error.h"

namespace tessera {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kBF16:
    case DType::kF16:
      return 2;
    case DType::kF8E4M3:
    case DType::kF8E5M2:
    case DType::kU8:
      return 1;
    case DType::kI64:
      return 8;
  }
  return 0;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kF8E4M3:
      return "fp8_e4m3";
    case DType::kF8E5M2:
      return "fp8_e5m2";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
    case DType::kU8:
      return "u8";
  }
  return "?";
}

std::optional<DType> dtype_from_safetensors(std::string_view s) {
  if (s == "F32") return DType::kF32;
  if (s == "BF16") return DType::kBF16;
  if (s == "F16") return DType::kF16;
  if (s == "F8_E4M3") return DType::kF8E4M3;
  if (s == "F8_E5M2") return DType::kF8E5M2;
  if (s == "I32") return DType::kI32;
  if (s == "I64") return DType::kI64;
  if (s == "U8") return DType::kU8;
  return std::nullopt;
}

std::optional<DType> dtype_from_name(std::string_view s) {
  if (s == "float32" || s == "f32" || s == "fp32" || s == "float") return DType::kF32;
  if (s == "bfloat16" || s == "bf16") return DType::kBF16;
  if (s == "float16" || s == "f16" || s == "fp16" || s == "half") return DType::kF16;
  if (s == "fp8" || s == "fp8_e4m3" || s == "float8_e4m3fn") return DType::kF8E4M3;
  if (s == "fp8_e5m2" || s == "float8_e5m2") return DType::kF8E5M2;
  return std::nullopt;
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  float v;
  if (exp == 0)
    v = std::ldexp(static_cast<float>(man), -24);
  else if (exp == 31)
    v = man ? NAN : INFINITY;
  else
    v = std::ldexp(static_cast<float>(man | 0x400), static_cast<int>(exp) - 25);
  return sign ? -v : v;
}

uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  int32_t exp = static_cast<int32_t>((x >> 23) & 0xff) - 127 + 15;
  uint32_t man = x & 0x7fffff;
  if (((x >> 23) & 0xff) == 0xff) return static_cast<uint16_t>(sign | 0x7c00 | (man ? 0x200 : 0));
  if (exp >= 31) return static_cast<uint16_t>(sign | 0x7c00);
  if (exp <= 0) {
    if (exp < -10) return static_cast<uint16_t>(sign);
    man |= 0x800000;
    uint32_t shift = static_cast<uint32_t>(14 - exp);
    uint32_t half = man >> shift;
    uint32_t rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = sign | (static_cast<uint32_t>(exp) << 10) | (man >> 13);
  uint32_t rem = man & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) ++half;
  return static_cast<uint16_t>(half);
}

// e4m3fn: bias 7, no infinities, 0x7f/0xff are NaN, max 448.
float fp8e4m3_to_f32(uint8_t v) {
  uint32_t sign = v >> 7, exp = (v >> 3) & 0xf, man = v & 7;
  float r;
  if (exp == 0xf && man == 7) return NAN;
  if (exp == 0)
    r = std::ldexp(static_cast<float>(man), -9);
  else
    r = std::ldexp(static_cast<float>(man | 8), static_cast<int>(exp) - 10);
  return sign ? -r : r;
}

namespace {
// Generic round-to-nearest-even encoder for small floats with `mbits` mantissa bits.
uint8_t encode_small_float(float f, int ebits, int mbits, int bias, float max_val, bool has_inf) {
  uint8_t sign = std::signbit(f) ? 0x80 : 0;
  if (std::isnan(f)) return 0x7f;  // a NaN code in both e4m3fn and e5m2
  float a = std::fabs(f);
  if (a >= max_val) {  // saturate
    a = max_val;
  }
  if (a == 0) return sign;
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5,1)
  int exp_field = e - 1 + bias;
  float scaled;
  if (exp_field <= 0) {  // subnormal
    scaled = std::ldexp(a, bias - 1 + mbits);
    exp_field = 0;
  } else {
    scaled = std::ldexp(a, -(e - 1) + mbits) - static_cast<float>(1 << mbits);
  }
  float rounded = std::nearbyint(scaled);  // default rounding mode: nearest even
  int man = static_cast<int>(rounded);
  if (man >= (1 << mbits)) {
    man -= (1 << mbits);
    ++exp_field;
    if (exp_field == 0) exp_field = 1;
  }
  if (exp_field == 0 && man == (1 << mbits)) {
    exp_field = 1;
    man = 0;
  }
  (void)ebits;
  return static_cast<uint8_t>(sign | (exp_field << mbits) | man);
}
}  // namespace

uint8_t f32_to_fp8e4m3(float f) { return encode_small_float(f, 4, 3, 7, 448.0f, false); }

float fp8e5m2_to_f32(uint8_t v) { return f16_to_f32(static_cast<uint16_t>(v) << 8); }
uint8_t f32_to_fp8e5m2(float f) {
  if (std::isnan(f)) return 0x7f;
  // e5m2 has infinities: an infinite input stays infinite; finite overflow saturates.
  if (std::isinf(f)) return f < 0 ? 0xfc : 0x7c;
  return encode_small_float(f, 5, 2, 15, 57344.0f, true);
}

namespace {
// Element access through memcpy: buffers may be unaligned (a safetensors data section
// starts wherever the header ends), and compilers turn these into plain loads.
template <typename T>
T load_as(const void* base, size_t i) {
  T v;
  std::memcpy(&v, static_cast<const char*>(base) + i * sizeof(T), sizeof(T));
  return v;
}
template <typename T>
void store_as(void* base, size_t i, T v) {
  std::memcpy(static_cast<char*>(base) + i * sizeof(T), &v, sizeof(T));
}

float load_one(const void* src, DType t, size_t i) {
  switch (t) {
    case DType::kF32:
      return load_as<float>(src, i);
    case DType::kBF16:
      return bf16_to_f32(load_as<uint16_t>(src, i));
    case DType::kF16:
      return f16_to_f32(load_as<uint16_t>(src, i));
    case DType::kF8E4M3:
      return fp8e4m3_to_f32(load_as<uint8_t>(src, i));
    case DType::kF8E5M2:
      return fp8e5m2_to_f32(load_as<uint8_t>(src, i));
    case DType::kI32:
      return static_cast<float>(load_as<int32_t>(src, i));
    case DType::kI64:
      return static_cast<float>(load_as<int64_t>(src, i));
    case DType::kU8:
      return static_cast<float>(load_as<uint8_t>(src, i));
  }
  return 0;
}
void store_one(void* dst, DType t, size_t i, float v) {
  switch (t) {
    case DType::kF32:
      store_as<float>(dst, i, v);
      return;
    case DType::kBF16:
      store_as<uint16_t>(dst, i, f32_to_bf16(v));
      return;
    case DType::kF16:
      store_as<uint16_t>(dst, i, f32_to_f16(v));
      return;
    case DType::kF8E4M3:
      store_as<uint8_t>(dst, i, f32_to_fp8e4m3(v));
      return;
    case DType::kF8E5M2:
      store_as<uint8_t>(dst, i, f32_to_fp8e5m2(v));
      return;
    default:
      fail(ErrorKind::kUnsupported, "cannot convert to {}", dtype_name(t));
  }
}
}  // namespace

void convert_host(const void* src, DType src_type, void* dst, DType dst_type, size_t n) {
  if (n == 0) return;  // src/dst may be null for empty vectors
  if (src_type == dst_type) {
    std::memcpy(dst, src, n * dtype_size(src_type));
    return;
  }
  if (src_type == DType::kBF16 && dst_type == DType::kF32) {
    for (size_t i = 0; i < n; ++i) store_as<float>(dst, i, bf16_to_f32(load_as<uint16_t>(src, i)));
    return;
  }
  for (size_t i = 0; i < n; ++i) store_one(dst, dst_type, i, load_one(src, src_type, i));
}

namespace {

// (memcpy: safetensors data may be unaligned.)
template <typename Bits>
size_t count_exponent_all_ones(const void* data, size_t n, Bits exponent) {
  const char* p = static_cast<const char*>(data);
  size_t c = 0;
  for (size_t i = 0; i < n; ++i) {
    Bits b;
    std::memcpy(&b, p + i * sizeof(Bits), sizeof(Bits));
    c += (b & exponent) == exponent;
  }
  return c;
}

}  // namespace

size_t count_nonfinite_host(const void* data, DType t, size_t n) {
  switch (t) {
    case DType::kF32:
      return count_exponent_all_ones<uint32_t>(data, n, 0x7f800000u);
    case DType::kBF16:
      return count_exponent_all_ones<uint16_t>(data, n, 0x7f80u);
    case DType::kF16:
      return count_exponent_all_ones<uint16_t>(data, n, 0x7c00u);
    case DType::kF8E5M2:
      return count_exponent_all_ones<uint8_t>(data, n, 0x7cu);
    case DType::kF8E4M3:
      return count_exponent_all_ones<uint8_t>(data, n, 0x7fu);
    case DType::kI32:
    case DType::kI64:
    case DType::kU8:
      break;
  }
  return 0;
}

}  // namespace tessera
