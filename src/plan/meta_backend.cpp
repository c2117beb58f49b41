#include "plan/meta_backend.h"

#include <cstring>
#include <limits>

#include "backend/op_workspace.h"

namespace tessera::plan {

MetaBackend::MetaBackend(MetaBackendOptions o) : opts_(o) {
  if (opts_.alloc_align == 0) opts_.alloc_align = 1;
  arena_ = std::make_shared<Storage>(nullptr, std::numeric_limits<size_t>::max() / 4, Device{opts_.device, 0},
                                     Storage::Release{});
}

size_t MetaBackend::align(size_t n) const {
  return (n + opts_.alloc_align - 1) / opts_.alloc_align * opts_.alloc_align;
}

Tensor MetaBackend::alloc(Shape shape, DType dtype) {
  const size_t bytes = std::max(align(static_cast<size_t>(shape.numel()) * dtype_size(dtype)), opts_.alloc_align);
  allocated_ += bytes;
  return Tensor(std::make_shared<Storage>(nullptr, bytes, Device{opts_.device, 0}, Storage::Release{}), 0, shape,
                dtype);
}

Tensor MetaBackend::scratch(Shape shape, DType dtype) {
  const size_t bytes = align(static_cast<size_t>(shape.numel()) * dtype_size(dtype));
  Tensor t(arena_, in_use_, shape, dtype);
  in_use_ += bytes;
  high_water_ = std::max(high_water_, in_use_);
  return t;
}

void MetaBackend::reset_scratch() {
  in_use_ = 0;
  marks_.clear();
}

size_t MetaBackend::scratch_mark() {
  marks_.push_back(in_use_);
  return marks_.size() - 1;
}

void MetaBackend::scratch_rewind(size_t mark) {
  TESSERA_CHECK(mark < marks_.size(), "scratch_rewind to an unknown mark");
  in_use_ = marks_[mark];
  marks_.resize(mark);
}

void MetaBackend::take_workspace(int64_t bytes) {
  const size_t mark = scratch_mark();
  scratch({bytes}, DType::kU8);
  scratch_rewind(mark);
}

void MetaBackend::linear(const Tensor& x, const Tensor& w, const Tensor*, const Tensor&) {
  if (w.ndim() != 2 || w.dim(1) == 0) return;
  switch (w.format().kind) {
    case WeightFormatKind::kPlain:  // cuBLAS and the GEMV take no workspace of ours
      return;
    case WeightFormatKind::kFp8Block:
      take_workspace(fp8_linear_workspace_bytes(x.numel() / w.dim(1), w.dim(0), w.dim(1)));
      return;
    default:
      fail_unsupported_format("planning linear", w.str(), w.format());
  }
}

void MetaBackend::moe_experts(const Tensor& x, const Tensor& gate_up, const Tensor& down, const Tensor& topk_ids,
                              const Tensor&, int, const Tensor&) {
  for (const Tensor* w : {&gate_up, &down})
    if (!w->format().supported()) fail_unsupported_format("planning moe_experts", w->str(), w->format());
  if (x.ndim() != 2 || gate_up.ndim() != 3 || topk_ids.ndim() != 2) return;
  take_workspace(moe_experts_workspace_bytes(x.dim(0), topk_ids.dim(1), x.dim(1), gate_up.dim(1) / 2, gate_up.dim(0)));
}

// Nothing was computed: the host gets zeros (a planning step never reads them).
void MetaBackend::copy_to_host(void* dst, const Tensor& src) { std::memset(dst, 0, src.nbytes()); }

}  // namespace tessera::plan
