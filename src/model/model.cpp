#include "model/model.h"

#include "core/error.h"

namespace tessera {

QuantConfig weight_quantization(const ModelConfig& config, const ModelOptions& options) {
  QuantConfig q = config.quant;
  if (options.quantization.empty()) return q;
  if (options.quantization != "fp8")
    fail(ErrorKind::kUnsupported, "--quantization {} is not supported (supported: fp8)", options.quantization);
  if (!q.fp8()) {
    q.format = fp8_block_format();
    q.from_checkpoint = false;
  }
  return q;
}

Tensor Model::run_mtp(const StepInputs&, const Tensor&, const Tensor&, KvCache&) {
  fail(ErrorKind::kUnsupported, "{} has no multi-token-prediction layer", config().architecture);
}

}  // namespace tessera
