// Scalar dtype conversions against known bit patterns and an independent reference:
// for fp8 the reference enumerates every code and picks the nearest (ties to the even
// code), for f16 the compiler's _Float16 (aarch64: __fp16) where it exists.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace tessera {
namespace {

uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }
float from_bits(uint32_t u) { return std::bit_cast<float>(u); }

std::mt19937_64& rng() {
  static std::mt19937_64 g(std::random_device{}());
  return g;
}

// A random float with a random exponent: covers subnormals, normals, huge values, inf, NaN.
float random_float_bits() { return from_bits(static_cast<uint32_t>(rng()())); }

// ---------------- bf16 ----------------

TEST(DTypeBF16, KnownPatterns) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_bf16(0.0f), 0x0000);
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_bf16(INFINITY), 0x7f80);
  EXPECT_EQ(f32_to_bf16(-INFINITY), 0xff80);
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  EXPECT_EQ(bf16_to_f32(0x4049), 3.140625f);
  EXPECT_EQ(f32_to_bf16(3.14159265f), 0x4049);
}

TEST(DTypeBF16, RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808000)), 0x3f80);  // tie, 0x3f80 is even: down
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f818000)), 0x3f82);  // tie, 0x3f81 is odd: up
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808001)), 0x3f81);  // above the tie: up
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f807fff)), 0x3f80);  // below the tie: down
  EXPECT_EQ(f32_to_bf16(from_bits(0xbf818000)), 0xbf82);  // sign does not matter
  EXPECT_EQ(f32_to_bf16(from_bits(0x7f7fffff)), 0x7f80);  // FLT_MAX rounds to inf
  EXPECT_EQ(f32_to_bf16(from_bits(0x7f7f7fff)), 0x7f7f);  // largest that stays finite
}

TEST(DTypeBF16, Subnormals) {
  EXPECT_EQ(f32_to_bf16(from_bits(0x00010000)), 0x0001);
  EXPECT_EQ(f32_to_bf16(from_bits(0x00008000)), 0x0000);  // tie to even
  EXPECT_EQ(f32_to_bf16(from_bits(0x00018000)), 0x0002);  // tie to even
  EXPECT_EQ(f32_to_bf16(from_bits(0x00000001)), 0x0000);
  EXPECT_EQ(bits(bf16_to_f32(0x0001)), 0x00010000u);
}

TEST(DTypeBF16, NaNStaysNaN) {
  for (uint32_t u : {0x7fc00000u, 0x7f800001u, 0x7f80ffffu, 0xff800001u, 0x7fffffffu}) {
    uint16_t b = f32_to_bf16(from_bits(u));
    EXPECT_TRUE(std::isnan(bf16_to_f32(b))) << std::hex << u << " -> " << b;  // no truncation to inf
    EXPECT_EQ(b >> 15, u >> 31) << "sign kept";
  }
}

TEST(DTypeBF16, EveryPatternRoundTrips) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    float f = bf16_to_f32(static_cast<uint16_t>(b));
    EXPECT_EQ(bits(f), b << 16);
    if (std::isnan(f))
      EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(f))));
    else
      ASSERT_EQ(f32_to_bf16(f), b) << std::hex << b;
  }
}

TEST(DTypeBF16, RandomAgainstDoubleReference) {
  // Nearest of the two bf16 neighbours, ties to even, computed in double.
  for (int i = 0; i < 200000; ++i) {
    float f = random_float_bits();
    if (std::isnan(f) || std::isinf(f)) continue;
    uint32_t u = bits(f);
    uint16_t lo = static_cast<uint16_t>(u >> 16), hi = static_cast<uint16_t>(lo + 1);
    // IEEE overflow: round as if the exponent were unbounded (inf's slot is worth 2^128).
    auto value = [](uint16_t b) {
      return (b & 0x7fff) == 0x7f80 ? std::copysign(0x1p128, bf16_to_f32(b)) : static_cast<double>(bf16_to_f32(b));
    };
    double dl = std::fabs(static_cast<double>(f) - value(lo));
    double dh = std::fabs(static_cast<double>(f) - value(hi));
    uint16_t want = (dl < dh || (dl == dh && !(lo & 1))) ? lo : hi;
    ASSERT_EQ(f32_to_bf16(f), want) << std::hex << u;
  }
}

// ---------------- f16 ----------------

