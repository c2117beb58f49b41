#pragma once
#include <vector>

#include "backend/backend.h"
#include "loader/model_config.h"

namespace tessera {

// Inverse frequencies and the attention factor of a config's rotary embedding,
// following transformers' rope initialisation functions for each rope type.
struct RopeFrequencies {
  std::vector<double> inv_freq;  // rotary_dim / 2
  double attention_factor = 1.0;
  int rotary_dim = 0;
};
RopeFrequencies compute_rope_frequencies(const ModelConfig& config);

// The [max_positions, rotary_dim] cos|sin table in backend memory.
RopeTable make_rope_table(const ModelConfig& config, int max_positions, Backend& backend);

}  // namespace tessera
