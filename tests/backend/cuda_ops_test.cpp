// CUDA ops against the CPU backend: the op table (op_table.h) for every op, and here the checks
// that are CUDA's own (FP8 weights, the fused decode kernel, graphs, MoE kernel paths, attention
// over many sequence mixes, linear-attention steps, the sampling rule's draws, the scratch arena).
// Inputs are rounded to bf16 first, so both backends see the same values; the
// CUDA outputs are poisoned (NaN) before each op and must come back finite.
// Thresholds are relative errors ||cuda - cpu|| / ||cpu|| (bf16: ~1e-2).
// Runs on a machine with a GPU; elsewhere (or in a CPU build) every test skips.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/attention_metadata.h"
#include "backend/backend.h"
#include "core/dtype.h"
#include "core/error.h"
#include "op_table.h"

#ifdef TESSERA_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_ops.h"      // kMaxFp8GemvRows, fp8_w16_gemm_splits
#include "backend/cuda/fp8_mma_gemm.h"  // the FP8 block-scaled mma.sync GEMM
#include "backend/cuda/kernel_smem.h"   // the kernels' shared-memory variants
#endif

namespace tessera {
namespace {

#ifdef TESSERA_HAVE_CUDA

struct MoeCase;

// Random e4m3 bytes (NaN codes skipped) and f32 block scales for a block-scaled weight.
struct Fp8Host {
  Shape shape, scale_shape;
  std::vector<uint8_t> q;
  std::vector<float> scale;
};

class CudaOps : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (cuda_device_count() > 0 && !gpu_) {
      gpu_ = make_cuda_backend(0);
      cpu_ = make_backend({DeviceType::kCPU, 0, 0});
      CudaOptions o;
      o.fp8_w8a8_min_rows = INT64_MAX;
      w16_ = make_cuda_backend(0, o);
    }
  }
  void SetUp() override {
    if (!gpu_) GTEST_SKIP() << "no CUDA device on this machine";
    rng_.seed(1234 + ::testing::UnitTest::GetInstance()->random_seed());
  }
  void TearDown() override {
    if (!gpu_) return;
    gpu_->synchronize();
    gpu_->reset_scratch();
    w16_->synchronize();
    w16_->reset_scratch();
    cpu_->reset_scratch();
  }

  Backend& gpu() { return *gpu_; }
  Backend& cpu() { return *cpu_; }

  // Random values, rounded through bf16 so both backends hold them exactly.
  std::vector<float> rand(int64_t n, float lo = -1.0f, float hi = 1.0f) {
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = bf16_to_f32(f32_to_bf16(d(rng_)));
    return v;
  }
  // moe_experts at one token on backends that differ in their one-token kernels (`names`, the
  // grouped kernels first): every one gives the first one's output bit for bit, launched and
  // replayed from a graph, and the CPU's within the bf16 tolerance. bf16 or FP8 block-scaled experts.
  void one_token_bit_for_bit(const MoeCase& c, bool fp8, const std::vector<std::unique_ptr<Backend>>& bes,
                             const std::vector<std::string>& names);
  // Random e4m3 bytes (NaN codes skipped) and f32 block scales of 1e-4 .. 4e-4.
  Fp8Host fp8_host(Shape shape) {
    Fp8Host h;
    h.shape = shape;
    h.scale_shape = block_scale_shape(shape);
    std::uniform_int_distribution<int> byte(0, 255);
    h.q.resize(static_cast<size_t>(shape.numel()));
    for (auto& b : h.q) {
      do b = static_cast<uint8_t>(byte(rng_));
      while ((b & 0x7f) == 0x7f);  // e4m3 NaN
    }
    h.scale = rand(h.scale_shape.numel(), 1e-4f, 4e-4f);
    return h;
  }
  // That weight on `be`, its scales attached.
  static Tensor put_fp8(Backend& be, const Fp8Host& h) {
    Tensor w = be.alloc(h.shape, DType::kF8E4M3), s = be.alloc(h.scale_shape, DType::kF32);
    be.copy_from_host(w, h.q.data());
    be.copy_from_host(s, h.scale.data());
    return w.with_block_scale(s);
  }
  // A RoPE cos/sin table [max_pos, rd] (theta 10000): cos in the first half of a row, sin in the second.
  static std::vector<float> rope_cos_sin(int64_t max_pos, int rd) {
    std::vector<float> cs(static_cast<size_t>(max_pos) * rd);
    for (int64_t p = 0; p < max_pos; ++p)
      for (int i = 0; i < rd / 2; ++i) {
        double f = p * std::pow(10000.0, -2.0 * i / rd);
        cs[p * rd + i] = static_cast<float>(std::cos(f));
        cs[p * rd + rd / 2 + i] = static_cast<float>(std::sin(f));
      }
    return cs;
  }
  Tensor on_cpu(const std::vector<float>& v, Shape shape) {
    Tensor t = cpu().alloc(shape, DType::kF32);
    std::memcpy(t.raw(), v.data(), v.size() * 4);
    return t;
  }
  Tensor on_cpu_i32(const std::vector<int32_t>& v, Shape shape) {
    Tensor t = cpu().alloc(shape, DType::kI32);
    std::memcpy(t.raw(), v.data(), v.size() * 4);
    return t;
  }
  // Host values into a new tensor of `be` (converted to dt), and back (as f32).
  static Tensor upload(Backend& be, const std::vector<float>& v, Shape shape, DType dt = DType::kBF16) {
    Tensor t = be.alloc(shape, dt);
    std::vector<uint8_t> bytes(t.nbytes());
    convert_host(v.data(), DType::kF32, bytes.data(), dt, v.size());
    be.copy_from_host(t, bytes.data());
    return t;
  }
  static Tensor upload_i32(Backend& be, const std::vector<int32_t>& v, Shape shape) {
    Tensor t = be.alloc(shape, DType::kI32);
    be.copy_from_host(t, v.data());
    return t;
  }
  static std::vector<float> download(Backend& be, const Tensor& t) {
    std::vector<uint8_t> bytes(t.nbytes());
    be.copy_to_host(bytes.data(), t);
    std::vector<float> v(static_cast<size_t>(t.numel()));
    convert_host(bytes.data(), t.dtype(), v.data(), DType::kF32, v.size());
    return v;
  }
  Tensor on_gpu(const std::vector<float>& v, Shape shape, DType dt = DType::kBF16) {
    return upload(gpu(), v, shape, dt);
  }
  Tensor on_gpu_i32(const std::vector<int32_t>& v, Shape shape) { return upload_i32(gpu(), v, shape); }
  Tensor gpu_out(Shape shape, DType dt = DType::kBF16) {
    Tensor t = gpu().alloc(shape, dt);
    gpu().fill(t, NAN);  // poison: every element must be written
    return t;
  }
  std::vector<float> from_gpu(const Tensor& t) { return download(gpu(), t); }
  // The GPU tensor's bytes into a CPU tensor of the same shape and dtype.
  void copy_to_cpu(const Tensor& g, const Tensor& c) { gpu().copy_to_host(c.raw(), g); }
  static std::vector<float> from_cpu(const Tensor& t) {
    std::vector<float> v(static_cast<size_t>(t.numel()));
    convert_host(t.raw(), t.dtype(), v.data(), DType::kF32, v.size());
    return v;
  }

  // `run` launched twice, then captured and replayed `replays` times, `out` poisoned with NaN
  // before each: every result within 1e-2 (relative) of `want`. Drops the graph and resets the
  // scratch arena afterwards (`out` keeps the last replay's result).
  static void expect_launched_and_replayed(Backend& be, const std::function<void()>& run, const Tensor& out,
                                           const std::vector<float>& want, const std::string& who, int replays) {
    for (int rep = 0; rep < 2; ++rep) {
      be.fill(out, NAN);
      run();
      be.synchronize();
      EXPECT_LT(rel_err(download(be, out), want), 1e-2) << who << " launch " << rep;
      be.reset_scratch();
    }
    be.begin_capture();
    run();
    std::unique_ptr<CapturedGraph> g = be.end_capture();
    ASSERT_TRUE(g) << who;
    for (int rep = 0; rep < replays; ++rep) {
      be.fill(out, NAN);
      be.replay(*g);
      be.synchronize();
      EXPECT_LT(rel_err(download(be, out), want), 1e-2) << who << " replay " << rep;
    }
    g.reset();
    be.reset_scratch();
  }

  // ||a - b|| / ||b||; NaN anywhere in a fails.
  static double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
    EXPECT_EQ(a.size(), b.size());
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      if (!std::isfinite(a[i])) return INFINITY;
      double d = static_cast<double>(a[i]) - b[i];
      num += d * d;
      den += static_cast<double>(b[i]) * b[i];
    }
    return std::sqrt(num / std::max(den, 1e-30));
  }

  std::mt19937 rng_;
  static std::unique_ptr<Backend> gpu_, cpu_;
  static std::unique_ptr<Backend> w16_;  // FP8 linears keep bf16 activations at every M
};
std::unique_ptr<Backend> CudaOps::gpu_, CudaOps::cpu_, CudaOps::w16_;

// The op table (op_table.h): every case on the GPU against the CPU backend (which cpu_ops_test checks
// against the plain references), on the same bf16-rounded inputs.
class CudaOpTable : public CudaOps, public ::testing::WithParamInterface<optest::OpCase> {};

TEST_P(CudaOpTable, MatchesTheCpuBackend) {
  const optest::OpCase& c = GetParam();
  const optest::Outputs want = c.run(cpu());
  EXPECT_EQ(optest::compare(c.run(gpu()), want, c.tolerance(gpu())), "") << c.name;
}

INSTANTIATE_TEST_SUITE_P(Table, CudaOpTable, ::testing::ValuesIn(optest::op_cases()),
                         [](const auto& info) { return optest::test_name(info.param.name); });

TEST_F(CudaOps, FillRandomMatchesCpuBitForBit) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (int64_t n : {1, 7, 1000, 65537}) {
      Tensor g = gpu_out({n}, dt);
      Tensor c = cpu().alloc({n}, dt);
      gpu().fill_random(g, 42, -0.5f, 2.0f);
      cpu().fill_random(c, 42, -0.5f, 2.0f);
      std::vector<uint8_t> gb(g.nbytes());
      gpu().copy_to_host(gb.data(), g);
      EXPECT_EQ(std::memcmp(gb.data(), c.raw(), gb.size()), 0) << dtype_name(dt) << " n=" << n;
    }
  }
}

TEST_F(CudaOps, Fill) {
  Tensor f = gpu_out({33}, DType::kF32);
  gpu().fill(f, 1.5f);
  for (float v : from_gpu(f)) EXPECT_EQ(v, 1.5f);
}

// Device sampling follows the host rule: greedy rows exactly; drawn rows use the same
// uniforms, so they agree but for rounding at a threshold, and never leave the kept set.
TEST_F(CudaOps, SampleMatchesTheHostRule) {
  for (int64_t V : {7, 1000, 151936}) {
    std::vector<SamplingRow> rows;
    for (int i = 0; i < 48; ++i) {
      SamplingRow r;
      r.temperature = i % 6 == 0 ? 0.0f : 0.3f + 0.1f * static_cast<float>(i % 9);
      r.top_k = i % 3 == 0 ? 0 : 1 + i % 40;
      r.top_p = i % 4 == 0 ? 1.0f : 0.5f + 0.01f * static_cast<float>(i);
      r.min_p = i % 5 == 0 ? 0.1f : 0.0f;
      r.seed = 1000u + static_cast<uint64_t>(i);
      r.position = static_cast<uint64_t>(i * 7);
      rows.push_back(r);
    }
    const int64_t n = static_cast<int64_t>(rows.size());
    auto logits = rand(n * V, -8.0f, 8.0f);
    for (int64_t i = 0; i < V; i += 97) logits[static_cast<size_t>(i)] = 8.0f;  // ties at the top of row 0
    Tensor gl = gpu().alloc({n, V}, DType::kF32);
    gpu().copy_from_host(gl, logits.data());
    Tensor gi = gpu().alloc({n}, DType::kI32);
    gpu().sample(gl, rows, gi);
    std::vector<int32_t> got(static_cast<size_t>(n));
    gpu().copy_to_host(got.data(), gi);
    Tensor ci = cpu().alloc({n}, DType::kI32);
    cpu().sample(on_cpu(logits, {n, V}), rows, ci);
    int same = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int32_t want = ci.data<int32_t>()[i];
      same += got[static_cast<size_t>(i)] == want;
      if (rows[static_cast<size_t>(i)].temperature == 0.0f) {
        EXPECT_EQ(got[static_cast<size_t>(i)], want) << "row " << i;
      }
      ASSERT_GE(got[static_cast<size_t>(i)], 0);
      ASSERT_LT(got[static_cast<size_t>(i)], V);
    }
    EXPECT_GE(same, n - 2) << "V=" << V;
  }
}

// A captured graph replays the same work on new inputs written into the same buffers.
TEST_F(CudaOps, CapturedGraphReplaysOnNewInputs) {
  ASSERT_TRUE(gpu().supports_graphs());
  const int64_t T = 5, H = 256, N = 384;
  Tensor x = gpu().alloc({T, H}, DType::kBF16);
  Tensor w = on_gpu(rand(N * H), {N, H});
  Tensor norm_w = on_gpu(rand(H, 0.5f, 1.5f), {H});
  Tensor y = gpu().alloc({T, N}, DType::kBF16);
  auto step = [&] {
    Tensor h = gpu().scratch({T, H}, DType::kBF16);
    gpu().rms_norm(x, norm_w, 1e-6f, h);
    gpu().linear(h, w, nullptr, y);
  };
  auto write_x = [&](const std::vector<float>& v) {
    std::vector<uint8_t> bytes(x.nbytes());
    convert_host(v.data(), DType::kF32, bytes.data(), DType::kBF16, v.size());
    gpu().copy_from_host(x, bytes.data());
  };
  std::vector<std::vector<float>> inputs = {rand(T * H), rand(T * H), rand(T * H)}, refs;
  for (const auto& v : inputs) {
    write_x(v);
    gpu().reset_scratch();
    step();
    refs.push_back(from_gpu(y));
  }
  gpu().reset_scratch();
  gpu().begin_capture();
  step();
  std::unique_ptr<CapturedGraph> g = gpu().end_capture();
  ASSERT_TRUE(g);
  for (size_t i = 0; i < inputs.size(); ++i) {
    write_x(inputs[i]);
    gpu().fill(y, NAN);
    gpu().replay(*g);
    EXPECT_EQ(rel_err(from_gpu(y), refs[i]), 0.0) << "input " << i;
  }
  // A host transfer inside a capture would replay stale data: refused.
  gpu().begin_capture();
  std::vector<uint8_t> bytes(x.nbytes());
  EXPECT_THROW(gpu().copy_from_host(x, bytes.data()), Error);
  g = gpu().end_capture();
}

// TESSERA_CUDA_OPTIONS sets CudaOptions members by name (and arch= the architecture profile); a
// bad item fails the backend's construction with a message that names it (and the known names).
TEST_F(CudaOps, CudaOptionsFromTheEnvironment) {
  // The process's own setting (the suite may run under a profile) comes back at the end.
  const char* outer = std::getenv("TESSERA_CUDA_OPTIONS");
  const std::string saved = outer ? outer : "";
  auto restore = [&] { outer ? setenv("TESSERA_CUDA_OPTIONS", saved.c_str(), 1) : unsetenv("TESSERA_CUDA_OPTIONS"); };
  auto message = [&](const char* value) -> std::string {
    setenv("TESSERA_CUDA_OPTIONS", value, 1);
    std::string m;
    try {
      make_cuda_backend(0);
    } catch (const Error& e) {
      m = e.what();
    }
    restore();
    return m;
  };
  EXPECT_EQ(message("chunked_gated_delta=0,fp8_w8a8_min_rows=100000,moe_fp8_decode=cuda_cores,"), "");
  EXPECT_NE(message("chunked_gated_delta=2").find("must be 0 or 1"), std::string::npos);
  EXPECT_NE(message("fp8_w8a8_min_rows=x").find("is not an integer"), std::string::npos);
  EXPECT_NE(message("moe_fp8_decode=fast").find("cuda_cores"), std::string::npos) << "lists the variants";
  EXPECT_NE(message("no_such_option=1").find("unknown option 'no_such_option'"), std::string::npos);
  EXPECT_NE(message("chunked_gated_delta").find("is not name=value"), std::string::npos);
  EXPECT_NE(message("arch=sm_120").find("names no architecture profile"), std::string::npos);
  // The sm_120 profile: the backend's record is the sm_120 row's, with this GPU's SMs.
  setenv("TESSERA_CUDA_OPTIONS", "arch=sm120", 1);
  auto be = make_cuda_backend(0);
  restore();
  const CudaArch* arch = cuda_backend_arch(*be);
  ASSERT_NE(arch, nullptr);
  EXPECT_EQ(arch->family, CudaArchFamily::kSm120);
  EXPECT_FALSE(arch->wgmma);
  EXPECT_FALSE(arch->cublaslt_block_fp8);
  EXPECT_LE(arch->smem_per_block_optin, 101376u);
  EXPECT_NE(be->name().find("as sm_120"), std::string::npos) << be->name();
}

TEST_F(CudaOps, BadTokenIdIsAnError) {
  Tensor table = on_gpu(rand(10 * 64), {10, 64});
  Tensor out = gpu_out({2, 64});
  gpu().embedding(on_gpu_i32({1, 10}, {2}), table, out);
  EXPECT_THROW(gpu().synchronize(), Error);
  gpu().synchronize();  // the flag is cleared after the report
}

