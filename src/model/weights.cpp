#include "model/weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <set>

#include "core/error.h"
#include "core/logging.h"
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

void WeightStore::set_quantization(const QuantConfig& q) {
  switch (q.format.kind) {
    case WeightFormatKind::kPlain:
    case WeightFormatKind::kFp8Block:
      quant_ = q;
      return;
    default:
      fail_unsupported_format("weight loading", "(every quantised projection)", q.format);
  }
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
  for (const auto& e : entries_) {
    if (!e.tied_to.empty()) continue;
    if (e.tensor.defined())
      n += e.tensor.format().weight_bytes(e.tensor.shape(), e.tensor.dtype()) +
           e.tensor.format().scale_bytes(e.tensor.shape());
    else
      n += static_cast<size_t>(e.local_shape.numel()) * dtype_size(e.f32 ? DType::kF32 : dtype);
  }
  return n;
}

void WeightStore::for_each_tensor(const std::function<void(const std::string&, const Tensor&)>& fn) const {
  for (const auto& e : entries_)
    if (e.tied_to.empty() && e.tensor.defined()) fn(e.name, e.tensor);
}

size_t WeightStore::fp8_bytes() const {
  size_t n = 0;
  for (const auto& e : entries_)
    if (e.tied_to.empty() && e.tensor.defined() && e.tensor.format().kind == WeightFormatKind::kFp8Block)
      n += e.tensor.format().weight_bytes(e.tensor.shape(), e.tensor.dtype());
  return n;
}

size_t WeightStore::fp8_scale_bytes() const {
  size_t n = 0;
  for (const auto& e : entries_)
    if (e.tied_to.empty() && e.tensor.defined() && e.tensor.format().kind == WeightFormatKind::kFp8Block)
      n += e.tensor.format().scale_bytes(e.tensor.shape());
  return n;
}

size_t WeightStore::expert_bytes() const {
  size_t n = 0;
  for (const auto& e : entries_)
    if (e.tied_to.empty() && e.tensor.defined() && e.style == ParallelStyle::kExpert)
      n += e.tensor.format().weight_bytes(e.tensor.shape(), e.tensor.dtype()) +
           e.tensor.format().scale_bytes(e.tensor.shape());
  return n;
}

void quantize_fp8_blocks(const float* src, int64_t rows, int64_t cols, uint8_t* dst, float* scale) {
  constexpr int64_t B = Tensor::kScaleBlock;
  const int64_t cb = (cols + B - 1) / B;
  for (int64_t r0 = 0; r0 < rows; r0 += B)
    for (int64_t c0 = 0; c0 < cols; c0 += B) {
      const int64_t r1 = std::min(rows, r0 + B), c1 = std::min(cols, c0 + B);
      float amax = 0;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(src[r * cols + c]));
      const float s = amax > 0 ? amax / 448.0f : 1.0f;
      scale[(r0 / B) * cb + c0 / B] = s;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) dst[r * cols + c] = f32_to_fp8e4m3(src[r * cols + c] / s);
    }
}

