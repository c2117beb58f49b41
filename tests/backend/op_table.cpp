// The op table (op_table.h): the cases of every Backend op and their references.
#include "op_table.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <numeric>
#include <regex>

#include "backend/attention_metadata.h"
#include "core/dtype.h"
#include "op_reference.h"

namespace tessera::optest {
namespace {

// ---- inputs ---------------------------------------------------------------------------------------

// splitmix64: fast enough for the cases of hundreds of MB, and a URBG for std::shuffle.
struct Rng {
  using result_type = uint64_t;
  uint64_t state;
  explicit Rng(uint32_t seed) : state(seed * 0x9e3779b97f4a7c15ull + 1) {}
  static constexpr uint64_t min() { return 0; }
  static constexpr uint64_t max() { return ~uint64_t{0}; }
  uint64_t operator()() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float unit() { return static_cast<float>((*this)() >> 40) * (1.0f / 16777216.0f); }  // [0, 1)
  // Uniform values rounded to bf16, which every backend's tensors hold exactly.
  std::vector<float> uniform(int64_t n, float lo = -1.0f, float hi = 1.0f) {
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = bf16_to_f32(f32_to_bf16(lo + (hi - lo) * unit()));
    return v;
  }
  // Not rounded (casts, logits).
  std::vector<float> raw(int64_t n, float lo, float hi) {
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = lo + (hi - lo) * unit();
    return v;
  }
  int randint(int lo, int hi) { return lo + static_cast<int>((*this)() % static_cast<uint64_t>(hi - lo + 1)); }
};

// An input made on first use: a test process runs one case, and listing the tests makes none (some
// cases hold hundreds of MB). Each input has its own seed, taken in table order.
class LazyVec {
 public:
  explicit LazyVec(std::function<std::vector<float>()> make) : s_(std::make_shared<State>()) {
    s_->make = std::move(make);
  }
  const std::vector<float>& operator*() const { return get(); }
  const std::vector<float>* operator->() const { return &get(); }

