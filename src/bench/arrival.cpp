#include "bench/arrival.h"

#include <cmath>
#include <random>

#include "core/error.h"

namespace tessera::bench {

RampUp parse_ramp_up(const std::string& text) {
  if (text == "linear") return RampUp::kLinear;
  if (text == "exponential") return RampUp::kExponential;
  fail(ErrorKind::kInvalidArgument, "--ramp-up-strategy '{}': expected linear or exponential", text);
}

const char* ramp_up_name(RampUp ramp) {
  switch (ramp) {
    case RampUp::kLinear:
      return "linear";
    case RampUp::kExponential:
      return "exponential";
    case RampUp::kNone:
      break;
  }
  return "none";
}

double rate_at(const ArrivalProcess& process, size_t index, size_t count) {
  if (process.ramp == RampUp::kNone) return process.request_rate;
  const double progress = static_cast<double>(index) / static_cast<double>(count > 1 ? count - 1 : 1);
  const double start = process.ramp_start_rps, end = process.ramp_end_rps;
  if (process.ramp == RampUp::kLinear) return start + (end - start) * progress;
  return start * std::pow(end / start, progress);
}

namespace {

void check_arrival_process(const ArrivalProcess& process) {
  if (!(process.burstiness > 0))
    fail(ErrorKind::kInvalidArgument, "--burstiness must be positive (1 = Poisson), got {}", process.burstiness);
  if (process.ramp == RampUp::kNone) {
    if (!(process.request_rate > 0))
      fail(ErrorKind::kInvalidArgument, "--request-rate must be a positive number or 'inf', got {}",
           process.request_rate);
    return;
  }
  if (process.ramp_start_rps < 1 || process.ramp_end_rps < process.ramp_start_rps)
    fail(ErrorKind::kInvalidArgument,
         "--ramp-up-start-rps ({}) must be at least 1 and at most --ramp-up-end-rps ({}): the first request is "
         "released at the start rate",
         process.ramp_start_rps, process.ramp_end_rps);
}

}  // namespace

std::vector<double> arrival_times(const ArrivalProcess& process, size_t count, uint64_t seed) {
  std::vector<double> times(count, 0.0);
  check_arrival_process(process);
  if (process.ramp == RampUp::kNone && std::isinf(process.request_rate)) return times;
  std::mt19937_64 rng(seed);
  double t = 0;
  // The first request goes at once, as in vLLM's benchmark; every later one waits a gap drawn at its own rate.
  std::gamma_distribution<double> gap;
  using Shape = std::gamma_distribution<double>::param_type;
  for (size_t i = 1; i < count; ++i) {
    const double rate = rate_at(process, i, count);
    t += gap(rng, Shape(process.burstiness, 1.0 / (rate * process.burstiness)));
    times[i] = t;
  }
  return times;
}

}  // namespace tessera::bench