namespace {

constexpr int64_t kBlock = Tensor::kScaleBlock;
int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The checkpoint's scale tensor for weight `name`: "x.weight" -> "x.weight_scale_inv",
// fused experts "x.gate_up_proj" -> "x.gate_up_proj_scale_inv".
std::string scale_name(const std::string& name) { return name + "_scale_inv"; }

// The --tensor-parallel-size values (up to 64) that split `dim` into whole 128-blocks.
std::string tp_sizes_that_work(int64_t dim) {
  std::string out = "1";
  for (int t = 2; t <= 64; t *= 2)
    if (dim % t == 0 && (dim / t) % kBlock == 0) out += ", " + std::to_string(t);
  return out;
}

using Read = CheckpointRead;

// A checkpoint tensor seen as a matrix: its last dimension is the columns, the others the rows.
// Its bytes are read through the checkpoint's StagedReader, never mapped.
struct Matrix {
  const std::string* path = nullptr;  // the file (owned by the checkpoint)
  uint64_t offset = 0;                // of element (0, 0) in the file
  StagedReader* reader = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 1, cols = 1;
  Read read = Read::kStored;
  // kValue / kScale: the tensor's block scales in f32, [rows / mat_rows * scale_rows, scale_cols]
  // (mat_rows: its dim -2, so that the experts of a fused 3-D tensor have their own blocks).
  std::shared_ptr<const std::vector<float>> scales;
  int64_t mat_rows = 1, scale_rows = 1, scale_cols = 1;
  float scale_at(int64_t r, int64_t c) const {
    return (*scales)[static_cast<size_t>(((r / mat_rows) * scale_rows + (r % mat_rows) / kBlock) * scale_cols +
                                         c / kBlock)];
  }
};

Matrix matrix_of(const CheckpointTensor& t) {
  const TensorInfo& info = *t.info;
  TESSERA_CHECK(t.reader, "{}: checkpoint tensor without a reader", info.name);
  Matrix m;
  m.path = &t.file->path();
  m.offset = info.offset;
  m.reader = t.reader;
  m.dtype = info.dtype;
  if (info.shape.ndim() == 0) return m;
  if (info.shape.ndim() == 1) {  // a vector: one element per row, so dim-0 slices are row ranges
    m.rows = info.shape[0];
    return m;
  }
  m.cols = info.shape[-1];
  for (int i = 0; i + 1 < info.shape.ndim(); ++i) m.rows *= info.shape[i];
  return m;
}

// fn(r, c, n, p) with p at element (r, c) of `m` and n elements from it, covering rows
// [r0, r0 + nr) x columns [c0, c0 + nc) in order: several rows a read where they fit the
// reader's buffer (a read spans from a row's first wanted column to the last row's last one),
// a row in pieces where one row's columns do not.
template <class Fn>
void for_each_span(const Matrix& m, int64_t r0, int64_t nr, int64_t c0, int64_t nc, Fn&& fn) {
  if (nr <= 0 || nc <= 0) return;
  const size_t es = dtype_size(m.dtype), row_bytes = static_cast<size_t>(m.cols) * es;
  const size_t span = static_cast<size_t>(nc) * es, max = m.reader->max_view_bytes();
  auto at = [&](int64_t r, int64_t c) { return m.offset + static_cast<uint64_t>(r * m.cols + c) * es; };
  if (span <= max) {
    const int64_t per = 1 + static_cast<int64_t>((max - span) / row_bytes);  // (g - 1) rows + span fit
    for (int64_t r = r0; r < r0 + nr;) {
      const int64_t g = std::min(per, r0 + nr - r);
      const char* p = m.reader->view(*m.path, at(r, c0), static_cast<size_t>(g - 1) * row_bytes + span);
      for (int64_t i = 0; i < g; ++i) fn(r + i, c0, nc, p + static_cast<size_t>(i) * row_bytes);
      r += g;
    }
    return;
  }
  const int64_t per = static_cast<int64_t>(max / es);
  for (int64_t r = r0; r < r0 + nr; ++r)
    for (int64_t c = c0; c < c0 + nc; c += per) {
      const int64_t n = std::min(per, c0 + nc - c);
      fn(r, c, n, m.reader->view(*m.path, at(r, c), static_cast<size_t>(n) * es));
    }
}

// Rows [r0, r0 + nr), columns [c0, c0 + nc) of `m`, converted to `dt`, packed into dst (a
// kValue / kScale read: f32 values or source scales, see Read).
void copy_block(const Matrix& m, int64_t r0, int64_t nr, int64_t c0, int64_t nc, DType dt, char* dst) {
  if (m.read != Read::kStored) {
    TESSERA_CHECK(dt == DType::kF32 && m.dtype == DType::kF8E4M3, "dequantising read of a {} tensor into {}",
                  dtype_name(m.dtype), dtype_name(dt));
    float* out = reinterpret_cast<float*>(dst);
    if (m.read == Read::kScale) {  // the scales alone: nothing to read from the file
      for (int64_t r = 0; r < nr; ++r)
        for (int64_t c = 0; c < nc; ++c) out[r * nc + c] = m.scale_at(r0 + r, c0 + c);
      return;
    }
    for_each_span(m, r0, nr, c0, nc, [&](int64_t r, int64_t c, int64_t n, const char* p) {
      const auto* q = reinterpret_cast<const uint8_t*>(p);
      float* o = out + (r - r0) * nc + (c - c0);
      for (int64_t j = 0; j < n; ++j) o[j] = fp8e4m3_to_f32(q[j]) * m.scale_at(r, c + j);
    });
    return;
  }
  const size_t ds = dtype_size(dt);
  if (c0 == 0 && nc == m.cols && nr > 1) {  // whole rows: one contiguous run, read as a single row
    Matrix flat = m;
    flat.offset = m.offset + static_cast<uint64_t>(r0 * m.cols) * dtype_size(m.dtype);
    flat.rows = 1;
    flat.cols = nr * nc;
    copy_block(flat, 0, 1, 0, flat.cols, dt, dst);
    return;
  }
  for_each_span(m, r0, nr, c0, nc, [&](int64_t r, int64_t c, int64_t n, const char* p) {
    convert_host(p, m.dtype, dst + static_cast<size_t>((r - r0) * nc + (c - c0)) * ds, dt, static_cast<size_t>(n));
  });
}

void check_shape(const CheckpointTensor& t, const Shape& want) {
  if (!(t.info->shape == want))
    fail(ErrorKind::kCorrupt, "{}: tensor '{}' has shape {} but the config implies {}", t.file->path(), t.info->name,
         t.info->shape.str(), want.str());
}

// The block scales of a weight as a matrix of want's shape ([rows, cols], or [E, rows, cols] read
// as [E * rows, cols]). A checkpoint may store them with size-1 dims dropped (the same bytes):
// transformers' FP8 quantizer saves the scales of an expert projection whose rows or columns fit
// one block, [1, n] (gate / up, vLLM loads them by broadcasting) or [n, 1] (down), as [n]; any
// other shape is corrupt.
Matrix scale_matrix(const CheckpointTensor& t, const Shape& want) {
  const Shape& have = t.info->shape;
  int i = 0, j = 0;  // have's dims must be want's in order, leaving out only size-1 ones
  while (j < want.ndim()) {
    if (i < have.ndim() && have[i] == want[j])
      ++i, ++j;
    else if (want[j] == 1)
      ++j;
    else
      break;
  }
  const bool ok = i == have.ndim() && j == want.ndim();
  if (!ok) check_shape(t, want);  // names both shapes
  Matrix m = matrix_of(t);
  m.cols = want[-1];
  m.rows = 1;
  for (int d = 0; d + 1 < want.ndim(); ++d) m.rows *= want[d];
  return m;
}

// `t` as `read` wants it: a kValue / kScale read of an FP8 tensor carries its block scales.
Matrix open_matrix(const Checkpoint& ckpt, const CheckpointTensor& t, Read read) {
  Matrix m = matrix_of(t);
  if (read == Read::kStored) return m;
  const Shape& shape = t.info->shape;
  TESSERA_CHECK(t.info->dtype == DType::kF8E4M3 && shape.ndim() >= 2, "{}: only FP8 weights are re-blocked",
                t.info->name);
  const Shape ss = block_scale_shape(shape);
  const Matrix sm = scale_matrix(ckpt.get(scale_name(t.info->name)), ss);
  auto v = std::make_shared<std::vector<float>>(static_cast<size_t>(sm.rows * sm.cols));
  copy_block(sm, 0, sm.rows, 0, sm.cols, DType::kF32, reinterpret_cast<char*>(v->data()));
  m.read = read;
  m.scales = std::move(v);
  m.mat_rows = shape[-2];
  m.scale_rows = ss[-2];
  m.scale_cols = ss[-1];
  return m;
}

// Re-quantises `v` [rows, cols] (each value with `src_scale`, the scale of the checkpoint block it
// came from) into fresh 128 x 128 blocks: a block's scale is the largest of its values' source
// scales, dst = fp8(v / scale). No value can overflow (|v| <= 448 * its source scale), values whose
// source scale is the block's keep their e4m3 bytes, the others are rounded once more to e4m3.
// True when every block's values shared one source scale: then nothing was rounded.
bool reblock_fp8(const float* v, const float* src_scale, int64_t rows, int64_t cols, uint8_t* dst, float* scale) {
  const int64_t cb = cdiv(cols, kBlock);
  bool exact = true;
  for (int64_t r0 = 0; r0 < rows; r0 += kBlock)
    for (int64_t c0 = 0; c0 < cols; c0 += kBlock) {
      const int64_t r1 = std::min(rows, r0 + kBlock), c1 = std::min(cols, c0 + kBlock);
      float smax = 0.0f, smin = std::numeric_limits<float>::infinity();
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) {
          smax = std::max(smax, src_scale[r * cols + c]);
          smin = std::min(smin, src_scale[r * cols + c]);
        }
      exact = exact && smin == smax;
      const float s = smax > 0.0f ? smax : 1.0f;
      scale[(r0 / kBlock) * cb + c0 / kBlock] = s;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) dst[r * cols + c] = f32_to_fp8e4m3(v[r * cols + c] / s);
    }
  return exact;
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
  // (Not zero-filled: a page is touched only when a weight is written into it, so a small model does not pay
  // for faulting in the whole buffer.)
  char* take(size_t n) {
    if (used_ + n > size_) {
      if (used_ > 0) backend_.synchronize();
      used_ = 0;
      if (n > size_) {
        size_ = std::max(n, kBytes);
        buf_.reset(new char[size_]);
      }
    }
    char* p = buf_.get() + used_;
    used_ += n;
    return p;
  }
  void upload(const Tensor& dst, const char* host) { backend_.copy_from_host(dst, host); }

 private:
  Backend& backend_;
  std::unique_ptr<char[]> buf_;
  size_t size_ = 0, used_ = 0;
};