TEST_F(CudaOps, LinearAtTheTinyFixturesShapes) {
  struct Case {
    int64_t T, K, N;
    bool bias;
    DType out;
  };
  // The tiny fixtures' shapes (hidden 64): the shared expert's gate (one bf16 column), routers (f32,
  // 8 or 60 experts), the lm_head; the op table has the general shapes.
  for (Case c : std::vector<Case>{{1, 64, 1, false, DType::kBF16},
                                  {7, 64, 1, false, DType::kBF16},
                                  {33, 64, 1, false, DType::kBF16},
                                  {300, 64, 1, false, DType::kBF16},
                                  {7, 64, 8, false, DType::kF32},
                                  {300, 64, 8, false, DType::kF32},
                                  {33, 64, 60, false, DType::kF32},
                                  {300, 64, 256, false, DType::kF32},
                                  {7, 64, 96, true, DType::kBF16}}) {
    auto x = rand(c.T * c.K), w = rand(c.N * c.K, -0.1f, 0.1f), b = rand(c.N);
    Tensor out = gpu_out({c.T, c.N}, c.out);
    Tensor gb = on_gpu(b, {c.N}), cb = on_cpu(b, {c.N});
    gpu().linear(on_gpu(x, {c.T, c.K}), on_gpu(w, {c.N, c.K}), c.bias ? &gb : nullptr, out);
    Tensor ref = cpu().alloc({c.T, c.N}, DType::kF32);
    cpu().linear(on_cpu(x, {c.T, c.K}), on_cpu(w, {c.N, c.K}), c.bias ? &cb : nullptr, ref);
    EXPECT_LT(rel_err(from_gpu(out), from_cpu(ref)), 1e-2)
        << "T=" << c.T << " K=" << c.K << " N=" << c.N << " out " << dtype_name(c.out);
  }
}

// FP8 block-scaled weights (e4m3 with one f32 scale per 128 x 128 block) against the CPU's
// dequantising reference. M <= 16 runs the FP8 GEMV, 17-64 rows on small weights the small-M
// kernel, below fp8_w8a8_min_rows the W8A16 GEMM (bf16 activations all: bf16-level error); from
// there activations are quantised to e4m3 per token and 128 columns (3 mantissa bits, rounding
// up to 1/16 per element, ~2-3% on these sums) for the block-scaled GEMM (cuBLASLt's or the mma.sync
// kernel) where K is a multiple of 512, else the weight is dequantised to bf16 for the bf16 GEMM.
TEST_F(CudaOps, Fp8BlockScaledLinear) {
  struct Case {
    int64_t T, K, N;
    bool bias;
    DType out;
  };
  for (Case c : std::vector<Case>{{1, 512, 256, false, DType::kBF16},
                                  {2, 4096, 1024, false, DType::kBF16},
                                  {3, 384, 200, true, DType::kF32},
                                  {5, 2048, 4096, false, DType::kBF16},
                                  {8, 256, 8192, false, DType::kF32},
                                  {16, 4096, 384, false, DType::kBF16},
                                  {17, 512, 256, false, DType::kBF16},
                                  {64, 4096, 1024, true, DType::kBF16},
                                  {300, 2048, 640, false, DType::kF32},
                                  {33, 384, 200, false, DType::kBF16},
                                  {9, 208, 130, false, DType::kF32},
                                  // The GEMV's tiles (16 rows, 64-column groups, 128-wide scale
                                  // blocks) with N and K off every multiple, for M = 1 .. 16.
                                  {1, 208, 130, false, DType::kBF16},
                                  {2, 336, 77, false, DType::kF32},
                                  {3, 1040, 1000, true, DType::kBF16},
                                  {4, 1040, 1000, false, DType::kF32},
                                  {8, 144, 19, true, DType::kBF16},
                                  {12, 80, 33, false, DType::kF32},
                                  {16, 400, 250, false, DType::kF32},
                                  {16, 3088, 1030, true, DType::kBF16},
                                  // The W8A16 GEMM: K slices (few tiles), odd N, partial row tiles.
                                  {24, 8192, 3072, true, DType::kBF16},
                                  {40, 1040, 77, false, DType::kF32},
                                  {129, 3088, 1030, false, DType::kBF16},
                                  {513, 1024, 640, true, DType::kF32}}) {
    std::uniform_int_distribution<int> byte(0, 255);
    std::vector<uint8_t> q(static_cast<size_t>(c.N * c.K));
    for (auto& b : q) {
      do b = static_cast<uint8_t>(byte(rng_));
      while ((b & 0x7f) == 0x7f);  // e4m3 NaN
    }
    const Shape ss = block_scale_shape({c.N, c.K});
    auto scales = rand(ss.numel(), 1e-4f, 4e-4f);
    auto x = rand(c.T * c.K), b = rand(c.N);
    auto make = [&](Backend& be) {
      Tensor w = be.alloc({c.N, c.K}, DType::kF8E4M3), s = be.alloc(ss, DType::kF32);
      be.copy_from_host(w, q.data());
      be.copy_from_host(s, scales.data());
      return w.with_block_scale(s);
    };
    Tensor gb = on_gpu(b, {c.N}), cb = on_cpu(b, {c.N});
    Tensor ref = cpu().alloc({c.T, c.N}, DType::kF32);
    cpu().linear(on_cpu(x, {c.T, c.K}), make(cpu()), c.bias ? &cb : nullptr, ref);
    // The production backend (the GEMV to 16 rows, the small-M kernel to 64 for small weights,
    // W8A8 through cuBLASLt above: e4m3 activations cost a few percent) and one that keeps bf16
    // activations at every M (the small-M kernel to 64 rows, then the W8A16 GEMM).
    for (Backend* be : {&gpu(), w16_.get()}) {
      const bool small = c.T <= cuda::kMaxFp8SmallRows && c.N * c.K <= CudaOptions{}.fp8_small_max_weights;
      const bool quantised = be == &gpu() && c.T >= CudaOptions{}.fp8_w8a8_min_rows && !small && c.K % 512 == 0;
      Tensor out = be->alloc({c.T, c.N}, c.out);
      be->fill(out, NAN);
      Tensor bb = upload(*be, b, {c.N}, DType::kBF16);
      be->linear(upload(*be, x, {c.T, c.K}, DType::kBF16), make(*be), c.bias ? &bb : nullptr, out);
      EXPECT_LT(rel_err(download(*be, out), from_cpu(ref)), quantised ? 5e-2 : 1e-2)
          << "T=" << c.T << " K=" << c.K << " N=" << c.N << " out " << dtype_name(c.out)
          << (quantised ? " (W8A8)" : "");
    }
  }
}

// The mma.sync block-scaled FP8 GEMM (W8A8 where cuBLASLt has no block-scaled GEMM: sm_120 /
// sm_121) on activations quantised by launch_quantize_act_fp8, against an f64 product of the same
// e4m3 values and scales. A 128-column block's dot product of e4m3 values is exact in f64 (and
// each product in f32), so what is left is the kernel's f32 sums (1e-3) and, for bf16 out, the
// output's rounding (2^-9 of a value at most). Shapes: partial row tiles, N off the 64- and
// 128-column tiles (200, 384), K of 1 to 32 scale blocks; each with the tile the device's SM count
// picks, with an SM count of 1 (the largest tile above 32 rows) and of INT_MAX (the smallest),
// which must give the same bits.
TEST_F(CudaOps, Fp8BlockMmaGemmMatchesReference) {
  int dev = 0, max_smem = 0, sms = 0;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), cudaSuccess);
  const auto stream = static_cast<cudaStream_t>(cuda_backend_stream(gpu()));
  std::vector<float> e4m3(256);
  for (int v = 0; v < 256; ++v) e4m3[v] = fp8e4m3_to_f32(static_cast<uint8_t>(v));
  struct Case {
    int64_t N, K;
  };
  for (Case c : std::vector<Case>{{128, 128}, {200, 256}, {3072, 1024}, {1024, 3072}, {384, 4096}}) {
    const int64_t N = c.N, K = c.K, KB = K / 128;
    const Fp8Host wh = fp8_host({N, K});
    const Tensor w = put_fp8(gpu(), wh);
    std::vector<float> wd(wh.q.size());
    for (size_t i = 0; i < wd.size(); ++i) wd[i] = e4m3[wh.q[i]];
    for (int64_t M : {1, 7, 16, 17, 64, 100, 256, 1000}) {
      // Rows and 128-column blocks of different magnitudes: every (row, block) has its own scale.
      std::vector<float> x = rand(M * K);
      for (int64_t i = 0; i < M * K; ++i) x[i] *= static_cast<float>(1 + (i / K * 7 + i % K / 128) % 13);
      const Tensor gx = on_gpu(x, {M, K});
      const Tensor xq = gpu().alloc({M, K}, DType::kF8E4M3), xs = gpu().alloc({KB, M}, DType::kF32);
      cuda::launch_quantize_act_fp8(gx.raw(), xq.raw(), xs.data<float>(), M, K, stream);
      std::vector<uint8_t> hq(static_cast<size_t>(M * K));
      std::vector<float> hs(static_cast<size_t>(KB * M));
      gpu().copy_to_host(hq.data(), xq);
      gpu().copy_to_host(hs.data(), xs);
      std::vector<float> xd(hq.size());
      for (size_t i = 0; i < xd.size(); ++i) xd[i] = e4m3[hq[i]];
      std::vector<float> want(static_cast<size_t>(M * N));
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
          double sum = 0;
          for (int64_t kb = 0; kb < KB; ++kb) {
            const float* xr = &xd[m * K + kb * 128];
            const float* wr = &wd[n * K + kb * 128];
            double d[4] = {0, 0, 0, 0};  // exact in any order: four chains
            for (int k = 0; k < 128; k += 4)
              for (int j = 0; j < 4; ++j) d[j] += static_cast<double>(xr[k + j] * wr[k + j]);
            sum += (d[0] + d[1] + d[2] + d[3]) * hs[kb * M + m] * wh.scale[(n / 128) * KB + kb];
          }
          want[m * N + n] = static_cast<float>(sum);
        }
      for (DType ot : {DType::kF32, DType::kBF16}) {
        std::vector<float> first;  // every tile sums in the same order: the same bits
        for (int tile_sms : {sms, 1, INT_MAX}) {
          const Tensor out = gpu_out({M, N}, ot);
          const std::string what = "M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K) +
                                   " out " + std::string(dtype_name(ot)) + " SMs " + std::to_string(tile_sms);
          ASSERT_TRUE(cuda::launch_fp8_block_mma_gemm(xq.raw(), xs.data<float>(), w.raw(),
                                                      w.block_scale()->data<float>(), out.raw(), ot, M, N, K, max_smem,
                                                      tile_sms, stream))
              << what;
          const std::vector<float> got = from_gpu(out);
          EXPECT_LT(rel_err(got, want), ot == DType::kF32 ? 1e-3 : 5e-3) << what;
          if (first.empty())
            first = got;
          else
            EXPECT_EQ(std::memcmp(got.data(), first.data(), got.size() * sizeof(float)), 0)
                << what << ": not the bits of the device's SM count";
        }
      }
    }
  }
  // What it does not take: K off the 128-column blocks, other output dtypes.
  const Tensor any = gpu().alloc({256}, DType::kF32);
  EXPECT_FALSE(cuda::launch_fp8_block_mma_gemm(any.raw(), any.data<float>(), any.raw(), any.data<float>(), any.raw(),
                                               DType::kF32, 1, 1, 192, max_smem, sms, stream));
  EXPECT_FALSE(cuda::launch_fp8_block_mma_gemm(any.raw(), any.data<float>(), any.raw(), any.data<float>(), any.raw(),
                                               DType::kF16, 1, 1, 128, max_smem, sms, stream));
}

// The W8A16 paths' rows against the same row alone (the GEMV): the small-M kernel (17 .. 64
// rows, K slices) and the tensor-core GEMM (row tiles, K slices where a shape has few 128 x 256
// tiles), on a backend that keeps bf16 activations at every M. All apply the block scales to f32
// sums of exact e4m3 x bf16 products, so they differ only by the order of f32 sums.
TEST_F(CudaOps, Fp8W16RowsMatchTheGemv) {
  struct Case {
    int64_t M, N, K;
  };
  for (Case c :
       std::vector<Case>{{17, 3072, 8192}, {48, 3072, 1024}, {64, 200, 336}, {130, 1000, 2048}, {600, 4096, 512}}) {
    const int splits = c.M <= cuda::kMaxFp8SmallRows ? cuda::fp8_w16_small_splits(c.N, c.K)
                                                     : cuda::fp8_w16_gemm_splits(c.M, c.N, c.K, 132);
    std::uniform_int_distribution<int> byte(0, 255);
    std::vector<uint8_t> q(static_cast<size_t>(c.N * c.K));
    for (auto& b : q) {
      do b = static_cast<uint8_t>(byte(rng_));
      while ((b & 0x7f) == 0x7f);
    }
    const Shape ss = block_scale_shape({c.N, c.K});
    auto scales = rand(ss.numel(), 1e-4f, 4e-4f);
    auto x = rand(c.M * c.K);
    Tensor w = gpu().alloc({c.N, c.K}, DType::kF8E4M3), s = gpu().alloc(ss, DType::kF32);
    gpu().copy_from_host(w, q.data());
    gpu().copy_from_host(s, scales.data());
    Tensor ws = w.with_block_scale(s);
    Tensor all = gpu_out({c.M, c.N}, DType::kF32), gx = on_gpu(x, {c.M, c.K});
    gpu().synchronize();  // the inputs were written on gpu's stream
    w16_->linear(gx, ws, nullptr, all);
    w16_->synchronize();
    const auto got = from_gpu(all);
    for (int64_t m : {int64_t{0}, c.M / 2, c.M - 1}) {
      Tensor one = gpu_out({1, c.N}, DType::kF32);
      std::vector<float> xr(x.begin() + m * c.K, x.begin() + (m + 1) * c.K);
      gpu().linear(on_gpu(xr, {1, c.K}), ws, nullptr, one);
      const std::vector<float> row(got.begin() + m * c.N, got.begin() + (m + 1) * c.N);
      EXPECT_LT(rel_err(row, from_gpu(one)), 1e-4)
          << "M=" << c.M << " N=" << c.N << " K=" << c.K << " row " << m << " (" << splits << " K slices)";
    }
  }
  EXPECT_GT(cuda::fp8_w16_gemm_splits(17, 3072, 8192, 132), 1) << "a decode batch's few tiles split K";
  EXPECT_EQ(cuda::fp8_w16_gemm_splits(4096, 4096, 4096, 132), 1);
}

// The fused prologue against the CPU backend's composition (split, norms, rope, write_kv).
TEST_F(CudaOps, QkvPrologueMatchesSplitNormRopeWrite) {
  for (DType cache_t : {DType::kBF16, DType::kF8E4M3}) {
    for (int D : {128, 24, 256}) {  // 256: Qwen3-Next / Qwen3.5 gated attention, 64 rotary dims
      for (bool norm : {true, false}) {
        const bool neox = D != 24;
        const int rd = D == 128 ? D : D == 256 ? 64 : 16;
        const int64_t T = 9, Hq = 8, Hk = 2, max_pos = 512, blocks = 4, bs = 16;
        std::vector<float> cs = rope_cos_sin(max_pos, rd);
        std::vector<int32_t> pos(T), slots(T);
        for (int64_t t = 0; t < T; ++t) {
          pos[t] = static_cast<int32_t>(rng_() % max_pos);
          slots[t] = t == 3 ? -1 : static_cast<int32_t>((t * 7) % (blocks * bs));
        }
        auto qkv = rand(T * (Hq + 2 * Hk) * D, -2.0f, 2.0f), qn = rand(D, 0.5f, 1.5f), kn = rand(D, 0.5f, 1.5f);
        AttentionLayout lay;
        lay.query_start_loc = {0, static_cast<int32_t>(T)};
        lay.seq_lens = {static_cast<int32_t>(T)};
        lay.block_tables = {0, 1, 2, 3};
        lay.max_blocks_per_seq = 4;
        lay.slot_mapping = slots;
        AttentionMetadata gm = upload_attention_metadata(gpu(), lay), cm = upload_attention_metadata(cpu(), lay);
        Tensor gkc = gpu().alloc({blocks, bs, Hk, D}, cache_t), gvc = gpu().alloc({blocks, bs, Hk, D}, cache_t);
        Tensor ckc = cpu().alloc({blocks, bs, Hk, D}, cache_t), cvc = cpu().alloc({blocks, bs, Hk, D}, cache_t);
        for (const Tensor& t : {gkc, gvc}) gpu().fill(t, 0.0f);
        std::memset(ckc.raw(), 0, ckc.nbytes());
        std::memset(cvc.raw(), 0, cvc.nbytes());
        Tensor gq = gpu_out({T, Hq, D}), cq = cpu().alloc({T, Hq, D}, DType::kF32);
        Tensor gqn = on_gpu(qn, {D}), gkn = on_gpu(kn, {D}), cqn = on_cpu(qn, {D}), ckn = on_cpu(kn, {D});
        RopeTable gt{on_gpu(cs, {max_pos, rd}, DType::kF32), rd, neox}, ct{on_cpu(cs, {max_pos, rd}), rd, neox};
        gpu().qkv_prologue(on_gpu(qkv, {T, (Hq + 2 * Hk) * D}), norm ? &gqn : nullptr, norm ? &gkn : nullptr, 1e-6f,
                           on_gpu_i32(pos, {T}), gt, gkc, gvc, gm, 1.0f, 1.0f, gq);
        cpu().qkv_prologue(on_cpu(qkv, {T, (Hq + 2 * Hk) * D}), norm ? &cqn : nullptr, norm ? &ckn : nullptr, 1e-6f,
                           on_cpu_i32(pos, {T}), ct, ckc, cvc, cm, 1.0f, 1.0f, cq);
        const double tol = cache_t == DType::kF8E4M3 ? 7e-2 : 1e-2;
        std::string what = std::string(dtype_name(cache_t)) + " D=" + std::to_string(D) + (norm ? " norm" : "");
        EXPECT_LT(rel_err(from_gpu(gq), from_cpu(cq)), 1e-2) << what;
        EXPECT_LT(rel_err(from_gpu(gkc), from_cpu(ckc)), tol) << what;
        EXPECT_LT(rel_err(from_gpu(gvc), from_cpu(cvc)), tol) << what;
      }
    }
  }
}