TEST(DTypeF16, KnownPatterns) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_f16(0.5f), 0x3800);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16(INFINITY), 0x7c00);
  EXPECT_EQ(f32_to_f16(-INFINITY), 0xfc00);
  EXPECT_EQ(f32_to_f16(0x1p-14f), 0x0400);  // smallest normal
  EXPECT_EQ(f16_to_f32(0x3555), 0.333251953125f);
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(f16_to_f32(0x0001), 0x1p-24f);
  EXPECT_EQ(f16_to_f32(0x03ff), 1023 * 0x1p-24f);
  EXPECT_TRUE(std::isinf(f16_to_f32(0x7c00)));
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7e00)));
  EXPECT_TRUE(std::isnan(f16_to_f32(0xfc01)));
}

TEST(DTypeF16, RoundsToNearestEvenAndOverflows) {
  EXPECT_EQ(f32_to_f16(1.0f + 0x1p-11f), 0x3c00);      // tie: even
  EXPECT_EQ(f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);  // tie: even (up)
  EXPECT_EQ(f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // tie between 65504 and 2^16: inf
  EXPECT_EQ(f32_to_f16(1e6f), 0x7c00);
  EXPECT_EQ(f32_to_f16(-1e6f), 0xfc00);
}

TEST(DTypeF16, Subnormals) {
  EXPECT_EQ(f32_to_f16(0x1p-24f), 0x0001);
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);            // tie to even: zero
  EXPECT_EQ(f32_to_f16(0x1.8p-25f), 0x0001);          // above the tie
  EXPECT_EQ(f32_to_f16(3 * 0x1p-25f), 0x0002);        // 1.5 ulp: tie to even
  EXPECT_EQ(f32_to_f16(1023.5f * 0x1p-24f), 0x0400);  // largest subnormal + half: up to the smallest normal
  EXPECT_EQ(f32_to_f16(0x1p-26f), 0x0000);
  EXPECT_EQ(f32_to_f16(-0x1p-24f), 0x8001);
  EXPECT_EQ(f32_to_f16(from_bits(1)), 0x0000);  // f32 subnormal
}

TEST(DTypeF16, NaNStaysNaN) {
  for (uint32_t u : {0x7fc00000u, 0x7f800001u, 0xffc00000u, 0x7f802000u}) {
    uint16_t h = f32_to_f16(from_bits(u));
    EXPECT_TRUE(std::isnan(f16_to_f32(h))) << std::hex << u << " -> " << h;
  }
}

TEST(DTypeF16, EveryPatternRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_f16(f), h) << std::hex << h;
  }
}

// The compiler's IEEE binary16: _Float16, which GCC 12 has in C++ on x86-64 but not on aarch64
// (it defines __FLT16_MAX__ there all the same); there ACLE's __fp16 stands in, the same format
// with the same round-to-nearest-even conversions.
#if defined(__aarch64__) && defined(__ARM_FP16_FORMAT_IEEE)
#define TESSERA_COMPILER_HALF __fp16
#elif defined(__FLT16_MAX__)
#define TESSERA_COMPILER_HALF _Float16
#endif

#ifdef TESSERA_COMPILER_HALF
TEST(DTypeF16, RandomAgainstCompilerFloat16) {
  for (int i = 0; i < 300000; ++i) {
    float f = random_float_bits();
    if (i % 3 == 0) f = std::ldexp(static_cast<float>(rng()() % 4096), static_cast<int>(rng()() % 40) - 38);
    if (std::isnan(f)) continue;
    const TESSERA_COMPILER_HALF want = static_cast<TESSERA_COMPILER_HALF>(f);
    ASSERT_EQ(f32_to_f16(f), std::bit_cast<uint16_t>(want)) << std::hex << bits(f);
    ASSERT_EQ(bits(f16_to_f32(std::bit_cast<uint16_t>(want))), bits(static_cast<float>(want)));
  }
}
#endif

// ---------------- fp8 ----------------

// Value of an fp8 code from its fields, computed independently of the code under test.
double fp8_value(uint8_t v, int ebits, int mbits, int bias) {
  int sign = v >> 7, exp = (v >> mbits) & ((1 << ebits) - 1), man = v & ((1 << mbits) - 1);
  double mag = exp == 0 ? std::ldexp(man, 1 - bias - mbits) : std::ldexp((1 << mbits) + man, exp - bias - mbits);
  return sign ? -mag : mag;
}
bool e4m3_is_nan(uint8_t v) { return (v & 0x7f) == 0x7f; }
bool e5m2_is_nan(uint8_t v) { return (v & 0x7f) > 0x7c; }
bool e5m2_is_inf(uint8_t v) { return (v & 0x7f) == 0x7c; }