 private:
  struct State {
    std::function<std::vector<float>()> make;
    std::once_flag once;
    std::vector<float> v;
  };
  const std::vector<float>& get() const {
    std::call_once(s_->once, [this] { s_->v = s_->make(); });
    return s_->v;
  }
  std::shared_ptr<State> s_;
};

uint32_t next_seed() {
  static uint32_t seed = 1;
  return seed++;
}
using Edit = std::function<void(std::vector<float>&)>;
// bf16-rounded uniform values in [lo, hi), then `edit`.
LazyVec lazy(int64_t n, float lo = -1.0f, float hi = 1.0f, Edit edit = nullptr) {
  return LazyVec([=, seed = next_seed()] {
    std::vector<float> v = Rng(seed).uniform(n, lo, hi);
    if (edit) edit(v);
    return v;
  });
}
// Not rounded (casts, logits).
LazyVec lazy_raw(int64_t n, float lo, float hi, Edit edit = nullptr) {
  return LazyVec([=, seed = next_seed()] {
    std::vector<float> v = Rng(seed).raw(n, lo, hi);
    if (edit) edit(v);
    return v;
  });
}

std::vector<double> dbl(const std::vector<float>& v) { return {v.begin(), v.end()}; }

Tensor up(Backend& be, const std::vector<float>& v, Shape shape, DType dt) {
  Tensor t = be.alloc(shape, dt);
  std::vector<uint8_t> bytes(t.nbytes());
  convert_host(v.data(), DType::kF32, bytes.data(), dt, v.size());
  be.copy_from_host(t, bytes.data());
  return t;
}
// Activations and weights: in the dtype the backend computes in.
Tensor act(Backend& be, const std::vector<float>& v, Shape shape) { return up(be, v, shape, be.compute_dtype()); }
Tensor up_i32(Backend& be, const std::vector<int32_t>& v, Shape shape) {
  Tensor t = be.alloc(shape, DType::kI32);
  be.copy_from_host(t, v.data());
  return t;
}
// An output nobody wrote yet: all bits set, NaN in every float dtype (-1 for ids), so an element
// the op skips cannot pass.
Tensor poisoned(Backend& be, Shape shape, DType dt) {
  Tensor t = be.alloc(shape, dt);
  be.copy_from_host(t, std::vector<uint8_t>(t.nbytes(), 0xff).data());
  return t;
}
std::vector<double> down(Backend& be, const Tensor& t) {
  std::vector<uint8_t> bytes(t.nbytes());
  be.copy_to_host(bytes.data(), t);
  std::vector<double> v(static_cast<size_t>(t.numel()));
  if (t.dtype() == DType::kI32) {
    const auto* p = reinterpret_cast<const int32_t*>(bytes.data());
    for (size_t i = 0; i < v.size(); ++i) v[i] = p[i];
  } else {
    std::vector<float> f(v.size());
    convert_host(bytes.data(), t.dtype(), f.data(), DType::kF32, f.size());
    std::copy(f.begin(), f.end(), v.begin());
  }
  return v;
}
Output out(const std::string& name, std::vector<double> values, bool exact = false) {
  return Output{name, std::move(values), exact};
}

// A RoPE cos/sin table [max_pos, rd]: cos of each frequency in the first half of a row, sin in the second.
std::vector<float> rope_cos_sin(int max_pos, int rd, double theta) {
  std::vector<float> cs(static_cast<size_t>(max_pos) * rd);
  for (int p = 0; p < max_pos; ++p)
    for (int i = 0; i < rd / 2; ++i) {
      const double a = p * std::pow(theta, -2.0 * i / rd);
      cs[static_cast<size_t>(p) * rd + i] = static_cast<float>(std::cos(a));
      cs[static_cast<size_t>(p) * rd + rd / 2 + i] = static_cast<float>(std::sin(a));
    }
  return cs;
}

double silu(double x) { return x / (1.0 + std::exp(-x)); }
double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// ---- the cases, one function per op family ------------------------------------------------------

using Cases = std::vector<OpCase>;

void embedding_cases(Cases& cases) {
  struct Shape3 {
    int64_t V, H;
    std::vector<int32_t> ids;
  };
  for (const Shape3& s : {Shape3{1000, 128, {0, 999, 5, 5, 17, 512, 3}}, Shape3{1000, 100, {0, 999, 5, 5, 17, 512, 3}},
                          Shape3{1000, 4096, {0, 999, 5, 5, 17, 512, 3}}}) {
    auto table = lazy(s.V * s.H);
    const int64_t T = static_cast<int64_t>(s.ids.size()), V = s.V, H = s.H;
    const std::vector<int32_t> ids = s.ids;
    auto want = [=] {
      std::vector<double> w;
      for (int32_t id : ids) w.insert(w.end(), table->begin() + id * H, table->begin() + (id + 1) * H);
      return Outputs{out("out", w, true)};
    };
    for (const char* op : {"embedding", "gather_rows"}) {
      OpCase c;
      c.op = op;
      c.name = fmt::format("{} V{} H{} T{}", op, V, H, T);
      c.run = [=, is_embedding = std::string(op) == "embedding"](Backend& be) {
        Tensor t = act(be, *table, {V, H}), o = poisoned(be, {T, H}, be.compute_dtype());
        if (is_embedding)
          be.embedding(up_i32(be, ids, {T}), t, o);
        else
          be.gather_rows(t, up_i32(be, ids, {T}), o);
        return Outputs{out("out", down(be, o), true)};
      };
      c.reference = want;
      cases.push_back(std::move(c));
    }
  }
  // Vocab-parallel: rows [begin, begin + rows) of the vocabulary; other ids give zeros.
  const int64_t V = 50, H = 72, begin = 20;
  const std::vector<int32_t> ids = {0, 19, 20, 35, 69, 70};
  const int64_t T = static_cast<int64_t>(ids.size());
  auto table = lazy(V * H);
  OpCase c;
  c.op = "embedding_slice";
  c.name = "embedding_slice V50 H72 begin20";
  c.run = [=](Backend& be) {
    Tensor o = poisoned(be, {T, H}, be.compute_dtype());
    be.embedding_slice(up_i32(be, ids, {T}), act(be, *table, {V, H}), begin, o);
    return Outputs{out("out", down(be, o), true)};
  };
  c.reference = [=] {
    std::vector<double> w(static_cast<size_t>(T * H), 0.0);
    for (int64_t t = 0; t < T; ++t)
      if (ids[t] >= begin && ids[t] < begin + V)
        for (int64_t h = 0; h < H; ++h) w[t * H + h] = (*table)[(ids[t] - begin) * H + h];
    return Outputs{out("out", w, true)};
  };
  cases.push_back(std::move(c));
}

void norm_cases(Cases& cases) {
  for (int64_t T : {1, 7, 33})
    for (int64_t D : {64, 128, 100, 4096}) {
      // T = 7: an all-zero first row (eps keeps it finite).
      auto x = lazy(T * D, -2, 2, [T, D](std::vector<float>& v) {
        if (T == 7) std::fill_n(v.begin(), D, 0.0f);
      });
      auto w = lazy(D, 0.5f, 1.5f);
      auto res = lazy(T * D, -2, 2);
      OpCase n;
      n.op = "rms_norm";
      n.name = fmt::format("rms_norm T{} D{}", T, D);
      n.run = [=](Backend& be) {
        Tensor o = poisoned(be, {T, D}, be.compute_dtype());
        be.rms_norm(act(be, *x, {T, D}), act(be, *w, {D}), 1e-6f, o);
        return Outputs{out("out", down(be, o))};
      };
      n.reference = [=] { return Outputs{out("out", rms_norm_ref(dbl(*x), dbl(*w), 1e-6))}; };
      cases.push_back(std::move(n));
      OpCase a;
      a.op = "add_rms_norm";
      a.name = fmt::format("add_rms_norm T{} D{}", T, D);
      a.run = [=](Backend& be) {
        Tensor tx = act(be, *x, {T, D}), tr = act(be, *res, {T, D});
        be.add_rms_norm(tx, tr, act(be, *w, {D}), 1e-6f);
        return Outputs{out("residual", down(be, tr)), out("out", down(be, tx))};
      };
      a.reference = [=] {
        std::vector<double> sum = dbl(*res);
        for (size_t i = 0; i < sum.size(); ++i) sum[i] += (*x)[i];
        return Outputs{out("residual", sum), out("out", rms_norm_ref(sum, dbl(*w), 1e-6))};
      };
      cases.push_back(std::move(a));
    }
  // Per head of [T, H, D] in place (q_norm / k_norm).
  const int64_t T = 5, H = 3, D = 24;
  auto q = lazy(T * H * D, -3, 3);
  auto w = lazy(D, 0.5f, 1.5f);
  OpCase c;
  c.op = "rms_norm";
  c.name = "rms_norm heads T5 H3 D24 in place";
  c.run = [=](Backend& be) {
    Tensor t = act(be, *q, {T, H, D});
    be.rms_norm(t, act(be, *w, {D}), 1e-5f, t);
    return Outputs{out("out", down(be, t))};
  };
  c.reference = [=] { return Outputs{out("out", rms_norm_ref(dbl(*q), dbl(*w), 1e-5))}; };
  cases.push_back(std::move(c));
}

void linear_cases(Cases& cases) {
  struct L {
    int64_t T, K, N;
    bool bias, f32_out;
  };
  // cuBLASLt for larger M, the decode GEMV for M <= 8 (split-K, ragged tails), f32 and bf16 outputs.
  const std::vector<L> shapes = {
      {1, 128, 256, false, false},        {7, 256, 72, true, false},      {33, 512, 1000, false, true},
      {33, 4096, 1024, true, true},       {1, 4096, 4096, false, false},  {7, 64, 17, false, true},
      {2, 4096, 1024, false, false},      {3, 12288, 4096, false, false}, {4, 1032, 333, true, true},
      {5, 256, 8192, false, false},       {6, 4096, 1, false, true},      {8, 8, 5, false, false},
      {8, 4096, 151936 / 16, false, true}};
  for (const L& s : shapes) {
    auto x = lazy(s.T * s.K);
    auto w = lazy(s.N * s.K, -0.1f, 0.1f);
    auto b = lazy(s.N);
    OpCase c;
    c.op = "linear";
    c.name = fmt::format("linear T{} K{} N{}{}{}", s.T, s.K, s.N, s.bias ? " bias" : "", s.f32_out ? " f32 out" : "");
    c.run = [=](Backend& be) {
      Tensor o = poisoned(be, {s.T, s.N}, s.f32_out ? DType::kF32 : be.compute_dtype());
      Tensor tb = act(be, *b, {s.N});
      be.linear(act(be, *x, {s.T, s.K}), act(be, *w, {s.N, s.K}), s.bias ? &tb : nullptr, o);
      return Outputs{out("out", down(be, o))};
    };
    c.reference = [=] {
      std::vector<double> o(static_cast<size_t>(s.T * s.N));
      for (int64_t m = 0; m < s.T; ++m)
        for (int64_t n = 0; n < s.N; ++n) {
          double acc = s.bias ? (*b)[n] : 0.0;
          const float* xr = x->data() + m * s.K;
          const float* wr = w->data() + n * s.K;
          for (int64_t k = 0; k < s.K; ++k) acc += static_cast<double>(xr[k]) * wr[k];
          o[m * s.N + n] = acc;
        }
      return Outputs{out("out", o)};
    };
    cases.push_back(std::move(c));
  }
  // Rows of a 3-d input flatten into M (as the attention projections use it).
  auto x = lazy(3 * 2 * 8);
  auto w = lazy(5 * 8);
  OpCase c;
  c.op = "linear";
  c.name = "linear 3-d input";
  c.run = [=](Backend& be) {
    Tensor o = poisoned(be, {6, 5}, be.compute_dtype());
    be.linear(act(be, *x, {3, 2, 8}), act(be, *w, {5, 8}), nullptr, o);
    return Outputs{out("out", down(be, o))};
  };
  c.reference = [=] {
    std::vector<double> o(30, 0.0);
    for (int m = 0; m < 6; ++m)
      for (int n = 0; n < 5; ++n)
        for (int k = 0; k < 8; ++k) o[m * 5 + n] += static_cast<double>((*x)[m * 8 + k]) * (*w)[n * 8 + k];
    return Outputs{out("out", o)};
  };
  cases.push_back(std::move(c));
}

void elementwise_cases(Cases& cases) {
  for (int64_t T : {1, 7, 33})
    for (int64_t I : {64, 100, 12288}) {
      auto gu = lazy(T * 2 * I, -4, 4);
      auto a = lazy(T * I);
      auto b = lazy(T * I);
      OpCase s;
      s.op = "silu_mul";
      s.name = fmt::format("silu_mul T{} I{}", T, I);
      s.run = [=](Backend& be) {
        Tensor o = poisoned(be, {T, I}, be.compute_dtype());
        be.silu_mul(act(be, *gu, {T, 2 * I}), o);
        return Outputs{out("out", down(be, o))};
      };
      s.reference = [=] {
        std::vector<double> o;
        for (int64_t t = 0; t < T; ++t)
          for (int64_t i = 0; i < I; ++i) o.push_back(silu((*gu)[t * 2 * I + i]) * (*gu)[t * 2 * I + I + i]);
        return Outputs{out("out", o)};
      };
      cases.push_back(std::move(s));
      OpCase d;
      d.op = "add";
      d.name = fmt::format("add T{} I{}", T, I);
      d.run = [=](Backend& be) {
        Tensor o = poisoned(be, {T, I}, be.compute_dtype());
        be.add(act(be, *a, {T, I}), act(be, *b, {T, I}), o);
        return Outputs{out("out", down(be, o))};
      };
      d.reference = [=] {
        std::vector<double> o(a->size());
        for (size_t i = 0; i < o.size(); ++i) o[i] = static_cast<double>((*a)[i]) + (*b)[i];
        return Outputs{out("out", o)};
      };
      cases.push_back(std::move(d));
    }
  for (int64_t T : {1, 7, 300})
    for (int64_t D : {1, 100, 2048}) {
      auto x = lazy(T * D, -4, 4);
      auto g = lazy(T * D, -8, 8);
      auto gr = lazy(T, -8, 8);
      OpCase e;
      e.op = "sigmoid_mul";
      e.name = fmt::format("sigmoid_mul T{} D{}", T, D);
      e.run = [=](Backend& be) {
        Tensor o = poisoned(be, {T, D}, be.compute_dtype());
        be.sigmoid_mul(act(be, *x, {T, D}), act(be, *g, {T, D}), o);
        return Outputs{out("out", down(be, o))};
      };
      e.reference = [=] {
        std::vector<double> o(x->size());
        for (size_t i = 0; i < o.size(); ++i) o[i] = (*x)[i] * sigmoid((*g)[i]);
        return Outputs{out("out", o)};
      };
      cases.push_back(std::move(e));
      OpCase p;
      p.op = "sigmoid_mul";
      p.name = fmt::format("sigmoid_mul per row in place T{} D{}", T, D);
      p.run = [=](Backend& be) {
        Tensor tx = act(be, *x, {T, D});
        be.sigmoid_mul(tx, act(be, *gr, {T, 1}), tx);
        return Outputs{out("out", down(be, tx))};
      };
      p.reference = [=] {
        std::vector<double> o(x->size());
        for (int64_t t = 0; t < T; ++t)
          for (int64_t i = 0; i < D; ++i) o[t * D + i] = (*x)[t * D + i] * sigmoid((*gr)[t]);
        return Outputs{out("out", o)};
      };
      cases.push_back(std::move(p));
    }
}

void rope_cases(Cases& cases) {
  struct R {
    bool neox;
    int D, rd;
    double theta;
  };
  std::vector<R> shapes;
  for (bool neox : {true, false})
    for (int D : {64, 128})
      for (int rd : {D, D / 2}) shapes.push_back({neox, D, rd, 10000.0});
  shapes.push_back({false, 64, 16, 500000.0});  // a small rotary part, a large theta
  for (const R& s : shapes) {
    const int64_t T = 33, Hq = 8, Hk = 2, max_pos = 4096;
    Rng r(static_cast<uint32_t>(s.D * 10 + s.rd + (s.neox ? 1000 : 0)));
    auto q = lazy(T * Hq * s.D);
    auto k = lazy(T * Hk * s.D);
    std::vector<int32_t> pos(T);
    for (auto& p : pos) p = r.randint(0, max_pos - 1);  // unsorted, with repeats, like a batch
    OpCase c;
    c.op = "rope";
    c.name = fmt::format("rope {} D{} rd{} theta{}", s.neox ? "neox" : "interleaved", s.D, s.rd, s.theta);
    c.run = [=](Backend& be) {
      Tensor tq = act(be, *q, {T, Hq, s.D}), tk = act(be, *k, {T, Hk, s.D});
      RopeTable table{up(be, rope_cos_sin(max_pos, s.rd, s.theta), {max_pos, s.rd}, DType::kF32), s.rd, s.neox};
      be.rope(tq, tk, up_i32(be, pos, {T}), table);
      return Outputs{out("q", down(be, tq)), out("k", down(be, tk))};
    };
    c.reference = [=] {
      return Outputs{out("q", rope_ref(dbl(*q), Hq, s.D, pos, s.rd, s.theta, s.neox)),
                     out("k", rope_ref(dbl(*k), Hk, s.D, pos, s.rd, s.theta, s.neox))};
    };
    c.tol_f32 = 2e-5;  // positions up to 4096: the f32 table's angle error
    cases.push_back(std::move(c));
  }
}

void cast_cases(Cases& cases) {
  const std::vector<std::pair<DType, DType>> pairs = {{DType::kF32, DType::kBF16},
                                                      {DType::kBF16, DType::kF32},
                                                      {DType::kF32, DType::kF16},
                                                      {DType::kBF16, DType::kF8E4M3},
                                                      {DType::kF8E4M3, DType::kBF16}};
  for (auto [from, to] : pairs) {
    const int64_t n = 1031;
    auto src = lazy_raw(n, -3, 3);
    OpCase c;
    c.op = "cast";
    c.name = fmt::format("cast {} to {}", dtype_name(from), dtype_name(to));
    c.run = [=](Backend& be) {
      Tensor o = poisoned(be, {n}, to);
      be.cast(up(be, *src, {n}, from), o);
      return Outputs{out("out", down(be, o), true)};
    };
    c.reference = [=] {  // the same conversions on the host (core/dtype.h)
      std::vector<uint8_t> a(n * dtype_size(from)), b(n * dtype_size(to));
      std::vector<float> f(static_cast<size_t>(n));
      convert_host(src->data(), DType::kF32, a.data(), from, n);
      convert_host(a.data(), from, b.data(), to, n);
      convert_host(b.data(), to, f.data(), DType::kF32, n);
      return Outputs{out("out", dbl(f), true)};
    };
    cases.push_back(std::move(c));
  }
}

void moe_cases(Cases& cases) {
  for (int64_t E : {8, 60, 128, 512})
    for (int k : {1, 2, 8})
      for (bool renormalize : {true, false}) {
        const int64_t T = E == 128 ? 300 : 37;
        auto logits = lazy(T * E, -4, 4, [E](std::vector<float>& v) {
          std::fill(v.begin() + E, v.begin() + 2 * E, 0.25f);  // row 1: all tied, lower ids win
        });
        OpCase c;
        c.op = "moe_topk";
        c.name = fmt::format("moe_topk E{} k{}{}", E, k, renormalize ? " renormalized" : "");
        c.run = [=](Backend& be) {
          Tensor ids = poisoned(be, {T, k}, DType::kI32), w = poisoned(be, {T, k}, DType::kF32);
          be.moe_topk(up(be, *logits, {T, E}, DType::kF32), k, renormalize, ids, w);
          return Outputs{out("ids", down(be, ids), true), out("weights", down(be, w))};
        };
        c.reference = [=] {
          std::vector<int32_t> ids;
          std::vector<double> w;
          moe_topk_ref(dbl(*logits), static_cast<int>(E), k, renormalize, ids, w);
          return Outputs{out("ids", std::vector<double>(ids.begin(), ids.end()), true), out("weights", w)};
        };
        c.tol_bf16 = 1e-5;  // router logits and weights are f32 on every backend
        cases.push_back(std::move(c));
      }
  struct M {
    int64_t T, E, k, H, I, E_local, begin;
  };
  // Decode and prefill shapes, ragged H and I, expert-parallel slices with a token routed only elsewhere.
  for (const M& s : {M{1, 8, 2, 256, 128, 8, 0}, M{3, 64, 8, 264, 96, 64, 0}, M{33, 128, 8, 512, 128, 128, 0},
                     M{3, 64, 8, 256, 128, 16, 16}, M{40, 64, 8, 256, 64, 16, 48}}) {
    Rng r(static_cast<uint32_t>(s.T * 31 + s.E * 7 + s.H + s.begin));
    auto x = lazy(s.T * s.H);
    auto gu = lazy(s.E_local * 2 * s.I * s.H, -0.1f, 0.1f);
    auto dn = lazy(s.E_local * s.H * s.I, -0.1f, 0.1f);
    // Routing from the reference top-k of random logits; weights rounded to f32.
    std::vector<int32_t> ids;
    std::vector<double> wd;
    moe_topk_ref(dbl(r.uniform(s.T * s.E, -3, 3)), static_cast<int>(s.E), static_cast<int>(s.k), true, ids, wd);
    if (s.E_local < s.E && s.T > 1)  // token 1's experts all on other ranks: a zero row
      for (int64_t j = 0; j < s.k; ++j)
        ids[s.k + j] = static_cast<int32_t>(s.begin > 0 ? j % s.begin : s.begin + s.E_local + j % (s.E - s.E_local));
    auto w = std::make_shared<std::vector<float>>(wd.begin(), wd.end());
    OpCase c;
    c.op = "moe_experts";
    c.name = fmt::format("moe_experts T{} E{} k{} H{} I{} local{} from{}", s.T, s.E, s.k, s.H, s.I, s.E_local, s.begin);
    c.run = [=](Backend& be) {
      Tensor o = poisoned(be, {s.T, s.H}, be.compute_dtype());
      be.moe_experts(act(be, *x, {s.T, s.H}), act(be, *gu, {s.E_local, 2 * s.I, s.H}),
                     act(be, *dn, {s.E_local, s.H, s.I}), up_i32(be, ids, {s.T, s.k}),
                     up(be, *w, {s.T, s.k}, DType::kF32), static_cast<int>(s.begin), o);
      return Outputs{out("out", down(be, o))};
    };
    c.reference = [=] {
      return Outputs{
          out("out", moe_experts_ref(dbl(*x), dbl(*gu), dbl(*dn), ids, dbl(*w), static_cast<int>(s.T),
                                     static_cast<int>(s.H), static_cast<int>(s.I), static_cast<int>(s.E_local),
                                     static_cast<int>(s.k), static_cast<int>(s.begin)))};
    };
    c.tol_f32 = 1e-4;
    cases.push_back(std::move(c));
    if (s.E_local != s.E) continue;
    // moe_topk_experts: the routing from the router logits and the experts in one call (no shared expert).
    auto logits = std::make_shared<std::vector<float>>(r.uniform(s.T * s.E, -3, 3));
    std::vector<int32_t> ids2;
    std::vector<double> wd2;
    moe_topk_ref(dbl(*logits), static_cast<int>(s.E), static_cast<int>(s.k), true, ids2, wd2);
    OpCase t;
    t.op = "moe_topk_experts";
    t.name = fmt::format("moe_topk_experts T{} E{} k{} H{} I{}", s.T, s.E, s.k, s.H, s.I);
    t.run = [=](Backend& be) {
      Tensor o = poisoned(be, {s.T, s.H}, be.compute_dtype());
      Tensor ids_t = be.alloc({s.T, s.k}, DType::kI32), w_t = be.alloc({s.T, s.k}, DType::kF32);
      be.moe_topk_experts(up(be, *logits, {s.T, s.E}, DType::kF32), static_cast<int>(s.k), true,
                          act(be, *x, {s.T, s.H}), act(be, *gu, {s.E, 2 * s.I, s.H}), act(be, *dn, {s.E, s.H, s.I}),
                          ids_t, w_t, 0, o, nullptr);
      return Outputs{out("out", down(be, o))};
    };
    t.reference = [=] {
      return Outputs{out(
          "out", moe_experts_ref(dbl(*x), dbl(*gu), dbl(*dn), ids2, wd2, static_cast<int>(s.T), static_cast<int>(s.H),
                                 static_cast<int>(s.I), static_cast<int>(s.E), static_cast<int>(s.k), 0))};
    };
    t.tol_f32 = 1e-4;
    cases.push_back(std::move(t));
  }
}

// ---- attention ----

// A step's sequences over a paged cache with shuffled physical blocks.
struct PagedStep {
  int bs = 16, num_blocks = 0, max_blocks = 0;
  std::vector<int> cached, qlen;
  std::vector<int32_t> table;
  int S() const { return static_cast<int>(cached.size()); }
  int T() const { return std::accumulate(qlen.begin(), qlen.end(), 0); }
  int slot(int s, int p) const { return table[static_cast<size_t>(s) * max_blocks + p / bs] * bs + p % bs; }
  AttentionLayout layout() const {
    AttentionLayout l;
    l.block_size = bs;
    l.max_blocks_per_seq = max_blocks;
    l.block_tables = table;
    l.query_start_loc.push_back(0);
    for (int s = 0; s < S(); ++s) {
      for (int i = 0; i < qlen[s]; ++i) l.slot_mapping.push_back(slot(s, cached[s] + i));
      l.query_start_loc.push_back(l.query_start_loc.back() + qlen[s]);
      l.seq_lens.push_back(cached[s] + qlen[s]);
    }
    return l;
  }
  // Points the table entries of the blocks wholly before each sequence's first window (its first
  // query, at cached[s], attends from cached[s] - window + 1 on) at block `to`, as a sliding-window
  // cache manager may give such blocks to other sequences.
  void give_away_before_window(int window, int32_t to) {
    for (int s = 0; s < S(); ++s)
      for (int b = 0; (b + 1) * bs <= cached[s] - window + 1; ++b) table[static_cast<size_t>(s) * max_blocks + b] = to;
  }
  std::vector<int32_t> positions() const {
    std::vector<int32_t> p;
    for (int s = 0; s < S(); ++s)
      for (int i = 0; i < qlen[s]; ++i) p.push_back(cached[s] + i);
    return p;
  }
};

PagedStep paged_step(Rng& r, std::vector<int> cached, std::vector<int> qlen) {
  PagedStep st;
  st.cached = std::move(cached);
  st.qlen = std::move(qlen);
  int total = 0;
  std::vector<int> nblocks;
  for (int s = 0; s < st.S(); ++s) {
    nblocks.push_back((st.cached[s] + st.qlen[s] + st.bs - 1) / st.bs);
    st.max_blocks = std::max(st.max_blocks, nblocks.back() + 1);  // padded tables
    total += nblocks.back();
  }
  st.num_blocks = total + 3;  // spare blocks nobody owns
  std::vector<int32_t> physical(static_cast<size_t>(st.num_blocks));
  std::iota(physical.begin(), physical.end(), 0);
  std::shuffle(physical.begin(), physical.end(), r);
  int next = 0;
  for (int s = 0; s < st.S(); ++s)
    for (int b = 0; b < st.max_blocks; ++b) st.table.push_back(b < nblocks[s] ? physical[next++] : 0);
  return st;
}

// Causal attention of q [T, Hq, D] over the host cache [blocks, bs, Hk, D] at the step's slots; with
// a sliding window W > 0, the query at position p attends the keys at p - W < j <= p only.
std::vector<double> attention_ref(const PagedStep& st, const std::vector<double>& q, const std::vector<double>& kc,
                                  const std::vector<double>& vc, int Hq, int Hk, int D, int window = 0) {
  std::vector<double> o(static_cast<size_t>(st.T()) * Hq * D);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  int t = 0;
  for (int s = 0; s < st.S(); ++s)
    for (int i = 0; i < st.qlen[s]; ++i, ++t) {
      const int pos = st.cached[s] + i, first = window > 0 ? std::max(0, pos - window + 1) : 0;
      for (int h = 0; h < Hq; ++h) {
        const int kh = h / (Hq / Hk);
        std::vector<double> sc(static_cast<size_t>(pos + 1 - first));
        double mx = -INFINITY;
        for (int j = first; j <= pos; ++j) {
          const size_t off = (static_cast<size_t>(st.slot(s, j)) * Hk + kh) * D;
          double dot = 0;
          for (int d = 0; d < D; ++d) dot += q[(static_cast<size_t>(t) * Hq + h) * D + d] * kc[off + d];
          sc[j - first] = dot * scale;
          mx = std::max(mx, sc[j - first]);
        }
        double sum = 0;
        for (auto& x : sc) sum += (x = std::exp(x - mx));
        for (int d = 0; d < D; ++d) {
          double acc = 0;
          for (int j = first; j <= pos; ++j)
            acc += sc[j - first] / sum * vc[(static_cast<size_t>(st.slot(s, j)) * Hk + kh) * D + d];
          o[(static_cast<size_t>(t) * Hq + h) * D + d] = acc;
        }
      }
    }
  return o;
}

// What qkv_prologue does, on the host: q out, and k/v written into the host caches.
std::vector<double> prologue_ref(const std::vector<float>& qkv, const std::vector<float>* qn,
                                 const std::vector<float>* kn, float eps, const std::vector<int32_t>& pos,
                                 const std::vector<int32_t>& slots, int Hq, int Hk, int D, int rd, double theta,
                                 bool neox, std::vector<double>& kc, std::vector<double>& vc) {
  const int T = static_cast<int>(pos.size()), W = (Hq + 2 * Hk) * D;
  std::vector<double> q(static_cast<size_t>(T) * Hq * D), k(static_cast<size_t>(T) * Hk * D);
  for (int t = 0; t < T; ++t) {
    for (int i = 0; i < Hq * D; ++i) q[static_cast<size_t>(t) * Hq * D + i] = qkv[static_cast<size_t>(t) * W + i];
    for (int i = 0; i < Hk * D; ++i)
      k[static_cast<size_t>(t) * Hk * D + i] = qkv[static_cast<size_t>(t) * W + Hq * D + i];
  }
  if (qn) q = rms_norm_ref(q, dbl(*qn), eps);
  if (kn) k = rms_norm_ref(k, dbl(*kn), eps);
  q = rope_ref(q, Hq, D, pos, rd, theta, neox);
  k = rope_ref(k, Hk, D, pos, rd, theta, neox);
  for (int t = 0; t < T; ++t) {
    if (slots[t] < 0) continue;
    for (int i = 0; i < Hk * D; ++i) {
      kc[static_cast<size_t>(slots[t]) * Hk * D + i] = k[static_cast<size_t>(t) * Hk * D + i];
      vc[static_cast<size_t>(slots[t]) * Hk * D + i] = qkv[static_cast<size_t>(t) * W + (Hq + Hk) * D + i];
    }
  }
  return q;
}

void attention_cases(Cases& cases) {
  // write_kv: a padding token (slot -1) writes nothing; every other slot keeps its zero.
  {
    const int64_t Hk = 2, D = 64, bs = 16, blocks = 4, T = 6;
    const std::vector<int32_t> slots = {5, 63, -1, 16, 0, 40};
    auto k = lazy(T * Hk * D);
    auto v = lazy(T * Hk * D);
    OpCase c;
    c.op = "write_kv";
    c.name = "write_kv Hk2 D64 with a padding token";
    c.run = [=](Backend& be) {
      AttentionLayout l;
      l.block_size = static_cast<int>(bs);
      l.max_blocks_per_seq = static_cast<int>(blocks);
      l.block_tables = {0, 1, 2, 3};
      l.query_start_loc = {0, static_cast<int32_t>(T)};
      l.seq_lens = {static_cast<int32_t>(T)};
      l.slot_mapping = slots;
      Tensor kc = be.alloc({blocks, bs, Hk, D}, be.compute_dtype()),
             vc = be.alloc({blocks, bs, Hk, D}, be.compute_dtype());
      be.fill(kc, 0.0f);
      be.fill(vc, 0.0f);
      be.write_kv(act(be, *k, {T, Hk, D}), act(be, *v, {T, Hk, D}), kc, vc, upload_attention_metadata(be, l), 1.0f,
                  1.0f);
      return Outputs{out("k_cache", down(be, kc), true), out("v_cache", down(be, vc), true)};
    };
    c.reference = [=] {
      std::vector<double> kc(static_cast<size_t>(blocks * bs * Hk * D), 0.0), vc = kc;
      for (int64_t t = 0; t < T; ++t)
        if (slots[t] >= 0)
          for (int64_t i = 0; i < Hk * D; ++i) {
            kc[slots[t] * Hk * D + i] = (*k)[t * Hk * D + i];
            vc[slots[t] * Hk * D + i] = (*v)[t * Hk * D + i];
          }
      return Outputs{out("k_cache", kc, true), out("v_cache", vc, true)};
    };
    cases.push_back(std::move(c));
  }
  // paged_attention: prefill, decode, a chunk after a cached prefix and a long decode in one step.
  struct A {
    int Hq, Hk, D;
  };
  for (const A& s : {A{4, 2, 64}, A{8, 2, 128}, A{14, 2, 128}, A{16, 2, 256}}) {
    Rng r(static_cast<uint32_t>(s.Hq * 100 + s.D));
    auto st = std::make_shared<PagedStep>(paged_step(r, {0, 20, 17, 70}, {5, 1, 4, 1}));
    const int64_t cache_n = static_cast<int64_t>(st->num_blocks) * st->bs * s.Hk * s.D;
    auto kc = lazy(cache_n);
    auto vc = lazy(cache_n);
    auto q = lazy(static_cast<int64_t>(st->T()) * s.Hq * s.D);
    OpCase c;
    c.op = "paged_attention";
    c.name = fmt::format("paged_attention Hq{} Hk{} D{}", s.Hq, s.Hk, s.D);
    c.run = [=](Backend& be) {
      const Shape cs{st->num_blocks, st->bs, s.Hk, s.D};
      const int64_t T = st->T();
      Tensor o = poisoned(be, {T, s.Hq, s.D}, be.compute_dtype());
      be.paged_attention(act(be, *q, {T, s.Hq, s.D}), act(be, *kc, cs), act(be, *vc, cs),
                         upload_attention_metadata(be, st->layout()), 1.0f / std::sqrt(static_cast<float>(s.D)), 1.0f,
                         1.0f, 0, o);
      return Outputs{out("out", down(be, o))};
    };
    c.reference = [=] { return Outputs{out("out", attention_ref(*st, dbl(*q), dbl(*kc), dbl(*vc), s.Hq, s.Hk, s.D))}; };
    cases.push_back(std::move(c));
  }
  // paged_attention with a sliding window W: shorter than a block (1, 5), one block (16), across
  // blocks (37) and longer than every context (1000); a decode step (one query per sequence: CUDA's
  // split-K decode kernel) and a prefill step (long queries from 0 and after a cached prefix: its
  // tensor-core prefill kernel), head_dim 64 and 128. The blocks wholly before each sequence's first
  // window point at a block of NaN (a sliding-window cache manager may give them away): a kernel that
  // reads them, or any key outside a query's window, fails.
  struct Win {
    int window, D;
    bool decode;
  };
  for (const Win& s :
       {Win{1, 128, true}, Win{5, 128, true}, Win{16, 64, true}, Win{37, 128, true}, Win{1000, 128, true},
        Win{1, 64, false}, Win{5, 128, false}, Win{16, 128, false}, Win{37, 64, false}, Win{1000, 128, false}}) {
    const int Hq = 8, Hk = 2;
    Rng r(static_cast<uint32_t>(s.window * 10 + s.D + s.decode));
    auto st = std::make_shared<PagedStep>(s.decode ? paged_step(r, {20, 70, 3, 200, 47}, {1, 1, 1, 1, 1})
                                                   : paged_step(r, {0, 20, 17, 70, 90}, {45, 1, 4, 33, 70}));
    const int32_t poison = st->num_blocks++;  // (no sequence owns it)
    st->give_away_before_window(s.window, poison);
    const int64_t block_n = static_cast<int64_t>(st->bs) * Hk * s.D, cache_n = st->num_blocks * block_n;
    auto nan_block = [=](std::vector<float>& v) {
      std::fill(v.begin() + poison * block_n, v.begin() + (poison + 1) * block_n, NAN);
    };
    auto kc = lazy(cache_n, -1, 1, nan_block);
    auto vc = lazy(cache_n, -1, 1, nan_block);
    auto q = lazy(static_cast<int64_t>(st->T()) * Hq * s.D);
    OpCase c;
    c.op = "paged_attention";
    c.name = fmt::format("paged_attention window {} D{} {}", s.window, s.D, s.decode ? "decode" : "prefill");
    c.run = [=](Backend& be) {
      const Shape cs{st->num_blocks, st->bs, Hk, s.D};
      const int64_t T = st->T();
      Tensor o = poisoned(be, {T, Hq, s.D}, be.compute_dtype());
      be.paged_attention(act(be, *q, {T, Hq, s.D}), act(be, *kc, cs), act(be, *vc, cs),
                         upload_attention_metadata(be, st->layout()), 1.0f / std::sqrt(static_cast<float>(s.D)), 1.0f,
                         1.0f, s.window, o);
      return Outputs{out("out", down(be, o))};
    };
    c.reference = [=] {
      return Outputs{out("out", attention_ref(*st, dbl(*q), dbl(*kc), dbl(*vc), Hq, Hk, s.D, s.window))};
    };
    cases.push_back(std::move(c));
  }
  // qkv_prologue and qkv_attention on a fused QKV projection: q/k norms or none, full and partial
  // rotary dims; a decode-only step (the fused decode kernel on CUDA) and a mixed one.
  // Two more with a sliding window: a decode-only step and a mixed one.
  struct P {
    int D, rd;
    bool norm;
    std::vector<int> cached, qlen;
    int window = 0;
  };
  for (const P& s : {P{128, 128, true, {0, 30}, {6, 1}}, P{64, 32, false, {5, 16, 40}, {1, 1, 1}},
                     P{256, 64, true, {3, 18}, {1, 1}}, P{64, 64, true, {0, 9, 33}, {7, 2, 1}},
                     P{128, 128, true, {5, 40, 90}, {1, 1, 1}, 16}, P{64, 64, true, {0, 9, 33}, {40, 2, 1}, 7}}) {
    const int Hq = 8, Hk = 2, D = s.D;
    const double theta = 10000.0;
    Rng r(static_cast<uint32_t>(D * 7 + s.rd + s.qlen.size()));
    auto st = std::make_shared<PagedStep>(paged_step(r, s.cached, s.qlen));
    const int64_t T = st->T(), cache_n = static_cast<int64_t>(st->num_blocks) * st->bs * Hk * D;
    auto qkv = lazy(T * (Hq + 2 * Hk) * D, -2, 2);
    auto qn = lazy(D, 0.5f, 1.5f);
    auto kn = lazy(D, 0.5f, 1.5f);
    auto kc = lazy(cache_n);
    auto vc = lazy(cache_n);
    const std::vector<int32_t> pos = st->positions(), slots = st->layout().slot_mapping;
    const bool norm = s.norm;
    const int rd = s.rd;
    const int window = s.window;
    const std::string shape =
        fmt::format("D{} rd{}{} T{}{}", D, rd, norm ? " norm" : "", T, window ? fmt::format(" window {}", window) : "");
    auto reference = [=](bool attend) {
      std::vector<double> k = dbl(*kc), v = dbl(*vc);
      std::vector<double> q = prologue_ref(*qkv, norm ? &*qn : nullptr, norm ? &*kn : nullptr, 1e-6f, pos, slots, Hq,
                                           Hk, D, rd, theta, true, k, v);
      if (attend) q = attention_ref(*st, q, k, v, Hq, Hk, D, window);
      return Outputs{out(attend ? "out" : "q", q), out("k_cache", k), out("v_cache", v)};
    };
    for (bool attend : {false, true}) {
      OpCase c;
      c.op = attend ? "qkv_attention" : "qkv_prologue";
      c.name = c.op + " " + shape;
      c.run = [=](Backend& be) {
        const Shape cs{st->num_blocks, st->bs, Hk, D};
        Tensor k = act(be, *kc, cs), v = act(be, *vc, cs), tqn = act(be, *qn, {D}), tkn = act(be, *kn, {D});
        Tensor o = poisoned(be, {T, Hq, D}, be.compute_dtype());
        RopeTable table{up(be, rope_cos_sin(4096, rd, theta), {4096, rd}, DType::kF32), rd, true};
        const Tensor x = act(be, *qkv, {T, (Hq + 2 * Hk) * D}), p = up_i32(be, pos, {T});
        const AttentionMetadata meta = upload_attention_metadata(be, st->layout());
        if (attend)
          be.qkv_attention(x, norm ? &tqn : nullptr, norm ? &tkn : nullptr, 1e-6f, p, table, k, v, meta,
                           1.0f / std::sqrt(static_cast<float>(D)), 1.0f, 1.0f, window, o);
        else
          be.qkv_prologue(x, norm ? &tqn : nullptr, norm ? &tkn : nullptr, 1e-6f, p, table, k, v, meta, 1.0f, 1.0f, o);
        return Outputs{out(attend ? "out" : "q", down(be, o)), out("k_cache", down(be, k)),
                       out("v_cache", down(be, v))};
      };
      c.reference = [=] { return reference(attend); };
      c.tol_f32 = 2e-5;  // rotary angles from the f32 table
      cases.push_back(std::move(c));
    }
  }
}

// ---- linear attention ----

LinearAttnLayout linear_layout(const std::vector<int>& lens, const std::vector<int>& slots,
                               const std::vector<int>& init) {
  LinearAttnLayout l;
  l.query_start_loc = {0};
  for (int n : lens) l.query_start_loc.push_back(l.query_start_loc.back() + n);
  l.state_slots.assign(slots.begin(), slots.end());
  l.has_initial_state.assign(init.begin(), init.end());
  return l;
}

void linear_attention_cases(Cases& cases) {
  // A prefill from a state, a decode token, a prompt shorter than the window without a state, a
  // padding sequence (slot -1) and an empty one.
  const std::vector<int> lens = {6, 1, 2, 1, 0}, slots = {1, 3, 0, -1, 5}, init = {1, 1, 0, 1, 1};
  const int T = 10, num_slots = 6;
  {
    const int C = 96, K = 4, x_col = 8, X = x_col + C + 5;
    auto x = lazy(static_cast<int64_t>(T) * X, -2, 2);
    auto w = lazy(static_cast<int64_t>(C) * K, -0.6f, 0.6f);
    auto st0 = lazy(static_cast<int64_t>(num_slots) * (K - 1) * C);
    OpCase c;
    c.op = "causal_conv1d";
    c.name = "causal_conv1d C96 K4";
    c.run = [=](Backend& be) {
      Tensor state = up(be, *st0, {num_slots, K - 1, C}, DType::kF32), o = poisoned(be, {T, C}, be.compute_dtype());
      be.causal_conv1d(act(be, *x, {T, X}), x_col, act(be, *w, {C, K}), state,
                       upload_linear_attn_metadata(be, linear_layout(lens, slots, init)), o);
      return Outputs{out("out", down(be, o)), out("conv_state", down(be, state), true)};
    };
    c.reference = [=] {
      std::vector<double> o(static_cast<size_t>(T) * C, 0.0), state = dbl(*st0);
      int t0 = 0;
      for (size_t s = 0; s < lens.size(); t0 += lens[s], ++s) {
        if (slots[s] < 0) continue;  // padding: zero rows, no state
        const size_t row = static_cast<size_t>(slots[s]) * (K - 1) * C;
        std::vector<double> hist(static_cast<size_t>(K - 1) * C, 0.0);
        if (init[s]) std::copy_n(state.begin() + row, hist.size(), hist.begin());
        ref_conv(dbl(*x), X, x_col, t0, t0 + lens[s], dbl(*w), C, K, hist, o);
        std::copy(hist.begin(), hist.end(), state.begin() + row);
      }
      return Outputs{out("out", o), out("conv_state", state, true)};
    };
    cases.push_back(std::move(c));
  }
  {
    const GdrDims d{2, 4, 32, 32};
    const int C = d.C(), ba_col = 3, X = ba_col + 2 * d.Hv + 5;
    const Shape ss{num_slots, d.Hv, d.Dk, d.Dv};
    auto qkv = lazy(static_cast<int64_t>(T) * C);
    auto ba = lazy(static_cast<int64_t>(T) * X, -3, 3);
    auto alog = lazy(d.Hv, -2.0f, 0.5f);
    auto dtb = lazy(d.Hv, -1.0f, 1.0f);
    auto st0 = lazy(ss.numel(), -0.3f, 0.3f);
    OpCase c;
    c.op = "gated_delta_rule";
    c.name = "gated_delta_rule Hk2 Hv4 Dk32 Dv32";
    c.run = [=](Backend& be) {
      Tensor state = up(be, *st0, ss, DType::kF32), o = poisoned(be, {T, d.Hv, d.Dv}, be.compute_dtype());
      be.gated_delta_rule(act(be, *qkv, {T, C}), act(be, *ba, {T, X}), ba_col, up(be, *alog, {d.Hv}, DType::kF32),
                          up(be, *dtb, {d.Hv}, DType::kF32), state,
                          upload_linear_attn_metadata(be, linear_layout(lens, slots, init)), o);
      return Outputs{out("out", down(be, o)), out("state", down(be, state))};
    };
    c.reference = [=] {
      std::vector<double> o(static_cast<size_t>(T) * d.Hv * d.Dv, 0.0), state = dbl(*st0);
      const size_t per_head = static_cast<size_t>(d.Dk) * d.Dv;
      int t0 = 0;
      for (size_t s = 0; s < lens.size(); t0 += lens[s], ++s) {
        if (slots[s] < 0) continue;
        for (int h = 0; h < d.Hv; ++h) {
          const size_t off = (static_cast<size_t>(slots[s]) * d.Hv + h) * per_head;
          std::vector<double> S(per_head, 0.0);
          if (init[s]) std::copy_n(state.begin() + off, per_head, S.begin());
          ref_gdr(d, dbl(*qkv), dbl(*ba), X, ba_col, dbl(*alog), dbl(*dtb), t0, t0 + lens[s], h, S, o);
          std::copy(S.begin(), S.end(), state.begin() + off);
        }
      }
      return Outputs{out("out", o), out("state", state)};
    };
    c.tol_f32 = 1e-4;
    c.tol_bf16 = 2e-2;
    cases.push_back(std::move(c));
  }
  for (int D : {16, 128}) {
    const int Tn = 37, H = 6, z_col = 24, Z = z_col + H * D + 8;
    auto x = lazy(static_cast<int64_t>(Tn) * H * D, -3, 3);
    auto z = lazy(static_cast<int64_t>(Tn) * Z, -4, 4);
    auto w = lazy(D, 0.5f, 1.5f);
    OpCase c;
    c.op = "gated_rms_norm";
    c.name = fmt::format("gated_rms_norm T{} H{} D{}", Tn, H, D);
    c.run = [=](Backend& be) {
      Tensor o = poisoned(be, {Tn, H, D}, be.compute_dtype());
      be.gated_rms_norm(act(be, *x, {Tn, H, D}), act(be, *z, {Tn, Z}), z_col, act(be, *w, {D}), 1e-6f, o);
      return Outputs{out("out", down(be, o))};
    };
    c.reference = [=] {
      std::vector<double> o = rms_norm_ref(dbl(*x), dbl(*w), 1e-6);
      for (int t = 0; t < Tn; ++t)
        for (int i = 0; i < H * D; ++i)
          o[static_cast<size_t>(t) * H * D + i] *= silu((*z)[static_cast<size_t>(t) * Z + z_col + i]);
      return Outputs{out("out", o)};
    };
    cases.push_back(std::move(c));
  }
}

// ---- sampling ----

// The token of each of n rows of `logits` [n, V] that a greedy draw gives: its first maximum.
Outputs first_maxima(const std::vector<float>& logits, int64_t n, int64_t V) {
  std::vector<double> want;
  for (int64_t i = 0; i < n; ++i) {
    const float* x = logits.data() + i * V;
    want.push_back(static_cast<double>(std::max_element(x, x + V) - x));
  }
  return Outputs{out("tokens", want, true)};
}

// Rows whose token follows from the logits alone: greedy (ties to the lowest id), top-k 1 at a
// temperature, and a drawn row with one token far above the rest. (The drawn distribution is
// sampling_test's and cuda_ops_test's SampleMatchesTheHostRule.)
void sample_cases(Cases& cases) {
  for (int64_t V : {7, 1000, 151936}) {
    const int64_t n = 12;
    std::vector<SamplingRow> rows;
    for (int64_t i = 0; i < n; ++i) {
      SamplingRow row;
      row.seed = static_cast<uint64_t>(1000 + i);
      row.position = static_cast<uint64_t>(7 * i);
      if (i % 3 == 1) {
        row.temperature = 0.8f;
        row.top_k = 1;
      } else if (i % 3 == 2) {
        row.temperature = 1.0f;
      }
      rows.push_back(row);
    }
    // Row 0 has ties at its maximum; the drawn rows (i % 3 == 2) one token 52 above every other.
    auto logits = lazy_raw(n * V, -8, 8, [V, n](std::vector<float>& v) {
      for (int64_t j = 0; j < V; j += 97) v[static_cast<size_t>(j)] = 8.5f;
      for (int64_t i = 2; i < n; i += 3) v[static_cast<size_t>(i * V + (i * 31) % V)] = 60.0f;
      // The top-k rows: a maximum 1 above the rest (no rounding at the threshold decides them).
      for (int64_t i = 1; i < n; i += 3) v[static_cast<size_t>(i * V + (i * 17) % V)] = 9.0f;
    });
    OpCase c;
    c.op = "sample";
    c.name = fmt::format("sample V{}", V);
    c.run = [=](Backend& be) {
      Tensor o = poisoned(be, {n}, DType::kI32);
      be.sample(up(be, *logits, {n, V}, DType::kF32), rows, o);
      return Outputs{out("tokens", down(be, o), true)};
    };
    c.reference = [=] { return first_maxima(*logits, n, V); };  // every row's token is its first maximum
    cases.push_back(std::move(c));
  }
  // argmax: the greedy token of each row, ties to the lowest id (row 0 and every fifth row tie at
  // their maximum); 300 rows grow the CUDA backend's device-resident greedy rows past 256.
  for (auto [V, n] : {std::pair<int64_t, int64_t>{7, 3}, {1000, 300}, {151936, 5}}) {
    auto logits = lazy_raw(n * V, -8, 8, [V, n](std::vector<float>& v) {
      for (int64_t i = 0; i < n; i += 5)
        for (int64_t j = (i * 13) % V; j < V; j += 97) v[static_cast<size_t>(i * V + j)] = 8.5f;
      for (int64_t i = 1; i < n; i += 5) v[static_cast<size_t>(i * V + (i * 31) % V)] = 9.0f;
    });
    OpCase c;
    c.op = "argmax";
    c.name = fmt::format("argmax V{} n{}", V, n);
    c.run = [=](Backend& be) {
      Tensor o = poisoned(be, {n}, DType::kI32);
      be.argmax(up(be, *logits, {n, V}, DType::kF32), o);
      return Outputs{out("tokens", down(be, o), true)};
    };
    c.reference = [=] { return first_maxima(*logits, n, V); };
    cases.push_back(std::move(c));
  }
  // Broken logits (Backend::sample's contract): a row holding a NaN (either sign) or a +inf gets -1 under every
  // rule, greedy or drawn; -inf is a masked token, not a broken one (row 3: all masked but one).
  for (int64_t V : {1000, 151936}) {
    const int64_t n = 8;
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    std::vector<SamplingRow> rows(static_cast<size_t>(n));
    rows[1].temperature = 0.8f;
    rows[1].top_k = 5;
    rows[2].temperature = 1.0f;
    rows[2].top_p = 0.9f;
    rows[4].temperature = 1.0f;
    rows[6].temperature = 1.0f;
    rows[6].min_p = 0.1f;
    auto logits = lazy_raw(n * V, -8, 8, [V, nan, inf](std::vector<float>& v) {
      auto at = [&](int64_t i, int64_t j) -> float& { return v[static_cast<size_t>(i * V + j)]; };
      at(0, 3) = nan;
      at(1, V - 1) = nan;
      at(2, V / 2) = inf;
      for (int64_t j = 0; j < V; ++j) at(3, j) = -inf;
      at(3, V - 2) = 1.0f;
      at(4, 17) = 60.0f;  // far above the rest: the draw is certain
      for (int64_t j = 0; j < V; ++j) at(5, j) = nan;
      at(6, 5) = -nan;
    });
    auto reference = [=] {
      std::vector<double> want = first_maxima(*logits, n, V)[0].values;
      for (int64_t i : {0, 1, 2, 5, 6}) want[static_cast<size_t>(i)] = -1;
      return Outputs{out("tokens", want, true)};
    };
    OpCase c;
    c.op = "sample";
    c.name = fmt::format("sample nan rows V{}", V);
    c.run = [=](Backend& be) {
      Tensor o = poisoned(be, {n}, DType::kI32);
      be.sample(up(be, *logits, {n, V}, DType::kF32), rows, o);
      return Outputs{out("tokens", down(be, o), true)};
    };
    c.reference = reference;
    cases.push_back(c);
    c.op = "argmax";
    c.name = fmt::format("argmax nan rows V{}", V);
    c.run = [=](Backend& be) {
      Tensor o = poisoned(be, {n}, DType::kI32);
      be.argmax(up(be, *logits, {n, V}, DType::kF32), o);
      return Outputs{out("tokens", down(be, o), true)};
    };
    cases.push_back(std::move(c));
  }
}

// Tensor parallelism's greedy rows. shard_argmax: a vocabulary of V split into 4 shards of Vs
// (the third narrower: its padding columns hold 100, above every real logit, and a NaN, all of
// which must be ignored; the fourth holds no column of the vocabulary); rows with ties inside a
// shard and across shards, a NaN, a +inf and all -inf. merge_shard_argmax: those pairs merged into stand-in rows whose
// argmax is the whole row's (ties to the lower id across shards too; -1 for a broken row).
void shard_argmax_cases(Cases& cases) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (int64_t V : {1000, 248320}) {
    const int64_t n = 7, S = 4, Vs = (V + 2) / 3 + 5;  // three shards' worth and 5 columns more: padding
    auto logits = lazy_raw(n * V, -8, 8, [V, Vs, nan, inf](std::vector<float>& v) {
      auto at = [&](int64_t i, int64_t j) -> float& { return v[static_cast<size_t>(i * V + j)]; };
      at(1, 3) = at(1, Vs + 9) = at(1, 2 * Vs + 1) = 9.5f;  // equal maxima in every shard: id 3
      at(2, Vs + 4) = at(2, Vs + 40) = 9.0f;                // a tie inside shard 1
      at(3, Vs + 2) = nan;
      at(4, V - 1) = inf;
      for (int64_t j = 0; j < V; ++j) at(5, j) = -inf;
      at(6, 2 * Vs) = -nan;
    });
    // Shard s: columns [s * Vs, s * Vs + width_s) of the vocabulary, then padding.
    auto shard = [=](int64_t s) {
      const int64_t first = s * Vs, width = std::clamp<int64_t>(V - first, 0, Vs);
      std::vector<float> x(static_cast<size_t>(n * Vs), 100.0f);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < width; ++j) x[static_cast<size_t>(i * Vs + j)] = (*logits)[i * V + first + j];
      if (width > 0 && width < Vs) x[static_cast<size_t>(Vs - 1)] = nan;  // row 0's last padding column
      return std::make_pair(x, width);
    };
    auto want_pairs = [=] {
      std::vector<double> want;
      for (int64_t s = 0; s < S; ++s) {
        const auto [x, width] = shard(s);
        for (int64_t i = 0; i < n; ++i) {
          int64_t best = 0;
          bool broken = false;
          for (int64_t j = 0; j < width; ++j) {
            const float v = x[static_cast<size_t>(i * Vs + j)];
            broken = broken || std::isnan(v) || v == inf;
            if (v > x[static_cast<size_t>(i * Vs + best)]) best = j;
          }
          const float value = broken ? nan : width == 0 ? -inf : x[static_cast<size_t>(i * Vs + best)];
          want.push_back(std::bit_cast<int32_t>(value));
          want.push_back(broken ? -1 : width == 0 ? INT32_MAX : static_cast<double>(s * Vs + best));
        }
      }
      return want;
    };
    OpCase c;
    c.op = "shard_argmax";
    c.name = fmt::format("shard_argmax V{} S{}", V, S);
    c.run = [=](Backend& be) {
      std::vector<double> got;
      for (int64_t s = 0; s < S; ++s) {
        const auto [x, width] = shard(s);
        Tensor o = poisoned(be, {n, 2}, DType::kI32);
        be.shard_argmax(up(be, x, {n, Vs}, DType::kF32), width, s * Vs, o);
        const std::vector<double> d = down(be, o);
        got.insert(got.end(), d.begin(), d.end());
      }
      return Outputs{out("pairs", got, true)};
    };
    c.reference = [=] { return Outputs{out("pairs", want_pairs(), true)}; };
    cases.push_back(c);
    // The merge, into rows 1..7 of 9 (rows 0 and 8 keep their logits), then argmax.
    c.op = "merge_shard_argmax";
    c.name = fmt::format("merge_shard_argmax V{} S{}", V, S);
    c.run = [=](Backend& be) {
      std::vector<int32_t> pairs;
      for (double d : want_pairs()) pairs.push_back(static_cast<int32_t>(d));
      std::vector<float> rows9(static_cast<size_t>(9 * V), -1.0f);
      rows9[3] = 2.0f, rows9[static_cast<size_t>(8 * V + 5)] = 2.0f;
      Tensor l = up(be, rows9, {9, V}, DType::kF32);
      be.merge_shard_argmax(up_i32(be, pairs, {S, n, 2}), up_i32(be, {1, 2, 3, 4, 5, 6, 7}, {n}), l);
      Tensor o = poisoned(be, {9}, DType::kI32);
      be.argmax(l, o);
      // Each merged row: how many of its entries are not -inf (one, or none when all were -inf).
      const std::vector<double> v = down(be, l);
      std::vector<double> kept;
      for (int64_t i = 1; i < 8; ++i)
        kept.push_back(static_cast<double>(std::count_if(v.begin() + i * V, v.begin() + (i + 1) * V, [](double x) {
          return !(x == -std::numeric_limits<double>::infinity());
        })));
      return Outputs{out("tokens", down(be, o), true), out("kept", kept, true)};
    };
    c.reference = [=] {
      std::vector<double> want = first_maxima(*logits, n, V)[0].values;
      for (int64_t i : {3, 4, 6}) want[static_cast<size_t>(i)] = -1;
      want.insert(want.begin(), 3);
      want.push_back(5);
      std::vector<double> kept(static_cast<size_t>(n), 1);
      kept[5] = 0;  // all -inf: every entry stays so
      return Outputs{out("tokens", want, true), out("kept", kept, true)};
    };
    cases.push_back(std::move(c));
  }
}

