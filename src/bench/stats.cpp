#include "bench/stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace tessera::bench {

double percentile_of_sorted(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  q = std::clamp(q, 0.0, 100.0);
  double rank = q / 100.0 * static_cast<double>(sorted.size() - 1);
  size_t lower = static_cast<size_t>(std::floor(rank));
  size_t upper = std::min(lower + 1, sorted.size() - 1);
  double fraction = rank - static_cast<double>(lower);
  return sorted[lower] + (sorted[upper] - sorted[lower]) * fraction;
}

Summary summarize(std::vector<double> sample) {
  Summary s;
  if (sample.empty()) return s;
  std::sort(sample.begin(), sample.end());
  s.count = sample.size();
  s.mean = std::accumulate(sample.begin(), sample.end(), 0.0) / static_cast<double>(sample.size());
  s.median = percentile_of_sorted(sample, 50);
  s.p90 = percentile_of_sorted(sample, 90);
  s.p95 = percentile_of_sorted(sample, 95);
  s.p99 = percentile_of_sorted(sample, 99);
  s.min = sample.front();
  s.max = sample.back();
  return s;
}

}  // namespace tessera::bench