// The fused decode kernel (the default; CudaOptions::fused_decode_attention = false turns
// it off): prologue and decode attention in one kernel. On decode steps it must give exactly what
// qkv_prologue then paged_attention give: the same output bits and the same cache bits (the
// newest key and value are written by the fused kernel).
// A decode step of one token per sequence after `cached` keys each (block size bs): the layout that
// writes the cached keys beforehand as one prefill would (sequences with none left out), the step's
// layout (block tables, the new token's slot), the positions, and the blocks used.
struct DecodeLayouts {
  AttentionLayout all, step;
  std::vector<int32_t> pos;
  int blocks = 0;
};
DecodeLayouts decode_layouts(const std::vector<int>& cached, int bs) {
  DecodeLayouts d;
  AttentionLayout &all = d.all, &step = d.step;
  all.block_size = step.block_size = bs;
  int max_blocks = 0;
  for (int c : cached) max_blocks = std::max(max_blocks, (c + 1 + bs - 1) / bs);
  all.max_blocks_per_seq = step.max_blocks_per_seq = max_blocks;
  all.query_start_loc = step.query_start_loc = {0};
  for (int c : cached) {
    std::vector<int32_t> bt(max_blocks, 0);
    for (int b = 0; b < (c + bs) / bs; ++b) bt[b] = d.blocks++;
    if (c > 0) {
      for (int j = 0; j < c; ++j) all.slot_mapping.push_back(bt[j / bs] * bs + j % bs);
      all.query_start_loc.push_back(all.query_start_loc.back() + c);
      all.seq_lens.push_back(c);
      all.block_tables.insert(all.block_tables.end(), bt.begin(), bt.end());
    }
    step.block_tables.insert(step.block_tables.end(), bt.begin(), bt.end());
    step.query_start_loc.push_back(step.query_start_loc.back() + 1);
    step.seq_lens.push_back(c + 1);
    step.slot_mapping.push_back(bt[c / bs] * bs + c % bs);
    d.pos.push_back(c);
  }
  return d;
}

TEST_F(CudaOps, FusedDecodeAttentionEqualsPrologueThenAttention) {
  CudaOptions unfused;
  unfused.fused_decode_attention = false;
  std::unique_ptr<Backend> two_ops = make_cuda_backend(0, unfused);
  std::unique_ptr<Backend> fused = make_cuda_backend(0);
  // The fused kernel with every query-head chunk a block can take (CudaOptions::decode_heads_per_block):
  // the same bits as the rule's choice.
  std::vector<std::unique_ptr<Backend>> chunked;
  for (int heads : {1, 2, 4, 8}) {
    CudaOptions o;
    o.decode_heads_per_block = heads;
    chunked.push_back(make_cuda_backend(0, o));
  }
  // The merge kernel launched when the attention ends (CudaOptions::decode_early_merge off), fused and as two ops.
  CudaOptions late;
  late.decode_early_merge = false;
  std::unique_ptr<Backend> fused_late_merge = make_cuda_backend(0, late);
  late.fused_decode_attention = false;
  std::unique_ptr<Backend> two_ops_late_merge = make_cuda_backend(0, late);
  std::vector<Backend*> backends = {two_ops.get(), fused.get()};
  for (auto& b : chunked) backends.push_back(b.get());
  backends.push_back(fused_late_merge.get());
  backends.push_back(two_ops_late_merge.get());
  const std::vector<int> cached = {0, 15, 16, 299, 1000};  // each sequence decodes one token
  for (DType cache_t : {DType::kBF16, DType::kF8E4M3})
    for (int D : {128, 64, 256})  // 256 with 64 rotary dims (neox): Qwen3-Next / Qwen3.5
      for (int group : {1, 4, 8, 16})
        for (bool norm : {true, false}) {
          const bool neox = D != 64;
          const int rd = D == 128 ? D : D == 256 ? 64 : 32, Hk = 2, Hq = Hk * group, bs = 16, max_pos = 2048;
          const int64_t T = static_cast<int64_t>(cached.size());
          const float k_scale = cache_t == DType::kF8E4M3 ? 0.01f : 1.0f;
          const float v_scale = cache_t == DType::kF8E4M3 ? 0.005f : 1.0f;
          std::vector<float> cs = rope_cos_sin(max_pos, rd);
          const DecodeLayouts lay = decode_layouts(cached, bs);
          const AttentionLayout &all = lay.all, &step = lay.step;
          const std::vector<int32_t>& pos = lay.pos;
          const int next = lay.blocks, Tall = all.query_start_loc.back();
          auto k = rand(int64_t{Tall} * Hk * D), v = rand(int64_t{Tall} * Hk * D);
          auto qkv = rand(T * (Hq + 2 * Hk) * D, -2.0f, 2.0f), qn = rand(D, 0.5f, 1.5f), kn = rand(D, 0.5f, 1.5f);
          const size_t n = backends.size();
          std::vector<std::vector<float>> out_bits(n), kc_bits(n), vc_bits(n);
          std::vector<size_t> scratch_bytes(n);
          size_t i = 0;
          for (Backend* be : backends) {
            be->reset_scratch();  // before the metadata: it lives in scratch memory
            Shape cache_shape{next, bs, Hk, D};
            Tensor kc = be->alloc(cache_shape, cache_t), vc = be->alloc(cache_shape, cache_t);
            be->fill(kc, 7.0f);
            be->fill(vc, 7.0f);
            AttentionMetadata ma = upload_attention_metadata(*be, all), ms = upload_attention_metadata(*be, step);
            be->write_kv(upload(*be, k, {Tall, Hk, D}), upload(*be, v, {Tall, Hk, D}), kc, vc, ma, k_scale, v_scale);
            Tensor gqn = upload(*be, qn, {D}), gkn = upload(*be, kn, {D});
            RopeTable rope{upload(*be, cs, {max_pos, rd}, DType::kF32), rd, neox};
            Tensor out = be->alloc({T, Hq, D}, DType::kBF16);
            be->fill(out, NAN);
            const size_t scratch_before = be->scratch_in_use();
            be->qkv_attention(upload(*be, qkv, {T, (Hq + 2 * Hk) * D}), norm ? &gqn : nullptr, norm ? &gkn : nullptr,
                              1e-6f, upload_i32(*be, pos, {T}), rope, kc, vc, ms,
                              1.0f / std::sqrt(static_cast<float>(D)), k_scale, v_scale, 0, out);
            scratch_bytes[i] = be->scratch_in_use() - scratch_before;
            out_bits[i] = download(*be, out);
            kc_bits[i] = download(*be, kc);
            vc_bits[i] = download(*be, vc);
            be->synchronize();
            be->reset_scratch();
            ++i;
          }
          std::string what = std::string(dtype_name(cache_t)) + " D=" + std::to_string(D) +
                             " group=" + std::to_string(group) + (norm ? " norm" : "");
          // The fused kernel took the step: it needs no q buffer, the two ops do.
          EXPECT_LE(scratch_bytes[1] + static_cast<size_t>(T * Hq * D * 2), scratch_bytes[0]) << what;
          for (size_t side = 0; side < n; ++side) {
            const std::string who = side == 0       ? ": two ops"
                                    : side == 1     ? ": fused"
                                    : side == n - 2 ? ": fused, merge launched late"
                                    : side == n - 1 ? ": two ops, merge launched late"
                                                    : ": fused, heads per block " + std::to_string(1 << (side - 2));
            const auto nan_at =
                std::find_if(out_bits[side].begin(), out_bits[side].end(), [](float f) { return !std::isfinite(f); });
            EXPECT_TRUE(nan_at == out_bits[side].end())
                << what << who << " output not finite at " << (nan_at - out_bits[side].begin()) << " of "
                << out_bits[side].size();
            if (side == 0) continue;
            EXPECT_EQ(rel_err(out_bits[side], out_bits[0]), 0.0) << what << who;
            EXPECT_EQ(rel_err(kc_bits[side], kc_bits[0]), 0.0) << what << who;
            EXPECT_EQ(rel_err(vc_bits[side], vc_bits[0]), 0.0) << what << who;
          }
        }
}

// A step whose arena grew only inside a mark/rewind span (a layer's temporaries) leaves one
// chunk behind; the next reset must still make room for the peak, or every layer of every
// later step allocates and frees (cudaFree synchronizes) a chunk again.
// Decode attention at the split count of a captured graph (slices sized for max_model_len, so most blocks find
// no keys and leave at once): launched twice and replayed from a graph twice it gives the same bits, the same as
// with the merge kernel launched when the attention ends (CudaOptions::decode_early_merge), and the result at the
// step's own split count up to the order of the sums.
TEST_F(CudaOps, DecodeAttentionAtAGraphsSplitCount) {
  CudaOptions late;
  late.decode_early_merge = false;
  std::unique_ptr<Backend> early = make_cuda_backend(0), late_merge = make_cuda_backend(0, late);
  for (int D : {128, 256})
    for (const std::vector<int>& cached : {std::vector<int>{40}, std::vector<int>{5, 700, 63}}) {
      const int Hk = 2, group = 8, Hq = Hk * group, bs = 16, max_pos = 2048, rd = D == 128 ? D : 64;
      const int64_t T = static_cast<int64_t>(cached.size());
      const DecodeLayouts lay = decode_layouts(cached, bs);
      const AttentionLayout &all = lay.all, &step = lay.step;
      const std::vector<int32_t>& pos = lay.pos;
      const int next = lay.blocks, Tall = all.query_start_loc.back();
      auto k = rand(int64_t{Tall} * Hk * D), v = rand(int64_t{Tall} * Hk * D);
      auto qkv = rand(T * (Hq + 2 * Hk) * D, -2.0f, 2.0f), qn = rand(D, 0.5f, 1.5f), kn = rand(D, 0.5f, 1.5f);
      std::vector<float> cs = rope_cos_sin(max_pos, rd);
      // early: 2 launches, 2 replays at the graph's split count, then 1 launch at the step's own; late: 1 launch
      std::vector<std::vector<float>> outs;
      std::vector<float> own_splits;
      for (Backend* be : {early.get(), late_merge.get()}) {
        be->reset_scratch();
        Tensor kc = be->alloc({next, bs, Hk, D}, DType::kBF16), vc = be->alloc({next, bs, Hk, D}, DType::kBF16);
        AttentionMetadata ma = upload_attention_metadata(*be, all), ms = upload_attention_metadata(*be, step);
        const int own_max = ms.max_seq_len;
        ms.max_seq_len = 8192;  // what a captured graph's metadata says: the most splits
        be->write_kv(upload(*be, k, {Tall, Hk, D}), upload(*be, v, {Tall, Hk, D}), kc, vc, ma, 1.0f, 1.0f);
        Tensor gqkv = upload(*be, qkv, {T, (Hq + 2 * Hk) * D}), gqn = upload(*be, qn, {D}), gkn = upload(*be, kn, {D});
        Tensor gpos = upload_i32(*be, pos, {T});
        RopeTable rope{upload(*be, cs, {max_pos, rd}, DType::kF32), rd, true};
        Tensor out = be->alloc({T, Hq, D}, DType::kBF16);
        auto run = [&] {
          be->qkv_attention(gqkv, &gqn, &gkn, 1e-6f, gpos, rope, kc, vc, ms, 1.0f / std::sqrt(static_cast<float>(D)),
                            1.0f, 1.0f, 0, out);
        };
        const bool first = be == early.get();
        for (int i = 0; i < (first ? 2 : 1); ++i) {
          be->fill(out, NAN);
          run();
          outs.push_back(download(*be, out));
        }
        if (first) {
          be->begin_capture();
          run();
          std::unique_ptr<CapturedGraph> g = be->end_capture();
          ASSERT_TRUE(g);
          for (int i = 0; i < 2; ++i) {
            be->fill(out, NAN);
            be->replay(*g);
            outs.push_back(download(*be, out));
          }
          ms.max_seq_len = own_max;
          be->fill(out, NAN);
          run();
          own_splits = download(*be, out);
        }
        be->synchronize();
        be->reset_scratch();
      }
      const std::string what = "D=" + std::to_string(D) + " T=" + std::to_string(T);
      const std::vector<float>& want = outs.back();
      ASSERT_TRUE(std::all_of(want.begin(), want.end(), [](float f) { return std::isfinite(f); })) << what;
      for (size_t i = 0; i + 1 < outs.size(); ++i)
        EXPECT_EQ(rel_err(outs[i], want), 0.0) << what << (i < 2 ? ", launch " : ", replay ") << i % 2;
      EXPECT_LT(rel_err(own_splits, want), 1e-2) << what << ": the step's own split count";
    }
}

TEST_F(CudaOps, ScratchArenaKeepsPeakGrownInsideRewind) {
  gpu().reset_scratch();
  Tensor small = gpu().scratch({256}, DType::kF32);
  size_t mark = gpu().scratch_mark();
  Tensor big = gpu().scratch({int64_t{2} << 30}, DType::kU8);  // past any earlier test's peak
  ASSERT_NE(big.storage().get(), small.storage().get()) << "the arena did not grow: the test checks nothing";
  gpu().fill(big, 0.0f);
  gpu().scratch_rewind(mark);
  big = Tensor();
  gpu().synchronize();
  gpu().reset_scratch();
  small = gpu().scratch({256}, DType::kF32);
  mark = gpu().scratch_mark();
  big = gpu().scratch({int64_t{2} << 30}, DType::kU8);
  // One chunk holds both: `big` follows `small` in the same allocation.
  EXPECT_EQ(big.storage().get(), small.storage().get());
  gpu().scratch_rewind(mark);
  gpu().reset_scratch();
}

TEST_F(CudaOps, ScratchArenaGrowsAndRewinds) {
  gpu().reset_scratch();
  Tensor first = gpu().scratch({256}, DType::kF32);  // the arena has a chunk before the mark
  size_t mark = gpu().scratch_mark();
  Tensor a = gpu().scratch({1 << 20}, DType::kF32);
  Tensor b = gpu().scratch({int64_t{300} << 20}, DType::kU8);  // past the first chunk
  gpu().fill(a, 1.0f);
  gpu().fill(b, 0.0f);
  gpu().scratch_rewind(mark);
  Tensor c = gpu().scratch({1 << 20}, DType::kF32);
  EXPECT_EQ(c.raw(), a.raw());
  gpu().reset_scratch();
  Tensor d = gpu().scratch({int64_t{300} << 20}, DType::kU8);  // one merged chunk now holds it
  gpu().fill(d, 0.0f);
  gpu().synchronize();
}

// ---------------------------------------------------------------- linear attention (Gated DeltaNet)
// A step of sequences in state slots: both backends get the same layout and the same states.
struct LinearStep {
  std::vector<int> lens, slots, init;
  std::vector<int> token_slots = {};  // speculative decoding: the slot of the state after each token
};
LinearAttnLayout linear_layout(const LinearStep& st) {
  LinearAttnLayout l;
  l.query_start_loc = {0};
  for (int n : st.lens) l.query_start_loc.push_back(l.query_start_loc.back() + n);
  l.state_slots.assign(st.slots.begin(), st.slots.end());
  l.has_initial_state.assign(st.init.begin(), st.init.end());
  l.token_state_slots.assign(st.token_slots.begin(), st.token_slots.end());
  return l;
}

// Token slots of a step whose first sequence is a verification chunk keeping the state after
// its token j in group[j]; the other sequences' final states go to their own slots (in place).
std::vector<int> token_slots(const std::vector<int>& group, const std::vector<int>& lens,
                             const std::vector<int>& slots) {
  std::vector<int> t(group);
  for (size_t s = 1; s < lens.size(); ++s)
    for (int i = 0; i < lens[s]; ++i) t.push_back(i == lens[s] - 1 ? slots[s] : -1);
  return t;
}

TEST_F(CudaOps, CausalConv1dMatchesCpu) {
  // Decode (one kernel), a short prefill (one kernel), a long one (then the state kernel); a
  // padding sequence, an empty one, sequences shorter than the window.
  const std::vector<LinearStep> steps = {
      {{1, 1, 1, 1}, {3, 0, -1, 5}, {1, 1, 1, 0}},
      {{9, 2, 1, 0, 64}, {1, 4, 2, 0, 5}, {0, 1, 1, 1, 1}},
      {{300, 2, 70, 1, 5}, {2, 5, 0, -1, 4}, {1, 1, 0, 1, 1}},
      // Speculative decoding: a 4-token verification chunk keeping each token's state (slots 1,
      // 4, 5, 0) beside a long prefill (two kernels) and a decode step, which write in place.
      {{4, 70, 1}, {1, 2, 3}, {1, 1, 1}, token_slots({1, 4, 5, 0}, {4, 70, 1}, {1, 2, 3})},
  };
  const int num_slots = 6, K = 4;
  for (DType sdt : {DType::kF32, DType::kBF16})
    for (int C : {384, 8192 + 96}) {
      const int x_col = 16, X = x_col + C + 40;
      std::vector<float> w = rand(static_cast<int64_t>(C) * K, -0.6f, 0.6f);
      std::vector<float> st0 = rand(static_cast<int64_t>(num_slots) * (K - 1) * C);
      Tensor gw = on_gpu(w, {C, K}), cw = on_cpu(w, {C, K});
      Tensor gs = on_gpu(st0, {num_slots, K - 1, C}, sdt), cs = upload(cpu(), st0, {num_slots, K - 1, C}, sdt);
      for (const LinearStep& step : steps) {
        LinearAttnLayout l = linear_layout(step);
        const int T = l.query_start_loc.back();
        std::vector<float> x = rand(static_cast<int64_t>(T) * X, -2.0f, 2.0f);
        Tensor gx = on_gpu(x, {T, X}), cx = on_cpu(x, {T, X});
        Tensor gout = gpu_out({T, C}), cout = cpu().alloc({T, C}, DType::kF32);
        gpu().causal_conv1d(gx, x_col, gw, gs, upload_linear_attn_metadata(gpu(), l), gout);
        cpu().causal_conv1d(cx, x_col, cw, cs, upload_linear_attn_metadata(cpu(), l), cout);
        EXPECT_LT(rel_err(from_gpu(gout), from_cpu(cout)), 1e-2) << "C " << C << " T " << T;
        // The conv states hold inputs (bf16 values): bit-exact.
        EXPECT_EQ(from_gpu(gs), from_cpu(cs)) << "conv state, C " << C << " T " << T;
        gpu().synchronize();
      }
    }
}