// Structured output's token masks, then argmax: rows 0, 2 and 5 masked (a sparse mask, a dense one, and one of
// fewer words than the vocabulary needs: the tokens past it count as masked); the others untouched.
void token_mask_cases(Cases& cases) {
  for (int64_t V : {1000, 151936}) {
    const int64_t n = 6, W = (V + 31) / 32;
    const std::vector<int32_t> rows = {0, 2, 5};
    std::vector<int32_t> mask(static_cast<size_t>(3 * W), 0);
    for (int64_t t = 0; t < V; t += 37) mask[static_cast<size_t>(t >> 5)] |= 1 << (t & 31);  // row 0: sparse
    for (int64_t w = 0; w < W; ++w) mask[static_cast<size_t>(W + w)] = static_cast<int32_t>(0xF0F0F0F0u);  // row 2
    for (int64_t t = 0; t < V / 2; t += 3) mask[static_cast<size_t>(2 * W + (t >> 5))] |= 1 << (t & 31);   // row 5
    const int64_t W5 = (V / 2 + 31) / 32;  // row 5's mask as sent: only its first W5 words
    std::vector<int32_t> sent = mask;
    for (int64_t w = W5; w < W; ++w) sent[static_cast<size_t>(2 * W + w)] = -1;  // all ones, past what counts
    auto logits = lazy_raw(n * V, -8, 8, [](std::vector<float>&) {});
    OpCase c;
    c.op = "apply_token_mask";
    c.name = fmt::format("apply_token_mask V{}", V);
    c.run = [=](Backend& be) {
      Tensor l = up(be, *logits, {n, V}, DType::kF32);
      // Rows 0 and 2 with every word; row 5 alone with its W5 words (two calls, as two mask widths).
      std::vector<int32_t> first(sent.begin(), sent.begin() + 2 * W);
      be.apply_token_mask(l, up_i32(be, first, {2, W}), up_i32(be, {0, 2}, {2}));
      std::vector<int32_t> last(sent.begin() + 2 * W, sent.begin() + 2 * W + W5);
      be.apply_token_mask(l, up_i32(be, last, {1, W5}), up_i32(be, {5}, {1}));
      Tensor o = poisoned(be, {n}, DType::kI32);
      be.argmax(l, o);
      return Outputs{out("tokens", down(be, o), true)};
    };
    c.reference = [=] {
      std::vector<float> v = *logits;
      for (size_t k = 0; k < rows.size(); ++k)
        for (int64_t t = 0; t < V; ++t) {
          const bool keep =
              (rows[k] != 5 || t < 32 * W5) && (mask[static_cast<size_t>(k * W + (t >> 5))] >> (t & 31) & 1);
          if (!keep) v[static_cast<size_t>(rows[k] * V + t)] = -std::numeric_limits<float>::infinity();
        }
      return first_maxima(v, n, V);
    };
    cases.push_back(std::move(c));
  }
}

