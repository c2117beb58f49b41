// CpuBackend: the op table (op_table.h) against plain double-precision references
// (op_reference.h), and the checks that are the CPU backend's own: paged attention over fp8 and
// bf16 caches with scales, random shapes for gather, cast, MoE routing with ties and expert
// parallelism, the scratch arena, bad ids and shapes. Inputs here are random and fresh each run
// (the seed is printed on failure); outputs are poisoned with NaN before each op so that an
// unwritten element cannot pass.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>
#include <random>
#include <set>
#include <sstream>
#include <vector>

#include "backend/attention_metadata.h"
#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "op_reference.h"
#include "op_table.h"

namespace tessera {
namespace {

class CpuOps : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = std::random_device{}();
    rng_.seed(seed_);
  }
  void TearDown() override {
    if (HasFailure()) std::printf("seed %llu\n", static_cast<unsigned long long>(seed_));
  }

  float uniform(float lo = -1.0f, float hi = 1.0f) { return std::uniform_real_distribution<float>(lo, hi)(rng_); }
  int randint(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }  // inclusive

  Tensor rand_f32(Shape s, float lo = -1.0f, float hi = 1.0f) {
    Tensor t = be_.alloc(s, DType::kF32);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = uniform(lo, hi);
    return t;
  }
  Tensor poisoned(Shape s, DType dt = DType::kF32) {
    Tensor t = be_.alloc(s, dt);
    if (dt == DType::kF32)
      std::fill_n(t.data<float>(), t.numel(), NAN);
    else
      std::memset(t.raw(), 0xff, t.nbytes());  // NaN in bf16/f16/fp8
    return t;
  }
  Tensor i32(const std::vector<int32_t>& v) {
    Tensor t = be_.alloc({static_cast<int64_t>(v.size())}, DType::kI32);
    std::copy(v.begin(), v.end(), t.data<int32_t>());
    return t;
  }
  static std::vector<double> vec(const Tensor& t) {
    std::vector<double> v(static_cast<size_t>(t.numel()));
    std::vector<float> f(v.size());
    convert_host(t.raw(), t.dtype(), f.data(), DType::kF32, f.size());
    std::copy(f.begin(), f.end(), v.begin());
    return v;
  }
  static void expect_close(const Tensor& got, const std::vector<double>& want, double atol, double rtol,
                           const std::string& what) {
    std::vector<double> g = vec(got);
    ASSERT_EQ(g.size(), want.size()) << what;
    int reported = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      double tol = atol + rtol * std::fabs(want[i]);
      if (!(std::fabs(g[i] - want[i]) <= tol) && reported++ < 5)
        ADD_FAILURE() << what << ": element " << i << " got " << g[i] << " want " << want[i];
    }
  }

  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
  CpuBackend be_;
};

// Value checks of every op are the op table's (op_table.h, CpuOpTable below); these are the CPU
// backend's refusals of bad ids and shapes.
TEST_F(CpuOps, OpsRefuseBadIdsAndShapes) {
  const int V = 9, H = 4;
  Tensor table = rand_f32({V, H});
  EXPECT_THROW(be_.embedding(i32({V}), table, poisoned({1, H})), Error);
  EXPECT_THROW(be_.embedding(i32({-1}), table, poisoned({1, H})), Error);
  EXPECT_THROW(be_.linear(rand_f32({2, 7}), rand_f32({5, 8}), nullptr, poisoned({2, 5})), Error);
  RopeTable rope;
  rope.rotary_dim = 4;
  rope.cos_sin = rand_f32({8, 4});
  Tensor q = rand_f32({1, 1, 4}), k = rand_f32({1, 1, 4});
  EXPECT_THROW(be_.rope(q, k, i32({8}), rope), Error);
  EXPECT_THROW(be_.rope(q, k, i32({-1}), rope), Error);
  Tensor x = rand_f32({3, H});
  EXPECT_THROW(be_.sigmoid_mul(x, rand_f32({4, 1}), x), Error);
}