struct GdrCase {
  int Hk, Hv, Dk, Dv;
  DType state;
  const char* what;
};
class CudaGatedDeltaRule : public CudaOps, public ::testing::WithParamInterface<GdrCase> {};

// A prefill step (chunked on tensor cores where Dk = Dv = 128, else the recurrent kernel) with
// sequences crossing 64-token chunks, some continuing from a state, a padding sequence and an
// empty one; then decode steps on the states each backend wrote. Outputs after every step and
// the states at the end against the CPU backend.
TEST_P(CudaGatedDeltaRule, PrefillThenDecodeMatchCpu) {
  const GdrCase c = GetParam();
  const int num_slots = 8, C = 2 * c.Hk * c.Dk + c.Hv * c.Dv;
  const std::vector<LinearStep> steps = {
      {{1, 40, 64, 65, 200, 3, 0}, {3, 0, 6, 2, 5, -1, 1}, {1, 0, 1, 0, 1, 1, 1}},
      {{1, 1, 1, 1, 1}, {3, 0, 6, 2, 5}, {1, 1, 1, 1, 1}},
      {{1, 1, 1, 1, 1, 1}, {3, 0, -1, 6, 2, 5}, {1, 1, 1, 1, 1, 1}},
      {{130, 1, 7}, {0, 3, 5}, {1, 1, 1}},  // a chunked prefill continuing from the state
      // Speculative decoding: a 3-token verification chunk keeping each token's state (slots 3,
      // 4, 7: the recurrent kernel for the whole step) beside a prefill and a decode step.
      {{3, 100, 1}, {3, 0, 6}, {1, 1, 1}, token_slots({3, 4, 7}, {3, 100, 1}, {3, 0, 6})},
      {{1, 1}, {7, 0}, {1, 1}},  // continuing from the kept state
  };
  std::vector<float> alog = rand(c.Hv, -2.0f, 0.5f), dtb = rand(c.Hv, -1.0f, 1.0f);
  Tensor ga = on_gpu(alog, {c.Hv}, DType::kF32), gd = on_gpu(dtb, {c.Hv}, DType::kF32);
  Tensor ca = on_cpu(alog, {c.Hv}), cd = on_cpu(dtb, {c.Hv});
  const Shape ss{num_slots, c.Hv, c.Dk, c.Dv};
  std::vector<float> st0 = rand(ss.numel(), -0.3f, 0.3f);
  Tensor gs = on_gpu(st0, ss, c.state), cs = upload(cpu(), st0, ss, c.state);
  for (size_t i = 0; i < steps.size(); ++i) {
    LinearAttnLayout l = linear_layout(steps[i]);
    const int T = l.query_start_loc.back(), ba_col = 3, X = ba_col + 2 * c.Hv + 5;
    std::vector<float> qkv = rand(static_cast<int64_t>(T) * C, -1.0f, 1.0f),
                       ba = rand(static_cast<int64_t>(T) * X, -3.0f, 3.0f);
    Tensor gout = gpu_out({T, c.Hv, c.Dv}), cout = cpu().alloc({T, c.Hv, c.Dv}, DType::kF32);
    gpu().gated_delta_rule(on_gpu(qkv, {T, C}), on_gpu(ba, {T, X}), ba_col, ga, gd, gs,
                           upload_linear_attn_metadata(gpu(), l), gout);
    cpu().gated_delta_rule(on_cpu(qkv, {T, C}), on_cpu(ba, {T, X}), ba_col, ca, cd, cs,
                           upload_linear_attn_metadata(cpu(), l), cout);
    EXPECT_LT(rel_err(from_gpu(gout), from_cpu(cout)), 2e-2) << c.what << " step " << i;
    gpu().synchronize();
  }
  EXPECT_LT(rel_err(from_gpu(gs), from_cpu(cs)), 2e-2) << c.what << " states";
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaGatedDeltaRule,
                         ::testing::Values(GdrCase{2, 4, 128, 128, DType::kF32, "chunked f32 state"},
                                           GdrCase{2, 4, 128, 128, DType::kBF16, "chunked bf16 state"},
                                           GdrCase{1, 1, 128, 128, DType::kF32, "chunked one head"},
                                           GdrCase{2, 4, 16, 16, DType::kF32, "recurrent, fixture dims"},
                                           GdrCase{2, 2, 64, 32, DType::kBF16, "recurrent 64x32"},
                                           GdrCase{1, 2, 256, 40, DType::kF32, "recurrent 256x40"}));

// A prompt chunk in a step with a verification chunk (which keeps a state per token, on the
// recurrent kernel) still takes the chunked kernel: its outputs and final state are the bits of
// the same chunk in a step of its own, and the verification chunk's kept states are the CPU's.
TEST_F(CudaOps, GatedDeltaRulePromptChunkBesideAVerificationIsChunked) {
  const int Hk = 2, Hv = 4, D = 128, C = 2 * Hk * D + Hv * D, num_slots = 8, ba_col = 3, X = ba_col + 2 * Hv + 5;
  const LinearStep mixed = {{3, 100, 1}, {3, 0, 6}, {1, 1, 1}, token_slots({3, 4, 7}, {3, 100, 1}, {3, 0, 6})};
  const LinearStep alone = {{100}, {0}, {1}};
  const int T = 104;
  std::vector<float> alog = rand(Hv, -2.0f, 0.5f), dtb = rand(Hv, -1.0f, 1.0f);
  Tensor ga = on_gpu(alog, {Hv}, DType::kF32), gd = on_gpu(dtb, {Hv}, DType::kF32);
  Tensor ca = on_cpu(alog, {Hv}), cd = on_cpu(dtb, {Hv});
  const Shape ss{num_slots, Hv, D, D};
  std::vector<float> st0 = rand(ss.numel(), -0.3f, 0.3f);
  Tensor gs_mixed = on_gpu(st0, ss, DType::kF32), gs_alone = on_gpu(st0, ss, DType::kF32), cs = on_cpu(st0, ss);
  std::vector<float> qkv = rand(static_cast<int64_t>(T) * C, -1.0f, 1.0f),
                     ba = rand(static_cast<int64_t>(T) * X, -3.0f, 3.0f);
  Tensor out_mixed = gpu_out({T, Hv, D}), out_alone = gpu_out({100, Hv, D}),
         cout = cpu().alloc({T, Hv, D}, DType::kF32);
  gpu().gated_delta_rule(on_gpu(qkv, {T, C}), on_gpu(ba, {T, X}), ba_col, ga, gd, gs_mixed,
                         upload_linear_attn_metadata(gpu(), linear_layout(mixed)), out_mixed);
  cpu().gated_delta_rule(on_cpu(qkv, {T, C}), on_cpu(ba, {T, X}), ba_col, ca, cd, cs,
                         upload_linear_attn_metadata(cpu(), linear_layout(mixed)), cout);
  const std::vector<float> qkv1(qkv.begin() + 3 * C, qkv.begin() + 103 * C),
      ba1(ba.begin() + 3 * X, ba.begin() + 103 * X);
  gpu().gated_delta_rule(on_gpu(qkv1, {100, C}), on_gpu(ba1, {100, X}), ba_col, ga, gd, gs_alone,
                         upload_linear_attn_metadata(gpu(), linear_layout(alone)), out_alone);
  const auto got = from_gpu(out_mixed), want = from_gpu(out_alone);
  const int64_t row = static_cast<int64_t>(Hv) * D;
  EXPECT_TRUE(std::equal(got.begin() + 3 * row, got.begin() + 103 * row, want.begin()))
      << "the prompt chunk's outputs differ from the chunked kernel's alone";
  const auto sm = from_gpu(gs_mixed), sa = from_gpu(gs_alone), sc = from_cpu(cs);
  const int64_t slot = static_cast<int64_t>(Hv) * D * D;
  EXPECT_TRUE(std::equal(sm.begin(), sm.begin() + slot, sa.begin())) << "the prompt's final state (slot 0)";
  EXPECT_LT(rel_err(got, from_cpu(cout)), 2e-2);
  for (int s : {3, 4, 7, 6}) {  // the verification chunk's kept states, the decode row's
    const std::vector<float> g(sm.begin() + s * slot, sm.begin() + (s + 1) * slot),
        c(sc.begin() + s * slot, sc.begin() + (s + 1) * slot);
    EXPECT_LT(rel_err(g, c), 2e-2) << "slot " << s;
  }
}

// One 300-token sequence through causal_conv1d and the gated delta rule in one step, and in
// steps of 32 tokens that continue from the slot's state (the engine's chunked prefill, issue
// 17): the outputs of the two runs and the final states agree with each other and with the CPU
// in one step. Fixture dims (recurrent kernel) and 128 x 128 (chunked kernel).
TEST_F(CudaOps, LinearAttentionStateCarriedOverStepsOf32EqualsOneStep) {
  struct Dims {
    int Hk, Hv, Dk, Dv;
  };
  for (Dims d : {Dims{2, 4, 16, 16}, Dims{2, 4, 128, 128}})
    for (DType conv_t : {DType::kBF16, DType::kF32}) {
      const int L = 300, K = 4, C = 2 * d.Hk * d.Dk + d.Hv * d.Dv, slots = 3, slot = 1;
      const int x_col = 8, X = x_col + C + 2 * d.Hv + 8, ba_col = x_col + C;  // [pad | qkv | b a | pad]
      std::vector<float> x = rand(int64_t{L} * X, -2, 2), w = rand(int64_t{C} * K, -0.6f, 0.6f);
      std::vector<float> alog = rand(d.Hv, -2.0f, 0.5f), dtb = rand(d.Hv, -1.0f, 1.0f);
      Tensor gx = on_gpu(x, {L, X}), gw = on_gpu(w, {C, K}), ga = on_gpu(alog, {d.Hv}, DType::kF32),
             gd = on_gpu(dtb, {d.Hv}, DType::kF32);
      const Shape css{slots, K - 1, C}, sss{slots, d.Hv, d.Dk, d.Dv};
      // Run `steps` (token counts) of the sequence on `be`; returns the conv and gdr outputs
      // of every token and the final states.
      struct Result {
        std::vector<float> conv, out, conv_state, state;
      };
      auto run = [&](Backend& be, bool gpu_side, const std::vector<int>& steps) {
        Tensor cs = be.alloc(css, conv_t), ss = be.alloc(sss, DType::kF32);
        be.fill(cs, 0.0f);
        be.fill(ss, 0.0f);
        Tensor xx = gpu_side ? gx : on_cpu(x, {L, X}), ww = gpu_side ? gw : on_cpu(w, {C, K});
        Tensor aa = gpu_side ? ga : on_cpu(alog, {d.Hv}), dd = gpu_side ? gd : on_cpu(dtb, {d.Hv});
        const DType act = gpu_side ? DType::kBF16 : DType::kF32;
        Tensor conv = be.alloc({L, C}, act), out = be.alloc({L, d.Hv, d.Dv}, act);
        int start = 0;
        for (int n : steps) {
          LinearAttnLayout l;
          l.query_start_loc = {0, n};
          l.state_slots = {slot};
          l.has_initial_state = {start > 0 ? 1 : 0};
          LinearAttnMetadata m = upload_linear_attn_metadata(be, l);
          Tensor xs = xx.rows(start, start + n), cv = conv.rows(start, start + n);
          be.causal_conv1d(xs, x_col, ww, cs, m, cv);
          be.gated_delta_rule(cv, xs, ba_col, aa, dd, ss, m, out.rows(start, start + n));
          start += n;
        }
        be.synchronize();
        Result r;
        r.conv = download(be, conv);
        r.out = download(be, out);
        r.conv_state = download(be, cs.rows(slot, slot + 1));
        r.state = download(be, ss.rows(slot, slot + 1));
        return r;
      };
      std::vector<int> of32;
      for (int start = 0; start < L; start += 32) of32.push_back(std::min(32, L - start));
      const Result cpu_one = run(cpu(), false, {L}), one = run(gpu(), true, {L}), chunked = run(gpu(), true, of32);
      const std::string what = "Dk=" + std::to_string(d.Dk) + " Dv=" + std::to_string(d.Dv) + " conv state " +
                               std::string(dtype_name(conv_t));
      EXPECT_LT(rel_err(one.conv, cpu_one.conv), 1e-2) << what << ": conv, one step";
      EXPECT_LT(rel_err(chunked.conv, cpu_one.conv), 1e-2) << what << ": conv, steps of 32";
      EXPECT_EQ(chunked.conv_state, one.conv_state) << what << ": conv state";
      EXPECT_LT(rel_err(one.out, cpu_one.out), 2e-2) << what << ": gdr, one step";
      EXPECT_LT(rel_err(chunked.out, cpu_one.out), 2e-2) << what << ": gdr, steps of 32";
      EXPECT_LT(rel_err(chunked.state, cpu_one.state), 2e-2) << what << ": state after steps of 32";
      EXPECT_LT(rel_err(one.state, cpu_one.state), 2e-2) << what << ": state after one step";
      // Per 32-token step: where the two runs part, if they do.
      for (int start = 0; start < L; start += 32) {
        const size_t row = static_cast<size_t>(d.Hv) * d.Dv, n = static_cast<size_t>(std::min(32, L - start)) * row;
        const std::vector<float> a(chunked.out.begin() + start * row, chunked.out.begin() + start * row + n),
            b(cpu_one.out.begin() + start * row, cpu_one.out.begin() + start * row + n);
        EXPECT_LT(rel_err(a, b), 3e-2) << what << ": gdr output of tokens [" << start << ", " << start + 32 << ")";
      }
    }
}

// The shared expert of the MoE fixtures at their shapes: gate_up, silu_mul, down, its one-column
// sigmoid gate (linear to [T, 1] bf16, then sigmoid_mul per row, in place) and the add to the
// routed experts' output, every step against the CPU on the GPU's inputs.
TEST_F(CudaOps, SharedExpertWithSigmoidGateAtFixtureShapes) {
  const int64_t H = 64, I = 48;
  for (int64_t T : {1, 7, 33, 300}) {
    auto x = rand(T * H), gu_w = rand(2 * I * H, -0.2f, 0.2f), dn_w = rand(H * I, -0.2f, 0.2f),
         g_w = rand(H, -0.3f, 0.3f), routed = rand(T * H);
    Tensor gx = on_gpu(x, {T, H}), gu = gpu_out({T, 2 * I}), act = gpu_out({T, I}), sh = gpu_out({T, H}),
           gate = gpu_out({T, 1}), out = on_gpu(routed, {T, H});
    gpu().linear(gx, on_gpu(gu_w, {2 * I, H}), nullptr, gu);
    gpu().silu_mul(gu, act);
    gpu().linear(act, on_gpu(dn_w, {H, I}), nullptr, sh);
    gpu().linear(gx, on_gpu(g_w, {1, H}), nullptr, gate);
    const std::vector<float> sh_before = from_gpu(sh), gate_v = from_gpu(gate);
    gpu().sigmoid_mul(sh, gate, sh);
    const std::vector<float> sh_gated = from_gpu(sh);
    gpu().add(out, sh, out);
    // The CPU on the GPU's intermediate values, step by step.
    Tensor c_gu = cpu().alloc({T, 2 * I}, DType::kF32), c_act = cpu().alloc({T, I}, DType::kF32);
    Tensor c_sh = cpu().alloc({T, H}, DType::kF32), c_gate = cpu().alloc({T, 1}, DType::kF32);
    cpu().linear(on_cpu(x, {T, H}), on_cpu(gu_w, {2 * I, H}), nullptr, c_gu);
    EXPECT_LT(rel_err(from_gpu(gu), from_cpu(c_gu)), 1e-2) << "gate_up T=" << T;
    cpu().silu_mul(on_cpu(from_gpu(gu), {T, 2 * I}), c_act);
    EXPECT_LT(rel_err(from_gpu(act), from_cpu(c_act)), 1e-2) << "silu_mul T=" << T;
    cpu().linear(on_cpu(from_gpu(act), {T, I}), on_cpu(dn_w, {H, I}), nullptr, c_sh);
    EXPECT_LT(rel_err(sh_before, from_cpu(c_sh)), 1e-2) << "down T=" << T;
    cpu().linear(on_cpu(x, {T, H}), on_cpu(g_w, {1, H}), nullptr, c_gate);
    EXPECT_LT(rel_err(gate_v, from_cpu(c_gate)), 1e-2) << "the [T, 1] gate T=" << T;
    Tensor c_shb = on_cpu(sh_before, {T, H});
    cpu().sigmoid_mul(c_shb, on_cpu(gate_v, {T, 1}), c_shb);
    EXPECT_LT(rel_err(sh_gated, from_cpu(c_shb)), 1e-2) << "sigmoid_mul per row T=" << T;
    Tensor c_out = on_cpu(routed, {T, H});
    cpu().add(c_out, on_cpu(sh_gated, {T, H}), c_out);
    EXPECT_LT(rel_err(from_gpu(out), from_cpu(c_out)), 1e-2) << "add T=" << T;
    gpu().reset_scratch();
  }
}

