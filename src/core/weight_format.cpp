#include "core/weight_format.h"

#include "core/error.h"
#include "core/tensor.h"

namespace tessera {

namespace {
int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
}  // namespace

Shape WeightFormat::scale_shape(const Shape& w) const {
  if (!quantized()) return Shape{};
  TESSERA_CHECK(w.ndim() >= 2, "a block-quantised weight has at least 2 dimensions, not {}", w.str());
  Shape out = w;
  out[-2] = cdiv(w[-2], block_rows);
  out[-1] = cdiv(w[-1], block_cols);
  return out;
}

size_t WeightFormat::weight_bytes(const Shape& w, DType plain_dtype) const {
  const auto n = static_cast<size_t>(w.numel());
  if (!quantized()) return n * dtype_size(plain_dtype);
  return (n * static_cast<size_t>(element_bits) + 7) / 8;
}

size_t WeightFormat::scale_bytes(const Shape& w) const {
  if (!quantized()) return 0;
  return static_cast<size_t>(scale_shape(w).numel()) * dtype_size(scale);
}

std::string WeightFormat::describe() const {
  switch (kind) {
    case WeightFormatKind::kPlain:
      return "plain";
    case WeightFormatKind::kFp8Block:
      return fmt::format("fp8 e4m3, {} scale per {}x{} block", dtype_name(scale), block_rows, block_cols);
    case WeightFormatKind::kInt4Group:
      return fmt::format("int4, {} scale per group of {} columns", dtype_name(scale), block_cols);
    case WeightFormatKind::kNvfp4:
      return fmt::format("nvfp4 (e2m1), e4m3 scale per {} columns", block_cols);
    case WeightFormatKind::kMxfp4:
      return fmt::format("mxfp4 (e2m1), e8m0 scale per {} columns", block_cols);
  }
  return "unknown";
}

WeightFormat plain_format() { return WeightFormat{}; }

WeightFormat fp8_block_format() {
  return WeightFormat{WeightFormatKind::kFp8Block, DType::kF8E4M3, 8, DType::kF32, 128, 128};
}

WeightFormat int4_group_format(int64_t group_size) {
  return WeightFormat{WeightFormatKind::kInt4Group, DType::kU8, 4, DType::kF16, 1, group_size};
}

WeightFormat nvfp4_format() { return WeightFormat{WeightFormatKind::kNvfp4, DType::kU8, 4, DType::kF8E4M3, 1, 16}; }

WeightFormat mxfp4_format() { return WeightFormat{WeightFormatKind::kMxfp4, DType::kU8, 4, DType::kU8, 1, 32}; }

void fail_unsupported_format(const char* backend_op, const std::string& weight, const WeightFormat& f) {
  fail(ErrorKind::kUnsupported,
       "{}: weight {} is stored as {}, which this backend has no kernel for (it runs plain weights and {}); serve an "
       "unquantised or FP8 block-scaled checkpoint",
       backend_op, weight, f.describe(), fp8_block_format().describe());
}

}  // namespace tessera
