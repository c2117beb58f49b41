// When each request of a run is released: all at once (rate inf), by a Poisson / gamma process, or by one whose
// rate ramps from a start to an end value over the run (vLLM's --ramp-up-strategy).
#pragma once
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace tessera::bench {

enum class RampUp { kNone, kLinear, kExponential };

struct ArrivalProcess {
  // Requests per second on average; infinity releases every request at time 0. Unused with a ramp.
  double request_rate = std::numeric_limits<double>::infinity();
  // Gamma shape, as vLLM's --burstiness: 1 is a Poisson process, below 1 burstier, above 1
  // more regular. The mean gap stays 1/rate whatever the shape.
  double burstiness = 1.0;
  // vLLM's --ramp-up-strategy / --ramp-up-start-rps / --ramp-up-end-rps: request i of n is released at the rate
  // start + (end - start) * i / (n - 1) (linear) or start * (end / start)^(i / (n - 1)) (exponential).
  RampUp ramp = RampUp::kNone;
  int ramp_start_rps = 0;
  int ramp_end_rps = 0;
};

// "linear" / "exponential" (vLLM's choices); throws tessera::Error naming the flag for anything else.
RampUp parse_ramp_up(const std::string& text);
const char* ramp_up_name(RampUp ramp);

// The rate (requests per second) at which request `index` of `count` is released: the ramp's value there, or
// request_rate without a ramp.
double rate_at(const ArrivalProcess& process, size_t index, size_t count);

// Release times in seconds from the start of the run, one per request, non-decreasing. The first request goes at
// once; the gap before request i is gamma(shape = burstiness, scale = 1 / (rate_i * burstiness)), with rate_i =
// rate_at(i), drawn from `seed`. Throws tessera::Error for a rate or shape that is not positive.
std::vector<double> arrival_times(const ArrivalProcess& process, size_t count, uint64_t seed);

}  // namespace tessera::bench