// Weights in a quantised format without kernels (int4 groups, NVFP4) reach linear and
// moe_experts only through code that builds them by hand: refused naming the format and what the
// backend runs, not read as plain bytes.
TEST_F(CpuOps, LinearAndExpertsRefuseFormatsWithoutKernels) {
  const WeightFormat int4 = int4_group_format(128);
  Tensor w = host_empty({8, 256}, DType::kU8).with_format(int4, host_empty(int4.scale_shape({8, 256}), DType::kF16));
  try {
    be_.linear(rand_f32({2, 256}), w, nullptr, poisoned({2, 8}));
    ADD_FAILURE() << "an int4 weight was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported) << e.what();
    EXPECT_NE(std::string(e.what()).find("int4, f16 scale per group of 128 columns"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("fp8 e4m3, f32 scale per 128x128 block"), std::string::npos) << e.what();
  }
  const WeightFormat fp4 = nvfp4_format();
  Tensor gu =
      host_empty({2, 16, 32}, DType::kU8).with_format(fp4, host_empty(fp4.scale_shape({2, 16, 32}), DType::kF8E4M3));
  Tensor dn =
      host_empty({2, 32, 8}, DType::kU8).with_format(fp4, host_empty(fp4.scale_shape({2, 32, 8}), DType::kF8E4M3));
  Tensor ids = i32({0, 1}).view({1, 2});
  Tensor weights = rand_f32({1, 2});
  EXPECT_THROW(be_.moe_experts(rand_f32({1, 32}), gu, dn, ids, weights, 0, poisoned({1, 32})), Error);
  // A format's scales must have its dtype and shape.
  EXPECT_THROW(host_empty({8, 256}, DType::kU8).with_format(int4, host_empty({8, 1}, DType::kF16)), Error);
  EXPECT_THROW(host_empty({8, 256}, DType::kU8).with_format(int4, host_empty({8, 2}, DType::kF32)), Error);
  EXPECT_THROW(host_empty({8, 256}, DType::kF32).with_format(int4, host_empty({8, 2}, DType::kF16)), Error);
}

// ---- paged KV cache ----

struct KvCase {
  int Hq, Hk, D, block_size;
  DType cache_dtype;
  float k_scale, v_scale;
};

std::string case_name(const KvCase& c) {
  return "Hq" + std::to_string(c.Hq) + "_Hk" + std::to_string(c.Hk) + "_D" + std::to_string(c.D) + "_bs" +
         std::to_string(c.block_size) + "_" + std::string(dtype_name(c.cache_dtype));
}

void PrintTo(const KvCase& c, std::ostream* os) { *os << case_name(c); }

class CpuPagedAttention : public CpuOps, public ::testing::WithParamInterface<KvCase> {};

// What the cache holds for value x: x / scale in the cache dtype, read back times scale.
double through_cache(float x, DType dt, float scale) {
  float q = x / scale, back;
  uint8_t buf[4];
  convert_host(&q, DType::kF32, buf, dt, 1);
  convert_host(buf, dt, &back, DType::kF32, 1);
  return static_cast<double>(back) * scale;
}

TEST_P(CpuPagedAttention, WriteKvThenAttendOverShuffledBlocks) {
  const KvCase c = GetParam();
  const int bs = c.block_size;
  // Sequences of different shapes in one batch: prefill, decode, chunked prefill, long decode.
  const int S = randint(2, 5);
  std::vector<int> cached(S), qlen(S);
  for (int s = 0; s < S; ++s) {
    switch (s % 4) {
      case 0:
        cached[s] = 0, qlen[s] = randint(1, 2 * bs + 3);
        break;
      case 1:
        cached[s] = randint(1, 3 * bs), qlen[s] = 1;
        break;
      case 2:
        cached[s] = randint(1, 2 * bs), qlen[s] = randint(2, bs + 5);
        break;
      default:
        cached[s] = randint(3 * bs, 5 * bs), qlen[s] = randint(1, 3);
        break;
    }
  }
  std::vector<int> seq_len(S), nblocks(S);
  int max_blocks = 0, total_blocks = 0;
  for (int s = 0; s < S; ++s) {
    seq_len[s] = cached[s] + qlen[s];
    nblocks[s] = (seq_len[s] + bs - 1) / bs;
    max_blocks = std::max(max_blocks, nblocks[s] + randint(0, 2));  // padded tables
    total_blocks += nblocks[s];
  }
  const int num_blocks = total_blocks + randint(1, 6);  // spare blocks that nobody owns
  std::vector<int32_t> physical(num_blocks);
  std::iota(physical.begin(), physical.end(), 0);
  std::shuffle(physical.begin(), physical.end(), rng_);
  std::vector<int32_t> table(static_cast<size_t>(S) * max_blocks);
  int next = 0;
  for (int s = 0; s < S; ++s)
    for (int b = 0; b < max_blocks; ++b)
      table[s * max_blocks + b] = b < nblocks[s] ? physical[next++] : physical[randint(0, num_blocks - 1)];
  auto slot_of = [&](int s, int p) { return table[s * max_blocks + p / bs] * bs + p % bs; };

  // K/V of every position of every sequence, and the queries of the new tokens.
  std::vector<Tensor> keys(S), values(S);
  for (int s = 0; s < S; ++s)
    keys[s] = rand_f32({seq_len[s], c.Hk, c.D}), values[s] = rand_f32({seq_len[s], c.Hk, c.D});

  Tensor k_cache = poisoned({num_blocks, bs, c.Hk, c.D}, c.cache_dtype);
  Tensor v_cache = poisoned({num_blocks, bs, c.Hk, c.D}, c.cache_dtype);
  const int64_t row = static_cast<int64_t>(c.Hk) * c.D;

  // Step 1 writes the cached prefix of each sequence, step 2 the new tokens: two
  // write_kv calls, as two engine steps would make them.
  auto write_step = [&](bool prefix) {
    AttentionLayout layout;
    layout.block_size = bs;
    layout.max_blocks_per_seq = max_blocks;
    layout.block_tables = table;
    layout.query_start_loc.push_back(0);
    std::vector<std::pair<int, int>> rows;  // (seq, position)
    for (int s = 0; s < S; ++s) {
      int from = prefix ? 0 : cached[s], to = prefix ? cached[s] : seq_len[s];
      for (int p = from; p < to; ++p) rows.emplace_back(s, p), layout.slot_mapping.push_back(slot_of(s, p));
      layout.query_start_loc.push_back(static_cast<int32_t>(rows.size()));
      layout.seq_lens.push_back(to);
    }
    const int T = static_cast<int>(rows.size());
    Tensor k = be_.scratch({std::max(T, 1), c.Hk, c.D}, DType::kF32).rows(0, T);
    Tensor v = be_.scratch({std::max(T, 1), c.Hk, c.D}, DType::kF32).rows(0, T);
    for (int t = 0; t < T; ++t) {
      auto [s, p] = rows[t];
      std::memcpy(k.data<float>() + t * row, keys[s].data<float>() + p * row, row * 4);
      std::memcpy(v.data<float>() + t * row, values[s].data<float>() + p * row, row * 4);
    }
    AttentionMetadata meta = upload_attention_metadata(be_, layout);
    be_.write_kv(k, v, k_cache, v_cache, meta, c.k_scale, c.v_scale);
    return meta;
  };
  write_step(true);
  AttentionMetadata meta = write_step(false);

  // The cache now holds every position at its slot, in the cache dtype.
  for (int s = 0; s < S; ++s)
    for (int p = 0; p < seq_len[s]; ++p) {
      size_t off = static_cast<size_t>(slot_of(s, p)) * row;
      for (int64_t i = 0; i < row; ++i) {
        float got_k, got_v;
        const size_t es = dtype_size(c.cache_dtype);
        convert_host(static_cast<char*>(k_cache.raw()) + (off + i) * es, c.cache_dtype, &got_k, DType::kF32, 1);
        convert_host(static_cast<char*>(v_cache.raw()) + (off + i) * es, c.cache_dtype, &got_v, DType::kF32, 1);
        double want_k = through_cache(keys[s].data<float>()[p * row + i], c.cache_dtype, c.k_scale) / c.k_scale;
        double want_v = through_cache(values[s].data<float>()[p * row + i], c.cache_dtype, c.v_scale) / c.v_scale;
        ASSERT_NEAR(got_k, want_k, 1e-6 * std::fabs(want_k) + 1e-7) << "k cache seq " << s << " pos " << p;
        ASSERT_NEAR(got_v, want_v, 1e-6 * std::fabs(want_v) + 1e-7) << "v cache seq " << s << " pos " << p;
      }
    }

  const int T = meta.num_tokens;
  Tensor q = rand_f32({T, c.Hq, c.D});
  Tensor out = poisoned({T, c.Hq, c.D});
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.D));
  be_.paged_attention(q, k_cache, v_cache, meta, scale, c.k_scale, c.v_scale, 0, out);

  // Reference: causal softmax attention per sequence, in double. `quantized` reads K/V
  // as the cache stores them (tight check); otherwise the original values (loose check).
  auto reference = [&](bool quantized) {
    std::vector<double> want(static_cast<size_t>(T) * c.Hq * c.D);
    const int group = c.Hq / c.Hk;
    int t = 0;
    for (int s = 0; s < S; ++s)
      for (int i = 0; i < qlen[s]; ++i, ++t) {
        const int pos = cached[s] + i;
        for (int h = 0; h < c.Hq; ++h) {
          const int kh = h / group;
          std::vector<double> sc(static_cast<size_t>(pos + 1));
          double mx = -INFINITY;
          for (int j = 0; j <= pos; ++j) {
            double dot = 0;
            for (int d = 0; d < c.D; ++d) {
              float kv = keys[s].data<float>()[(j * c.Hk + kh) * c.D + d];
              double kd = quantized ? through_cache(kv, c.cache_dtype, c.k_scale) : kv;
              dot += static_cast<double>(q.data<float>()[(t * c.Hq + h) * c.D + d]) * kd;
            }
            sc[j] = dot * scale;
            mx = std::max(mx, sc[j]);
          }
          double sum = 0;
          for (auto& x : sc) sum += (x = std::exp(x - mx));
          for (int d = 0; d < c.D; ++d) {
            double acc = 0;
            for (int j = 0; j <= pos; ++j) {
              float vv = values[s].data<float>()[(j * c.Hk + kh) * c.D + d];
              acc += sc[j] / sum * (quantized ? through_cache(vv, c.cache_dtype, c.v_scale) : vv);
            }
            want[(static_cast<size_t>(t) * c.Hq + h) * c.D + d] = acc;
          }
        }
      }
    return want;
  };
  expect_close(out, reference(true), 2e-5, 1e-4, "paged_attention vs the cached values");
  // Worst-case relative rounding of one value: bf16 2^-8, e4m3 2^-4, e5m2 2^-3.
  const double loose = c.cache_dtype == DType::kF32      ? 2e-5
                       : c.cache_dtype == DType::kBF16   ? 1e-2
                       : c.cache_dtype == DType::kF8E4M3 ? 0.08
                                                         : 0.15;
  expect_close(out, reference(false), loose, 0, "paged_attention vs the unquantized values");
}

