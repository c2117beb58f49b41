#include "bench/arrival.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/error.h"

namespace tessera::bench {
namespace {

struct GapMoments {
  double mean = 0;
  double coefficient_of_variation = 0;
};

GapMoments gap_moments(const std::vector<double>& times) {
  std::vector<double> gaps;
  for (size_t i = 1; i < times.size(); ++i) gaps.push_back(times[i] - times[i - 1]);
  double mean = 0, var = 0;
  for (double g : gaps) mean += g;
  mean /= gaps.size();
  for (double g : gaps) var += (g - mean) * (g - mean);
  var /= gaps.size() - 1;
  return {mean, std::sqrt(var) / mean};
}

TEST(Arrival, InfiniteRateReleasesEverythingAtOnce) {
  auto times = arrival_times({}, 10, 0);
  ASSERT_EQ(times.size(), 10u);
  for (double t : times) EXPECT_EQ(t, 0);
}

TEST(Arrival, PoissonGapsHaveMeanOneOverRateAndUnitVariation) {
  auto times = arrival_times({20.0, 1.0}, 40001, 42);
  EXPECT_EQ(times[0], 0);
  for (size_t i = 1; i < times.size(); ++i) ASSERT_GE(times[i], times[i - 1]);
  GapMoments m = gap_moments(times);
  EXPECT_NEAR(m.mean, 0.05, 0.05 * 0.02);
  EXPECT_NEAR(m.coefficient_of_variation, 1.0, 0.03);  // exponential: sd == mean
}

TEST(Arrival, GammaBurstinessChangesVariationNotMean) {
  for (double shape : {0.25, 4.0}) {
    SCOPED_TRACE(shape);
    GapMoments m = gap_moments(arrival_times({10.0, shape}, 40001, 7));
    EXPECT_NEAR(m.mean, 0.1, 0.1 * 0.03);
    EXPECT_NEAR(m.coefficient_of_variation, 1.0 / std::sqrt(shape), 0.05 / std::sqrt(shape));
  }
}

TEST(Arrival, SameSeedSameSchedule) {
  EXPECT_EQ(arrival_times({5.0, 1.0}, 100, 3), arrival_times({5.0, 1.0}, 100, 3));
  EXPECT_NE(arrival_times({5.0, 1.0}, 100, 3), arrival_times({5.0, 1.0}, 100, 4));
}

TEST(Arrival, RejectsNonsense) {
  EXPECT_THROW(arrival_times({-1.0, 1.0}, 3, 0), Error);
  EXPECT_THROW(arrival_times({1.0, 0.0}, 3, 0), Error);
}

}  // namespace
}  // namespace tessera::bench