// Speculative decoding's device-side acceptance and the MTP drafting inputs after it: sequences
// that accept nothing, some and all of their drafts, and (draft_positions) a padding sequence
// and a position whose block is past the table.
void spec_decode_cases(Cases& cases) {
  for (int q : {1, 3, 4}) {
    const int S = 6;
    std::vector<int32_t> sampled(static_cast<size_t>(S * q)), tokens(static_cast<size_t>(S * q));
    std::vector<double> want(static_cast<size_t>(S));
    for (int s = 0; s < S; ++s) {
      const int accept = s % q;  // sequence s agrees on its first `accept` drafts, then differs
      for (int j = 0; j < q; ++j) {
        const size_t r = static_cast<size_t>(s * q + j);
        sampled[r] = 100 + 7 * s + j;
        tokens[r] = j == 0 ? 5 : (j - 1 < accept ? sampled[r - 1] : sampled[r - 1] + 1);
      }
      want[static_cast<size_t>(s)] = s * q + accept;
    }
    OpCase c;
    c.op = "accept_drafts";
    c.name = fmt::format("accept_drafts S{} q{}", S, q);
    c.run = [=](Backend& be) {
      Tensor rows = poisoned(be, {S}, DType::kI32);
      be.accept_drafts(up_i32(be, sampled, {S * q}), up_i32(be, tokens, {S * q}), q, rows);
      return Outputs{out("rows", down(be, rows), true)};
    };
    c.reference = [=] { return Outputs{out("rows", want, true)}; };
    cases.push_back(std::move(c));
  }
  for (int ahead : {1, 2}) {
    const int S = 4, q = 3, W = 3, bs = 4;
    // Sequence 0 from position 0, 1 from 5, 2 a padding sequence, 3 from 9 (its last positions
    // run past its 3 blocks).
    const std::vector<int32_t> rows = {1, 5, 6, 11};
    std::vector<int32_t> positions(static_cast<size_t>(S * q)), slots(static_cast<size_t>(S * q));
    const std::vector<int32_t> first = {0, 5, 0, 9};
    const std::vector<int32_t> tables = {3, 9, 1, 2, 8, 6, 0, 0, 0, 4, 7, 5};
    for (int s = 0; s < S; ++s)
      for (int j = 0; j < q; ++j) {
        const size_t r = static_cast<size_t>(s * q + j);
        positions[r] = s == 2 ? 0 : first[static_cast<size_t>(s)] + j;
        slots[r] = s == 2 ? -1 : 1000 + static_cast<int32_t>(r);
      }
    std::vector<double> pos, slot, len;
    for (int s = 0; s < S; ++s) {
      if (s == 2) {
        pos.push_back(0), slot.push_back(-1), len.push_back(1);
        continue;
      }
      const int at = positions[static_cast<size_t>(rows[static_cast<size_t>(s)])] + ahead, block = at / bs;
      pos.push_back(at);
      slot.push_back(block < W ? tables[static_cast<size_t>(s * W + block)] * bs + at % bs : -1);
      len.push_back(at + 1);
    }
    OpCase c;
    c.op = "draft_positions";
    c.name = fmt::format("draft_positions ahead{}", ahead);
    c.run = [=](Backend& be) {
      Tensor p = poisoned(be, {S}, DType::kI32), sl = poisoned(be, {S}, DType::kI32),
             l = poisoned(be, {S}, DType::kI32);
      be.draft_positions(up_i32(be, rows, {S}), up_i32(be, positions, {S * q}), up_i32(be, slots, {S * q}),
                         up_i32(be, tables, {S, W}), q, bs, ahead, p, sl, l);
      return Outputs{out("positions", down(be, p), true), out("slots", down(be, sl), true),
                     out("seq_lens", down(be, l), true)};
    };
    c.reference = [=] {
      return Outputs{out("positions", pos, true), out("slots", slot, true), out("seq_lens", len, true)};
    };
    cases.push_back(std::move(c));
  }
}

}  // namespace