// Nearest finite code, ties to the code with an even mantissa; |x| above max saturates.
uint8_t nearest_fp8(double x, bool e4m3) {
  int ebits = e4m3 ? 4 : 5, mbits = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15;
  const double max = e4m3 ? 448.0 : 57344.0;
  if (std::fabs(x) >= max) return static_cast<uint8_t>((std::signbit(x) ? 0x80 : 0) | (e4m3 ? 0x7e : 0x7b));
  uint8_t best = 0;
  double best_d = INFINITY;
  for (int c = 0; c < 256; ++c) {
    uint8_t v = static_cast<uint8_t>(c);
    if (e4m3 ? e4m3_is_nan(v) : (e5m2_is_nan(v) || e5m2_is_inf(v))) continue;
    if ((v >> 7) != (std::signbit(x) ? 1 : 0)) continue;
    double d = std::fabs(fp8_value(v, ebits, mbits, bias) - x);
    if (d < best_d || (d == best_d && (v & 1) == 0)) best = v, best_d = d;
  }
  return best;
}

TEST(DTypeFp8E4M3, KnownPatterns) {
  EXPECT_EQ(f32_to_fp8e4m3(1.0f), 0x38);
  EXPECT_EQ(f32_to_fp8e4m3(2.0f), 0x40);
  EXPECT_EQ(f32_to_fp8e4m3(0.5f), 0x30);
  EXPECT_EQ(f32_to_fp8e4m3(-1.5f), 0xbc);
  EXPECT_EQ(f32_to_fp8e4m3(448.0f), 0x7e);
  EXPECT_EQ(f32_to_fp8e4m3(0x1p-6f), 0x08);  // smallest normal
  EXPECT_EQ(f32_to_fp8e4m3(0x1p-9f), 0x01);  // smallest subnormal
  EXPECT_EQ(f32_to_fp8e4m3(7 * 0x1p-9f), 0x07);
  EXPECT_EQ(f32_to_fp8e4m3(-0.0f), 0x80);
  EXPECT_EQ(fp8e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(fp8e4m3_to_f32(0x01), 0x1p-9f);
  EXPECT_EQ(fp8e4m3_to_f32(0xb8), -1.0f);
  EXPECT_TRUE(std::isnan(fp8e4m3_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(fp8e4m3_to_f32(0xff)));
  EXPECT_EQ(fp8e4m3_to_f32(0x78), 256.0f);  // e4m3fn has no infinity: exponent 15 is finite
}

TEST(DTypeFp8E4M3, RoundsToNearestEven) {
  EXPECT_EQ(f32_to_fp8e4m3(1.0625f), 0x38);  // tie between 1 and 1.125: even
  EXPECT_EQ(f32_to_fp8e4m3(1.1875f), 0x3a);  // tie between 1.125 and 1.25: even (up)
  EXPECT_EQ(f32_to_fp8e4m3(1.07f), 0x39);
  EXPECT_EQ(f32_to_fp8e4m3(0x1p-10f), 0x00);        // half the smallest subnormal: zero
  EXPECT_EQ(f32_to_fp8e4m3(3 * 0x1p-10f), 0x02);    // tie between 1 and 2 ulps: even
  EXPECT_EQ(f32_to_fp8e4m3(7.5f * 0x1p-9f), 0x08);  // largest subnormal + half: smallest normal
  EXPECT_EQ(f32_to_fp8e4m3(15.5f), 0x58);           // tie between 15 (0x57) and 16 (0x58): even
}

TEST(DTypeFp8E4M3, SaturatesAndKeepsNaN) {
  EXPECT_EQ(f32_to_fp8e4m3(464.0f), 0x7e);  // would round to 480, which does not exist
  EXPECT_EQ(f32_to_fp8e4m3(1e9f), 0x7e);
  EXPECT_EQ(f32_to_fp8e4m3(-1e9f), 0xfe);
  EXPECT_EQ(f32_to_fp8e4m3(INFINITY), 0x7e);
  EXPECT_EQ(f32_to_fp8e4m3(-INFINITY), 0xfe);
  EXPECT_TRUE(e4m3_is_nan(f32_to_fp8e4m3(NAN)));
  EXPECT_TRUE(e4m3_is_nan(f32_to_fp8e4m3(-NAN)));
}

TEST(DTypeFp8E4M3, EveryCodeDecodesAndRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    uint8_t v = static_cast<uint8_t>(c);
    float f = fp8e4m3_to_f32(v);
    if (e4m3_is_nan(v)) {
      EXPECT_TRUE(std::isnan(f)) << c;
      continue;
    }
    EXPECT_EQ(static_cast<double>(f), fp8_value(v, 4, 3, 7)) << c;
    EXPECT_EQ(f32_to_fp8e4m3(f), v) << c;
  }
}

TEST(DTypeFp8E4M3, RandomAgainstNearestCode) {
  for (int i = 0; i < 100000; ++i) {
    // Mostly in range (and around the subnormals), some far outside.
    float f = std::ldexp(static_cast<float>(rng()() % 100000) / 100000.0f, static_cast<int>(rng()() % 26) - 14);
    if (rng()() & 1) f = -f;
    if (i % 50 == 0) f = random_float_bits();
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_fp8e4m3(f), nearest_fp8(f, true)) << std::hexfloat << f;
  }
}