void WeightStore::fill_entry(const Entry& e, const Checkpoint& ckpt, DType dt, char* dst, Read read) const {
  const size_t ds = dtype_size(dt);
  if (!e.blocks.empty()) {  // row blocks of one or more tensors, in order
    size_t offset = 0;
    for (const auto& b : e.blocks) {
      CheckpointTensor src = ckpt.get(b.name);
      check_shape(src, b.full_shape);
      Matrix m = open_matrix(ckpt, src, read);
      const int64_t per_row = m.rows / b.full_shape[0];
      copy_block(m, b.row_begin * per_row, b.rows * per_row, 0, m.cols, dt, dst + offset);
      offset += static_cast<size_t>(b.rows * per_row * m.cols) * ds;
    }
    return;
  }
  if (e.offset != 0.0f) {  // checkpoint + offset, added in f32
    CheckpointTensor src = ckpt.get(e.name);
    check_shape(src, e.full_shape);
    Matrix m = matrix_of(src);
    std::vector<float> f(static_cast<size_t>(m.rows * m.cols));
    copy_block(m, 0, m.rows, 0, m.cols, DType::kF32, reinterpret_cast<char*>(f.data()));
    for (float& x : f) x += e.offset;
    convert_host(f.data(), DType::kF32, dst, dt, f.size());
    return;
  }
  if (!e.parts.empty()) {  // stacked column-parallel parts (gate + up, q + k + v)
    size_t offset = 0;
    for (const auto& p : e.parts) {
      CheckpointTensor src = ckpt.get(p.name);
      check_shape(src, Shape{p.rows, e.full_shape[1]});
      const int64_t local = p.rows / pc_.tp_size;
      copy_block(open_matrix(ckpt, src, read), pc_.tp_rank * local, local, 0, e.full_shape[1], dt, dst + offset);
      offset += static_cast<size_t>(local * e.full_shape[1]) * ds;
    }
    return;
  }
  CheckpointTensor src = ckpt.get(e.name);
  check_shape(src, e.full_shape);
  Matrix m = open_matrix(ckpt, src, read);
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
    const size_t row_bytes = static_cast<size_t>(e.local_shape.numel() / per) * ds;
    if (have > 0) copy_block(m, begin * per_row, have * per_row, 0, m.cols, dt, dst);
    std::memset(dst + static_cast<size_t>(have) * row_bytes, 0, static_cast<size_t>(per - have) * row_bytes);
  } else if (e.style == ParallelStyle::kColumn) {
    const int64_t rows = e.local_shape[0] * per_row;
    copy_block(m, pc_.tp_rank * rows, rows, 0, m.cols, dt, dst);
  } else {
    copy_block(m, 0, m.rows, 0, m.cols, dt, dst);
  }
}

