// How a weight's elements are stored: plain (one value per element in the tensor's dtype), or
// block-quantised (narrow elements and one scale per block of the last two dimensions, the value
// of an element its stored number times its block's scale). The loader maps a checkpoint's
// quantization_config to one; the weight store, the backends' linear and moe_experts ops, the
// meta backend and the planner dispatch on it (Tensor::format). Only kPlain and kFp8Block have
// kernels; the others are described so that a checkpoint in them is named when refused.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace tessera {

class Shape;

enum class WeightFormatKind : uint8_t {
  kPlain,      // the tensor's dtype, no scales
  kFp8Block,   // e4m3 elements, f32 scale per 128 x 128 block (DeepSeek-V3 / Qwen FP8 releases)
  kInt4Group,  // int4 elements, two a byte, one scale per group of columns of a row (AWQ, GPTQ)
  kNvfp4,      // e2m1 elements, two a byte, e4m3 scale per 16 columns of a row
  kMxfp4,      // e2m1 elements, two a byte, e8m0 (power of two) scale per 32 columns of a row
};

struct WeightFormat {
  WeightFormatKind kind = WeightFormatKind::kPlain;
  DType element = DType::kF32;             // the stored element's container dtype (kU8 for the packed 4-bit ones)
  int element_bits = 0;                    // bits per element (0: the tensor's dtype)
  DType scale = DType::kF32;               // the scales' dtype (kU8 for e8m0)
  int64_t block_rows = 0, block_cols = 0;  // the elements one scale covers (0: no scales)

  bool quantized() const { return kind != WeightFormatKind::kPlain; }
  // Whether tessera has kernels for it (plain and FP8 blocks).
  bool supported() const { return kind == WeightFormatKind::kPlain || kind == WeightFormatKind::kFp8Block; }
  // The scales of a weight of shape `w` (at least 2-D): [..., ceil(rows / block_rows),
  // ceil(cols / block_cols)], the leading dimensions (experts) as the weight's. Plain: none.
  Shape scale_shape(const Shape& w) const;
  // Bytes of the elements (packed: two 4-bit elements a byte) and of the scales of a weight of
  // shape `w`; plain weights take `plain_dtype`'s size per element and no scales.
  size_t weight_bytes(const Shape& w, DType plain_dtype) const;
  size_t scale_bytes(const Shape& w) const;
  // "fp8 e4m3, f32 scale per 128x128 block", "plain".
  std::string describe() const;
  bool operator==(const WeightFormat& o) const = default;
};

WeightFormat plain_format();
WeightFormat fp8_block_format();                     // 128 x 128 blocks, f32 scales
WeightFormat int4_group_format(int64_t group_size);  // AWQ / GPTQ (no kernels)
WeightFormat nvfp4_format();                         // no kernels
WeightFormat mxfp4_format();                         // no kernels

// Fails (kUnsupported) naming the op, the weight, its format and what the backend runs: for a
// backend's linear / moe_experts given a weight format it has no kernel for.
[[noreturn]] void fail_unsupported_format(const char* backend_op, const std::string& weight, const WeightFormat& f);

}  // namespace tessera
