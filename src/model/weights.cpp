#include "model/weights.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "loader/checkpoint.h"

namespace tessera {

int64_t vocab_rows_per_rank(int64_t vocab, int tp_size) { return (vocab + tp_size - 1) / tp_size; }

ExpertShard expert_shard(const ParallelContext& pc, int64_t num_experts, int64_t intermediate) {
  ExpertShard s;
  s.num_experts = num_experts;
  s.intermediate = intermediate;
  const int tp = pc.tp_size;
  if (pc.expert_parallel) {
    if (num_experts % tp != 0)
      fail(ErrorKind::kInvalidArgument,
           "--enable-expert-parallel: num_experts ({}) is not divisible by --tensor-parallel-size {}; drop the flag "
           "to split every expert instead",
           num_experts, tp);
    s.local_experts = num_experts / tp;
    s.expert_begin = pc.tp_rank * s.local_experts;
    s.local_intermediate = intermediate;
  } else {
    if (intermediate % tp != 0)
      fail(ErrorKind::kInvalidArgument,
           "moe_intermediate_size ({}) is not divisible by --tensor-parallel-size {}; try --enable-expert-parallel",
           intermediate, tp);
    s.local_experts = num_experts;
    s.local_intermediate = intermediate / tp;
    s.inter_begin = pc.tp_rank * s.local_intermediate;
  }
  return s;
}

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
    case ParallelStyle::kExpert:
      break;
    case ParallelStyle::kColumn:
      split(0);
      break;
    case ParallelStyle::kVocab:
      s[0] = vocab_rows_per_rank(s[0], tp);
      break;
    case ParallelStyle::kRow:
      split(1);
      break;
  }
  return s;
}

WeightStore::Entry WeightStore::make_entry(const std::string& name, Shape full, Shape local, ParallelStyle style,
                                           DummyInit init) {
  Entry e;
  e.name = name;
  e.full_shape = full;
  e.local_shape = local;
  e.style = style;
  e.init = init;
  return e;
}

WeightStore::Entry& WeightStore::find(const std::string& name) {
  for (auto& e : entries_)
    if (e.name == name) return e;
  fail(ErrorKind::kInternal, "parameter {} was never declared", name);
}

const Tensor& WeightStore::declare(const std::string& name, Shape full_shape, ParallelStyle style, DummyInit init) {
  TESSERA_CHECK(style != ParallelStyle::kExpert, "{}: experts are declared with declare_experts", name);
  Entry e = make_entry(name, full_shape, local_shape(full_shape, style, name), style, init);
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
  Entry e = make_entry(label, Shape{rows, cols}, Shape{rows / pc_.tp_size, cols}, ParallelStyle::kColumn,
                       DummyInit::kUniform);
  e.parts = std::move(parts);
  entries_.push_back(std::move(e));
  return entries_.back().tensor;
}

const Tensor& WeightStore::declare_row_block(const std::string& name, Shape full_shape, int64_t row_begin,
                                             int64_t rows) {
  TESSERA_CHECK(full_shape.ndim() >= 1 && row_begin >= 0 && rows > 0 && row_begin + rows <= full_shape[0],
                "{}: rows [{}, {}) of {}", name, row_begin, row_begin + rows, full_shape.str());
  Shape local = full_shape;
  local[0] = rows;
  Entry e = make_entry(name, full_shape, local, ParallelStyle::kReplicated, DummyInit::kUniform);
  e.row_begin = row_begin;
  entries_.push_back(std::move(e));
  return entries_.back().tensor;
}

const Tensor& WeightStore::declare_row_blocks(const std::string& label, std::vector<RowBlock> blocks,
                                              Shape local_shape) {
  int64_t elems = 0;
  for (const auto& b : blocks) {
    TESSERA_CHECK(b.full_shape.ndim() >= 1 && b.row_begin >= 0 && b.rows > 0 && b.row_begin + b.rows <= b.full_shape[0],
                  "{}: rows [{}, {}) of {} {}", label, b.row_begin, b.row_begin + b.rows, b.name, b.full_shape.str());
    elems += b.rows * (b.full_shape.numel() / b.full_shape[0]);
  }
  TESSERA_CHECK(elems == local_shape.numel(), "{}: row blocks of {} elements for a {} parameter", label, elems,
                local_shape.str());
  Entry e = make_entry(label, local_shape, local_shape, ParallelStyle::kReplicated, DummyInit::kUniform);
  e.blocks = std::move(blocks);
  entries_.push_back(std::move(e));
  return entries_.back().tensor;
}

