#include "model/rope.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace tessera {

namespace {

double yarn_get_mscale(double scale, double mscale) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

}  // namespace

RopeFrequencies compute_rope_frequencies(const ModelConfig& c) {
  RopeFrequencies r;
  int dim = static_cast<int>(c.head_dim * c.partial_rotary_factor);
  dim -= dim % 2;
  r.rotary_dim = dim;
  int half = dim / 2;
  double base = c.rope_theta;
  const RopeScaling& s = c.rope;
  if (s.type == "dynamic") {
    // As vLLM: one static table sized for max_position_embeddings * factor.
    double max_len = static_cast<double>(c.max_position_embeddings) * s.factor;
    int orig = s.original_max_position_embeddings ? s.original_max_position_embeddings : c.max_position_embeddings;
    base = base * std::pow(s.factor * max_len / orig - (s.factor - 1), static_cast<double>(dim) / (dim - 2));
  }
  r.inv_freq.resize(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) {
    // transformers computes base ** (arange(0, dim, 2).float() / dim) in float32.
    float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
    r.inv_freq[i] = 1.0 / static_cast<double>(std::pow(static_cast<float>(base), exponent));
  }
  if (s.type == "linear") {
    for (auto& f : r.inv_freq) f /= s.factor;
  } else if (s.type == "llama3") {
    double old_len = s.original_max_position_embeddings;
    if (old_len <= 0) fail(ErrorKind::kCorrupt, "llama3 rope scaling needs original_max_position_embeddings");
    double low_wavelen = old_len / s.low_freq_factor, high_wavelen = old_len / s.high_freq_factor;
    for (auto& f : r.inv_freq) {
      double wavelen = 2 * M_PI / f;
      if (wavelen > low_wavelen) {
        f = f / s.factor;
      } else if (wavelen >= high_wavelen) {
        double smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        f = (1 - smooth) * f / s.factor + smooth * f;
      }
    }
  } else if (s.type == "yarn") {
    double factor = s.factor;
    int orig = c.max_position_embeddings;
    if (s.original_max_position_embeddings > 0) {
      orig = s.original_max_position_embeddings;
      // transformers derives the factor from the two lengths when both are given.
      factor = static_cast<double>(c.max_position_embeddings) / orig;
    }
    if (s.attention_factor)
      r.attention_factor = *s.attention_factor;
    else if (s.mscale != 0 && s.mscale_all_dim != 0)
      r.attention_factor = yarn_get_mscale(factor, s.mscale) / yarn_get_mscale(factor, s.mscale_all_dim);
    else
      r.attention_factor = yarn_get_mscale(factor, 1.0);
    auto correction_dim = [&](double rotations) {
      return (dim * std::log(orig / (rotations * 2 * M_PI))) / (2 * std::log(base));
    };
    double low = correction_dim(s.beta_fast), high = correction_dim(s.beta_slow);
    if (s.truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(dim - 1));
    if (low == high) high += 0.001;
    for (int i = 0; i < half; ++i) {
      double extrapolation = r.inv_freq[i], interpolation = r.inv_freq[i] / factor;
      double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
      double extrapolation_factor = 1 - ramp;
      r.inv_freq[i] = interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor;
    }
  }
  return r;
}

RopeTable make_rope_table(const ModelConfig& config, int max_positions, Backend& backend) {
  RopeFrequencies f = compute_rope_frequencies(config);
  int rd = f.rotary_dim, half = rd / 2;
  Tensor host = host_empty({max_positions, rd}, DType::kF32);
  float* p = host.data<float>();
  for (int pos = 0; pos < max_positions; ++pos) {
    for (int i = 0; i < half; ++i) {
      // float32 angle, as transformers computes position * inv_freq in float32.
      float angle = static_cast<float>(pos) * static_cast<float>(f.inv_freq[i]);
      p[pos * rd + i] = static_cast<float>(std::cos(angle) * f.attention_factor);
      p[pos * rd + half + i] = static_cast<float>(std::sin(angle) * f.attention_factor);
    }
  }
  RopeTable t;
  t.cos_sin = backend.alloc({max_positions, rd}, DType::kF32);
  backend.copy_from_host(t.cos_sin, p);
  backend.synchronize();
  t.rotary_dim = rd;
  t.neox_style = true;
  return t;
}

}  // namespace tessera
