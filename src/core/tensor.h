// A tensor is a typed, shaped view into a Storage that lives on one device.
// It never allocates by itself: backends allocate (core knows no CUDA).
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>

#include "core/dtype.h"
#include "core/weight_format.h"

namespace tessera {

enum class DeviceType : uint8_t { kCPU, kCUDA };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;
  bool operator==(const Device&) const = default;
  std::string str() const;
};

// Owns (or borrows, with a no-op release) `bytes` bytes at `data` on `device`.
class Storage {
 public:
  using Release = std::function<void(void*)>;
  Storage(void* data, size_t bytes, Device device, Release release)
      : data_(data), bytes_(bytes), device_(device), release_(std::move(release)) {}
  ~Storage() {
    if (release_) release_(data_);
  }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void* data_;
  size_t bytes_;
  Device device_;
  Release release_;
};

class Shape {
 public:
  static constexpr int kMaxDims = 6;
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  int ndim() const { return n_; }
  int64_t operator[](int i) const { return d_[i < 0 ? i + n_ : i]; }
  int64_t& operator[](int i) { return d_[i < 0 ? i + n_ : i]; }
  int64_t numel() const;
  void push_back(int64_t v);
  bool operator==(const Shape& o) const;
  std::string str() const;  // "[2, 3]"

 private:
  std::array<int64_t, kMaxDims> d_{};
  int n_ = 0;
};

class Tensor {
 public:
  Tensor() = default;
  // A contiguous tensor over `storage` starting `offset_bytes` in.
  Tensor(std::shared_ptr<Storage> storage, size_t offset_bytes, Shape shape, DType dtype);

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int ndim() const { return shape_.ndim(); }
  int64_t dim(int i) const { return shape_[i]; }
  int64_t numel() const { return shape_.numel(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  Device device() const { return storage_ ? storage_->device() : Device{}; }
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  size_t offset_bytes() const { return offset_; }

  void* raw() const { return static_cast<char*>(storage_->data()) + offset_; }
  template <typename T>
  T* data() const {
    return static_cast<T*>(raw());
  }

  // Same bytes, new shape (numel must match). All tensors are contiguous row-major.
  Tensor view(Shape shape) const;
  // Rows [begin, end) along dimension 0.
  Tensor rows(int64_t begin, int64_t end) const;
  // Same bytes reinterpreted with another dtype of equal size (e.g. bf16 <-> u16 views).
  Tensor reinterpret(DType dtype, Shape shape) const;
  std::string str() const;  // "bf16[2, 3]"

  // Quantised weights: how the elements are stored (core/weight_format.h) and, for a quantised
  // format, the scales, one per block of the last two dimensions (the leading dimensions, e.g.
  // experts, as the tensor's): FP8 e4m3 with an f32 scale per kScaleBlock x kScaleBlock block,
  // [..., ceil(rows / 128), ceil(cols / 128)], the value of element [.., r, c] being
  // data[.., r, c] * scale[.., r / 128, c / 128]. Plain tensors have no scales. Both travel with
  // copies of this Tensor; view/rows/reinterpret drop them (they describe other bytes).
  static constexpr int64_t kScaleBlock = 128;
  const WeightFormat& format() const { return format_; }
  const Tensor* block_scale() const { return block_scale_.get(); }
  // Whether it carries scales (any quantised format); ops dispatch on format().kind.
  bool block_scaled() const { return block_scale_ != nullptr; }
  // This tensor in quantised format `f` with its `scale` (dtype and shape checked against f).
  Tensor with_format(const WeightFormat& f, Tensor scale) const;
  // with_format(fp8_block_format(), scale).
  Tensor with_block_scale(Tensor scale) const;

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;
  Shape shape_;
  DType dtype_ = DType::kF32;
  std::shared_ptr<const Tensor> block_scale_;
  WeightFormat format_;
};

// The scale shape of an FP8 block-scaled tensor of shape `s` (fp8_block_format().scale_shape).
Shape block_scale_shape(const Shape& s);

// The f32 values of a block-scaled host tensor (FP8 with Tensor::block_scale), w = fp8 * scale
// per 128 x 128 block of the last two dimensions: the exact reference the backends check against.
Tensor dequantize_block_scaled_host(const Tensor& w);

// Host tensor helpers (CPU memory, 64-byte aligned). Used by tests, the loader and
// the CPU backend; never by model code, which allocates through its Backend.
Tensor host_empty(Shape shape, DType dtype);
Tensor host_wrap(void* data, Shape shape, DType dtype, std::shared_ptr<void> keep_alive = nullptr);

}  // namespace tessera
