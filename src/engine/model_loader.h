// Builds a model from a directory and fills its weights (checkpoint or dummy), with
// vLLM-style log lines and a progress bar. Shared by `generate` and `serve`.
#pragma once
#include <memory>
#include <string>

#include <nlohmann/json.hpp>
#include <vector>

#include "model/model.h"

namespace tessera {

struct LoadOptions {
  std::string model_dir;
  std::string load_format = "auto";  // auto | safetensors | dummy
  int max_model_len = 0;             // sizes the rotary table; 0 = config
  ParallelContext parallel;
  ParallelRuntime runtime;  // this rank's TP/PP communicators (TP/PP > 1)
  uint64_t seed = 0;
  std::string quantization;     // --quantization: "" (the checkpoint's format) or "fp8"
  nlohmann::json hf_overrides;  // --hf-overrides (and --rope-scaling / --rope-theta): over config.json
  // --speculative-config method mtp: build and load the checkpoint's MTP layer (mtp.* weights);
  // a checkpoint without them fails here, naming what is missing.
  bool mtp = false;
  // --check-weights: after loading, scan every weight for NaN/Inf and fail naming them (check_weights).
  bool check_weights = false;
  // --disable-sliding-window: every layer attends the whole context (ModelOptions::disable_sliding_window).
  bool disable_sliding_window = false;
};

std::unique_ptr<Model> load_model(const LoadOptions& options, Backend& backend);

// The loaded weights (this rank's slices, FP8 block scales included) that hold NaN or +-inf,
// by name in declaration order. Reads every weight through the host, in chunks.
struct NonFiniteWeights {
  std::vector<std::string> names;
  size_t tensors_checked = 0;
};
NonFiniteWeights find_nonfinite_weights(const WeightStore& weights, Backend& backend);
// find_nonfinite_weights, failing (ErrorKind::kCorrupt) with the first few names and the count.
void check_weights(const WeightStore& weights, Backend& backend, const std::string& model_dir);

}  // namespace tessera