void WeightStore::load_entry(Entry& e, const Checkpoint& ckpt, DType dt, Stager& stager) {
  char* dst = stager.take(e.tensor.nbytes());
  fill_entry(e, ckpt, dt, dst);
  stager.upload(e.tensor, dst);
}

void WeightStore::fill_expert(const Entry& e, const Checkpoint& ckpt, int64_t j, DType dt, char* dst, Read read) const {
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
  // One expert: [2 * Il, H] or [H, Il], contiguous in the stacked tensor.
  const int64_t ge = s.expert_begin + j;
  if (gate_up) {
    const size_t half = static_cast<size_t>(Il * H) * ds;
    if (fused) {
      Matrix m = open_matrix(ckpt, fused_src, read);  // [E * 2I, H]
      copy_block(m, ge * 2 * I + i0, Il, 0, H, dt, dst);
      copy_block(m, ge * 2 * I + I + i0, Il, 0, H, dt, dst + half);
    } else {
      const std::string p = prefix + "." + std::to_string(ge) + ".";
      CheckpointTensor g = ckpt.get(p + "gate_proj.weight"), u = ckpt.get(p + "up_proj.weight");
      check_shape(g, Shape{I, H});
      check_shape(u, Shape{I, H});
      copy_block(open_matrix(ckpt, g, read), i0, Il, 0, H, dt, dst);
      copy_block(open_matrix(ckpt, u, read), i0, Il, 0, H, dt, dst + half);
    }
  } else if (fused) {
    copy_block(open_matrix(ckpt, fused_src, read), ge * H, H, i0, Il, dt, dst);  // [E * H, I]
  } else {
    CheckpointTensor d = ckpt.get(prefix + "." + std::to_string(ge) + ".down_proj.weight");
    check_shape(d, Shape{H, I});
    copy_block(open_matrix(ckpt, d, read), 0, H, i0, Il, dt, dst);
  }
}

void WeightStore::load_experts(Entry& e, const Checkpoint& ckpt, DType dt, Stager& stager) {
  for (int64_t j = 0; j < e.expert.local_experts; ++j) {
    Tensor dst_t = rows_of(e.tensor, j, 1);
    char* dst = stager.take(dst_t.nbytes());
    fill_expert(e, ckpt, j, dt, dst);
    stager.upload(dst_t, dst);
  }
}

// ---- FP8 block-scaled weights ----

void WeightStore::fill_entry_scale(const Entry& e, const Checkpoint& ckpt, char* dst) const {
  const DType f32 = DType::kF32;
  const int tp = pc_.tp_size;
  if (!e.blocks.empty()) {  // each piece's scale rows, in order (pieces on block edges: fp8_shard_problem)
    size_t offset = 0;
    for (const auto& b : e.blocks) {
      CheckpointTensor src = ckpt.get(scale_name(b.name));
      Matrix m = scale_matrix(src, block_scale_shape(b.full_shape));
      const int64_t nb = cdiv(b.rows, kBlock);
      copy_block(m, b.row_begin / kBlock, nb, 0, m.cols, f32, dst + offset);
      offset += static_cast<size_t>(nb * m.cols) * sizeof(float);
    }
    return;
  }
  if (!e.parts.empty()) {
    const int64_t kb = cdiv(e.full_shape[1], kBlock);
    size_t offset = 0;
    for (const auto& p : e.parts) {
      CheckpointTensor src = ckpt.get(scale_name(p.name));
      const Matrix m = scale_matrix(src, Shape{cdiv(p.rows, kBlock), kb});
      const int64_t local = p.rows / tp, nb = cdiv(local, kBlock);
      copy_block(m, pc_.tp_rank * local / kBlock, nb, 0, kb, f32, dst + offset);
      offset += static_cast<size_t>(nb * kb) * sizeof(float);
    }
    return;
  }
  CheckpointTensor src = ckpt.get(scale_name(e.name));
  Matrix m = scale_matrix(src, block_scale_shape(e.full_shape));
  if (e.row_begin >= 0) {
    copy_block(m, e.row_begin / kBlock, cdiv(e.local_shape[0], kBlock), 0, m.cols, f32, dst);
  } else if (e.style == ParallelStyle::kRow && tp > 1) {
    const int64_t cols = e.local_shape[-1];
    copy_block(m, 0, m.rows, pc_.tp_rank * cols / kBlock, cdiv(cols, kBlock), f32, dst);
  } else if (e.style == ParallelStyle::kColumn || e.style == ParallelStyle::kVocab) {
    const int64_t rows = e.local_shape[0];
    copy_block(m, pc_.tp_rank * rows / kBlock, cdiv(rows, kBlock), 0, m.cols, f32, dst);
  } else {
    copy_block(m, 0, m.rows, 0, m.cols, f32, dst);
  }
}