const Tensor& WeightStore::declare_f32(const std::string& name, Shape full_shape, ParallelStyle style) {
  const Tensor& t = declare(name, full_shape, style);
  entries_.back().f32 = true;
  return t;
}

const Tensor& WeightStore::declare_offset(const std::string& name, Shape shape, float offset, bool f32) {
  Entry e = make_entry(name, shape, shape, ParallelStyle::kReplicated, DummyInit::kOnes);
  e.offset = offset;
  e.f32 = f32;
  entries_.push_back(std::move(e));
  return entries_.back().tensor;
}

WeightStore::Experts WeightStore::declare_experts(const std::string& prefix, int64_t num_experts, int64_t intermediate,
                                                  int64_t hidden) {
  TESSERA_CHECK(num_experts > 0 && intermediate > 0 && hidden > 0, "{}: {} experts of {} x {}", prefix, num_experts,
                intermediate, hidden);
  ExpertShard s = expert_shard(pc_, num_experts, intermediate);
  Experts out;
  out.shard = s;
  Entry gu =
      make_entry(prefix + ".gate_up_proj", Shape{num_experts, 2 * intermediate, hidden},
                 Shape{s.local_experts, 2 * s.local_intermediate, hidden}, ParallelStyle::kExpert, DummyInit::kUniform);
  gu.expert_part = Entry::ExpertPart::kGateUp;
  gu.expert = s;
  entries_.push_back(std::move(gu));
  out.gate_up = &entries_.back().tensor;
  Entry dn =
      make_entry(prefix + ".down_proj", Shape{num_experts, hidden, intermediate},
                 Shape{s.local_experts, hidden, s.local_intermediate}, ParallelStyle::kExpert, DummyInit::kUniform);
  dn.expert_part = Entry::ExpertPart::kDown;
  dn.expert = s;
  entries_.push_back(std::move(dn));
  out.down = &entries_.back().tensor;
  return out;
}

const Tensor& WeightStore::declare_tied(const std::string& alias, const std::string& target) {
  Entry& t = find(target);
  Entry e = make_entry(alias, t.full_shape, t.local_shape, t.style, t.init);
  e.tied_to = target;
  entries_.push_back(std::move(e));
  return entries_.back().tensor;
}

size_t WeightStore::param_bytes(DType dtype) const {
  size_t n = 0;
  for (const auto& e : entries_)
    if (e.tied_to.empty()) n += static_cast<size_t>(e.local_shape.numel()) * dtype_size(e.f32 ? DType::kF32 : dtype);
  return n;
}

namespace {

// A checkpoint tensor seen as a matrix: its last dimension is the columns, the others the rows.
struct Matrix {
  const char* base;
  DType dtype;
  int64_t rows, cols;
};

Matrix matrix_of(const CheckpointTensor& t) {
  const TensorInfo& info = *t.info;
  Matrix m{static_cast<const char*>(t.file->data(info)), info.dtype, 1, 1};
  if (info.shape.ndim() == 0) return m;
  if (info.shape.ndim() == 1) {  // a vector: one element per row, so dim-0 slices are row ranges
    m.rows = info.shape[0];
    return m;
  }
  m.cols = info.shape[-1];
  for (int i = 0; i + 1 < info.shape.ndim(); ++i) m.rows *= info.shape[i];
  return m;
}

// Rows [r0, r0 + nr), columns [c0, c0 + nc) of `m`, converted to `dt`, packed into dst.
void copy_block(const Matrix& m, int64_t r0, int64_t nr, int64_t c0, int64_t nc, DType dt, char* dst) {
  const size_t es = dtype_size(m.dtype), ds = dtype_size(dt);
  if (c0 == 0 && nc == m.cols) {  // whole rows: one contiguous run
    convert_host(m.base + static_cast<size_t>(r0 * m.cols) * es, m.dtype, dst, dt, static_cast<size_t>(nr * nc));
    return;
  }
  for (int64_t r = 0; r < nr; ++r)
    convert_host(m.base + static_cast<size_t>((r0 + r) * m.cols + c0) * es, m.dtype,
                 dst + static_cast<size_t>(r * nc) * ds, dt, static_cast<size_t>(nc));
}

void check_shape(const CheckpointTensor& t, const Shape& want) {
  if (!(t.info->shape == want))
    fail(ErrorKind::kCorrupt, "{}: tensor '{}' has shape {} but the config implies {}", t.file->path(), t.info->name,
         t.info->shape.str(), want.str());
}

// A view of `rows` dim-0 rows of `t` starting at `row` (t contiguous).
Tensor rows_of(const Tensor& t, int64_t row, int64_t rows) {
  Shape s = t.shape();
  const size_t row_bytes = t.nbytes() / static_cast<size_t>(s[0]);
  s[0] = rows;
  return Tensor(t.storage(), t.offset_bytes() + static_cast<size_t>(row) * row_bytes, s, t.dtype());
}

}  // namespace