// Ties between some experts only (not a whole row): the two largest tied, the k-th and the
// (k+1)-th tied, ties in the middle; both backends take the lower id.
TEST_F(CudaOps, MoeTopkPartialTiesGoToTheLowerId) {
  for (int64_t E : {8, 60})
    for (int k : {2, 4, 8}) {
      const int64_t T = 5;
      auto logits = rand(T * E, -4, 0);
      float* r0 = &logits[0];  // experts 6 and 1 tied at the top
      r0[6] = r0[1] = 2.0f;
      float* r1 = &logits[E];  // experts 0 .. k-2 clear winners; k-1 ties with E-1 for the last place
      for (int i = 0; i < k - 1; ++i) r1[i] = 3.0f + i;
      r1[k - 1] = r1[E - 1] = 1.0f;
      float* r2 = &logits[2 * E];  // three-way tie below the top
      r2[E - 1] = 5.0f;
      r2[2] = r2[4] = r2[5] = 1.5f;
      Tensor cids = cpu().alloc({T, k}, DType::kI32), cw = cpu().alloc({T, k}, DType::kF32);
      cpu().moe_topk(on_cpu(logits, {T, E}), k, true, cids, cw);
      Tensor ids = gpu().alloc({T, k}, DType::kI32), w = gpu_out({T, k}, DType::kF32);
      gpu().moe_topk(on_gpu(logits, {T, E}, DType::kF32), k, true, ids, w);
      std::vector<int32_t> got(static_cast<size_t>(T * k));
      gpu().copy_to_host(got.data(), ids);
      const std::string what = "E=" + std::to_string(E) + " k=" + std::to_string(k);
      EXPECT_EQ(got, std::vector<int32_t>(cids.data<int32_t>(), cids.data<int32_t>() + T * k)) << what;
      EXPECT_EQ(got[0], 1) << what << ": the lower of the tied top experts first";
      EXPECT_LT(rel_err(from_gpu(w), from_cpu(cw)), 1e-5) << what;
    }
}

// Qwen3-Next / Qwen3.5 tiny attention through qkv_attention: head_dim 32, a quarter of it rotated
// (neox), q/k norms, 2 kv heads for 4 query heads; a 300-token prefill then decode steps up to
// position 309 (the fixture's greedy steps), against the CPU with the same cache contents.
TEST_F(CudaOps, QkvAttentionHeadDim32PartialRotaryOverLongContext) {
  const int Hq = 4, Hk = 2, D = 32, rd = 8, bs = 16, blocks = 24, max_pos = 512;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  std::vector<float> cs = rope_cos_sin(max_pos, rd), qn = rand(D, 0.8f, 1.2f), kn = rand(D, 0.8f, 1.2f);
  RopeTable gt{on_gpu(cs, {max_pos, rd}, DType::kF32), rd, true}, ct{on_cpu(cs, {max_pos, rd}), rd, true};
  Tensor gqn = on_gpu(qn, {D}), gkn = on_gpu(kn, {D}), cqn = on_cpu(qn, {D}), ckn = on_cpu(kn, {D});
  const Shape cache{blocks, bs, Hk, D};
  Tensor gkc = gpu().alloc(cache, DType::kBF16), gvc = gpu().alloc(cache, DType::kBF16);
  Tensor ckc = cpu().alloc(cache, DType::kBF16), cvc = cpu().alloc(cache, DType::kBF16);
  for (const Tensor& t : {gkc, gvc}) gpu().fill(t, 0.0f);
  std::memset(ckc.raw(), 0, ckc.nbytes());
  std::memset(cvc.raw(), 0, cvc.nbytes());
  int pos = 0;
  for (int n : {300, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}) {
    AttentionLayout lay;
    lay.query_start_loc = {0, n};
    lay.seq_lens = {pos + n};
    lay.max_blocks_per_seq = blocks;
    for (int b = 0; b < blocks; ++b) lay.block_tables.push_back(blocks - 1 - b);  // blocks in reverse
    std::vector<int32_t> positions;
    for (int i = pos; i < pos + n; ++i) {
      positions.push_back(i);
      lay.slot_mapping.push_back(lay.block_tables[i / bs] * bs + i % bs);
    }
    auto qkv = rand(int64_t{n} * (Hq + 2 * Hk) * D, -2.0f, 2.0f);
    Tensor gout = gpu_out({n, Hq, D}), cout = cpu().alloc({n, Hq, D}, DType::kF32);
    gpu().qkv_attention(on_gpu(qkv, {n, (Hq + 2 * Hk) * D}), &gqn, &gkn, 1e-6f, on_gpu_i32(positions, {n}), gt, gkc,
                        gvc, upload_attention_metadata(gpu(), lay), scale, 1.0f, 1.0f, 0, gout);
    // The CPU starts from the GPU's cache (bf16, exact; it holds this step's keys too, which the
    // CPU writes again), so each step is checked on its own.
    copy_to_cpu(gkc, ckc);
    copy_to_cpu(gvc, cvc);
    cpu().qkv_attention(on_cpu(qkv, {n, (Hq + 2 * Hk) * D}), &cqn, &ckn, 1e-6f, on_cpu_i32(positions, {n}), ct, ckc,
                        cvc, upload_attention_metadata(cpu(), lay), scale, 1.0f, 1.0f, 0, cout);
    EXPECT_LT(rel_err(from_gpu(gout), from_cpu(cout)), 1e-2) << "tokens [" << pos << ", " << pos + n << ")";
    // The new keys and values: the CPU wrote them into its copy of the GPU's cache.
    EXPECT_LT(rel_err(from_gpu(gkc), from_cpu(ckc)), 1e-2) << "k cache after position " << pos + n - 1;
    EXPECT_LT(rel_err(from_gpu(gvc), from_cpu(cvc)), 1e-2) << "v cache after position " << pos + n - 1;
    pos += n;
    gpu().reset_scratch();
    cpu().reset_scratch();
  }
}

// ---------------------------------------------------------------- paged KV write + attention
// ---- mixture of experts: each op against CpuBackend on the same (bf16-rounded) inputs ----

TEST_F(CudaOps, MoeTopkMatchesCpu) {
  for (int64_t E : {8, 60, 128, 512})
    for (int k : {1, 2, 8})
      for (bool renormalize : {true, false}) {
        const int64_t T = E == 128 ? 300 : 37;
        auto logits = rand(T * E, -4, 4);
        std::fill(logits.begin() + E, logits.begin() + 2 * E, 0.25f);  // row 1: all tied
        Tensor ids = gpu().alloc({T, k}, DType::kI32), w = gpu_out({T, k}, DType::kF32);
        gpu().moe_topk(on_gpu(logits, {T, E}, DType::kF32), k, renormalize, ids, w);
        Tensor cids = cpu().alloc({T, k}, DType::kI32), cw = cpu().alloc({T, k}, DType::kF32);
        cpu().moe_topk(on_cpu(logits, {T, E}), k, renormalize, cids, cw);
        std::vector<int32_t> got(static_cast<size_t>(T * k));
        gpu().copy_to_host(got.data(), ids);
        const std::string what =
            "moe_topk E=" + std::to_string(E) + " k=" + std::to_string(k) + (renormalize ? " renormalized" : "");
        EXPECT_EQ(got, std::vector<int32_t>(cids.data<int32_t>(), cids.data<int32_t>() + T * k)) << what;
        EXPECT_LT(rel_err(from_gpu(w), from_cpu(cw)), 1e-5) << what;
      }
}

struct MoeCase {
  int64_t T, E, k, H, I, E_local, begin;
  bool renormalize;
};

// Decode (T * k <= 256) and prefill shapes: a hidden size that is not a multiple of the GEMM's
// 64-wide K step or 128-wide column tile, an intermediate size that leaves a partial column
// tile, experts with more rows than one 128-row tile, more tokens on an expert than one GEMV
// pass, and expert-parallel slices (expert_begin > 0) with tokens routed only elsewhere.
TEST_F(CudaOps, MoeExpertsMatchesCpuOnBothPaths) {
  const MoeCase cases[] = {
      {1, 8, 2, 256, 128, 8, 0, true},
      {1, 64, 8, 512, 96, 64, 0, true},
      {3, 64, 8, 264, 96, 64, 0, false},
      {32, 8, 2, 256, 64, 8, 0, true},
      {32, 128, 8, 512, 128, 128, 0, true},  // 256 pairs: decode
      {33, 128, 8, 512, 128, 128, 0, true},  // 264 pairs: prefill
      {64, 64, 8, 264, 96, 64, 0, true},
      {300, 8, 4, 256, 192, 8, 0, false},
      {300, 128, 8, 512, 128, 128, 0, true},
      {3, 64, 8, 256, 128, 16, 16, true},  // expert parallel
      {300, 64, 8, 256, 128, 16, 48, false},
      {200, 32, 4, 256, 64, 8, 0, true},
      // the tiny fixtures' dims (hidden 64, intermediate 32): decode, 7-, 33- and 300-token prompts
      {1, 8, 2, 64, 32, 8, 0, true},
      {7, 8, 2, 64, 32, 8, 0, false},
      {33, 8, 2, 64, 32, 8, 0, true},
      {300, 8, 2, 64, 32, 8, 0, true},
      {300, 8, 2, 64, 32, 8, 0, false},
      {7, 60, 4, 64, 48, 60, 0, false},
      {300, 60, 4, 64, 48, 60, 0, false},
      {300, 60, 8, 64, 32, 60, 0, true},
      {129, 8, 2, 64, 32, 8, 0, true},        // 258 pairs: the prefill path just above the decode one
      {600, 16, 8, 2048, 768, 16, 0, true}};  // Qwen3-30B-A3B's expert shape, 300 rows an expert
  // The prefill's grouped GEMMs on both kernels: the production one (wgmma on an H200) and mma.sync.
  CudaOptions mma_options;
  mma_options.moe_prefill_wgmma = false;
  std::unique_ptr<Backend> mma = make_cuda_backend(0, mma_options);
  for (const MoeCase& c : cases) {
    const int64_t T = c.T, H = c.H, I = c.I, k = c.k, EL = c.E_local;
    auto x = rand(T * H), gu = rand(EL * 2 * I * H, -0.1f, 0.1f), dn = rand(EL * H * I, -0.1f, 0.1f);
    auto logits = rand(T * c.E, -3, 3);
    Tensor cids = cpu().alloc({T, k}, DType::kI32), cw = cpu().alloc({T, k}, DType::kF32);
    cpu().moe_topk(on_cpu(logits, {T, c.E}), static_cast<int>(k), c.renormalize, cids, cw);
    if (EL < c.E && T > 1)  // token 1's experts all on other ranks: a zero row
      for (int64_t j = 0; j < k; ++j)
        cids.data<int32_t>()[k + j] = static_cast<int32_t>(c.begin > 0 ? j % c.begin : c.begin + EL + j % (c.E - EL));
    std::vector<int32_t> ids(cids.data<int32_t>(), cids.data<int32_t>() + T * k);
    std::vector<float> w = from_cpu(cw);
    Tensor ref = cpu().alloc({T, H}, DType::kF32);
    cpu().moe_experts(on_cpu(x, {T, H}), on_cpu(gu, {EL, 2 * I, H}), on_cpu(dn, {EL, H, I}), cids, cw,
                      static_cast<int>(c.begin), ref);
    for (Backend* be : {&gpu(), mma.get()}) {
      Tensor out = be->alloc({T, H}, DType::kBF16);
      be->moe_experts(upload(*be, x, {T, H}, DType::kBF16), upload(*be, gu, {EL, 2 * I, H}, DType::kBF16),
                      upload(*be, dn, {EL, H, I}, DType::kBF16), upload_i32(*be, ids, {T, k}),
                      upload(*be, w, {T, k}, DType::kF32), static_cast<int>(c.begin), out);
      const std::vector<float> got = download(*be, out);
      EXPECT_LT(rel_err(got, from_cpu(ref)), 1e-2)
          << "moe_experts T=" << T << " E=" << c.E << " k=" << k << " H=" << H << " I=" << I << " local " << EL
          << " from " << c.begin << (be == mma.get() ? " (mma.sync prefill)" : "");
      if (EL < c.E && T > 1)
        for (int64_t h = 0; h < H; ++h) ASSERT_EQ(got[H + h], 0.0f) << "a token routed only to other ranks";
      be->reset_scratch();
    }
  }
}

// FP8 block-scaled experts (e4m3, one f32 scale per 128 x 128 block of each expert's matrix, as
// the Qwen3.5 FP8 checkpoints) against the CPU's dequantising reference, on both CUDA paths:
// decode (T * k <= 256: the grouped GEMVs widening in registers) and prefill (the grouped GEMM
// widening each weight tile to bf16 in shared memory, the block scales on its f32 accumulators).
// Shapes: the flagship's experts (H 3072, I 1024, 256 experts, top-8) as an expert-parallel slice
// of 16 experts, a 64-expert layer at H 2048 / I 768, and sizes off every tile and block
// multiple (H 528, I 144: partial 64-deep k steps, partial scale blocks, up rows starting inside
// a gate block, so a gate_up tile's up rows span two scale blocks). Tolerance as the bf16 experts:
// both paths are exact up to bf16 activations and the order of f32 sums.
TEST_F(CudaOps, Fp8MoeExpertsMatchCpuOnBothPaths) {
  const MoeCase cases[] = {
      // decode: T * k = 8, 32, 128 pairs
      {1, 64, 8, 2048, 768, 64, 0, true},
      {4, 64, 8, 2048, 768, 64, 0, true},
      {16, 64, 8, 2048, 768, 64, 0, true},
      {3, 64, 8, 528, 144, 64, 0, false},
      {1, 256, 8, 3072, 1024, 16, 0, true},     // flagship shape, experts 0..15 of 256
      {16, 256, 8, 3072, 1024, 16, 128, true},  // experts 128..143
      {32, 256, 8, 3072, 1024, 16, 240, true},  // 256 pairs: the last decode size
      {32, 8, 8, 528, 144, 8, 0, true},         // 32 pairs an expert: two passes of the MMA GEMV
      // prefill
      {33, 64, 8, 528, 144, 64, 0, true},  // 264 pairs
      {300, 64, 8, 2048, 768, 64, 0, true},
      {1000, 64, 8, 1024, 512, 64, 0, false},
      {300, 256, 8, 3072, 1024, 16, 64, true},  // expert parallel, experts 64..79
  };
  auto make_fp8 = [&](Shape shape) { return fp8_host(shape); };
  auto put = [](Backend& be, const Fp8Host& h) { return put_fp8(be, h); };
  // One backend per FP8 MoE decode kernel (CudaOptions::moe_fp8_decode), the production one first.
  std::vector<std::unique_ptr<Backend>> fp8_decode;
  for (CudaMoeFp8Decode v : kAllCudaMoeFp8Decode) {
    CudaOptions f;
    f.moe_fp8_decode = v;
    fp8_decode.push_back(make_cuda_backend(0, f));
  }
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::pair<Fp8Host, Fp8Host>> weights;  // by (E_local, H, I)
  for (const MoeCase& c : cases) {
    const int64_t T = c.T, H = c.H, I = c.I, k = c.k, EL = c.E_local;
    auto it = weights.find({EL, H, I});
    if (it == weights.end())
      it = weights.emplace(std::make_tuple(EL, H, I), std::make_pair(make_fp8({EL, 2 * I, H}), make_fp8({EL, H, I})))
               .first;
    const Fp8Host &gu = it->second.first, &dn = it->second.second;
    auto x = rand(T * H);
    auto logits = rand(T * c.E, -3, 3);
    Tensor cids = cpu().alloc({T, k}, DType::kI32), cw = cpu().alloc({T, k}, DType::kF32);
    cpu().moe_topk(on_cpu(logits, {T, c.E}), static_cast<int>(k), c.renormalize, cids, cw);
    int32_t* idp = cids.data<int32_t>();
    if (EL < c.E) {
      // A slice of the experts: route the first 3 slots of every token to local experts (so
      // the slice has work), except token 1, whose experts are all elsewhere (a zero row).
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < k; ++j) {
          if (t == 1)
            idp[t * k + j] = static_cast<int32_t>(c.begin > 0 ? j % c.begin : c.begin + EL + j % (c.E - EL));
          else if (j < 3)
            idp[t * k + j] = static_cast<int32_t>(c.begin + (t * 3 + j) % EL);
        }
      // distinct ids within a token (the router never repeats one): slots 3.. keep their
      // top-k ids unless they collide with the forced ones
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 3; j < k && t != 1; ++j)
          for (int64_t i = 0; i < 3; ++i)
            if (idp[t * k + j] == idp[t * k + i]) idp[t * k + j] = static_cast<int32_t>((c.begin + EL + j) % c.E);
    }
    std::vector<int32_t> ids(idp, idp + T * k);
    std::vector<float> w = from_cpu(cw);
    Tensor ref = cpu().alloc({T, H}, DType::kF32);
    cpu().moe_experts(on_cpu(x, {T, H}), put(cpu(), gu), put(cpu(), dn), cids, cw, static_cast<int>(c.begin), ref);
    const auto want = from_cpu(ref);
    // The decode path on each FP8 GEMV kernel (the production one first); prefill takes one kernel.
    for (size_t vi = 0; vi < fp8_decode.size(); ++vi) {
      const CudaMoeFp8Decode variant = kAllCudaMoeFp8Decode[vi];
      if (T * k > 256 && variant != CudaOptions{}.moe_fp8_decode) continue;
      Backend* be = fp8_decode[vi].get();
      Tensor out = be->alloc({T, H}, DType::kBF16);
      be->moe_experts(upload(*be, x, {T, H}, DType::kBF16), put(*be, gu), put(*be, dn), upload_i32(*be, ids, {T, k}),
                      upload(*be, w, {T, k}, DType::kF32), static_cast<int>(c.begin), out);
      const std::string what =
          "FP8 moe_experts T=" + std::to_string(T) + " E=" + std::to_string(c.E) + " k=" + std::to_string(k) +
          " H=" + std::to_string(H) + " I=" + std::to_string(I) + " experts [" + std::to_string(c.begin) + ", " +
          std::to_string(c.begin + EL) + ") (" +
          (T * k <= 256 ? std::string("decode, ") + cuda_moe_fp8_decode_name(variant) : "prefill") + " path)";
      const auto got = download(*be, out);
      EXPECT_LT(rel_err(got, want), 1e-2) << what;
      if (EL < c.E && T > 1) {
        for (int64_t h = 0; h < H; ++h) ASSERT_EQ(got[H + h], 0.0f) << what << ": a token routed only to other ranks";
      }
      be->synchronize();
      be->reset_scratch();
    }
    cpu().reset_scratch();
  }
}