void WeightStore::fill_expert_scale(const Entry& e, const Checkpoint& ckpt, int64_t j, char* dst) const {
  const ExpertShard& s = e.expert;
  const DType f32 = DType::kF32;
  const bool gate_up = e.expert_part == Entry::ExpertPart::kGateUp;
  const int64_t E = s.num_experts, I = s.intermediate, H = gate_up ? e.full_shape[2] : e.full_shape[1];
  const int64_t Il = s.local_intermediate, i0b = s.inter_begin / kBlock, Hb = cdiv(H, kBlock);
  const int64_t ge = s.expert_begin + j;
  const std::string prefix = e.name.substr(0, e.name.rfind('.'));
  const bool fused = ckpt.contains(e.name);
  if (gate_up) {
    const int64_t Ilb = Il / kBlock;  // whole blocks (fp8_shard_problem)
    const size_t half = static_cast<size_t>(Ilb * Hb) * sizeof(float);
    if (fused) {
      CheckpointTensor src = ckpt.get(scale_name(e.name));
      const int64_t rb = cdiv(2 * I, kBlock);
      Matrix m = scale_matrix(src, Shape{E, rb, Hb});  // [E * rb, Hb]
      copy_block(m, ge * rb + i0b, Ilb, 0, Hb, f32, dst);
      copy_block(m, ge * rb + I / kBlock + i0b, Ilb, 0, Hb, f32, dst + half);
    } else {
      const std::string p = prefix + "." + std::to_string(ge) + ".";
      CheckpointTensor g = ckpt.get(p + "gate_proj.weight_scale_inv"), u = ckpt.get(p + "up_proj.weight_scale_inv");
      copy_block(scale_matrix(g, Shape{cdiv(I, kBlock), Hb}), i0b, Ilb, 0, Hb, f32, dst);
      copy_block(scale_matrix(u, Shape{cdiv(I, kBlock), Hb}), i0b, Ilb, 0, Hb, f32, dst + half);
    }
  } else if (fused) {
    CheckpointTensor src = ckpt.get(scale_name(e.name));
    copy_block(scale_matrix(src, Shape{E, Hb, cdiv(I, kBlock)}), ge * Hb, Hb, i0b, cdiv(Il, kBlock), f32,
               dst);  // [E * Hb, Ib]
  } else {
    CheckpointTensor d = ckpt.get(prefix + "." + std::to_string(ge) + ".down_proj.weight_scale_inv");
    copy_block(scale_matrix(d, Shape{Hb, cdiv(I, kBlock)}), 0, Hb, i0b, cdiv(Il, kBlock), f32, dst);
  }
}

bool WeightStore::fp8_candidate(const Entry& e) const {
  if (!quant_.fp8() || !e.tied_to.empty() || e.local_shape.ndim() < 2 || e.offset != 0.0f || e.f32) return false;
  if (e.style == ParallelStyle::kExpert) return !quant_.excluded(e.name.substr(0, e.name.rfind('.')));
  if (e.local_shape.ndim() != 2) return false;
  // Linear projections: "...proj.weight" (q_proj, gate_proj, out_proj...) and the Gated
  // DeltaNet input projections in_proj_qkv, in_proj_z, in_proj_qkvz, unless
  // modules_to_not_convert names them. Never in_proj_b / in_proj_a / in_proj_ba (the decay and
  // beta gates, a few rows each): the released FP8 checkpoints keep them in bf16.
  auto ok = [&](const std::string& n) {
    const std::string suffix = "proj.weight";
    auto ends_with = [&](const std::string& x) {
      return n.size() >= x.size() && n.compare(n.size() - x.size(), x.size(), x) == 0;
    };
    const bool proj = ends_with(suffix) || ends_with(".in_proj_qkv.weight") || ends_with(".in_proj_z.weight") ||
                      ends_with(".in_proj_qkvz.weight");
    return proj && !quant_.excluded(n);
  };
  if (!e.blocks.empty()) {  // every piece a 2-D projection weight
    for (const auto& b : e.blocks)
      if (b.full_shape.ndim() != 2 || !ok(b.name)) return false;
    return true;
  }
  if (e.parts.empty()) return ok(e.name);
  for (const auto& p : e.parts)
    if (!ok(p.name)) return false;
  return true;
}

