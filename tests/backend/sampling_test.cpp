// The sampling rule (backend/sampling.h) on the host and through the CPU backend: greedy
// ties, what top-k / top-p / min-p keep, the drawn distribution, and that a draw depends on
// (seed, position) only.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "backend/backend.h"
#include "backend/sampling.h"

namespace tessera {
namespace {

SamplingRow drawn(float t, int top_k = 0, float top_p = 1.0f, float min_p = 0.0f) {
  SamplingRow r;
  r.temperature = t;
  r.top_k = top_k;
  r.top_p = top_p;
  r.min_p = min_p;
  r.seed = 99;
  return r;
}

std::vector<double> softmax(const std::vector<float>& x, float t) {
  const float m = *std::max_element(x.begin(), x.end());
  std::vector<double> p(x.size());
  double z = 0;
  for (size_t i = 0; i < x.size(); ++i) z += p[i] = std::exp((x[i] - m) / t);
  for (double& v : p) v /= z;
  return p;
}

// Frequencies over `draws` positions.
std::vector<double> frequencies(const std::vector<float>& x, SamplingRow row, int draws) {
  std::vector<double> f(x.size(), 0.0);
  for (int i = 0; i < draws; ++i) {
    row.position = static_cast<uint64_t>(i);
    f[static_cast<size_t>(sample_row_host(x.data(), static_cast<int64_t>(x.size()), row))] += 1.0 / draws;
  }
  return f;
}

TEST(Sampling, GreedyTakesTheFirstMaximum) {
  std::vector<float> x = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f};
  EXPECT_EQ(sample_row_host(x.data(), 5, SamplingRow{}), 1);
  EXPECT_EQ(sample_row_host(x.data(), 5, drawn(1e-6f)), 1);
  // top-k 1 keeps the largest value, and ties at a threshold keep every copy of it.
  const int32_t t = sample_row_host(x.data(), 5, drawn(1.0f, 1));
  EXPECT_TRUE(t == 1 || t == 3) << t;
  x[3] = 1.99f;
  EXPECT_EQ(sample_row_host(x.data(), 5, drawn(1.0f, 1)), 1);
}

TEST(Sampling, DrawsFollowTheSoftmax) {
  std::vector<float> x = {1.0f, 0.0f, 2.0f, -1.0f, 0.5f, 1.5f};
  for (float t : {0.5f, 1.0f, 2.0f}) {
    auto f = frequencies(x, drawn(t), 40000);
    auto p = softmax(x, t);
    for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(f[i], p[i], 0.012) << "t=" << t << " token " << i;
  }
}

TEST(Sampling, TopKTopPMinPKeepWhatVllmKeeps) {
  std::vector<float> x = {3.0f, 2.0f, 1.0f, 0.0f, -1.0f, -2.0f, 2.5f, 0.5f};
  auto p = softmax(x, 1.0f);
  std::vector<size_t> order(x.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return x[a] > x[b]; });
  // top-k 3: tokens 0, 6, 1 in proportion.
  auto f = frequencies(x, drawn(1.0f, 3), 30000);
  double z3 = p[0] + p[6] + p[1];
  for (size_t i = 0; i < x.size(); ++i) {
    const bool kept = i == 0 || i == 6 || i == 1;
    EXPECT_NEAR(f[i], kept ? p[i] / z3 : 0.0, 0.012) << "top-k token " << i;
  }
  // top-p 0.6: the smallest prefix by probability whose mass reaches 0.6.
  double acc = 0;
  size_t keep = 0;
  while (acc < 0.6) acc += p[order[keep++]];
  f = frequencies(x, drawn(1.0f, 0, 0.6f), 30000);
  for (size_t r = 0; r < order.size(); ++r) {
    const size_t i = order[r];
    EXPECT_NEAR(f[i], r < keep ? p[i] / acc : 0.0, 0.012) << "top-p token " << i;
  }
  // top-p after top-k: 0.9 of the top-3 mass keeps tokens 0 and 6 here (p0 + p6 >= 0.9 * z3? else also 1).
  f = frequencies(x, drawn(1.0f, 3, 0.7f), 30000);
  EXPECT_EQ(f[1] > 0, (p[0] + p[6]) / z3 < 0.7);
  for (size_t i : {2u, 3u, 4u, 5u, 7u}) EXPECT_EQ(f[i], 0.0);
  // min-p 0.3: tokens with p >= 0.3 * p_max.
  f = frequencies(x, drawn(1.0f, 0, 1.0f, 0.3f), 20000);
  for (size_t i = 0; i < x.size(); ++i)
    if (p[i] < 0.3 * p[0]) EXPECT_EQ(f[i], 0.0) << "min-p token " << i;
}

TEST(Sampling, ADrawDependsOnSeedAndPositionOnly) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> d(-3, 3);
  std::vector<float> x(5000);
  for (float& v : x) v = d(rng);
  SamplingRow r = drawn(1.0f, 0, 0.95f);
  r.position = 12;
  const int32_t a = sample_row_host(x.data(), 5000, r);
  EXPECT_EQ(sample_row_host(x.data(), 5000, r), a);
  std::set<int32_t> seen;
  for (uint64_t pos = 0; pos < 50; ++pos) {
    r.position = pos;
    seen.insert(sample_row_host(x.data(), 5000, r));
  }
  EXPECT_GT(seen.size(), 10u);
  r.position = 12;
  r.seed = 100;
  std::set<int32_t> by_seed;
  for (uint64_t seed = 0; seed < 50; ++seed) {
    r.seed = seed;
    by_seed.insert(sample_row_host(x.data(), 5000, r));
  }
  EXPECT_GT(by_seed.size(), 10u);
}

TEST(Sampling, CpuBackendSamplesEveryRowByTheRule) {
  auto be = make_backend({DeviceType::kCPU, 0, 1});
  const int64_t n = 9, V = 333;
  Tensor logits = be->alloc({n, V}, DType::kF32);
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0, 2);
  for (int64_t i = 0; i < n * V; ++i) logits.data<float>()[i] = d(rng);
  std::vector<SamplingRow> rows;
  for (int i = 0; i < n; ++i) {
    SamplingRow r = drawn(i == 0 ? 0.0f : 0.8f, i % 3 == 1 ? 20 : 0, i % 2 ? 0.9f : 1.0f);
    r.seed = static_cast<uint64_t>(i);
    rows.push_back(r);
  }
  Tensor out = be->alloc({n}, DType::kI32);
  be->sample(logits, rows, out);
  for (int64_t i = 0; i < n; ++i)
    EXPECT_EQ(out.data<int32_t>()[i], sample_row_host(logits.data<float>() + i * V, V, rows[static_cast<size_t>(i)]));
}

}  // namespace
}  // namespace tessera