INSTANTIATE_TEST_SUITE_P(Caches, CpuPagedAttention,
                         ::testing::Values(KvCase{4, 4, 16, 16, DType::kF32, 1.0f, 1.0f},       // MHA
                                           KvCase{4, 2, 32, 16, DType::kF32, 1.0f, 1.0f},       // GQA 2
                                           KvCase{8, 2, 8, 4, DType::kF32, 1.0f, 1.0f},         // GQA 4, small blocks
                                           KvCase{6, 1, 24, 8, DType::kF32, 1.0f, 1.0f},        // MQA
                                           KvCase{4, 2, 16, 16, DType::kBF16, 1.0f, 1.0f},      // bf16 cache
                                           KvCase{4, 1, 16, 4, DType::kBF16, 0.5f, 2.0f},       // bf16 with scales
                                           KvCase{4, 2, 16, 16, DType::kF8E4M3, 0.02f, 0.03f},  // fp8 with scales
                                           KvCase{8, 2, 32, 8, DType::kF8E4M3, 0.05f, 0.01f},
                                           KvCase{4, 4, 16, 16, DType::kF8E5M2, 0.25f, 0.5f}),
                         [](const auto& info) { return case_name(info.param); });

TEST_F(CpuOps, WriteKvSkipsNegativeSlotsAndRefusesOutOfRange) {
  const int bs = 4, Hk = 2, D = 8, num_blocks = 3;
  Tensor k_cache = poisoned({num_blocks, bs, Hk, D}), v_cache = poisoned({num_blocks, bs, Hk, D});
  Tensor k = rand_f32({2, Hk, D}), v = rand_f32({2, Hk, D});
  AttentionLayout layout;
  layout.block_size = bs;
  layout.max_blocks_per_seq = 1;
  layout.block_tables = {2};
  layout.query_start_loc = {0, 2};
  layout.seq_lens = {2};
  layout.slot_mapping = {-1, 9};  // padding token, then block 2 offset 1
  be_.write_kv(k, v, k_cache, v_cache, upload_attention_metadata(be_, layout), 1.0f, 1.0f);
  auto kc = vec(k_cache), vc = vec(v_cache);
  for (size_t i = 0; i < kc.size(); ++i) {
    const size_t slot = i / (Hk * D);
    if (slot == 9) {
      EXPECT_EQ(kc[i], k.data<float>()[Hk * D + i % (Hk * D)]);
      EXPECT_EQ(vc[i], v.data<float>()[Hk * D + i % (Hk * D)]);
    } else {
      ASSERT_TRUE(std::isnan(kc[i]) && std::isnan(vc[i])) << "slot " << slot << " was written";
    }
  }
  layout.slot_mapping = {0, num_blocks * bs};  // one past the cache
  EXPECT_THROW(be_.write_kv(k, v, k_cache, v_cache, upload_attention_metadata(be_, layout), 1.0f, 1.0f), Error);
}

