#include "model/model.h"

#include "core/error.h"

namespace tessera {

void check_step_input(const ModelInput& in, int vocab, int max_positions) {
  TESSERA_CHECK(!in.token_ids.empty() && in.positions.size() == in.token_ids.size(), "forward: {} tokens, {} positions",
                in.token_ids.size(), in.positions.size());
  for (int32_t id : in.token_ids)
    if (id < 0 || id >= vocab) fail(ErrorKind::kInvalidArgument, "token id {} outside the vocabulary", id);
  for (int32_t p : in.positions)
    if (p < 0 || p >= max_positions)
      fail(ErrorKind::kInvalidArgument, "position {} is beyond the model's {} positions", p, max_positions);
}

StepInputs upload_step_inputs(Backend& be, const ModelInput& in, int vocab, int max_positions) {
  check_step_input(in, vocab, max_positions);
  const int64_t T = static_cast<int64_t>(in.token_ids.size());
  StepInputs s;
  s.token_ids = be.scratch({T}, DType::kI32);
  be.copy_from_host(s.token_ids, in.token_ids.data());
  s.positions = be.scratch({T}, DType::kI32);
  be.copy_from_host(s.positions, in.positions.data());
  const int64_t n = static_cast<int64_t>(in.logits_indices.size());
  s.logits_indices = be.scratch({n}, DType::kI32);
  if (n > 0) be.copy_from_host(s.logits_indices, in.logits_indices.data());
  s.attention = upload_attention_metadata(be, in.attention);
  if (!in.linear.query_start_loc.empty()) s.linear = upload_linear_attn_metadata(be, in.linear);
  return s;
}

QuantConfig weight_quantization(const ModelConfig& config, const ModelOptions& options) {
  QuantConfig q = config.quant;
  if (options.quantization.empty()) return q;
  if (options.quantization != "fp8")
    fail(ErrorKind::kUnsupported, "--quantization {} is not supported (supported: fp8)", options.quantization);
  if (!q.fp8()) {
    q.method = QuantConfig::Method::kFp8Block;
    q.from_checkpoint = false;
  }
  return q;
}

}  // namespace tessera
