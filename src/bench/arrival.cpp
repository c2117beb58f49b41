#include "bench/arrival.h"

#include <cmath>
#include <random>

#include "core/error.h"

namespace tessera::bench {

std::vector<double> arrival_times(const ArrivalProcess& process, size_t count, uint64_t seed) {
  std::vector<double> times(count, 0.0);
  if (std::isinf(process.request_rate)) return times;
  if (!(process.request_rate > 0))
    fail(ErrorKind::kInvalidArgument, "--request-rate must be a positive number or 'inf', got {}",
         process.request_rate);
  if (!(process.burstiness > 0))
    fail(ErrorKind::kInvalidArgument, "--burstiness must be positive (1 = Poisson), got {}", process.burstiness);
  std::mt19937_64 rng(seed);
  std::gamma_distribution<double> gap(process.burstiness, 1.0 / (process.request_rate * process.burstiness));
  double t = 0;
  // The first request goes at once, as in vLLM's benchmark; every later one waits a gap.
  for (size_t i = 1; i < count; ++i) {
    t += gap(rng);
    times[i] = t;
  }
  return times;
}

}  // namespace tessera::bench
