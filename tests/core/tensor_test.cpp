// Shape and Tensor views: element counts, bounds checks on view/rows/reinterpret,
// offsets into shared storage, and storage lifetime.
#include <gtest/gtest.h>

#include <cstdint>

#include "core/error.h"
#include "core/tensor.h"

namespace tessera {
namespace {

TEST(Shape, BasicsAndNegativeIndex) {
  Shape s{2, 3, 4};
  EXPECT_EQ(s.ndim(), 3);
  EXPECT_EQ(s.numel(), 24);
  EXPECT_EQ(s[-1], 4);
  EXPECT_EQ(s[0], 2);
  EXPECT_EQ(s.str(), "[2, 3, 4]");
  s[-1] = 5;
  EXPECT_EQ(s[2], 5);
  EXPECT_TRUE((Shape{2, 3, 5} == s));
  EXPECT_FALSE((Shape{2, 3} == s));
  EXPECT_FALSE((Shape{2, 3, 4} == s));
  EXPECT_EQ(Shape{}.numel(), 1);  // a scalar
  EXPECT_EQ(Shape{}.str(), "[]");
  EXPECT_EQ((Shape{4, 0, 2}.numel()), 0);
}

TEST(Shape, RankLimit) {
  Shape s{1, 2, 3, 4, 5, 6};
  EXPECT_EQ(s.ndim(), Shape::kMaxDims);
  EXPECT_THROW(s.push_back(7), Error);
  EXPECT_THROW((Shape{1, 2, 3, 4, 5, 6, 7}), Error);
}

TEST(Tensor, HostEmptyIsAlignedAndSized) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kF8E4M3, DType::kI64}) {
    Tensor x = host_empty({3, 5}, t);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(x.raw()) % 64, 0u);
    EXPECT_EQ(x.nbytes(), 15 * dtype_size(t));
    EXPECT_GE(x.storage()->bytes(), x.nbytes());
    EXPECT_EQ(x.str(), std::string(dtype_name(t)) + "[3, 5]");
  }
  Tensor empty = host_empty({0, 8}, DType::kF32);
  EXPECT_EQ(empty.nbytes(), 0u);
  EXPECT_TRUE(empty.defined());
  EXPECT_FALSE(Tensor().defined());
}

TEST(Tensor, ViewSharesBytesAndChecksCount) {
  Tensor x = host_empty({2, 6}, DType::kF32);
  for (int i = 0; i < 12; ++i) x.data<float>()[i] = static_cast<float>(i);
  Tensor v = x.view({3, 4});
  EXPECT_EQ(v.raw(), x.raw());
  EXPECT_EQ(v.data<float>()[7], 7.0f);
  EXPECT_EQ(v.shape(), (Shape{3, 4}));
  EXPECT_THROW(x.view({5, 2}), Error);
  EXPECT_THROW(x.view({13}), Error);
}

TEST(Tensor, RowsOffsetsAndBounds) {
  Tensor x = host_empty({5, 3}, DType::kBF16);
  for (int i = 0; i < 15; ++i) x.data<uint16_t>()[i] = static_cast<uint16_t>(i);
  Tensor r = x.rows(1, 4);
  EXPECT_EQ(r.shape(), (Shape{3, 3}));
  EXPECT_EQ(r.offset_bytes(), 3 * 2u);
  EXPECT_EQ(r.data<uint16_t>()[0], 3);
  Tensor rr = r.rows(2, 3);  // rows of rows: offsets add up
  EXPECT_EQ(rr.data<uint16_t>()[0], 9);
  EXPECT_EQ(rr.offset_bytes(), 9 * 2u);
  EXPECT_EQ(x.rows(5, 5).numel(), 0);  // empty range at the end is fine
  EXPECT_EQ(x.rows(0, 5).raw(), x.raw());
  EXPECT_THROW(x.rows(-1, 2), Error);
  EXPECT_THROW(x.rows(3, 2), Error);
  EXPECT_THROW(x.rows(0, 6), Error);
  EXPECT_THROW(r.rows(0, 4), Error);  // bounded by the view, not the storage
  Tensor scalar = host_empty({}, DType::kF32);
  EXPECT_THROW(scalar.rows(0, 1), Error);
}