const std::vector<OpCase>& op_cases() {
  static const std::vector<OpCase> cases = [] {
    Cases c;
    embedding_cases(c);
    norm_cases(c);
    linear_cases(c);
    elementwise_cases(c);
    rope_cases(c);
    cast_cases(c);
    moe_cases(c);
    attention_cases(c);
    linear_attention_cases(c);
    sample_cases(c);
    token_mask_cases(c);
    shard_argmax_cases(c);
    spec_decode_cases(c);
    return c;
  }();
  return cases;
}

std::string compare(const Outputs& got, const Outputs& want, double tol) {
  if (got.size() != want.size()) return fmt::format("{} outputs, want {}", got.size(), want.size());
  std::string msg;
  for (size_t o = 0; o < got.size(); ++o) {
    const auto& g = got[o].values;
    const auto& w = want[o].values;
    if (g.size() != w.size()) {
      msg += fmt::format("{}: {} values, want {}\n", want[o].name, g.size(), w.size());
      continue;
    }
    double num = 0, den = 0;
    size_t first_bad = g.size(), bad = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      const bool finite = std::isfinite(g[i]) || !std::isfinite(w[i]);
      const bool differs = want[o].exact ? !(g[i] == w[i]) : !finite;
      if (differs) {
        ++bad;
        if (first_bad == g.size()) first_bad = i;
      }
      if (std::isfinite(g[i]) && std::isfinite(w[i])) {
        num += (g[i] - w[i]) * (g[i] - w[i]);
        den += w[i] * w[i];
      }
    }
    const double rel = std::sqrt(num / std::max(den, 1e-30));
    if (bad > 0)
      msg += fmt::format("{}: {} of {} elements differ{} (first: element {}, got {}, want {})\n", want[o].name, bad,
                         g.size(), want[o].exact ? "" : " or are not finite", first_bad, g[first_bad], w[first_bad]);
    else if (!want[o].exact && rel > tol)
      msg += fmt::format("{}: relative error {:.3g} > {:.3g}\n", want[o].name, rel, tol);
  }
  return msg;
}

std::vector<std::string> declared_backend_ops(const std::string& header) {
  std::vector<std::string> ops;
  const size_t begin = header.find("// ---- ops");
  if (begin == std::string::npos) return ops;
  const size_t end = header.find("\n};", begin);  // the end of class Backend
  const std::string body = header.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
  static const std::regex decl(R"(virtual\s+[\w:<>\s\*&,]+?\b(\w+)\s*\()");
  for (auto it = std::sregex_iterator(body.begin(), body.end(), decl); it != std::sregex_iterator(); ++it)
    ops.push_back((*it)[1].str());
  return ops;
}

std::string test_name(const std::string& case_name) {
  std::string s;
  for (char ch : case_name) s += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return s;
}

}  // namespace tessera::optest