TEST(DTypeFp8E5M2, KnownPatterns) {
  EXPECT_EQ(f32_to_fp8e5m2(1.0f), 0x3c);
  EXPECT_EQ(f32_to_fp8e5m2(-2.0f), 0xc0);
  EXPECT_EQ(f32_to_fp8e5m2(57344.0f), 0x7b);
  EXPECT_EQ(f32_to_fp8e5m2(0x1p-14f), 0x04);  // smallest normal
  EXPECT_EQ(f32_to_fp8e5m2(0x1p-16f), 0x01);  // smallest subnormal
  EXPECT_EQ(fp8e5m2_to_f32(0x7b), 57344.0f);
  EXPECT_EQ(fp8e5m2_to_f32(0x01), 0x1p-16f);
  EXPECT_TRUE(std::isinf(fp8e5m2_to_f32(0x7c)));
  EXPECT_TRUE(std::isnan(fp8e5m2_to_f32(0x7d)));
  EXPECT_TRUE(std::isnan(fp8e5m2_to_f32(0xff)));
}

TEST(DTypeFp8E5M2, RoundsToNearestEven) {
  EXPECT_EQ(f32_to_fp8e5m2(1.125f), 0x3c);  // tie between 1 and 1.25: even
  EXPECT_EQ(f32_to_fp8e5m2(1.375f), 0x3e);  // tie between 1.25 and 1.5: even (up)
  EXPECT_EQ(f32_to_fp8e5m2(0x1p-17f), 0x00);
  EXPECT_EQ(f32_to_fp8e5m2(3 * 0x1p-17f), 0x02);
  EXPECT_EQ(f32_to_fp8e5m2(3.5f * 0x1p-16f), 0x04);  // largest subnormal + half: smallest normal
}

TEST(DTypeFp8E5M2, FiniteOverflowSaturatesInfinityStays) {
  EXPECT_EQ(f32_to_fp8e5m2(61440.0f), 0x7b);  // the tie above max: saturates, never inf
  EXPECT_EQ(f32_to_fp8e5m2(1e9f), 0x7b);
  EXPECT_EQ(f32_to_fp8e5m2(-1e9f), 0xfb);
  EXPECT_EQ(f32_to_fp8e5m2(INFINITY), 0x7c);  // e5m2 has infinities: an inf stays one
  EXPECT_EQ(f32_to_fp8e5m2(-INFINITY), 0xfc);
  EXPECT_TRUE(e5m2_is_nan(f32_to_fp8e5m2(NAN)));
}

TEST(DTypeFp8E5M2, EveryCodeDecodesAndRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    uint8_t v = static_cast<uint8_t>(c);
    float f = fp8e5m2_to_f32(v);
    if (e5m2_is_nan(v)) {
      EXPECT_TRUE(std::isnan(f)) << c;
      EXPECT_TRUE(e5m2_is_nan(f32_to_fp8e5m2(f))) << c;
      continue;
    }
    if (!e5m2_is_inf(v)) EXPECT_EQ(static_cast<double>(f), fp8_value(v, 5, 2, 15)) << c;
    EXPECT_EQ(f32_to_fp8e5m2(f), v) << c;
  }
}

TEST(DTypeFp8E5M2, RandomAgainstNearestCode) {
  for (int i = 0; i < 100000; ++i) {
    float f = std::ldexp(static_cast<float>(rng()() % 100000) / 100000.0f, static_cast<int>(rng()() % 36) - 18);
    if (rng()() & 1) f = -f;
    if (i % 50 == 0) f = random_float_bits();
    if (std::isnan(f) || std::isinf(f)) continue;
    ASSERT_EQ(f32_to_fp8e5m2(f), nearest_fp8(f, false)) << std::hexfloat << f;
  }
}

