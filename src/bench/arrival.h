// When each request of a run is released: all at once (rate inf) or by a Poisson / gamma process.
#pragma once
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace tessera::bench {

struct ArrivalProcess {
  // Requests per second on average; infinity releases every request at time 0.
  double request_rate = std::numeric_limits<double>::infinity();
  // Gamma shape, as vLLM's --burstiness: 1 is a Poisson process, below 1 burstier, above 1
  // more regular. The mean gap stays 1/request_rate whatever the shape.
  double burstiness = 1.0;
};

// Release times in seconds from the start of the run, one per request, non-decreasing.
// The gaps are gamma(shape = burstiness, scale = 1 / (rate * burstiness)), drawn from `seed`.
std::vector<double> arrival_times(const ArrivalProcess& process, size_t count, uint64_t seed);

}  // namespace tessera::bench