// Host memory the conversions are written into before upload. The backend's copy_from_host
// is asynchronous, so a region is reused only after a synchronize; filling the buffer front
// to back and synchronising when it wraps keeps that to one wait per buffer's worth of
// weights instead of one per tensor.
class WeightStore::Stager {
 public:
  static constexpr size_t kBytes = size_t{256} << 20;
  explicit Stager(Backend& backend) : backend_(backend) {}
  // Host bytes to convert into; upload() them before the next take().
  char* take(size_t n) {
    if (used_ + n > buf_.size()) {
      if (used_ > 0) backend_.synchronize();
      used_ = 0;
      if (n > buf_.size()) buf_.assign(std::max(n, kBytes), 0);
    }
    char* p = buf_.data() + used_;
    used_ += n;
    return p;
  }
  void upload(const Tensor& dst, const char* host) { backend_.copy_from_host(dst, host); }

 private:
  Backend& backend_;
  std::vector<char> buf_;
  size_t used_ = 0;
};

void WeightStore::load_entry(Entry& e, const Checkpoint& ckpt, DType dt, Stager& stager) {
  const size_t ds = dtype_size(dt);
  char* dst = stager.take(e.tensor.nbytes());
  if (!e.blocks.empty()) {  // row blocks of one or more tensors, in order
    size_t offset = 0;
    for (const auto& b : e.blocks) {
      CheckpointTensor src = ckpt.get(b.name);
      check_shape(src, b.full_shape);
      Matrix m = matrix_of(src);
      const int64_t per_row = m.rows / b.full_shape[0];
      copy_block(m, b.row_begin * per_row, b.rows * per_row, 0, m.cols, dt, dst + offset);
      offset += static_cast<size_t>(b.rows * per_row * m.cols) * ds;
    }
  } else if (e.offset != 0.0f) {  // checkpoint + offset, added in f32
    CheckpointTensor src = ckpt.get(e.name);
    check_shape(src, e.full_shape);
    Matrix m = matrix_of(src);
    std::vector<float> f(static_cast<size_t>(m.rows * m.cols));
    copy_block(m, 0, m.rows, 0, m.cols, DType::kF32, reinterpret_cast<char*>(f.data()));
    for (float& x : f) x += e.offset;
    convert_host(f.data(), DType::kF32, dst, dt, f.size());
  } else if (!e.parts.empty()) {  // stacked column-parallel parts (gate + up, q + k + v)
    size_t offset = 0;
    for (const auto& p : e.parts) {
      CheckpointTensor src = ckpt.get(p.name);
      check_shape(src, Shape{p.rows, e.full_shape[1]});
      const int64_t local = p.rows / pc_.tp_size;
      copy_block(matrix_of(src), pc_.tp_rank * local, local, 0, e.full_shape[1], dt, dst + offset);
      offset += static_cast<size_t>(local * e.full_shape[1]) * ds;
    }
  } else {
    CheckpointTensor src = ckpt.get(e.name);
    check_shape(src, e.full_shape);
    Matrix m = matrix_of(src);
    // Matrix rows per dim-0 index (1 for 1-D and 2-D tensors).
    const int64_t per_row = m.rows / e.full_shape[0];
    if (e.row_begin >= 0) {  // a fixed block of whole rows
      copy_block(m, e.row_begin * per_row, e.local_shape[0] * per_row, 0, m.cols, dt, dst);
    } else if (e.style == ParallelStyle::kRow && pc_.tp_size > 1) {
      const int64_t cols = e.local_shape[-1];
      copy_block(m, 0, m.rows, pc_.tp_rank * cols, cols, dt, dst);
    } else if (e.style == ParallelStyle::kVocab) {
      // Rows past the vocabulary (padding to a multiple of the TP size) stay zero.
      const int64_t per = e.local_shape[0], begin = pc_.tp_rank * per;
      const int64_t have = std::clamp<int64_t>(e.full_shape[0] - begin, 0, per);
      const size_t row_bytes = e.tensor.nbytes() / static_cast<size_t>(per);
      if (have > 0) copy_block(m, begin * per_row, have * per_row, 0, m.cols, dt, dst);
      std::memset(dst + static_cast<size_t>(have) * row_bytes, 0, static_cast<size_t>(per - have) * row_bytes);
    } else if (e.style == ParallelStyle::kColumn) {
      const int64_t rows = e.local_shape[0] * per_row;
      copy_block(m, pc_.tp_rank * rows, rows, 0, m.cols, dt, dst);
    } else {
      copy_block(m, 0, m.rows, 0, m.cols, dt, dst);
    }
  }
  stager.upload(e.tensor, dst);
}

