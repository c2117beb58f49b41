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

// The CPU backend's sample() against properties computed here from the logits alone (not
// against sample_row_host, which it calls): each row is sampled from its own logits with its
// own controls, so a wrong row offset, a row's controls applied to another, or a filter that
// is not applied shows up.
TEST(Sampling, CpuBackendSamplesEveryRowByTheRule) {
  auto be = make_backend({DeviceType::kCPU, 0, 1});
  const int64_t n = 12, V = 333;
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0, 2);
  std::vector<float> host(static_cast<size_t>(n * V));
  for (float& v : host) v = d(rng);
  // Rows 9..11: one token far above the rest (at a different id in each row), drawn at
  // temperature 1 it is taken with probability ~1 - V * e^-40.
  for (int64_t i = 9; i < n; ++i) host[static_cast<size_t>(i * V + 17 * i)] = 60.0f;
  std::vector<SamplingRow> rows;
  for (int i = 0; i < n; ++i) {
    SamplingRow r;
    r.seed = static_cast<uint64_t>(i);
    r.position = static_cast<uint64_t>(3 * i);
    switch (i % 4) {
      case 0:
        r.temperature = 0.0f;
        break;  // greedy
      case 1:
        r = drawn(0.8f, 5);
        r.seed = i;
        break;  // top-k 5
      case 2:
        r = drawn(1.0f, 0, 0.5f);
        r.seed = i;
        break;  // top-p 0.5
      default:
        r = drawn(1.0f, 0, 1.0f, 0.5f);
        r.seed = i;
        break;  // min-p 0.5
    }
    if (i >= 9) r = drawn(1.0f);
    rows.push_back(r);
  }
  auto sample = [&](const std::vector<float>& logits, const std::vector<SamplingRow>& rs) {
    Tensor t = be->alloc({n, V}, DType::kF32);
    std::copy(logits.begin(), logits.end(), t.data<float>());
    Tensor out = be->alloc({n}, DType::kI32);
    std::fill_n(out.data<int32_t>(), n, -1);
    be->sample(t, rs, out);
    return std::vector<int32_t>(out.data<int32_t>(), out.data<int32_t>() + n);
  };
  const std::vector<int32_t> got = sample(host, rows);
  for (int64_t i = 0; i < n; ++i) {
    const float* x = host.data() + i * V;
    const int32_t tok = got[static_cast<size_t>(i)];
    ASSERT_TRUE(tok >= 0 && tok < V) << "row " << i << ": " << tok;
    const SamplingRow& r = rows[static_cast<size_t>(i)];
    std::vector<int32_t> order(static_cast<size_t>(V));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return x[a] > x[b]; });
    const int rank = static_cast<int>(std::find(order.begin(), order.end(), tok) - order.begin());
    if (i >= 9) {
      EXPECT_EQ(tok, 17 * i) << "row " << i << " did not take its own dominant token";
    } else if (r.temperature == 0.0f) {
      EXPECT_EQ(tok, order[0]) << "greedy row " << i;
    } else if (r.top_k > 0) {
      EXPECT_LT(rank, r.top_k) << "top-k row " << i;
    } else if (r.top_p < 1.0f) {
      const auto p = softmax(std::vector<float>(x, x + V), r.temperature);
      double mass = 0;  // the nucleus: the smallest prefix by probability whose mass reaches top_p
      int keep = 0;
      while (mass < r.top_p) mass += p[static_cast<size_t>(order[static_cast<size_t>(keep++)])];
      EXPECT_LT(rank, keep) << "top-p row " << i;
    } else {
      const auto p = softmax(std::vector<float>(x, x + V), r.temperature);
      EXPECT_GE(p[static_cast<size_t>(tok)], r.min_p * p[static_cast<size_t>(order[0])]) << "min-p row " << i;
    }
  }
  // The rows in reverse order (logits and controls together) give the same tokens, reversed.
  std::vector<float> rev_host(host.size());
  std::vector<SamplingRow> rev_rows(rows.rbegin(), rows.rend());
  for (int64_t i = 0; i < n; ++i) std::copy_n(host.data() + (n - 1 - i) * V, V, rev_host.data() + i * V);
  std::vector<int32_t> rev = sample(rev_host, rev_rows);
  std::reverse(rev.begin(), rev.end());
  EXPECT_EQ(rev, got);
  // Other seeds draw other tokens for the drawn rows (and the same for the greedy ones).
  std::vector<SamplingRow> reseeded = rows;
  for (auto& r : reseeded) r.seed += 1000;
  std::vector<int32_t> other = sample(host, reseeded);
  int differ = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (rows[static_cast<size_t>(i)].temperature == 0.0f)
      EXPECT_EQ(other[static_cast<size_t>(i)], got[static_cast<size_t>(i)]);
    differ += other[static_cast<size_t>(i)] != got[static_cast<size_t>(i)];
  }
  EXPECT_GT(differ, 0) << "the seed does not reach the draw";
}

}  // namespace
}  // namespace tessera
