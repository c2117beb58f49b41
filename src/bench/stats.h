// Summary statistics of a sample (latencies, token gaps), with numpy's default percentile rule.
#pragma once
#include <cstddef>
#include <vector>

namespace tessera::bench {

struct Summary {
  size_t count = 0;
  double mean = 0;
  double median = 0;
  double p90 = 0;
  double p95 = 0;
  double p99 = 0;
  double min = 0;
  double max = 0;
};

// Percentile q in [0, 100] of an ascending-sorted sample, interpolating linearly between the
// two nearest ranks (numpy.percentile's default, which vLLM's benchmark reports use too).
// Returns 0 for an empty sample.
double percentile_of_sorted(const std::vector<double>& sorted, double q);

// Sorts a copy; an empty sample gives an all-zero summary with count 0.
Summary summarize(std::vector<double> sample);

}  // namespace tessera::bench
