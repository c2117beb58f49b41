// Qwen3NextForCausalLM: a hybrid of Gated DeltaNet layers (Qwen3-Next's interleaved
// in_proj_qkvz / in_proj_ba) and gated full attention (q/k norm, partial rotary, output gate),
// zero-centred (1 + w) RMSNorms, and MoE blocks with a sigmoid-gated shared expert (dense
// SwiGLU MLPs in mlp_only_layers / off decoder_sparse_step).
#include "model/decoder.h"
#include "model/registry.h"

namespace tessera {

std::unique_ptr<Model> make_qwen3_next(const ModelConfig& config, const ModelOptions& options, Backend& backend) {
  DecoderSpec spec = hybrid_decoder_spec(config, GdnLayout::kInterleaved);
  const MoeOptions moe = moe_options(config);
  spec.feed_forward = [moe](BlockContext& ctx, int layer, const std::string& prefix) {
    return moe_or_dense(ctx, layer, prefix, moe);
  };
  return std::make_unique<DecoderModel>(config, std::move(spec), options, backend);
}

}  // namespace tessera