// ---------------- arrays and names ----------------

TEST(DTypeConvert, ArraysBetweenFloatTypes) {
  const std::vector<float> src = {0.0f, 1.0f, -2.5f, 0.15625f, 320.0f, -0x1p-8f};
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kF8E4M3, DType::kF8E5M2}) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    std::vector<uint8_t> mid(src.size() * dtype_size(t), 0xcd);
    std::vector<float> back(src.size(), NAN);
    convert_host(src.data(), DType::kF32, mid.data(), t, src.size());
    convert_host(mid.data(), t, back.data(), DType::kF32, src.size());
    for (size_t i = 0; i < src.size(); ++i) EXPECT_EQ(back[i], src[i]) << i;  // all exactly representable
  }
  // Element-wise equal to the scalar functions, also between two narrow types.
  std::vector<uint16_t> h(64);
  std::vector<uint8_t> e4(64);
  for (size_t i = 0; i < h.size(); ++i) h[i] = f32_to_f16(static_cast<float>(i) * 0.37f - 11.0f);
  convert_host(h.data(), DType::kF16, e4.data(), DType::kF8E4M3, h.size());
  for (size_t i = 0; i < h.size(); ++i) EXPECT_EQ(e4[i], f32_to_fp8e4m3(f16_to_f32(h[i]))) << i;
  // Integer sources convert to float; converting to an integer type is refused.
  std::vector<int32_t> ints = {-3, 0, 7};
  std::vector<float> f(3);
  convert_host(ints.data(), DType::kI32, f.data(), DType::kF32, 3);
  EXPECT_EQ(f, std::vector<float>({-3.0f, 0.0f, 7.0f}));
  EXPECT_THROW(convert_host(f.data(), DType::kF32, ints.data(), DType::kI32, 3), Error);
}

TEST(DTypeConvert, UnalignedBuffers) {
  // Safetensors data need not be aligned to the element size; conversion must not care
  // (UBSan flags a misaligned load in the sanitizer build).
  alignas(16) uint8_t raw[64] = {};
  const std::vector<float> src = {1.0f, -2.0f, 0.5f, 3.0f};
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32}) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    std::vector<float> ints_as_float = src;
    if (t == DType::kI32) {
      int32_t iv[4] = {1, -2, 0, 3};
      std::memcpy(raw + 1, iv, sizeof(iv));
      ints_as_float = {1.0f, -2.0f, 0.0f, 3.0f};
    } else {
      convert_host(src.data(), DType::kF32, raw + 1, t, src.size());  // unaligned destination
    }
    alignas(16) uint8_t out[32];
    convert_host(raw + 1, t, out + 3, DType::kF32, src.size());  // unaligned both ways
    float back[4];
    std::memcpy(back, out + 3, sizeof(back));
    for (size_t i = 0; i < 4; ++i) EXPECT_EQ(back[i], ints_as_float[i]) << i;
  }
  convert_host(nullptr, DType::kBF16, nullptr, DType::kF32, 0);  // empty: no access at all
}

TEST(DTypeNames, SizesAndSpellings) {
  EXPECT_EQ(dtype_size(DType::kF32), 4u);
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
  EXPECT_EQ(dtype_size(DType::kF8E5M2), 1u);
  EXPECT_EQ(dtype_size(DType::kI64), 8u);
  EXPECT_EQ(dtype_from_safetensors("BF16"), DType::kBF16);
  EXPECT_EQ(dtype_from_safetensors("F8_E4M3"), DType::kF8E4M3);
  EXPECT_EQ(dtype_from_safetensors("F64"), std::nullopt);
  EXPECT_EQ(dtype_from_safetensors("bf16"), std::nullopt) << "safetensors spellings are upper case";
  EXPECT_EQ(dtype_from_name("bfloat16"), DType::kBF16);
  EXPECT_EQ(dtype_from_name("float8_e4m3fn"), DType::kF8E4M3);
  EXPECT_EQ(dtype_from_name("float64"), std::nullopt);
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kF8E4M3, DType::kF8E5M2})
    EXPECT_EQ(dtype_from_name(dtype_name(t)), t) << dtype_name(t);
}

}  // namespace
}  // namespace tessera