TEST(Tensor, ReinterpretKeepsByteCount) {
  Tensor x = host_empty({4, 2}, DType::kBF16);  // 16 bytes
  Tensor u = x.reinterpret(DType::kI32, {4});
  EXPECT_EQ(u.raw(), x.raw());
  EXPECT_EQ(u.nbytes(), x.nbytes());
  Tensor b = x.rows(1, 3).reinterpret(DType::kU8, {8});
  EXPECT_EQ(b.offset_bytes(), 4u);
  EXPECT_THROW(x.reinterpret(DType::kF32, {8}), Error);
  EXPECT_THROW(x.reinterpret(DType::kU8, {15}), Error);
}

TEST(Tensor, ConstructorRefusesOverrun) {
  Tensor x = host_empty({16}, DType::kU8);  // 64 bytes allocated
  const size_t cap = x.storage()->bytes();
  EXPECT_NO_THROW(Tensor(x.storage(), cap - 4, Shape{1}, DType::kF32));
  EXPECT_THROW(Tensor(x.storage(), cap - 3, Shape{1}, DType::kF32), Error);
  EXPECT_THROW(Tensor(x.storage(), 0, Shape{static_cast<int64_t>(cap) + 1}, DType::kU8), Error);
}

TEST(Tensor, WrapKeepsOwnerAliveUntilLastView) {
  auto owner = std::make_shared<std::vector<float>>(6, 1.5f);
  std::weak_ptr<std::vector<float>> watch = owner;
  Tensor v;
  {
    Tensor t = host_wrap(owner->data(), {2, 3}, DType::kF32, owner);
    owner.reset();
    v = t.rows(1, 2);
  }
  EXPECT_FALSE(watch.expired()) << "a view must keep the wrapped memory alive";
  EXPECT_EQ(v.data<float>()[2], 1.5f);
  v = Tensor();
  EXPECT_TRUE(watch.expired()) << "and release it with the last view";
}

TEST(Tensor, BlockScalesTravelWithTheTensorAndDequantiseExactly) {
  EXPECT_EQ(block_scale_shape({200, 130}), (Shape{2, 2}));
  EXPECT_EQ(block_scale_shape({3, 256, 128}), (Shape{3, 2, 1}));
  Tensor w = host_empty({2, 130, 129}, DType::kF8E4M3), s = host_empty({2, 2, 2}, DType::kF32);
  for (int64_t i = 0; i < w.numel(); ++i) w.data<uint8_t>()[i] = f32_to_fp8e4m3(static_cast<float>(i % 17) - 8);
  for (int64_t i = 0; i < s.numel(); ++i) s.data<float>()[i] = 0.5f * static_cast<float>(i + 1);
  EXPECT_THROW(w.with_block_scale(host_empty({2, 1, 2}, DType::kF32)), Error);
  EXPECT_THROW(w.with_block_scale(host_empty({2, 2, 2}, DType::kBF16)), Error);
  const Tensor q = w.with_block_scale(s);
  EXPECT_FALSE(w.block_scaled());
  const Tensor copy = q;  // copies carry the scales; views describe other bytes and drop them
  ASSERT_TRUE(copy.block_scaled());
  EXPECT_EQ(copy.block_scale()->raw(), s.raw());
  EXPECT_FALSE(q.view({260, 129}).block_scaled());
  const Tensor f = dequantize_block_scaled_host(q);
  for (int64_t e = 0; e < 2; ++e)
    for (int64_t r = 0; r < 130; ++r)
      for (int64_t c = 0; c < 129; ++c) {
        const int64_t i = (e * 130 + r) * 129 + c;
        const float want = (static_cast<float>(i % 17) - 8) * s.data<float>()[(e * 2 + r / 128) * 2 + c / 128];
        ASSERT_EQ(f.data<float>()[i], want) << e << "," << r << "," << c;
      }
  EXPECT_THROW(dequantize_block_scaled_host(w), Error);
}

TEST(Device, Names) {
  EXPECT_EQ(Device{}.str(), "cpu");
  EXPECT_EQ((Device{DeviceType::kCUDA, 3}.str()), "cuda:3");
}

}  // namespace
}  // namespace tessera