std::vector<std::string> WeightStore::source_names(const Entry& e, const Checkpoint& ckpt) const {
  std::vector<std::string> names;
  for (const auto& b : e.blocks) names.push_back(b.name);
  for (const auto& p : e.parts) names.push_back(p.name);
  if (!names.empty()) return names;
  if (e.style == ParallelStyle::kExpert && !ckpt.contains(e.name)) {  // per-expert tensors
    const std::string p = e.name.substr(0, e.name.rfind('.')) + "." + std::to_string(e.expert.expert_begin) + ".";
    if (e.expert_part == Entry::ExpertPart::kGateUp) return {p + "gate_proj.weight", p + "up_proj.weight"};
    return {p + "down_proj.weight"};
  }
  return {e.name};
}

WeightStore::Format WeightStore::format_of(const Entry& e, const Checkpoint& ckpt) const {
  if (e.offset != 0.0f || e.f32) return Format::kPlain;  // offset or f32 parameters: never FP8
  // FP8 when every source tensor is (their e4m3 bytes and scales are copied, or re-blocked where
  // this rank's slice cuts the checkpoint's blocks: load_fp8), plain when none is.
  const std::vector<std::string> names = source_names(e, ckpt);
  const std::string* fp8 = nullptr;
  const std::string* plain = nullptr;
  for (const auto& n : names) {
    const CheckpointTensor t = ckpt.get(n);
    if (t.info->dtype == DType::kF8E5M2)
      fail(ErrorKind::kUnsupported, "{}: tensor '{}' is F8_E5M2; only e4m3 FP8 weights are supported", t.file->path(),
           n);
    (t.info->dtype == DType::kF8E4M3 ? fp8 : plain) = &n;
  }
  if (!fp8) return quant_.fp8() && !quant_.from_checkpoint && fp8_candidate(e) ? Format::kFp8Quantise : Format::kPlain;
  const CheckpointTensor t = ckpt.get(*fp8);
  if (plain)
    fail(ErrorKind::kUnsupported,
         "{}: parameter {} is assembled from '{}' (FP8) and '{}' ({}); tessera needs the pieces of one parameter all "
         "FP8 or all unquantised (list the module in modules_to_not_convert, or use the bf16 checkpoint)",
         t.file->path(), e.name, *fp8, *plain, dtype_name(ckpt.get(*plain).info->dtype));
  if (!quant_.fp8())
    fail(ErrorKind::kCorrupt,
         "{}: tensor '{}' is F8_E4M3 but config.json has no quantization_config (an FP8 checkpoint names "
         "quant_method fp8 and weight_block_size [128, 128])",
         t.file->path(), *fp8);
  // Linear weights only: 2-D tensors, or the 3-D fused experts.
  const int ndim = e.style == ParallelStyle::kExpert && ckpt.contains(e.name) ? 3 : 2;
  for (const auto& n : names) {
    const CheckpointTensor src = ckpt.get(n);
    if (src.info->shape.ndim() != ndim || (e.style != ParallelStyle::kExpert && e.local_shape.ndim() != 2))
      fail(ErrorKind::kUnsupported, "{}: tensor '{}' is FP8 but tessera reads it as {}, which is not a linear weight",
           src.file->path(), n, e.local_shape.str());
    if (!ckpt.contains(scale_name(n)))
      fail(ErrorKind::kCorrupt, "{}: FP8 tensor '{}' has no '{}' (its block scales)", src.file->path(), n,
           scale_name(n));
  }
  return Format::kFp8Checkpoint;
}