// The register top-k (a warp per token) against the CPU: E from 8 to 1024 (every kPer of the
// kernel), k = 1 and 8, renormalised, and a row of ties (lower ids win).
TEST_F(CudaOps, MoeTopkInRegistersMatchesCpuWithTies) {
  for (int64_t E : {8, 33, 128, 256, 300, 1024})
    for (int k : {1, 8}) {
      const int64_t T = 19;
      auto logits = rand(T * E, -4, 4);
      std::fill(logits.begin() + E, logits.begin() + 2 * E, 0.5f);  // row 1: all tied
      Tensor cids = cpu().alloc({T, k}, DType::kI32), cw = cpu().alloc({T, k}, DType::kF32);
      cpu().moe_topk(on_cpu(logits, {T, E}), k, true, cids, cw);
      Tensor gl = upload(gpu(), logits, {T, E}, DType::kF32);
      Tensor ids = gpu().alloc({T, k}, DType::kI32), w = gpu().alloc({T, k}, DType::kF32);
      gpu().moe_topk(gl, k, true, ids, w);
      std::vector<int32_t> got(static_cast<size_t>(T * k));
      gpu().copy_to_host(got.data(), ids);
      std::vector<float> gw(static_cast<size_t>(T * k));
      gpu().copy_to_host(gw.data(), w);
      const std::string what = "moe_topk E=" + std::to_string(E) + " k=" + std::to_string(k);
      EXPECT_EQ(got, std::vector<int32_t>(cids.data<int32_t>(), cids.data<int32_t>() + T * k)) << what;
      EXPECT_LT(rel_err(gw, from_cpu(cw)), 1e-5) << what;
    }
}

// Every decode variant of moe_experts (cuda_options.h; the backend's default is one of them)
// against the CPU: a few decode shapes, expert-parallel slices with a token routed only to other
// ranks and a rank that gets no pair at all, each launched twice in a row and then replayed three
// times from a captured graph (the fused kernel's barrier and counters must be back at zero after
// every launch, and a barrier that did not complete would raise a device error at synchronize).
// Then moe_topk_experts from the router logits (the fused variants fold the top-k in): the same
// ids and weights as the CPU's moe_topk and the same output, without a shared expert and with one
// (folded into the fused kernel, or at one token into the split path's one-token kernels, where it has
// the routed experts' I; gated or not), against the CPU's moe_topk, moe_experts and shared-expert ops.
TEST_F(CudaOps, MoeDecodeVariantsMatchCpu) {
  const MoeCase cases[] = {{1, 16, 8, 2048, 768, 16, 0, true},  // Qwen3-30B-A3B's expert shape
                           {1, 8, 2, 256, 128, 8, 0, true},    {3, 64, 8, 264, 96, 64, 0, false},
                           {8, 64, 8, 512, 136, 64, 0, true},  {32, 128, 8, 512, 128, 128, 0, true},  // 256 pairs
                           {3, 64, 8, 256, 128, 16, 16, true},   // expert parallel, token 1 elsewhere
                           {2, 64, 4, 256, 64, 16, 48, true},    // expert parallel, every pair elsewhere
                           {1, 16, 8, 2048, 512, 16, 0, true},   // Qwen3.5-35B-A3B's expert shape
                           {1, 64, 8, 256, 128, 16, 16, true}};  // expert parallel at one token
  for (CudaMoeDecode variant : kAllCudaMoeDecode) {
    std::unique_ptr<Backend> be = make_cuda_backend(0, CudaOptions{variant});
    for (const MoeCase& c : cases) {
      const int64_t T = c.T, H = c.H, I = c.I, k = c.k, EL = c.E_local;
      const std::string what = std::string(cuda_moe_decode_name(variant)) + " T=" + std::to_string(T) +
                               " E=" + std::to_string(c.E) + " H=" + std::to_string(H) + " I=" + std::to_string(I) +
                               " local " + std::to_string(EL) + " from " + std::to_string(c.begin);
      auto x = rand(T * H), gu = rand(EL * 2 * I * H, -0.1f, 0.1f), dn = rand(EL * H * I, -0.1f, 0.1f);
      auto logits = rand(T * c.E, -3, 3);
      Tensor cids = cpu().alloc({T, k}, DType::kI32), cw = cpu().alloc({T, k}, DType::kF32);
      cpu().moe_topk(on_cpu(logits, {T, c.E}), static_cast<int>(k), c.renormalize, cids, cw);
      const std::vector<int32_t> topk_ids(cids.data<int32_t>(), cids.data<int32_t>() + T * k);
      Tensor ref_topk = cpu().alloc({T, H}, DType::kF32);
      cpu().moe_experts(on_cpu(x, {T, H}), on_cpu(gu, {EL, 2 * I, H}), on_cpu(dn, {EL, H, I}), cids, cw,
                        static_cast<int>(c.begin), ref_topk);
      int32_t* idp = cids.data<int32_t>();
      if (c.begin == 48)  // no pair on this rank
        for (int64_t p = 0; p < T * k; ++p) idp[p] = static_cast<int32_t>(p % c.begin);
      else if (EL < c.E && T > 1)  // token 1's experts all on other ranks: a zero row
        for (int64_t j = 0; j < k; ++j) idp[k + j] = static_cast<int32_t>(j % c.begin);
      std::vector<int32_t> ids(idp, idp + T * k);
      Tensor ref = cpu().alloc({T, H}, DType::kF32);
      cpu().moe_experts(on_cpu(x, {T, H}), on_cpu(gu, {EL, 2 * I, H}), on_cpu(dn, {EL, H, I}), cids, cw,
                        static_cast<int>(c.begin), ref);
      const std::vector<float> want = from_cpu(ref);
      Tensor gx = upload(*be, x, {T, H}), ggu = upload(*be, gu, {EL, 2 * I, H}), gdn = upload(*be, dn, {EL, H, I});
      Tensor gids = upload_i32(*be, ids, {T, k}), gw = upload(*be, from_cpu(cw), {T, k}, DType::kF32);
      Tensor out = be->alloc({T, H}, DType::kBF16);
      auto run = [&] { be->moe_experts(gx, ggu, gdn, gids, gw, static_cast<int>(c.begin), out); };
      expect_launched_and_replayed(*be, run, out, want, what, 3);
      if (EL < c.E && T > 1) {
        const std::vector<float> got = download(*be, out);
        const int64_t t0 = c.begin == 48 ? 0 : 1, t1 = c.begin == 48 ? T : 2;
        for (int64_t i = t0 * H; i < t1 * H; ++i) ASSERT_EQ(got[i], 0.0f) << what << ": a token routed elsewhere";
      }
      Tensor glogits = upload(*be, logits, {T, c.E}, DType::kF32);
      Tensor tids = be->alloc({T, k}, DType::kI32), tw = be->alloc({T, k}, DType::kF32);
      // shared expert: 0 none, 1 the routed I, 2 the routed I and gated, 3 another I (gated)
      for (int sh = 0; sh < 4; ++sh) {
        const int64_t SI = sh == 3 ? I + 8 : I;
        auto sgu = rand(2 * SI * H, -0.1f, 0.1f), sdn = rand(H * SI, -0.1f, 0.1f), sg = rand(H, -0.2f, 0.2f);
        Tensor cgu = on_cpu(sgu, {2 * SI, H}), cdn = on_cpu(sdn, {H, SI}), cg = on_cpu(sg, {1, H});
        Tensor ggu2 = upload(*be, sgu, {2 * SI, H}), gdn2 = upload(*be, sdn, {H, SI}), gg = upload(*be, sg, {1, H});
        const Backend::MoeSharedExpert cshared{&cgu, &cdn, sh >= 2 ? &cg : nullptr};
        const Backend::MoeSharedExpert gshared{&ggu2, &gdn2, sh >= 2 ? &gg : nullptr};
        Tensor cref = cpu().alloc({T, H}, DType::kF32), ctids = cpu().alloc({T, k}, DType::kI32),
               ctw = cpu().alloc({T, k}, DType::kF32);
        cpu().moe_topk_experts(on_cpu(logits, {T, c.E}), static_cast<int>(k), c.renormalize, on_cpu(x, {T, H}),
                               on_cpu(gu, {EL, 2 * I, H}), on_cpu(dn, {EL, H, I}), ctids, ctw,
                               static_cast<int>(c.begin), cref, sh > 0 ? &cshared : nullptr);
        const std::string swhat = what + " moe_topk_experts, shared expert case " + std::to_string(sh);
        for (int rep = 0; rep < 2; ++rep) {
          be->fill(out, NAN);
          be->fill(tw, NAN);
          be->moe_topk_experts(glogits, static_cast<int>(k), c.renormalize, gx, ggu, gdn, tids, tw,
                               static_cast<int>(c.begin), out, sh > 0 ? &gshared : nullptr);
          be->synchronize();
          std::vector<int32_t> got_ids(static_cast<size_t>(T * k));
          be->copy_to_host(got_ids.data(), tids);
          EXPECT_EQ(got_ids, topk_ids) << swhat << " " << rep;
          EXPECT_LT(rel_err(download(*be, tw), from_cpu(cw)), 1e-5) << swhat << " " << rep;
          EXPECT_LT(rel_err(download(*be, out), sh == 0 ? from_cpu(ref_topk) : from_cpu(cref)), 1e-2)
              << swhat << " " << rep;
          be->reset_scratch();
        }
      }
    }
  }
}

// bf16 experts at one token (CudaMoeOneToken). Shapes: Qwen3-30B-A3B's and the flagship's experts
// (H 3072: gate_up in two passes of 8 loads), an intermediate size past one pass of the down GEMV's
// loads (I 1,088), k = 10 (warps taking two pairs), k = 2 at the tiny fixtures' dims, a hidden size
// of an odd number of 16-byte chunks, and expert-parallel slices with some pairs local and with none.
TEST_F(CudaOps, MoeOneTokenKernelsGiveTheGroupedResultBitForBit) {
  const MoeCase cases[] = {{1, 16, 8, 2048, 768, 16, 0, true}, {1, 16, 8, 3072, 1024, 16, 0, true},
                           {1, 16, 8, 512, 1088, 16, 0, true}, {1, 32, 10, 512, 256, 32, 0, true},
                           {1, 8, 2, 64, 32, 8, 0, true},      {1, 64, 8, 264, 96, 64, 0, false},
                           {1, 64, 8, 256, 128, 16, 16, true}, {1, 64, 4, 256, 64, 16, 48, true}};
  std::vector<std::unique_ptr<Backend>> bes;
  std::vector<std::string> names;
  for (CudaMoeOneToken v : kAllCudaMoeOneToken) {
    CudaOptions o;
    o.moe_decode = CudaMoeDecode::kSplit;
    o.moe_one_token = v;
    bes.push_back(make_cuda_backend(0, o));
    names.push_back(cuda_moe_one_token_name(v));
  }
  for (const MoeCase& c : cases) one_token_bit_for_bit(c, false, bes, names);
}

// moe_topk_experts at one token with FP8 experts and an FP8 shared expert of their I (the flagship's
// layers), the shared expert folded into the one-token kernels (CudaOptions::moe_one_token_shared) and
// not, gated and not, launched twice and replayed from a graph twice, against the CPU's moe_topk,
// moe_experts and shared-expert ops (FP8 dequantised).
TEST_F(CudaOps, Fp8MoeSharedExpertAtOneToken) {
  CudaOptions apart;
  apart.moe_one_token_shared = false;
  std::unique_ptr<Backend> folded = make_cuda_backend(0), separate = make_cuda_backend(0, apart);
  struct Case {
    int64_t E, k, H, I, E_local, begin;
  };
  for (Case c : {Case{64, 8, 1024, 256, 64, 0}, Case{256, 8, 3072, 1024, 16, 0}, Case{256, 8, 3072, 1024, 16, 128}})
    for (bool gated : {true, false}) {
      const int64_t H = c.H, I = c.I, k = c.k, EL = c.E_local;
      const Fp8Host gu = fp8_host({EL, 2 * I, H}), dn = fp8_host({EL, H, I});
      const Fp8Host sgu = fp8_host({2 * I, H}), sdn = fp8_host({H, I});
      auto x = rand(H), logits = rand(c.E, -3, 3), sg = rand(H, -0.2f, 0.2f);
      Tensor cgu = put_fp8(cpu(), sgu), cdn = put_fp8(cpu(), sdn), cg = on_cpu(sg, {1, H});
      const Backend::MoeSharedExpert cshared{&cgu, &cdn, gated ? &cg : nullptr};
      Tensor cref = cpu().alloc({1, H}, DType::kF32), cids = cpu().alloc({1, k}, DType::kI32),
             cw = cpu().alloc({1, k}, DType::kF32);
      // With the shared expert, and the routed experts alone too, so that a failure says which part is off.
      const Tensor clogits = on_cpu(logits, {1, c.E}), cx = on_cpu(x, {1, H}), cgu_e = put_fp8(cpu(), gu),
                   cdn_e = put_fp8(cpu(), dn);
      Tensor cref_routed = cpu().alloc({1, H}, DType::kF32);
      cpu().moe_topk_experts(clogits, static_cast<int>(k), true, cx, cgu_e, cdn_e, cids, cw, static_cast<int>(c.begin),
                             cref, &cshared);
      cpu().moe_topk_experts(clogits, static_cast<int>(k), true, cx, cgu_e, cdn_e, cids, cw, static_cast<int>(c.begin),
                             cref_routed, nullptr);
      const std::vector<float> want = from_cpu(cref), want_routed = from_cpu(cref_routed);
      const std::string what = "E=" + std::to_string(c.E) + " H=" + std::to_string(H) + " I=" + std::to_string(I) +
                               " local " + std::to_string(EL) + " from " + std::to_string(c.begin) +
                               (gated ? " gated" : "");
      for (Backend* be : {folded.get(), separate.get()}) {
        const std::string who = what + (be == folded.get() ? ", folded" : ", separate ops");
        Tensor gx = upload(*be, x, {1, H}), glogits = upload(*be, logits, {1, c.E}, DType::kF32);
        Tensor ggu = put_fp8(*be, gu), gdn = put_fp8(*be, dn), sgu_t = put_fp8(*be, sgu), sdn_t = put_fp8(*be, sdn);
        Tensor gg = upload(*be, sg, {1, H});
        const Backend::MoeSharedExpert gshared{&sgu_t, &sdn_t, gated ? &gg : nullptr};
        Tensor ids = be->alloc({1, k}, DType::kI32), w = be->alloc({1, k}, DType::kF32),
               out = be->alloc({1, H}, DType::kBF16);
        auto run = [&] {
          be->moe_topk_experts(glogits, static_cast<int>(k), true, gx, ggu, gdn, ids, w, static_cast<int>(c.begin), out,
                               &gshared);
        };
        expect_launched_and_replayed(*be, run, out, want, who, 2);
        Tensor routed_out = be->alloc({1, H}, DType::kBF16);
        auto run_routed = [&] {
          be->moe_topk_experts(glogits, static_cast<int>(k), true, gx, ggu, gdn, ids, w, static_cast<int>(c.begin),
                               routed_out, nullptr);
        };
        expect_launched_and_replayed(*be, run_routed, routed_out, want_routed, who + ", routed experts only", 1);
      }
    }
}

// FP8 experts at one token on the tensor-core kernels (CudaMoeFp8OneToken): the flagship's and
// Qwen3-30B-A3B's experts, sizes off every tile and scale block (H 528, I 144), k = 10, and
// expert-parallel slices.
TEST_F(CudaOps, Fp8MoeOneTokenKernelsGiveTheGroupedResultBitForBit) {
  const MoeCase cases[] = {{1, 16, 8, 3072, 1024, 16, 0, true}, {1, 16, 8, 2048, 768, 16, 0, true},
                           {1, 64, 8, 528, 144, 64, 0, false},  {1, 32, 10, 512, 256, 32, 0, true},
                           {1, 64, 8, 256, 128, 16, 16, true},  {1, 64, 4, 256, 64, 16, 48, true}};
  std::vector<std::unique_ptr<Backend>> bes;
  std::vector<std::string> names;
  for (CudaMoeFp8OneToken v : kAllCudaMoeFp8OneToken) {
    CudaOptions o;
    o.moe_fp8_one_token = v;
    bes.push_back(make_cuda_backend(0, o));
    names.push_back(cuda_moe_fp8_one_token_name(v));
  }
  for (const MoeCase& c : cases) one_token_bit_for_bit(c, true, bes, names);
}