TEST_F(CpuOps, GatherRows) {
  for (DType dt : {DType::kF32, DType::kBF16, DType::kI32}) {
    const int R = randint(1, 30), C = randint(1, 40), n = randint(1, 20);
    Tensor x = be_.alloc({R, C}, dt);
    for (int64_t i = 0; i < x.nbytes(); ++i) static_cast<uint8_t*>(x.raw())[i] = static_cast<uint8_t>(randint(0, 255));
    std::vector<int32_t> idx(static_cast<size_t>(n));
    for (auto& i : idx) i = randint(0, R - 1);  // repeats allowed
    Tensor out = poisoned({n, C}, dt);
    be_.gather_rows(x, i32(idx), out);
    const size_t rb = static_cast<size_t>(C) * dtype_size(dt);
    for (int i = 0; i < n; ++i)
      ASSERT_EQ(std::memcmp(static_cast<char*>(out.raw()) + i * rb, static_cast<char*>(x.raw()) + idx[i] * rb, rb), 0)
          << dtype_name(dt) << " row " << i;
    EXPECT_THROW(be_.gather_rows(x, i32({R}), poisoned({1, C}, dt)), Error);
    EXPECT_THROW(be_.gather_rows(x, i32({-1}), poisoned({1, C}, dt)), Error);
  }
}

