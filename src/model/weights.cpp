#include "model/weights.h"

#include <cstring>

#include "core/error.h"
#include "loader/checkpoint.h"

namespace tessera {

Shape WeightStore::local_shape(const Shape& full, ParallelStyle style, const std::string& name) const {
  Shape s = full;
  int tp = pc_.tp_size;
  auto split = [&](int dim) {
    if (s[dim] % tp != 0)
      fail(ErrorKind::kInvalidArgument, "{}: dimension {} ({}) is not divisible by --tensor-parallel-size {}", name,
           dim, s[dim], tp);
    s[dim] /= tp;
  };
  switch (style) {
    case ParallelStyle::kReplicated:
      break;
    case ParallelStyle::kColumn:
    case ParallelStyle::kVocab:
      split(0);
      break;
    case ParallelStyle::kRow:
      split(1);
      break;
  }
  return s;
}

WeightStore::Entry& WeightStore::find(const std::string& name) {
  for (auto& e : entries_)
    if (e.name == name) return e;
  fail(ErrorKind::kInternal, "parameter {} was never declared", name);
}

const Tensor& WeightStore::declare(const std::string& name, Shape full_shape, ParallelStyle style, DummyInit init) {
  Entry e{name, full_shape, local_shape(full_shape, style, name), style, {}, init, {}, {}};
  entries_.push_back(std::move(e));
  return entries_.back().tensor;
}

const Tensor& WeightStore::declare_stacked(const std::string& label, std::vector<Part> parts, int64_t cols) {
  int64_t rows = 0;
  for (const auto& p : parts) {
    if (p.rows % pc_.tp_size != 0)
      fail(ErrorKind::kInvalidArgument, "{}: {} rows are not divisible by --tensor-parallel-size {}", p.name, p.rows,
           pc_.tp_size);
    rows += p.rows;
  }
  Entry e{label,
          Shape{rows, cols},
          Shape{rows / pc_.tp_size, cols},
          ParallelStyle::kColumn,
          std::move(parts),
          DummyInit::kUniform,
          {},
          {}};
  entries_.push_back(std::move(e));
  return entries_.back().tensor;
}

const Tensor& WeightStore::declare_row_block(const std::string& name, Shape full_shape, int64_t row_begin,
                                             int64_t rows) {
  TESSERA_CHECK(full_shape.ndim() >= 1 && row_begin >= 0 && rows > 0 && row_begin + rows <= full_shape[0],
                "{}: rows [{}, {}) of {}", name, row_begin, row_begin + rows, full_shape.str());
  Shape local = full_shape;
  local[0] = rows;
  Entry e{name, full_shape, local, ParallelStyle::kReplicated, {}, DummyInit::kUniform, {}, {}};
  e.row_begin = row_begin;
  entries_.push_back(std::move(e));
  return entries_.back().tensor;
}

const Tensor& WeightStore::declare_tied(const std::string& alias, const std::string& target) {
  Entry& t = find(target);
  Entry e{alias, t.full_shape, t.local_shape, t.style, {}, t.init, target, {}};
  entries_.push_back(std::move(e));
  return entries_.back().tensor;
}

size_t WeightStore::param_bytes(DType dtype) const {
  size_t n = 0;
  for (const auto& e : entries_)
    if (e.tied_to.empty()) n += static_cast<size_t>(e.local_shape.numel()) * dtype_size(dtype);
  return n;
}

namespace {

// Copies this rank's slice of a checkpoint tensor, converted to `dst_type`, into `dst` (host).
void copy_slice(const CheckpointTensor& src, ParallelStyle style, const ParallelContext& pc, const Shape& local,
                DType dst_type, char* dst, int64_t row_begin = -1) {
  const TensorInfo& info = *src.info;
  const char* base = static_cast<const char*>(src.file->data(info));
  size_t es = dtype_size(info.dtype), ds = dtype_size(dst_type);
  if (row_begin >= 0) {  // a fixed block of whole rows
    size_t n = static_cast<size_t>(local.numel());
    size_t row = n / static_cast<size_t>(local[0]);
    convert_host(base + static_cast<size_t>(row_begin) * row * es, info.dtype, dst, dst_type, n);
    return;
  }
  if (style == ParallelStyle::kRow && pc.tp_size > 1) {
    int64_t rows = info.shape[0], full_cols = info.shape[1], cols = local[1];
    for (int64_t r = 0; r < rows; ++r)
      convert_host(base + (r * full_cols + pc.tp_rank * cols) * es, info.dtype, dst + r * cols * ds, dst_type,
                   static_cast<size_t>(cols));
    return;
  }
  size_t n = static_cast<size_t>(local.numel());
  size_t start = (style == ParallelStyle::kColumn || style == ParallelStyle::kVocab) ? pc.tp_rank * n : 0;
  convert_host(base + start * es, info.dtype, dst, dst_type, n);
}

void check_shape(const CheckpointTensor& t, const Shape& want) {
  if (!(t.info->shape == want))
    fail(ErrorKind::kCorrupt, "{}: tensor '{}' has shape {} but the config implies {}", t.file->path(), t.info->name,
         t.info->shape.str(), want.str());
}

}  // namespace

void WeightStore::load(const Checkpoint& ckpt, Backend& backend, const Progress& progress) {
  DType dt = backend.compute_dtype();
  size_t done = 0, bytes = 0;
  std::vector<char> staging;
  for (auto& e : entries_) {
    if (!e.tied_to.empty()) continue;
    e.tensor = backend.alloc(e.local_shape, dt);
    staging.resize(e.tensor.nbytes());
    if (e.parts.empty()) {
      CheckpointTensor src = ckpt.get(e.name);
      check_shape(src, e.full_shape);
      copy_slice(src, e.style, pc_, e.local_shape, dt, staging.data(), e.row_begin);
    } else {
      size_t offset = 0;
      for (const auto& p : e.parts) {
        CheckpointTensor src = ckpt.get(p.name);
        check_shape(src, Shape{p.rows, e.full_shape[1]});
        Shape local{p.rows / pc_.tp_size, e.full_shape[1]};
        copy_slice(src, ParallelStyle::kColumn, pc_, local, dt, staging.data() + offset);
        offset += static_cast<size_t>(local.numel()) * dtype_size(dt);
      }
    }
    backend.copy_from_host(e.tensor, staging.data());
    // The staging buffer is reused for the next tensor, so wait for an asynchronous copy.
    backend.synchronize();
    bytes += e.tensor.nbytes();
    if (progress) progress(++done, entries_.size(), bytes);
  }
  for (auto& e : entries_)
    if (!e.tied_to.empty()) e.tensor = find(e.tied_to).tensor;
}

void WeightStore::load_dummy(Backend& backend, uint64_t seed, const Progress& progress) {
  DType dt = backend.compute_dtype();
  size_t done = 0, bytes = 0, i = 0;
  for (auto& e : entries_) {
    ++i;
    if (!e.tied_to.empty()) continue;
    e.tensor = backend.alloc(e.local_shape, dt);
    if (e.init == DummyInit::kOnes)
      backend.fill(e.tensor, 1.0f);
    else
      backend.fill_random(e.tensor, seed * 1000003ull + i, -0.05f, 0.05f);
    bytes += e.tensor.nbytes();
    if (progress) progress(++done, entries_.size(), bytes);
  }
  backend.synchronize();
  for (auto& e : entries_)
    if (!e.tied_to.empty()) e.tensor = find(e.tied_to).tensor;
}

}  // namespace tessera