// Why the checkpoint's scale blocks cannot be copied for this rank's slice (empty when they can):
// a slice must start and end on 128-row/column block edges (the last piece of an assembled or
// stacked parameter may end with its tensor's partial block). `kind` gets the error's kind.
std::string WeightStore::fp8_shard_problem(const Entry& e, ErrorKind& kind) const {
  const int tp = pc_.tp_size;
  kind = ErrorKind::kInvalidArgument;
  auto split = [&](const std::string& what, int64_t dim) -> std::string {
    if (tp > 1 && (dim % tp != 0 || (dim / tp) % kBlock != 0))
      return fmt::format(
          "{}: FP8 block-scaled weight: {} ({}) split over --tensor-parallel-size {} is not a whole number of "
          "128-wide scale blocks per rank; tensor-parallel sizes that work for this layer: {}",
          e.name, what, dim, tp, tp_sizes_that_work(dim));
    return "";
  };
  if (e.style == ParallelStyle::kExpert) {
    // gate_up stacks each expert's gate and up rows: whole blocks only when its slice is; down's
    // columns may end with the tensor's partial block.
    const ExpertShard& s = e.expert;
    const bool down = e.expert_part == Entry::ExpertPart::kDown;
    if (s.local_intermediate % kBlock == 0 ||
        (down && s.inter_begin % kBlock == 0 && s.inter_begin + s.local_intermediate == s.intermediate))
      return "";
    if (tp > 1 && !pc_.expert_parallel)
      return fmt::format(
          "{}: FP8 experts: moe_intermediate_size ({}) split over --tensor-parallel-size {} is {} rows per rank, "
          "not a multiple of the 128-row scale blocks; tensor-parallel sizes that work: {} (or "
          "--enable-expert-parallel, which keeps experts whole)",
          e.name, s.intermediate, tp, s.local_intermediate, tp_sizes_that_work(s.intermediate));
    kind = ErrorKind::kUnsupported;
    return fmt::format("{}: FP8 experts: moe_intermediate_size ({}) is not a multiple of the 128-row scale blocks",
                       e.name, s.intermediate);
  }
  if (!e.blocks.empty()) {
    kind = ErrorKind::kUnsupported;
    for (size_t i = 0; i < e.blocks.size(); ++i) {
      const RowBlock& b = e.blocks[i];
      const int64_t end = b.row_begin + b.rows;
      const bool last = i + 1 == e.blocks.size();
      if (b.row_begin % kBlock != 0 || (end % kBlock != 0 && !(last && end == b.full_shape[0])))
        return fmt::format(
            "{}: FP8 block-scaled weight: this rank's parameter is assembled from rows [{}, {}) of '{}', which do "
            "not start and end on 128-row scale block edges",
            e.name, b.row_begin, end, b.name);
    }
    return "";
  }
  if (!e.parts.empty()) {
    for (size_t i = 0; i < e.parts.size(); ++i) {
      const Part& p = e.parts[i];
      if (std::string m = split(p.name + " rows", p.rows); !m.empty()) return m;
      if (i + 1 < e.parts.size() && (p.rows / tp) % kBlock != 0) {
        kind = ErrorKind::kUnsupported;
        return fmt::format(
            "{}: FP8 weight {} ({} rows per rank) is stacked before {}: only the last stacked part may end inside "
            "a 128-row scale block",
            e.name, p.name, p.rows / tp, e.parts[i + 1].name);
      }
    }
    return "";
  }
  if (e.row_begin >= 0) {
    const int64_t end = e.row_begin + e.local_shape[0];
    if (e.row_begin % kBlock != 0 || (end % kBlock != 0 && end != e.full_shape[0]))
      return fmt::format(
          "{}: FP8 block-scaled weight: this rank reads rows [{}, {}) (key/value heads replicated over "
          "--tensor-parallel-size {}), which are not on 128-row scale block edges; use a tensor-parallel size of "
          "at most the number of key/value heads",
          e.name, e.row_begin, end, tp);
    return "";
  }
  switch (e.style) {
    case ParallelStyle::kColumn:
    case ParallelStyle::kVocab:
      return split("output features", e.full_shape[0]);
    case ParallelStyle::kRow:
      return split("input features", e.full_shape[1]);
    default:
      return "";
  }
}

// Whether a slice that cuts the checkpoint's scale blocks may be re-blocked with rounding (not
// only where re-blocking is exact): where the model's own layout cuts them (an assembled
// parameter's pieces, experts or stacked parts whose sizes are not whole blocks), which no flag
// avoids. A tensor-parallel cut is refused instead, naming the sizes that keep the checkpoint's
// blocks (or --enable-expert-parallel), so that the weights stay the checkpoint's.
bool WeightStore::may_reblock_with_rounding(const Entry& e) const {
  return pc_.tp_size == 1 || !e.blocks.empty() || (e.style == ParallelStyle::kExpert && pc_.expert_parallel);
}

void WeightStore::load_fp8(Entry& e, const Checkpoint& ckpt, Format f, Backend& backend, Stager& stager) {
  // Checkpoint scales cover the full tensor's blocks: a slice that cuts one is re-blocked
  // (reblock_fp8). Quantising while loading makes blocks over this rank's own slice.
  ErrorKind problem_kind = ErrorKind::kInvalidArgument;
  const std::string problem = f == Format::kFp8Checkpoint ? fp8_shard_problem(e, problem_kind) : "";
  const bool reblock = !problem.empty();
  Tensor w = backend.alloc(e.local_shape, DType::kF8E4M3);
  Tensor s = backend.alloc(block_scale_shape(e.local_shape), DType::kF32);
  const bool experts = e.style == ParallelStyle::kExpert;
  const int64_t units = experts ? e.local_shape[0] : 1;
  std::vector<float> wide, src_scale;
  auto fill = [&](int64_t j, DType dt, char* dst, Read read) {
    if (experts)
      fill_expert(e, ckpt, j, dt, dst, read);
    else
      fill_entry(e, ckpt, dt, dst, read);
  };
  for (int64_t j = 0; j < units; ++j) {
    const Tensor wd = experts ? rows_of(w, j, 1) : w, sd = experts ? rows_of(s, j, 1) : s;
    // One region for both, so that a wrap of the staging buffer cannot separate them.
    char* wdst = stager.take(wd.nbytes() + sd.nbytes());
    char* sdst = wdst + wd.nbytes();
    auto* q = reinterpret_cast<uint8_t*>(wdst);
    auto* sc = reinterpret_cast<float*>(sdst);
    if (f == Format::kFp8Checkpoint && !reblock) {
      fill(j, DType::kF8E4M3, wdst, Read::kStored);
      if (experts)
        fill_expert_scale(e, ckpt, j, sdst);
      else
        fill_entry_scale(e, ckpt, sdst);
    } else if (f == Format::kFp8Checkpoint) {
      wide.resize(static_cast<size_t>(wd.numel()));
      src_scale.resize(wide.size());
      fill(j, DType::kF32, reinterpret_cast<char*>(wide.data()), Read::kValue);
      fill(j, DType::kF32, reinterpret_cast<char*>(src_scale.data()), Read::kScale);
      const bool exact = reblock_fp8(wide.data(), src_scale.data(), wd.dim(-2), wd.dim(-1), q, sc);
      if (!exact && !may_reblock_with_rounding(e)) fail(problem_kind, "{}", problem);
      if (j == 0) TLOG_DEBUG("{}: re-blocked{}", problem, exact ? " exactly" : " (values rounded once more to e4m3)");
    } else {
      wide.resize(static_cast<size_t>(wd.numel()));
      fill(j, DType::kF32, reinterpret_cast<char*>(wide.data()), Read::kStored);
      quantize_fp8_blocks(wide.data(), wd.dim(-2), wd.dim(-1), q, sc);
    }
    stager.upload(wd, wdst);
    stager.upload(sd, sdst);
  }
  if (reblock) ++reblocked_;
  e.tensor = w.with_block_scale(s);
}