TEST_F(CpuOps, CastBetweenFloatTypes) {
  const int n = randint(1, 500);
  Tensor src = rand_f32({n}, -100, 100);
  for (DType dt : {DType::kBF16, DType::kF16, DType::kF8E4M3, DType::kF8E5M2}) {
    Tensor narrow = poisoned({n}, dt), back = poisoned({n});
    be_.cast(src, narrow);
    be_.cast(narrow, back);
    std::vector<double> want(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) want[i] = through_cache(src.data<float>()[i], dt, 1.0f);
    expect_close(back, want, 0, 0, std::string("cast via ") + std::string(dtype_name(dt)));
  }
  EXPECT_THROW(be_.cast(src, poisoned({n + 1})), Error);
}

TEST_F(CpuOps, FillAndFillRandom) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    Tensor a = poisoned({1000}, dt), b = poisoned({1000}, dt), c = poisoned({1000}, dt);
    be_.fill_random(a, 7, -0.5f, 0.25f);
    be_.fill_random(b, 7, -0.5f, 0.25f);
    be_.fill_random(c, 8, -0.5f, 0.25f);
    EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0) << "same seed, same values";
    EXPECT_NE(std::memcmp(a.raw(), c.raw(), a.nbytes()), 0) << "another seed, other values";
    double lo = 1e9, hi = -1e9, mean = 0;
    for (double v : vec(a)) lo = std::min(lo, v), hi = std::max(hi, v), mean += v / 1000;
    EXPECT_GE(lo, -0.5);
    EXPECT_LE(hi, 0.25);
    EXPECT_NEAR(mean, -0.125, 0.03);
    be_.fill(a, 1.5f);
    for (double v : vec(a)) ASSERT_EQ(v, 1.5);
  }
  // Large enough to run on the thread pool; an integer destination is refused, not a crash.
  Tensor big = poisoned({200000});
  be_.fill_random(big, 1, 0.0f, 1.0f);
  for (double v : vec(big)) ASSERT_TRUE(v >= 0 && v < 1);
  Tensor ints = be_.alloc({200000}, DType::kI32);
  EXPECT_THROW(be_.fill_random(ints, 1, 0.0f, 1.0f), Error);
}

TEST_F(CpuOps, Copies) {
  Tensor a = rand_f32({5, 7}), b = poisoned({5, 7}), c = poisoned({35});
  std::vector<float> host(35);
  be_.copy_to_host(host.data(), a);
  be_.copy_from_host(b, host.data());
  be_.copy(c, b);
  be_.synchronize();
  EXPECT_EQ(std::memcmp(a.raw(), c.raw(), a.nbytes()), 0);
  EXPECT_THROW(be_.copy(poisoned({34}), a), Error);
}

