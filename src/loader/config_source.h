// The file a ModelConfig was read from, as error messages name it: "<model_dir>/config.json",
// or "config" for one parsed without a model directory.
#pragma once
#include <string>

#include "loader/model_config.h"

namespace tessera {

inline std::string config_source(const ModelConfig& config) {
  return config.model_dir.empty() ? std::string("config") : config.model_dir + "/config.json";
}

}  // namespace tessera