void CudaOps::one_token_bit_for_bit(const MoeCase& c, bool fp8, const std::vector<std::unique_ptr<Backend>>& bes,
                                    const std::vector<std::string>& names) {
  CudaOps& f = *this;
  const int64_t H = c.H, I = c.I, k = c.k, EL = c.E_local;
  const std::string what = std::string(fp8 ? "FP8" : "bf16") + " E=" + std::to_string(c.E) + " k=" + std::to_string(k) +
                           " H=" + std::to_string(H) + " I=" + std::to_string(I) + " local " + std::to_string(EL) +
                           " from " + std::to_string(c.begin);
  auto x = f.rand(H);
  std::vector<float> gu, dn;
  Fp8Host gu8, dn8;
  if (fp8) {
    gu8 = f.fp8_host({EL, 2 * I, H});
    dn8 = f.fp8_host({EL, H, I});
  } else {
    gu = f.rand(EL * 2 * I * H, -0.1f, 0.1f);
    dn = f.rand(EL * H * I, -0.1f, 0.1f);
  }
  auto weights_on = [&](Backend& be, bool cpu) {
    if (fp8) return std::make_pair(CudaOps::put_fp8(be, gu8), CudaOps::put_fp8(be, dn8));
    return cpu ? std::make_pair(f.on_cpu(gu, {EL, 2 * I, H}), f.on_cpu(dn, {EL, H, I}))
               : std::make_pair(CudaOps::upload(be, gu, {EL, 2 * I, H}), CudaOps::upload(be, dn, {EL, H, I}));
  };
  auto logits = f.rand(c.E, -3, 3);
  Tensor cids = f.cpu().alloc({1, k}, DType::kI32), cw = f.cpu().alloc({1, k}, DType::kF32);
  f.cpu().moe_topk(f.on_cpu(logits, {1, c.E}), static_cast<int>(k), c.renormalize, cids, cw);
  if (c.begin == 48)  // no pair on this rank
    for (int64_t j = 0; j < k; ++j) cids.data<int32_t>()[j] = static_cast<int32_t>(j);
  const std::vector<int32_t> ids(cids.data<int32_t>(), cids.data<int32_t>() + k);
  Tensor ref = f.cpu().alloc({1, H}, DType::kF32);
  {
    auto [cgu, cdn] = weights_on(f.cpu(), true);
    f.cpu().moe_experts(f.on_cpu(x, {1, H}), cgu, cdn, cids, cw, static_cast<int>(c.begin), ref);
  }
  std::vector<float> first;
  for (size_t vi = 0; vi < bes.size(); ++vi) {
    Backend& be = *bes[vi];
    const std::string vwhat = names[vi] + " " + what;
    auto [ggu, gdn] = weights_on(be, false);
    Tensor gx = CudaOps::upload(be, x, {1, H});
    Tensor gids = CudaOps::upload_i32(be, ids, {1, k}), gw = CudaOps::upload(be, f.from_cpu(cw), {1, k}, DType::kF32);
    Tensor out = be.alloc({1, H}, DType::kBF16);
    auto run = [&] { be.moe_experts(gx, ggu, gdn, gids, gw, static_cast<int>(c.begin), out); };
    be.fill(out, NAN);
    run();
    be.synchronize();
    const std::vector<float> got = CudaOps::download(be, out);
    be.reset_scratch();
    EXPECT_LT(rel_err(got, f.from_cpu(ref)), 1e-2) << vwhat;
    if (c.begin == 48)
      for (float v : got) ASSERT_EQ(v, 0.0f) << vwhat << ": every pair routed elsewhere";
    if (vi == 0) first = got;
    for (int64_t h = 0; h < H; ++h)
      ASSERT_EQ(std::memcmp(&got[h], &first[h], sizeof(float)), 0)
          << vwhat << ": output " << h << " is " << got[h] << ", " << names[0] << "'s " << first[h];
    be.begin_capture();
    run();
    std::unique_ptr<CapturedGraph> g = be.end_capture();
    ASSERT_TRUE(g) << vwhat;
    for (int rep = 0; rep < 2; ++rep) {
      be.fill(out, NAN);
      be.replay(*g);
      be.synchronize();
      const std::vector<float> again = CudaOps::download(be, out);
      for (int64_t h = 0; h < H; ++h)
        ASSERT_EQ(std::memcmp(&again[h], &first[h], sizeof(float)), 0) << vwhat << " replay " << rep << ", " << h;
    }
    g.reset();
    be.reset_scratch();
  }
  f.cpu().reset_scratch();
}

// Routing results never go to the host: top-k and both expert paths replay in a graph.
// FP8 experts (e4m3 with block scales) too.
TEST_F(CudaOps, MoeRunsInsideACapturedGraph) {
  const int64_t E = 32, k = 4, H = 256, I = 64;
  for (bool fp8 : {false, true})
    for (int64_t T : {4, 100}) {
      Tensor gu = on_gpu(rand(E * 2 * I * H, -0.1f, 0.1f), {E, 2 * I, H}),
             dn = on_gpu(rand(E * H * I, -0.1f, 0.1f), {E, H, I});
      if (fp8) {
        auto to_fp8 = [&](Shape shape) {
          Tensor q = gpu().alloc(shape, DType::kF8E4M3), s = gpu().alloc(block_scale_shape(shape), DType::kF32);
          gpu().fill_random(q, 7 + shape.numel(), -448.0f, 448.0f);
          gpu().fill_random(s, 11 + shape.numel(), 1e-4f, 4e-4f);
          return q.with_block_scale(s);
        };
        gu = to_fp8({E, 2 * I, H});
        dn = to_fp8({E, H, I});
      }
      Tensor x = gpu().alloc({T, H}, DType::kBF16), logits = gpu().alloc({T, E}, DType::kF32);
      Tensor ids = gpu().alloc({T, k}, DType::kI32), w = gpu().alloc({T, k}, DType::kF32);
      Tensor out = gpu().alloc({T, H}, DType::kBF16);
      auto step = [&] {
        gpu().moe_topk(logits, static_cast<int>(k), true, ids, w);
        gpu().moe_experts(x, gu, dn, ids, w, 0, out);
      };
      auto write = [&](const Tensor& t, const std::vector<float>& v) {
        std::vector<uint8_t> bytes(t.nbytes());
        convert_host(v.data(), DType::kF32, bytes.data(), t.dtype(), v.size());
        gpu().copy_from_host(t, bytes.data());
      };
      std::vector<std::vector<float>> xs = {rand(T * H), rand(T * H)}, ls = {rand(T * E, -3, 3), rand(T * E, -3, 3)};
      std::vector<std::vector<float>> refs;
      for (size_t i = 0; i < xs.size(); ++i) {
        write(x, xs[i]);
        write(logits, ls[i]);
        gpu().reset_scratch();
        step();
        refs.push_back(from_gpu(out));
      }
      gpu().reset_scratch();
      gpu().begin_capture();
      step();
      std::unique_ptr<CapturedGraph> g = gpu().end_capture();
      ASSERT_TRUE(g);
      for (size_t i = 0; i < xs.size(); ++i) {
        write(x, xs[i]);
        write(logits, ls[i]);
        gpu().fill(out, NAN);
        gpu().replay(*g);
        EXPECT_EQ(rel_err(from_gpu(out), refs[i]), 0.0) << "T=" << T << " input " << i << (fp8 ? " FP8 experts" : "");
      }
    }
}

struct SeqSpec {
  int cached, new_tokens;
};

struct AttnCase {
  int D, group;
  DType cache;
  std::vector<SeqSpec> seqs;
  const char* what;
};

class CudaAttention : public CudaOps, public ::testing::WithParamInterface<AttnCase> {};

TEST_P(CudaAttention, WriteKvThenPagedAttentionMatchCpu) {
  const AttnCase& p = GetParam();
  const int Hk = 2, Hq = Hk * p.group, D = p.D, bs = 16;
  const float k_scale = p.cache == DType::kF8E4M3 ? 0.01f : 1.0f, v_scale = p.cache == DType::kF8E4M3 ? 0.005f : 1.0f;
  int max_blocks = 0, total_blocks = 0;
  for (auto& s : p.seqs) {
    int nb = (s.cached + s.new_tokens + bs - 1) / bs;
    max_blocks = std::max(max_blocks, nb);
    total_blocks += nb;
  }
  const int num_blocks = total_blocks + 3;
  std::vector<int32_t> phys(num_blocks);
  std::iota(phys.begin(), phys.end(), 0);
  std::shuffle(phys.begin(), phys.end(), rng_);

  // Every position of every sequence, and the query tokens (the new ones).
  AttentionLayout all, step;
  all.block_size = step.block_size = bs;
  all.max_blocks_per_seq = step.max_blocks_per_seq = max_blocks;
  all.query_start_loc = {0};
  step.query_start_loc = {0};
  int next = 0;
  for (auto& s : p.seqs) {
    int ctx = s.cached + s.new_tokens, nb = (ctx + bs - 1) / bs;
    std::vector<int32_t> bt(max_blocks, 0);
    for (int b = 0; b < nb; ++b) bt[b] = phys[next++];
    for (int j = 0; j < ctx; ++j) all.slot_mapping.push_back(bt[j / bs] * bs + j % bs);
    all.block_tables.insert(all.block_tables.end(), bt.begin(), bt.end());
    step.block_tables.insert(step.block_tables.end(), bt.begin(), bt.end());
    all.query_start_loc.push_back(all.query_start_loc.back() + ctx);
    step.query_start_loc.push_back(step.query_start_loc.back() + s.new_tokens);
    all.seq_lens.push_back(ctx);
    step.seq_lens.push_back(ctx);
    for (int j = s.cached; j < ctx; ++j) step.slot_mapping.push_back(bt[j / bs] * bs + j % bs);
  }
  const int Tall = all.query_start_loc.back(), T = step.query_start_loc.back();
  auto k = rand(int64_t{Tall} * Hk * D), v = rand(int64_t{Tall} * Hk * D), q = rand(int64_t{T} * Hq * D);

  Shape cache_shape{num_blocks, bs, Hk, D};
  Tensor gkc = gpu().alloc(cache_shape, p.cache), gvc = gpu().alloc(cache_shape, p.cache);
  Tensor ckc = cpu().alloc(cache_shape, p.cache), cvc = cpu().alloc(cache_shape, p.cache);
  for (Tensor* t : {&gkc, &gvc}) gpu().fill(*t, 7.0f);  // poison: untouched slots must stay 7 on both
  for (Tensor* t : {&ckc, &cvc}) cpu().fill(*t, 7.0f);

  AttentionMetadata gm_all = upload_attention_metadata(gpu(), all), cm_all = upload_attention_metadata(cpu(), all);
  gpu().write_kv(on_gpu(k, {Tall, Hk, D}), on_gpu(v, {Tall, Hk, D}), gkc, gvc, gm_all, k_scale, v_scale);
  cpu().write_kv(on_cpu(k, {Tall, Hk, D}), on_cpu(v, {Tall, Hk, D}), ckc, cvc, cm_all, k_scale, v_scale);
  // bf16: bit-exact; fp8: the same rounding of the same quotients, up to ties.
  const double cache_tol = p.cache == DType::kBF16 ? 0.0 : 1e-3;
  EXPECT_LE(rel_err(from_gpu(gkc), from_cpu(ckc)), cache_tol) << "k cache";
  EXPECT_LE(rel_err(from_gpu(gvc), from_cpu(cvc)), cache_tol) << "v cache";

  AttentionMetadata gm = upload_attention_metadata(gpu(), step), cm = upload_attention_metadata(cpu(), step);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  Tensor out = gpu_out({T, Hq, D});
  gpu().paged_attention(on_gpu(q, {T, Hq, D}), gkc, gvc, gm, scale, k_scale, v_scale, 0, out);
  Tensor ref = cpu().alloc({T, Hq, D}, DType::kF32);
  cpu().paged_attention(on_cpu(q, {T, Hq, D}), ckc, cvc, cm, scale, k_scale, v_scale, 0, ref);
  double err = rel_err(from_gpu(out), from_cpu(ref));
  EXPECT_LT(err, 1e-2) << p.what << " D=" << D << " group=" << p.group << " cache " << dtype_name(p.cache);
  std::printf("[attention] %-14s D=%3d group=%d cache=%-8s T=%4d rel_err=%.2e\n", p.what, D, p.group,
              std::string(dtype_name(p.cache)).c_str(), T, err);
}