TEST_F(CpuOps, EmptyBatchesAreNoOps) {
  // A step where no sequence wants logits (a middle prefill chunk) hands the backend
  // zero-row tensors and empty host vectors, whose data() may be null. Every op must accept
  // them, write nothing (a zero-row scratch tensor shares its address with the next scratch
  // allocation: the canary after them must stay intact) and leave its inputs alone.
  const int H = 8, V = 16;
  std::vector<int32_t> none;
  Tensor idx = be_.scratch({0}, DType::kI32);
  Tensor rows = be_.scratch({0, H}, DType::kF32);
  Tensor logits = be_.scratch({0, V}, DType::kF32);
  Tensor emb = be_.scratch({0, H}, DType::kF32);
  Tensor gate_up = be_.scratch({0, 2 * H}, DType::kF32);
  Tensor narrow = be_.scratch({0, H}, DType::kBF16);
  Tensor canary = be_.scratch({64}, DType::kF32);
  std::fill_n(canary.data<float>(), 64, 1234.5f);
  Tensor x = rand_f32({3, H}), w = rand_f32({V, H}), g = rand_f32({H});
  const std::vector<double> x0 = vec(x), w0 = vec(w), g0 = vec(g);
  std::vector<float> sink;
  EXPECT_NO_THROW(be_.copy_from_host(idx, none.data()));
  EXPECT_NO_THROW(be_.copy_to_host(sink.data(), rows));
  EXPECT_NO_THROW(be_.gather_rows(x, idx, rows));
  EXPECT_NO_THROW(be_.linear(rows, w, nullptr, logits));
  EXPECT_NO_THROW(be_.embedding(idx, w, emb));
  EXPECT_NO_THROW(be_.rms_norm(rows, g, 1e-6f, rows));
  EXPECT_NO_THROW(be_.silu_mul(gate_up, rows));
  EXPECT_NO_THROW(be_.cast(rows, narrow));
  EXPECT_NO_THROW(be_.sample(logits, {}, idx));
  be_.synchronize();
  for (int i = 0; i < 64; ++i) ASSERT_EQ(canary.data<float>()[i], 1234.5f) << "an op on zero rows wrote element " << i;
  EXPECT_EQ(vec(x), x0);
  EXPECT_EQ(vec(w), w0);
  EXPECT_EQ(vec(g), g0);
}

TEST_F(CpuOps, ScratchArenaAcrossResets) {
  // Three steps with the same allocation pattern: within a step the tensors are aligned
  // and disjoint; from the second step on, no new memory (same addresses every step).
  std::vector<std::pair<Shape, DType>> pattern;
  for (int i = 0; i < 40; ++i)
    pattern.push_back({Shape{randint(0, 500), randint(1, 50)}, i % 3 ? DType::kF32 : DType::kBF16});
  pattern.push_back({Shape{3 << 20}, DType::kU8});  // larger than the first chunk
  std::vector<std::vector<void*>> addresses;
  for (int step = 0; step < 3; ++step) {
    be_.reset_scratch();
    std::vector<Tensor> ts;
    std::vector<void*> addr;
    for (size_t i = 0; i < pattern.size(); ++i) {
      Tensor t = be_.scratch(pattern[i].first, pattern[i].second);
      ASSERT_EQ(reinterpret_cast<uintptr_t>(t.raw()) % 64, 0u);
      ASSERT_EQ(t.shape(), pattern[i].first);
      std::memset(t.raw(), static_cast<int>(i + 1), t.nbytes());
      ts.push_back(t);
      addr.push_back(t.raw());
    }
    for (size_t i = 0; i < ts.size(); ++i) {
      const auto* p = static_cast<const uint8_t*>(ts[i].raw());
      for (size_t b = 0; b < ts[i].nbytes(); b += 97)
        ASSERT_EQ(p[b], static_cast<uint8_t>(i + 1)) << "overlap at " << i;
    }
    addresses.push_back(addr);
  }
  EXPECT_EQ(addresses[1], addresses[2]) << "steady state must reuse the arena";
}

