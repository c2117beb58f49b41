#include "bench/stats.h"

#include <gtest/gtest.h>

namespace tessera::bench {
namespace {

// Expected values from numpy.percentile(x, q) (linear interpolation, numpy's default).
TEST(Stats, PercentilesMatchNumpyLinearInterpolation) {
  std::vector<double> sample = {15, 20, 35, 40, 50};
  EXPECT_DOUBLE_EQ(percentile_of_sorted(sample, 0), 15);
  EXPECT_DOUBLE_EQ(percentile_of_sorted(sample, 50), 35);
  EXPECT_DOUBLE_EQ(percentile_of_sorted(sample, 40), 29);  // np.percentile(x, 40) == 29.0
  EXPECT_DOUBLE_EQ(percentile_of_sorted(sample, 90), 46);  // 40 + 0.6 * 10
  EXPECT_DOUBLE_EQ(percentile_of_sorted(sample, 95), 48);
  EXPECT_DOUBLE_EQ(percentile_of_sorted(sample, 99), 49.6);
  EXPECT_DOUBLE_EQ(percentile_of_sorted(sample, 100), 50);
}

TEST(Stats, SummaryOfOneToHundred) {
  std::vector<double> sample;
  for (int i = 100; i >= 1; --i) sample.push_back(i);  // unsorted on purpose
  Summary s = summarize(sample);
  EXPECT_EQ(s.count, 100u);
  EXPECT_DOUBLE_EQ(s.mean, 50.5);
  EXPECT_DOUBLE_EQ(s.median, 50.5);
  EXPECT_DOUBLE_EQ(s.p90, 90.1);  // np.percentile(range(1, 101), 90)
  EXPECT_DOUBLE_EQ(s.p95, 95.05);
  EXPECT_DOUBLE_EQ(s.p99, 99.01);
  EXPECT_DOUBLE_EQ(s.min, 1);
  EXPECT_DOUBLE_EQ(s.max, 100);
}

TEST(Stats, EmptyAndSingleSamples) {
  Summary empty = summarize({});
  EXPECT_EQ(empty.count, 0u);
  EXPECT_EQ(empty.p99, 0);
  Summary one = summarize({7.5});
  EXPECT_DOUBLE_EQ(one.median, 7.5);
  EXPECT_DOUBLE_EQ(one.p99, 7.5);
  EXPECT_DOUBLE_EQ(one.max, 7.5);
}

}  // namespace
}  // namespace tessera::bench