void WeightStore::log_summary(const Backend& backend) const {
  const size_t fp8 = fp8_bytes();
  if (fp8 == 0) return;
  const size_t scales = fp8_scale_bytes(), total = param_bytes(backend.compute_dtype());
  TLOG_INFO("Weights: {:.2f} GiB FP8 (e4m3) + {:.1f} MiB block scales (128x128, f32), {:.2f} GiB in {}",
            fp8 / 1073741824.0, scales / 1048576.0, (total - fp8 - scales) / 1073741824.0,
            dtype_name(backend.compute_dtype()));
  if (reblocked_ > 0)
    TLOG_INFO("Weights: {} FP8 parameters re-blocked (this rank's pieces cut the checkpoint's 128x128 scale blocks)",
              reblocked_);
}

void WeightStore::load(const Checkpoint& ckpt, Backend& backend, const Progress& progress) {
  DType dt = backend.compute_dtype();
  size_t done = 0, bytes = 0;
  reblocked_ = 0;
  Stager stager(backend);
  for (auto& e : entries_) {
    if (!e.tied_to.empty()) continue;
    const DType edt = e.f32 ? DType::kF32 : dt;
    const Format f = format_of(e, ckpt);
    if (f != Format::kPlain) {
      load_fp8(e, ckpt, f, backend, stager);
    } else {
      e.tensor = backend.alloc(e.local_shape, edt);
      if (e.style == ParallelStyle::kExpert)
        load_experts(e, ckpt, edt, stager);
      else
        load_entry(e, ckpt, edt, stager);
    }
    bytes += e.tensor.nbytes();
    if (progress) progress(++done, entries_.size(), bytes);
  }
  backend.synchronize();
  ckpt.reader().close_files();  // drops what an earlier reader left of O_DIRECT files' pages
  for (auto& e : entries_)
    if (!e.tied_to.empty()) e.tensor = find(e.tied_to).tensor;
}

std::vector<WeightStore::SourceTensor> WeightStore::checkpoint_layout() const {
  std::vector<SourceTensor> out;
  std::set<std::string> seen;
  for (const auto& e : entries_) {
    if (!e.tied_to.empty()) continue;
    const bool fp8 = fp8_candidate(e);
    auto add = [&](const std::string& name, Shape shape) {
      if (seen.insert(name).second) out.push_back({name, shape, fp8});
    };
    if (!e.blocks.empty()) {
      for (const auto& b : e.blocks) add(b.name, b.full_shape);
    } else if (!e.parts.empty()) {
      for (const auto& p : e.parts) add(p.name, Shape{p.rows, e.full_shape[1]});
    } else if (e.style == ParallelStyle::kExpert) {
      const std::string prefix = e.name.substr(0, e.name.rfind('.'));
      const int64_t I = e.expert.intermediate,
                    H = e.expert_part == Entry::ExpertPart::kGateUp ? e.full_shape[2] : e.full_shape[1];
      for (int64_t x = 0; x < e.expert.num_experts; ++x) {
        const std::string p = prefix + "." + std::to_string(x) + ".";
        if (e.expert_part == Entry::ExpertPart::kGateUp) {
          add(p + "gate_proj.weight", Shape{I, H});
          add(p + "up_proj.weight", Shape{I, H});
        } else {
          add(p + "down_proj.weight", Shape{H, I});
        }
      }
    } else {
      add(e.name, e.full_shape);
    }
  }
  return out;
}

void WeightStore::load_dummy(Backend& backend, uint64_t seed, const Progress& progress) {
  DType dt = backend.compute_dtype();
  size_t done = 0, bytes = 0, i = 0;
  for (auto& e : entries_) {
    ++i;
    if (!e.tied_to.empty()) continue;
    if (fp8_candidate(e)) {
      // FP8 values spread over e4m3's range with one scale, so that the weights are uniform in
      // [-0.05, 0.05] like the bf16 dummies. Blocks are over this rank's slice (no shard limit).
      Tensor w = backend.alloc(e.local_shape, DType::kF8E4M3);
      Tensor s = backend.alloc(block_scale_shape(e.local_shape), DType::kF32);
      backend.fill_random(w, seed * 1000003ull + i, -448.0f, 448.0f);
      backend.fill(s, 0.05f / 448.0f);
      e.tensor = w.with_block_scale(s);
      bytes += e.tensor.nbytes();
      if (progress) progress(++done, entries_.size(), bytes);
      continue;
    }
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
