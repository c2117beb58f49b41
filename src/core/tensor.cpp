#include "core/tensor.h"

#include <cstdlib>

#include "core/error.h"

namespace tessera {

std::string Device::str() const {
  return type == DeviceType::kCPU ? std::string("cpu") : fmt::format("cuda:{}", index);
}

Shape::Shape(std::initializer_list<int64_t> dims) {
  for (int64_t v : dims) push_back(v);
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < n_; ++i) n *= d_[i];
  return n;
}

void Shape::push_back(int64_t v) {
  TESSERA_CHECK(n_ < kMaxDims, "tensor rank above {}", kMaxDims);
  d_[n_++] = v;
}

bool Shape::operator==(const Shape& o) const {
  if (n_ != o.n_) return false;
  for (int i = 0; i < n_; ++i)
    if (d_[i] != o.d_[i]) return false;
  return true;
}

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < n_; ++i) s += (i ? ", " : "") + std::to_string(d_[i]);
  return s + "]";
}

Tensor::Tensor(std::shared_ptr<Storage> storage, size_t offset_bytes, Shape shape, DType dtype)
    : storage_(std::move(storage)), offset_(offset_bytes), shape_(shape), dtype_(dtype) {
  TESSERA_CHECK(!storage_ || offset_ + nbytes() <= storage_->bytes(),
                "tensor {} at offset {} overruns its {}-byte storage", str(), offset_, storage_->bytes());
}

Tensor Tensor::view(Shape shape) const {
  TESSERA_CHECK(shape.numel() == numel(), "view {} of {} changes the element count", shape.str(), str());
  return Tensor(storage_, offset_, shape, dtype_);
}

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  TESSERA_CHECK(ndim() >= 1 && begin >= 0 && begin <= end && end <= dim(0), "rows [{}, {}) of {}", begin, end, str());
  Shape s = shape_;
  s[0] = end - begin;
  size_t row_bytes = dim(0) ? nbytes() / static_cast<size_t>(dim(0)) : 0;
  return Tensor(storage_, offset_ + static_cast<size_t>(begin) * row_bytes, s, dtype_);
}

Tensor Tensor::reinterpret(DType dtype, Shape shape) const {
  TESSERA_CHECK(shape.numel() * static_cast<int64_t>(dtype_size(dtype)) == static_cast<int64_t>(nbytes()),
                "reinterpret {} as {}{} changes the byte count", str(), dtype_name(dtype), shape.str());
  return Tensor(storage_, offset_, shape, dtype);
}

Shape block_scale_shape(const Shape& s) { return fp8_block_format().scale_shape(s); }

Tensor Tensor::with_format(const WeightFormat& f, Tensor scale) const {
  TESSERA_CHECK(f.quantized() && f.element == dtype_, "{} cannot be stored as {}", str(), f.describe());
  TESSERA_CHECK(scale.dtype() == f.scale && scale.shape() == f.scale_shape(shape_),
                "scales of {} ({}) must be {}{}, not {}", str(), f.describe(), dtype_name(f.scale),
                f.scale_shape(shape_).str(), scale.str());
  Tensor t = *this;
  t.block_scale_ = std::make_shared<const Tensor>(std::move(scale));
  t.format_ = f;
  return t;
}

Tensor Tensor::with_block_scale(Tensor scale) const { return with_format(fp8_block_format(), std::move(scale)); }

Tensor dequantize_block_scaled_host(const Tensor& w) {
  TESSERA_CHECK(w.format().kind == WeightFormatKind::kFp8Block && w.device().type == DeviceType::kCPU,
                "dequantize_block_scaled_host: {} is not a host FP8 block-scaled tensor", w.str());
  const Tensor& s = *w.block_scale();
  const int64_t R = w.dim(-2), C = w.dim(-1), mats = w.numel() / (R * C);
  const int64_t rb = s.dim(-2), cb = s.dim(-1);
  Tensor out = host_empty(w.shape(), DType::kF32);
  const uint8_t* q = w.data<uint8_t>();
  const float* sc = s.data<float>();
  float* o = out.data<float>();
  float lut[256];
  for (int v = 0; v < 256; ++v) lut[v] = fp8e4m3_to_f32(static_cast<uint8_t>(v));
  for (int64_t m = 0; m < mats; ++m)
    for (int64_t r = 0; r < R; ++r) {
      const float* srow = sc + (m * rb + r / Tensor::kScaleBlock) * cb;
      const int64_t base = (m * R + r) * C;
      for (int64_t c = 0; c < C; ++c) o[base + c] = lut[q[base + c]] * srow[c / Tensor::kScaleBlock];
    }
  return out;
}

std::string Tensor::str() const { return std::string(dtype_name(dtype_)) + shape_.str(); }

Tensor host_empty(Shape shape, DType dtype) {
  size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  size_t alloc = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, alloc ? alloc : 64);
  if (!p) fail(ErrorKind::kOutOfMemory, "cannot allocate {} bytes of host memory", bytes);
  auto st = std::make_shared<Storage>(p, alloc, Device{}, [](void* q) { std::free(q); });
  return Tensor(std::move(st), 0, shape, dtype);
}

Tensor host_wrap(void* data, Shape shape, DType dtype, std::shared_ptr<void> keep_alive) {
  size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  auto st = std::make_shared<Storage>(data, bytes, Device{}, [keep_alive](void*) {});
  return Tensor(std::move(st), 0, shape, dtype);
}

}  // namespace tessera