TEST_F(CpuOps, ScratchMarksReuseMemoryPerLayer) {
  // As the model uses them: per layer, mark, take temporaries, rewind. Every layer then
  // gets the same addresses, and tensors taken before the mark are left alone.
  for (int step = 0; step < 3; ++step) {
    be_.reset_scratch();
    Tensor keep = be_.scratch({1000}, DType::kF32);
    std::fill_n(keep.data<float>(), 1000, 7.0f);
    std::vector<void*> first_layer;
    for (int layer = 0; layer < 4; ++layer) {
      const size_t mark = be_.scratch_mark();
      std::vector<void*> addr;
      for (int i = 0; i < 5; ++i) {
        Tensor t = be_.scratch({(i + 1) * 50000}, DType::kF32);  // spills over the first 1 MiB chunk
        ASSERT_TRUE(static_cast<char*>(t.raw()) >= static_cast<char*>(keep.raw()) + keep.nbytes() ||
                    static_cast<char*>(t.raw()) + t.nbytes() <= static_cast<char*>(keep.raw()));
        std::fill_n(t.data<float>(), t.numel(), static_cast<float>(layer));
        addr.push_back(t.raw());
      }
      const size_t inner = be_.scratch_mark();  // nested marks rewind independently
      Tensor tmp = be_.scratch({10}, DType::kF32);
      be_.scratch_rewind(inner);
      EXPECT_EQ(be_.scratch({10}, DType::kF32).raw(), tmp.raw());
      be_.scratch_rewind(mark);
      if (layer == 0)
        first_layer = addr;
      else if (step > 0)
        EXPECT_EQ(addr, first_layer) << "layer " << layer << " step " << step;
    }
    for (int i = 0; i < 1000; ++i) ASSERT_EQ(keep.data<float>()[i], 7.0f) << "a rewind clobbered older scratch";
  }
  EXPECT_THROW(be_.scratch_rewind(12345), Error);
}

TEST_F(CpuOps, ScratchFromAnEarlierStepStaysValidMemory) {
  // Contract: scratch is valid until reset_scratch; holding a tensor past it must not
  // turn into a use-after-free when the arena merges its chunks (ASan checks this).
  Tensor held = be_.scratch({1 << 18}, DType::kF32);
  Tensor more = be_.scratch({1 << 19}, DType::kF32);  // forces a second chunk
  be_.reset_scratch();                                // merges chunks into one
  std::fill_n(held.data<float>(), held.numel(), 1.0f);
  std::fill_n(more.data<float>(), more.numel(), 2.0f);
  EXPECT_EQ(held.data<float>()[held.numel() - 1], 1.0f);
}

// ---- mixture of experts ----

TEST_F(CpuOps, MoeTopkSoftmaxTiesAndRenormalize) {
  for (int rep = 0; rep < 24; ++rep) {
    const int E = randint(8, 64), k = std::min(E, 1 + rep % 8), T = randint(1, 40);
    const bool renormalize = rep % 2 == 0;
    // Logits on a coarse grid (multiples of 1/4 in [-2, 2]): many exact ties, and distinct
    // logits far enough apart that f32 and double agree on the order.
    Tensor logits = be_.alloc({T, E}, DType::kF32);
    for (int64_t i = 0; i < logits.numel(); ++i) logits.data<float>()[i] = static_cast<float>(randint(-8, 8)) / 4;
    if (T > 1) std::fill_n(logits.data<float>() + E, E, 0.5f);  // a row of nothing but ties
    Tensor ids = poisoned({T, k}, DType::kI32), w = poisoned({T, k});
    be_.moe_topk(logits, k, renormalize, ids, w);
    std::vector<int32_t> want_ids;
    std::vector<double> want_w;
    optest::moe_topk_ref(vec(logits), E, k, renormalize, want_ids, want_w);
    const std::string what =
        "moe_topk E=" + std::to_string(E) + " k=" + std::to_string(k) + (renormalize ? " renormalized" : "");
    ASSERT_EQ(std::vector<int32_t>(ids.data<int32_t>(), ids.data<int32_t>() + T * k), want_ids) << what;
    expect_close(w, want_w, 1e-7, 1e-5, what);
    if (T > 1) {
      for (int j = 0; j < k; ++j) EXPECT_EQ(ids.data<int32_t>()[k + j], j) << "ties go to the lower id";
    }
  }
  EXPECT_THROW(be_.moe_topk(rand_f32({2, 4}), 5, true, poisoned({2, 5}, DType::kI32), poisoned({2, 5})), Error);
}

