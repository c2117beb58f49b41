// Builds a model from a directory and fills its weights (checkpoint or dummy), with
// vLLM-style log lines and a progress bar. Shared by `generate` and `serve`.
#pragma once
#include <memory>
#include <string>

#include "model/model.h"

namespace tessera {

struct LoadOptions {
  std::string model_dir;
  std::string load_format = "auto";  // auto | safetensors | dummy
  int max_model_len = 0;             // sizes the rotary table; 0 = config
  ParallelContext parallel;
  ParallelRuntime runtime;  // this rank's TP/PP communicators (TP/PP > 1)
  uint64_t seed = 0;
  std::string quantization;  // --quantization: "" (the checkpoint's format) or "fp8"
  // --speculative-config method mtp: build and load the checkpoint's MTP layer (mtp.* weights);
  // a checkpoint without them fails here, naming what is missing.
  bool mtp = false;
};

std::unique_ptr<Model> load_model(const LoadOptions& options, Backend& backend);

}  // namespace tessera
