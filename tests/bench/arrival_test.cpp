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

ArrivalProcess ramp(RampUp strategy, int start, int end, double burstiness = 1.0) {
  ArrivalProcess p;
  p.burstiness = burstiness;
  p.ramp = strategy;
  p.ramp_start_rps = start;
  p.ramp_end_rps = end;
  return p;
}

TEST(Arrival, RampRatesFollowVllmsSchedule) {
  const ArrivalProcess linear = ramp(RampUp::kLinear, 2, 12);
  EXPECT_DOUBLE_EQ(rate_at(linear, 0, 11), 2);
  EXPECT_DOUBLE_EQ(rate_at(linear, 5, 11), 7);  // start + (end - start) * i / (n - 1)
  EXPECT_DOUBLE_EQ(rate_at(linear, 10, 11), 12);
  const ArrivalProcess exponential = ramp(RampUp::kExponential, 1, 16);
  EXPECT_DOUBLE_EQ(rate_at(exponential, 0, 5), 1);
  EXPECT_NEAR(rate_at(exponential, 1, 5), 2, 1e-12);  // start * (end / start)^(i / (n - 1))
  EXPECT_NEAR(rate_at(exponential, 2, 5), 4, 1e-12);
  EXPECT_NEAR(rate_at(exponential, 4, 5), 16, 1e-12);
  EXPECT_DOUBLE_EQ(rate_at(ArrivalProcess{3.0, 1.0}, 7, 9), 3);  // no ramp: the constant rate
  EXPECT_EQ(parse_ramp_up("linear"), RampUp::kLinear);
  EXPECT_EQ(parse_ramp_up("exponential"), RampUp::kExponential);
  EXPECT_THROW(parse_ramp_up("step"), Error);
}

// The gaps of a ramped schedule have the mean 1 / rate of where they are: early gaps long, late ones short.
TEST(Arrival, RampedGapsShrinkAsTheRateRises) {
  for (RampUp strategy : {RampUp::kLinear, RampUp::kExponential}) {
    SCOPED_TRACE(ramp_up_name(strategy));
    const size_t n = 60001;
    const ArrivalProcess process = ramp(strategy, 5, 50);
    const std::vector<double> times = arrival_times(process, n, 9);
    EXPECT_EQ(times[0], 0);
    for (size_t i = 1; i < n; ++i) ASSERT_GE(times[i], times[i - 1]);
    // Mean gap over windows near the start, middle and end against 1 / rate at their centre.
    for (size_t from : {size_t{1}, n / 2 - 2000, n - 4001}) {
      double sum = 0, expected = 0;
      for (size_t i = from; i < from + 4000; ++i) {
        sum += times[i] - times[i - 1];
        expected += 1.0 / rate_at(process, i, n);
      }
      EXPECT_NEAR(sum / expected, 1.0, 0.05) << "window from " << from;
    }
  }
  EXPECT_EQ(arrival_times(ramp(RampUp::kLinear, 2, 8), 50, 3), arrival_times(ramp(RampUp::kLinear, 2, 8), 50, 3));
}

TEST(Arrival, RampRefusesAZeroOrFallingRate) {
  EXPECT_THROW(arrival_times(ramp(RampUp::kLinear, 0, 5), 3, 0), Error);
  EXPECT_THROW(arrival_times(ramp(RampUp::kExponential, 0, 5), 3, 0), Error);
  EXPECT_THROW(arrival_times(ramp(RampUp::kLinear, 6, 5), 3, 0), Error);
  EXPECT_NO_THROW(arrival_times(ramp(RampUp::kLinear, 5, 5), 3, 0));
}

}  // namespace
}  // namespace tessera::bench