TEST_F(CpuOps, MoeExpertsRoutesGroupsAndCombines) {
  for (int rep = 0; rep < 12; ++rep) {
    const int E = randint(8, 64), k = std::min(E, randint(1, 8)), T = randint(1, 24);
    const int H = randint(4, 48), I = randint(2, 40);
    // Expert parallel on odd reps: this rank holds [begin, begin + E_local) of E experts.
    const int E_local = rep % 2 ? randint(1, E) : E, begin = rep % 2 ? randint(0, E - E_local) : 0;
    Tensor x = rand_f32({T, H}), gate_up = rand_f32({E_local, 2 * I, H}, -0.5f, 0.5f),
           down = rand_f32({E_local, H, I}, -0.5f, 0.5f);
    Tensor logits = rand_f32({T, E}, -3, 3), ids = be_.alloc({T, k}, DType::kI32), w = be_.alloc({T, k}, DType::kF32);
    be_.moe_topk(logits, k, rep % 3 == 0, ids, w);
    if (E_local < E && T > 1)  // one token whose experts are all on other ranks: its row comes out zero
      for (int j = 0; j < k; ++j)
        ids.data<int32_t>()[k + j] = begin > 0 ? j % begin : begin + E_local + j % (E - E_local);
    std::vector<int32_t> idv(ids.data<int32_t>(), ids.data<int32_t>() + T * k);
    Tensor out = poisoned({T, H});
    be_.moe_experts(x, gate_up, down, ids, w, begin, out);
    auto want = optest::moe_experts_ref(vec(x), vec(gate_up), vec(down), idv, vec(w), T, H, I, E_local, k, begin);
    expect_close(out, want, 1e-5, 1e-4,
                 "moe_experts E=" + std::to_string(E) + " local " + std::to_string(E_local) + " from " +
                     std::to_string(begin) + " k=" + std::to_string(k) + " T=" + std::to_string(T));
  }
  // No tokens: a no-op on empty tensors.
  be_.moe_experts(be_.scratch({0, 8}, DType::kF32), rand_f32({4, 6, 8}), rand_f32({4, 8, 3}),
                  be_.scratch({0, 2}, DType::kI32), be_.scratch({0, 2}, DType::kF32), 0,
                  be_.scratch({0, 8}, DType::kF32));
  // Mismatched expert tensors are refused.
  EXPECT_THROW(be_.moe_experts(rand_f32({1, 8}), rand_f32({4, 6, 8}), rand_f32({3, 8, 3}), i32({0}).view({1, 1}),
                               rand_f32({1, 1}), 0, poisoned({1, 8})),
               Error);
}

// ---- the op table, on the CPU backend against the plain references ----

class CpuOpTable : public ::testing::TestWithParam<optest::OpCase> {};

TEST_P(CpuOpTable, MatchesTheReference) {
  const optest::OpCase& c = GetParam();
  CpuBackend be;
  EXPECT_EQ(optest::compare(c.run(be), c.reference(), c.tolerance(be)), "") << c.name;
}

INSTANTIATE_TEST_SUITE_P(Table, CpuOpTable, ::testing::ValuesIn(optest::op_cases()),
                         [](const auto& info) { return optest::test_name(info.param.name); });

// A Backend op declared without a case in the table fails here (and a case of an op the interface
// no longer declares).
TEST(OpTable, EveryBackendOpHasACase) {
  std::ifstream f(TESSERA_SOURCE_DIR "/src/backend/backend.h");
  ASSERT_TRUE(f) << "src/backend/backend.h not found";
  std::stringstream header;
  header << f.rdbuf();
  const std::vector<std::string> declared = optest::declared_backend_ops(header.str());
  ASSERT_GE(declared.size(), 20u) << "backend.h's ops were not found; has its '// ---- ops' line moved?";
  std::set<std::string> covered;
  for (const auto& c : optest::op_cases()) covered.insert(c.op);
  for (const auto& op : declared)
    EXPECT_EQ(covered.count(op), 1u) << "Backend::" << op << " has no case in tests/backend/op_table.cpp";
  for (const auto& op : covered)
    EXPECT_NE(std::find(declared.begin(), declared.end(), op), declared.end())
        << "the table checks " << op << ", which backend.h does not declare";
}

TEST(OpTable, DeclaredOpsAreTheVirtualMembersAfterTheOpsLine) {
  const std::string header = R"(class Backend {
  virtual Tensor alloc(Shape shape, DType dtype) = 0;
  // ---- ops; shapes in comments
  virtual void embedding(const Tensor& ids, const Tensor& table,
                         const Tensor& out) = 0;
  // ---- mixture of experts ----
  virtual std::unique_ptr<CapturedGraph> odd_one(int x) { return nullptr; }
  void not_virtual();
};
virtual void after_the_class();)";
  EXPECT_EQ(optest::declared_backend_ops(header), (std::vector<std::string>{"embedding", "odd_one"}));
}

}  // namespace
}  // namespace tessera