std::vector<AttnCase> attention_cases() {
  const std::vector<SeqSpec> decode = {{0, 1}, {15, 1}, {16, 1}, {32, 1}, {299, 1}, {1000, 1}, {2500, 1}};
  const std::vector<SeqSpec> prefill = {{0, 7}, {5, 33}, {40, 100}, {16, 64}, {0, 130}, {200, 1}};
  const std::vector<SeqSpec> mixed = {{20, 1}, {0, 33}, {100, 1}, {17, 70}, {600, 1}};
  const std::vector<SeqSpec> short_prefill = {{0, 7}, {5, 33}, {300, 1}, {64, 64}};  // 64-row blocks
  // Speculative verification: chunks of 1 + drafts over long contexts take the decode kernel
  // (CudaOptions::decode_attention_max_query), each token over its own causal range; with a
  // prompt chunk of 33 the prefill kernel takes that one beside them.
  const std::vector<SeqSpec> verify = {{1000, 3}, {17, 4}, {2500, 17}, {300, 1}, {0, 2}, {63, 16}};
  const std::vector<SeqSpec> verify_prefill = {{600, 3}, {0, 33}, {100, 1}, {31, 16}, {2000, 5}};
  std::vector<AttnCase> cases;
  for (int D : {64, 128})
    for (int g : {1, 2, 4, 8})
      for (DType c : {DType::kBF16, DType::kF8E4M3}) {
        cases.push_back({D, g, c, decode, "decode"});
        cases.push_back({D, g, c, prefill, "prefill+prefix"});
        cases.push_back({D, g, c, mixed, "mixed"});
        cases.push_back({D, g, c, short_prefill, "short-prefill"});
        cases.push_back({D, g, c, verify, "verify"});
        cases.push_back({D, g, c, verify_prefill, "verify+prefill"});
      }
  cases.push_back({128, 16, DType::kBF16, decode, "decode"});  // more query heads than one block takes
  // Groups that are not powers of two (Qwen2.5-7B: 7, Qwen3-14B: 5): padded head chunks.
  for (int g : {3, 5, 7, 12}) {
    cases.push_back({128, g, DType::kBF16, decode, "decode"});
    cases.push_back({128, g, DType::kBF16, mixed, "mixed"});
  }
  cases.push_back({128, 4, DType::kBF16, {{0, 1}}, "decode"});  // one token, one key
  // head_dim 256 with 2 kv heads (Qwen3-Next / Qwen3.5 gated attention: 16 or 32 query heads).
  for (int g : {8, 16})
    for (DType c : {DType::kBF16, DType::kF8E4M3}) {
      cases.push_back({256, g, c, decode, "decode"});
      cases.push_back({256, g, c, prefill, "prefill+prefix"});
      cases.push_back({256, g, c, mixed, "mixed"});
      cases.push_back({256, g, c, short_prefill, "short-prefill"});
      cases.push_back({256, g, c, verify, "verify"});
      cases.push_back({256, g, c, verify_prefill, "verify+prefill"});
    }
  // The fixtures' head dims (Qwen3-Next / Qwen3.5 tiny: 32, Qwen2-MoE / Qwen3-MoE tiny: 16) run
  // the generic kernel: contexts of 300 to 1000 keys (several 128-key chunks of its online
  // softmax, lengths that are not multiples of the chunk or the block), prefill and decode.
  const std::vector<SeqSpec> long_prefill = {{0, 300}, {0, 1000}, {37, 263}};
  const std::vector<SeqSpec> long_decode = {{299, 1}, {300, 1}, {309, 1}, {511, 1}, {999, 1}};
  for (int D : {16, 32})
    for (int g : {1, 2}) {
      cases.push_back({D, g, DType::kBF16, decode, "decode"});
      cases.push_back({D, g, DType::kBF16, prefill, "prefill+prefix"});
      cases.push_back({D, g, DType::kBF16, mixed, "mixed"});
      cases.push_back({D, g, DType::kBF16, long_prefill, "long-prefill"});
      cases.push_back({D, g, DType::kBF16, long_decode, "long-decode"});
    }
  for (int D : {64, 256}) {
    cases.push_back({D, 2, DType::kBF16, long_prefill, "long-prefill"});
    cases.push_back({D, 2, DType::kBF16, long_decode, "long-decode"});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaAttention, ::testing::ValuesIn(attention_cases()));

// ---------------------------------------------------------------- shared memory per block
// Launchers whose kernels take more than 48 KiB of shared memory a block pick a variant from
// max_smem, the bytes a block may opt into: Hopper's by default, kBlackwellDesktopMaxSmem on
// sm_120 and sm_121. These tests call the launchers directly (on the legacy default stream, after
// the backend's queued work) under both limits, on any GPU: the variants must give the same bits,
// and the CPU's result within the usual tolerance.
constexpr size_t kSmemLimits[] = {cuda::kHopperMaxSmem, cuda::kBlackwellDesktopMaxSmem};

// `launch` on the legacy default stream once `be`'s queued work is done; waits for it.
void on_default_stream(Backend& be, const std::function<void()>& launch) {
  be.synchronize();
  launch();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// Elements whose bits differ (both finite, as the poisoned outputs must be).
size_t bits_differ(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  size_t n = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return n;
}

// The grouped GEMM of the MoE prefill (bf16 and FP8 experts, mma.sync): 4 stages under Hopper's
// limit, 2 stages (and one widened tile for FP8) under sm_120's. The same bits.
TEST_F(CudaOps, MoePrefillUnderSm120SharedMemoryGivesTheSameBits) {
  struct Case {
    MoeCase c;
    bool fp8;
  };
  const Case cases[] = {
      {{300, 60, 4, 64, 48, 60, 0, false}, false},     // the tiny fixtures' dims
      {{600, 16, 8, 2048, 768, 16, 0, true}, false},   // Qwen3-30B-A3B's expert shape
      {{33, 64, 8, 528, 144, 64, 0, true}, true},      // partial k steps and scale blocks
      {{300, 256, 8, 3072, 1024, 16, 64, true}, true}  // the flagship's experts, 64..79 of 256
  };
  for (const Case& cs : cases) {
    const MoeCase& c = cs.c;
    const int64_t T = c.T, H = c.H, I = c.I, k = c.k, EL = c.E_local, P = T * k;
    const std::string what = std::string(cs.fp8 ? "FP8" : "bf16") + " experts T=" + std::to_string(T) +
                             " H=" + std::to_string(H) + " I=" + std::to_string(I);
    auto x = rand(T * H), logits = rand(T * c.E, -3, 3);
    Tensor cids = cpu().alloc({T, k}, DType::kI32), cw = cpu().alloc({T, k}, DType::kF32);
    cpu().moe_topk(on_cpu(logits, {T, c.E}), static_cast<int>(k), c.renormalize, cids, cw);
    Tensor ref = cpu().alloc({T, H}, DType::kF32), gu, dn;
    if (cs.fp8) {
      const Fp8Host hgu = fp8_host({EL, 2 * I, H}), hdn = fp8_host({EL, H, I});
      gu = put_fp8(gpu(), hgu);
      dn = put_fp8(gpu(), hdn);
      cpu().moe_experts(on_cpu(x, {T, H}), put_fp8(cpu(), hgu), put_fp8(cpu(), hdn), cids, cw,
                        static_cast<int>(c.begin), ref);
    } else {
      auto g = rand(EL * 2 * I * H, -0.1f, 0.1f), d = rand(EL * H * I, -0.1f, 0.1f);
      gu = on_gpu(g, {EL, 2 * I, H});
      dn = on_gpu(d, {EL, H, I});
      cpu().moe_experts(on_cpu(x, {T, H}), on_cpu(g, {EL, 2 * I, H}), on_cpu(d, {EL, H, I}), cids, cw,
                        static_cast<int>(c.begin), ref);
    }
    const std::vector<int32_t> ids(cids.data<int32_t>(), cids.data<int32_t>() + P);
    Tensor gx = on_gpu(x, {T, H}), gids = on_gpu_i32(ids, {T, k}), gw = on_gpu(from_cpu(cw), {T, k}, DType::kF32);
    Tensor route = gpu().alloc({2 * (EL + 1) + 2 * P}, DType::kI32);
    Tensor act = gpu().alloc({P, I}, DType::kBF16), y = gpu().alloc({P, H}, DType::kBF16);
    int32_t* r = route.data<int32_t>();
    const cuda::MoePrefillWorkspace ws{r, r + EL + 1, r + 2 * (EL + 1), r + 2 * (EL + 1) + P, act.raw(), y.raw()};
    std::vector<std::vector<float>> outs;
    for (size_t max_smem : kSmemLimits) {
      Tensor out = gpu_out({T, H});
      cuda::MoeArgs a;
      a.x = gx.raw();
      a.gate_up = gu.raw();
      a.down = dn.raw();
      if (cs.fp8) {
        a.gate_up_scale = gu.block_scale()->data<float>();
        a.down_scale = dn.block_scale()->data<float>();
      }
      a.ids = gids.data<int32_t>();
      a.weights = gw.data<float>();
      a.out = out.raw();
      a.T = static_cast<int>(T);
      a.k = static_cast<int>(k);
      a.H = static_cast<int>(H);
      a.I = static_cast<int>(I);
      a.E_local = static_cast<int>(EL);
      a.expert_begin = static_cast<int>(c.begin);
      on_default_stream(gpu(), [&] { cuda::launch_moe_prefill(a, ws, false, nullptr, max_smem); });
      outs.push_back(from_gpu(out));
      EXPECT_LT(rel_err(outs.back(), from_cpu(ref)), 1e-2) << what << ", max_smem " << max_smem;
    }
    EXPECT_EQ(bits_differ(outs[0], outs[1]), 0u) << what << ": sm_120's variant against Hopper's";
  }
}

// The dense FP8 W8A16 GEMM (the grouped GEMM with one group; K slices where tiles are few).
TEST_F(CudaOps, Fp8W16GemmUnderSm120SharedMemoryGivesTheSameBits) {
  struct Case {
    int64_t M, N, K;
    DType out;
  };
  for (Case c : std::vector<Case>{
           {24, 3072, 8192, DType::kBF16}, {130, 1000, 2048, DType::kF32}, {513, 640, 1040, DType::kBF16}}) {
    const int splits = cuda::fp8_w16_gemm_splits(c.M, c.N, c.K, 132);
    const Fp8Host h = fp8_host({c.N, c.K});
    Tensor w = put_fp8(gpu(), h);
    auto x = rand(c.M * c.K);
    Tensor gx = on_gpu(x, {c.M, c.K}), part = gpu().alloc({splits * c.M * c.N}, DType::kF32);
    Tensor ref = cpu().alloc({c.M, c.N}, DType::kF32);
    cpu().linear(on_cpu(x, {c.M, c.K}), put_fp8(cpu(), h), nullptr, ref);
    const std::string what = "M=" + std::to_string(c.M) + " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) +
                             " (" + std::to_string(splits) + " K slices)";
    std::vector<std::vector<float>> outs;
    for (size_t max_smem : kSmemLimits) {
      Tensor out = gpu_out({c.M, c.N}, c.out);
      bool done = false;
      on_default_stream(gpu(), [&] {
        done = cuda::launch_fp8_w16_gemm(gx.raw(), w.raw(), w.block_scale()->data<float>(), out.raw(), c.out, c.M, c.N,
                                         c.K, splits, part.data<float>(), nullptr, max_smem);
      });
      ASSERT_TRUE(done) << what << ", max_smem " << max_smem;
      outs.push_back(from_gpu(out));
      EXPECT_LT(rel_err(outs.back(), from_cpu(ref)), 1e-2) << what << ", max_smem " << max_smem;
    }
    EXPECT_EQ(bits_differ(outs[0], outs[1]), 0u) << what << ": sm_120's variant against Hopper's";
  }
}

// Prefill attention's tiles fit sm_120 (at most 86,016 bytes): every head dim and cache dtype,
// with a sequence longer than 64 query tokens (two row fragments a warp) and without.
TEST_F(CudaOps, PrefillAttentionUnderSm120SharedMemoryGivesTheSameBits) {
  const std::vector<std::vector<SeqSpec>> steps = {{{0, 130}, {40, 100}, {5, 33}}, {{0, 64}, {200, 17}}};
  const int Hk = 2, group = 2, Hq = Hk * group, bs = 16;
  for (int D : {64, 128, 256})
    for (DType cache : {DType::kBF16, DType::kF8E4M3})
      for (const std::vector<SeqSpec>& seqs : steps) {
        const float k_scale = cache == DType::kF8E4M3 ? 0.01f : 1.0f, v_scale = cache == DType::kF8E4M3 ? 0.005f : 1.0f;
        AttentionLayout all, step;
        all.block_size = step.block_size = bs;
        all.query_start_loc = step.query_start_loc = {0};
        int max_blocks = 0, next = 0;
        for (const SeqSpec& sp : seqs) max_blocks = std::max(max_blocks, (sp.cached + sp.new_tokens + bs - 1) / bs);
        all.max_blocks_per_seq = step.max_blocks_per_seq = max_blocks;
        for (const SeqSpec& sp : seqs) {  // sequence i takes blocks next, next + 1, ...
          const int ctx = sp.cached + sp.new_tokens;
          std::vector<int32_t> bt(max_blocks, 0);
          for (int b = 0; b < (ctx + bs - 1) / bs; ++b) bt[b] = next++;
          for (int j = 0; j < ctx; ++j) all.slot_mapping.push_back(bt[j / bs] * bs + j % bs);
          for (int j = sp.cached; j < ctx; ++j) step.slot_mapping.push_back(bt[j / bs] * bs + j % bs);
          for (AttentionLayout* l : {&all, &step}) l->block_tables.insert(l->block_tables.end(), bt.begin(), bt.end());
          all.query_start_loc.push_back(all.query_start_loc.back() + ctx);
          step.query_start_loc.push_back(step.query_start_loc.back() + sp.new_tokens);
          all.seq_lens.push_back(ctx);
          step.seq_lens.push_back(ctx);
        }
        const int Tall = all.query_start_loc.back(), T = step.query_start_loc.back();
        auto k = rand(int64_t{Tall} * Hk * D), v = rand(int64_t{Tall} * Hk * D), q = rand(int64_t{T} * Hq * D);
        const Shape cs{next, bs, Hk, D};
        Tensor gkc = gpu().alloc(cs, cache), gvc = gpu().alloc(cs, cache);
        Tensor ckc = cpu().alloc(cs, cache), cvc = cpu().alloc(cs, cache);
        gpu().write_kv(on_gpu(k, {Tall, Hk, D}), on_gpu(v, {Tall, Hk, D}), gkc, gvc,
                       upload_attention_metadata(gpu(), all), k_scale, v_scale);
        cpu().write_kv(on_cpu(k, {Tall, Hk, D}), on_cpu(v, {Tall, Hk, D}), ckc, cvc,
                       upload_attention_metadata(cpu(), all), k_scale, v_scale);
        const float scale = 1.0f / std::sqrt(static_cast<float>(D));
        Tensor ref = cpu().alloc({T, Hq, D}, DType::kF32);
        cpu().paged_attention(on_cpu(q, {T, Hq, D}), ckc, cvc, upload_attention_metadata(cpu(), step), scale, k_scale,
                              v_scale, 0, ref);
        const AttentionMetadata gm = upload_attention_metadata(gpu(), step);
        Tensor gq = on_gpu(q, {T, Hq, D});
        const std::string what = "D=" + std::to_string(D) + " cache " + std::string(dtype_name(cache)) +
                                 " longest query " + std::to_string(gm.max_query_len);
        std::vector<std::vector<float>> outs;
        for (size_t max_smem : kSmemLimits) {
          Tensor out = gpu_out({T, Hq, D});
          cuda::PagedAttentionArgs a{};
          a.q = gq.raw();
          a.k_cache = gkc.raw();
          a.v_cache = gvc.raw();
          a.out = out.raw();
          a.query_start_loc = gm.query_start_loc.data<int32_t>();
          a.seq_lens = gm.seq_lens.data<int32_t>();
          a.block_tables = gm.block_tables.data<int32_t>();
          a.num_seqs = gm.num_seqs;
          a.num_tokens = T;
          a.Hq = Hq;
          a.Hk = Hk;
          a.D = D;
          a.block_size = bs;
          a.max_blocks_per_seq = max_blocks;
          a.scale = scale;
          a.k_scale = k_scale;
          a.v_scale = v_scale;
          a.cache_dtype = cache;
          on_default_stream(gpu(), [&] { cuda::launch_prefill_attention(a, gm.max_query_len, 0, nullptr, max_smem); });
          outs.push_back(from_gpu(out));
          EXPECT_LT(rel_err(outs.back(), from_cpu(ref)), 1e-2) << what << ", max_smem " << max_smem;
        }
        EXPECT_EQ(bits_differ(outs[0], outs[1]), 0u) << what << ": sm_120's launch against Hopper's";
        gpu().reset_scratch();
        cpu().reset_scratch();
      }
}

// The chunked gated delta rule (Dk = Dv = 128): its three shared-memory layouts fit sm_120.
// Sequences over several 64-token chunks, from a state and from zeros, f32 and bf16 states.
TEST_F(CudaOps, ChunkedGatedDeltaRuleUnderSm120SharedMemoryGivesTheSameBits) {
  const int Hk = 2, Hv = 4, D = 128, C = 2 * Hk * D + Hv * D, ba_col = 3, X = ba_col + 2 * Hv + 5, num_slots = 4;
  const LinearStep st = {{130, 64, 7}, {2, 0, 3}, {1, 0, 1}};
  const LinearAttnLayout l = linear_layout(st);
  const int S = static_cast<int>(st.lens.size()), T = l.query_start_loc.back();
  std::vector<int32_t> chunks, seq_chunks = {0};  // as CudaBackend::gated_delta_rule builds them
  for (int s = 0; s < S; ++s) {
    for (int t = l.query_start_loc[s]; t < l.query_start_loc[s + 1]; t += 64)
      chunks.insert(chunks.end(), {t, std::min(64, l.query_start_loc[s + 1] - t), s});
    seq_chunks.push_back(static_cast<int32_t>(chunks.size() / 3));
  }
  const int num_chunks = static_cast<int>(chunks.size() / 3);
  auto qkv = rand(int64_t{T} * C), ba = rand(int64_t{T} * X, -3.0f, 3.0f);
  auto alog = rand(Hv, -2.0f, 0.5f), dtb = rand(Hv, -1.0f, 1.0f);
  const Shape ss{num_slots, Hv, D, D};
  const auto st0 = rand(ss.numel(), -0.3f, 0.3f);
  Tensor cs = on_cpu(st0, ss), cout = cpu().alloc({T, Hv, D}, DType::kF32);
  cpu().gated_delta_rule(on_cpu(qkv, {T, C}), on_cpu(ba, {T, X}), ba_col, on_cpu(alog, {Hv}), on_cpu(dtb, {Hv}), cs,
                         upload_linear_attn_metadata(cpu(), l), cout);
  Tensor gqkv = on_gpu(qkv, {T, C}), gba = on_gpu(ba, {T, X});
  Tensor ga = on_gpu(alog, {Hv}, DType::kF32), gd = on_gpu(dtb, {Hv}, DType::kF32);
  Tensor gqsl = on_gpu_i32(l.query_start_loc, {S + 1}), gslots = on_gpu_i32(l.state_slots, {S}),
         ginit = on_gpu_i32(l.has_initial_state, {S});
  Tensor gchunks = on_gpu_i32(chunks, {num_chunks * 3}), gseq = on_gpu_i32(seq_chunks, {S + 1});
  Tensor ws =
      gpu().alloc({static_cast<int64_t>(cuda::gdr_chunked_workspace_bytes(num_chunks, Hk, Hv, D, D))}, DType::kU8);
  for (DType state_t : {DType::kF32, DType::kBF16}) {
    std::vector<std::vector<float>> outs, states;
    for (size_t max_smem : kSmemLimits) {
      Tensor gs = on_gpu(st0, ss, state_t), out = gpu_out({T, Hv, D});
      cuda::GatedDeltaRuleArgs a{};
      a.qkv = gqkv.raw();
      a.ba = gba.raw();
      a.ba_stride = X;
      a.ba_col = ba_col;
      a.A_log = ga.raw();
      a.dt_bias = gd.raw();
      a.param_t = DType::kF32;
      a.state = gs.raw();
      a.state_t = state_t;
      a.qsl = gqsl.data<int32_t>();
      a.slots = gslots.data<int32_t>();
      a.has_init = ginit.data<int32_t>();
      a.out = out.raw();
      a.num_seqs = S;
      a.Hk = Hk;
      a.Hv = Hv;
      a.Dk = a.Dv = D;
      a.scale = 1.0f / std::sqrt(static_cast<float>(D));
      a.chunks = gchunks.data<int32_t>();
      a.seq_chunks = gseq.data<int32_t>();
      a.num_chunks = num_chunks;
      cuda::gdr_carve_workspace(a, ws.raw());
      on_default_stream(gpu(), [&] { cuda::launch_gated_delta_rule(a, true, nullptr, max_smem); });
      outs.push_back(from_gpu(out));
      states.push_back(from_gpu(gs));
      const std::string what = std::string(dtype_name(state_t)) + " state, max_smem " + std::to_string(max_smem);
      EXPECT_LT(rel_err(outs.back(), from_cpu(cout)), 2e-2) << what;
      EXPECT_LT(rel_err(states.back(), from_cpu(cs)), 2e-2) << what << ": states";
    }
    EXPECT_EQ(bits_differ(outs[0], outs[1]), 0u) << dtype_name(state_t) << " state: outputs, sm_120 against Hopper";
    EXPECT_EQ(bits_differ(states[0], states[1]), 0u) << dtype_name(state_t) << " state: states, sm_120 against Hopper";
  }
}

// No GPU needed: every launcher has a variant within sm_120's limit; the grouped GEMM takes the
// 4-stage one on Hopper and a smaller one there; below every variant the launchers refuse before
// queuing anything (an Error, or false where the caller has a fallback).
TEST(CudaSharedMemory, LaunchersFitSm120AndRefuseBelowEveryVariant) {
  using namespace cuda;
  for (bool fp8 : {false, true}) {
    EXPECT_EQ(moe_gemm_variant(fp8, kHopperMaxSmem), 0);
    EXPECT_EQ(kMoeGemmVariants[0].stages, 4);
    const int v = moe_gemm_variant(fp8, kBlackwellDesktopMaxSmem);
    ASSERT_GT(v, 0) << (fp8 ? "FP8" : "bf16");
    EXPECT_LE(moe_gemm_smem_bytes(fp8, kMoeGemmVariants[v]), kBlackwellDesktopMaxSmem);
  }
  EXPECT_GT(kMoeWgmmaSmemBytes, kBlackwellDesktopMaxSmem) << "the wgmma kernel runs on Hopper only";
  for (int D : {64, 128, 256})
    for (int cache_bytes : {1, 2})
      for (bool long_query : {false, true}) {
        const PrefillTile t = prefill_tile(D, long_query);
        EXPECT_LE(prefill_smem_bytes(D, cache_bytes, t.row_frags, t.keys), kBlackwellDesktopMaxSmem) << "D=" << D;
      }
  EXPECT_LE(sizeof(gdr::WySmem<128, 128>), kBlackwellDesktopMaxSmem);
  EXPECT_LE(sizeof(gdr::StateSmem<128, 128>), kBlackwellDesktopMaxSmem);
  EXPECT_LE(sizeof(gdr::OutSmem<128>), kBlackwellDesktopMaxSmem);

  const size_t small = 48 * 1024;  // under every variant of the kernels above
  auto expect_unsupported = [](const std::function<void()>& f, const char* who) {
    try {
      f();
      ADD_FAILURE() << who << " did not refuse";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUnsupported) << who << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find(std::to_string(small)), std::string::npos) << e.what();
    }
  };
  MoeArgs m{};
  m.T = 300;
  m.k = 8;
  m.H = 2048;
  m.I = 768;
  m.E_local = 16;
  expect_unsupported([&] { launch_moe_prefill(m, MoePrefillWorkspace{}, true, nullptr, small); }, "bf16 MoE prefill");
  const float scale = 1.0f;
  m.gate_up_scale = m.down_scale = &scale;
  expect_unsupported([&] { launch_moe_prefill(m, MoePrefillWorkspace{}, false, nullptr, small); }, "FP8 MoE prefill");
  EXPECT_FALSE(launch_fp8_w16_gemm(nullptr, nullptr, &scale, nullptr, DType::kBF16, 300, 1024, 1024, 1, nullptr,
                                   nullptr, small));
  PagedAttentionArgs pa{};
  pa.num_seqs = 1;
  pa.D = 128;
  pa.cache_dtype = DType::kF8E4M3;  // 86,016 bytes at 100 query tokens
  expect_unsupported([&] { launch_prefill_attention(pa, 100, 0, nullptr, small); }, "prefill attention");
  GatedDeltaRuleArgs g{};
  g.num_seqs = 1;
  g.num_chunks = 1;
  g.state_t = DType::kF32;
  expect_unsupported([&] { launch_gated_delta_rule(g, true, nullptr, small); }, "chunked gated delta rule");
}

#else

TEST(CudaOps, Skipped) { GTEST_SKIP() << "this build has no CUDA backend (configure with -DTESSERA_CUDA=ON)"; }

#endif

}  // namespace
}  // namespace tessera