void WeightStore::load_experts(Entry& e, const Checkpoint& ckpt, DType dt, Stager& stager) {
  const ExpertShard& s = e.expert;
  const bool gate_up = e.expert_part == Entry::ExpertPart::kGateUp;
  const int64_t I = s.intermediate, H = gate_up ? e.full_shape[2] : e.full_shape[1];
  const int64_t Il = s.local_intermediate, i0 = s.inter_begin;
  const size_t ds = dtype_size(dt);
  // e.name is prefix + ".gate_up_proj" or prefix + ".down_proj": the fused tensor's own name.
  const std::string prefix = e.name.substr(0, e.name.rfind('.'));
  const bool fused = ckpt.contains(e.name);
  CheckpointTensor fused_src;
  if (fused) {
    fused_src = ckpt.get(e.name);
    check_shape(fused_src, e.full_shape);
  }
  // One expert at a time: [2 * Il, H] or [H, Il], contiguous in the stacked tensor.
  for (int64_t j = 0; j < s.local_experts; ++j) {
    const int64_t ge = s.expert_begin + j;
    Tensor dst_t = rows_of(e.tensor, j, 1);
    char* dst = stager.take(dst_t.nbytes());
    if (gate_up) {
      const size_t half = static_cast<size_t>(Il * H) * ds;
      if (fused) {
        Matrix m = matrix_of(fused_src);  // [E * 2I, H]
        copy_block(m, ge * 2 * I + i0, Il, 0, H, dt, dst);
        copy_block(m, ge * 2 * I + I + i0, Il, 0, H, dt, dst + half);
      } else {
        const std::string p = prefix + "." + std::to_string(ge) + ".";
        CheckpointTensor g = ckpt.get(p + "gate_proj.weight"), u = ckpt.get(p + "up_proj.weight");
        check_shape(g, Shape{I, H});
        check_shape(u, Shape{I, H});
        copy_block(matrix_of(g), i0, Il, 0, H, dt, dst);
        copy_block(matrix_of(u), i0, Il, 0, H, dt, dst + half);
      }
    } else if (fused) {
      copy_block(matrix_of(fused_src), ge * H, H, i0, Il, dt, dst);  // [E * H, I]
    } else {
      CheckpointTensor d = ckpt.get(prefix + "." + std::to_string(ge) + ".down_proj.weight");
      check_shape(d, Shape{H, I});
      copy_block(matrix_of(d), 0, H, i0, Il, dt, dst);
    }
    stager.upload(dst_t, dst);
  }
}

void WeightStore::load(const Checkpoint& ckpt, Backend& backend, const Progress& progress) {
  DType dt = backend.compute_dtype();
  size_t done = 0, bytes = 0;
  Stager stager(backend);
  for (auto& e : entries_) {
    if (!e.tied_to.empty()) continue;
    const DType edt = e.f32 ? DType::kF32 : dt;
    e.tensor = backend.alloc(e.local_shape, edt);
    if (e.style == ParallelStyle::kExpert)
      load_experts(e, ckpt, edt, stager);
    else
      load_entry(e, ckpt, edt, stager);
    bytes += e.tensor.nbytes();
    if (progress) progress(++done, entries_.size(), bytes);
  }
  backend.synchronize();
  for (auto& e : entries_)
    if (!e.tied_to.empty()) e.tensor = find(e.tied_to).tensor;
}

void WeightStore::load_dummy(Backend& backend, uint64_t seed, const Progress& progress) {
  DType dt = backend.compute_dtype();
  size_t done = 0, bytes = 0, i = 0;
  for (auto& e : entries_) {
    ++i;
    if (!e.tied_to.empty()) continue;
    e.tensor = backend.alloc(e.local_shape, e.f32 ? DType::kF32 : dt);
    if (e.offset != 0.0f)
      backend.fill(e.tensor, e.offset);
    else if (e.init == DummyInit::kOnes)
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
