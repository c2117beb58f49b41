// LinearAttnOps (linear_attn_ops.h).
#include "backend/cuda/linear_attn_ops.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backend/cuda/cuda_ops.h"

namespace tessera::cuda {

void LinearAttnOps::check_linear_meta(const LinearAttnMetadata& m, int64_t T, const char* op) const {
  CUDA_REQUIRE(m.num_tokens == T && static_cast<int>(m.host_query_start_loc.size()) == m.num_seqs + 1 &&
                   m.state_slots.dtype() == DType::kI32 && m.has_initial_state.dtype() == DType::kI32,
               op, "metadata has " + std::to_string(m.num_tokens) + " tokens, the input " + std::to_string(T));
}

void LinearAttnOps::causal_conv1d(const Tensor& x, int64_t x_col, const Tensor& weight, const Tensor& conv_state,
                                  const LinearAttnMetadata& meta, const Tensor& out) {
  CUDA_REQUIRE(x.ndim() == 2 && out.ndim() == 2 && x.dtype() == DType::kBF16 && out.dtype() == DType::kBF16,
               "causal_conv1d", "x and out must be bf16 [T, *], got " + x.str() + ", " + out.str());
  CUDA_REQUIRE(conv_state.ndim() == 3 && (conv_state.dtype() == DType::kF32 || conv_state.dtype() == DType::kBF16),
               "causal_conv1d", "conv_state must be f32 or bf16 [num_slots, K-1, C], got " + conv_state.str());
  const int64_t T = x.dim(0), X = x.dim(1), C = out.dim(1), K = conv_state.dim(1) + 1;
  CUDA_REQUIRE(out.dim(0) == T && conv_state.dim(2) == C && weight.dim(0) == C && weight.numel() == C * K &&
                   act(weight) && x_col >= 0 && x_col + C <= X,
               "causal_conv1d",
               "shapes " + x.str() + " (column " + std::to_string(x_col) + "), " + weight.str() + ", " +
                   conv_state.str() + " -> " + out.str());
  if (K != 4)
    fail(ErrorKind::kUnsupported, "CUDA causal_conv1d supports kernel size 4 (linear_conv_kernel_dim), not {}", K);
  check_linear_meta(meta, T, "causal_conv1d");
  dev_.need_cuda(x, "causal_conv1d");
  dev_.need_cuda(conv_state, "causal_conv1d");
  dev_.bind();
  launch_causal_conv1d(x.raw(), X, x_col, weight.raw(), weight.dtype(), conv_state.raw(), conv_state.dtype(),
                       meta.query_start_loc.data<int32_t>(), meta.state_slots.data<int32_t>(),
                       meta.has_initial_state.data<int32_t>(),
                       meta.token_state_slots.defined() ? meta.token_state_slots.data<int32_t>() : nullptr, out.raw(),
                       static_cast<int>(C), meta.num_seqs, meta.max_query_len, dev_.stream());
}

void LinearAttnOps::gated_delta_rule(const Tensor& qkv, const Tensor& ba, int64_t ba_col, const Tensor& A_log,
                                     const Tensor& dt_bias, const Tensor& state, const LinearAttnMetadata& meta,
                                     const Tensor& out) {
  CUDA_REQUIRE(qkv.ndim() == 2 && ba.ndim() == 2 && out.ndim() == 3 && qkv.dtype() == DType::kBF16 &&
                   ba.dtype() == DType::kBF16 && out.dtype() == DType::kBF16,
               "gated_delta_rule", "qkv [T, C], ba [T, X], out [T, Hv, Dv] must be bf16");
  CUDA_REQUIRE(state.ndim() == 4 && (state.dtype() == DType::kF32 || state.dtype() == DType::kBF16), "gated_delta_rule",
               "state must be f32 or bf16 [num_slots, Hv, Dk, Dv], got " + state.str());
  const int64_t T = qkv.dim(0), Hv = state.dim(1), Dk = state.dim(2), Dv = state.dim(3), C = qkv.dim(1);
  const int64_t Hk = Dk > 0 ? (C - Hv * Dv) / (2 * Dk) : 0;
  CUDA_REQUIRE(Hk > 0 && 2 * Hk * Dk + Hv * Dv == C && Hv % Hk == 0 && out.dim(0) == T && out.dim(1) == Hv &&
                   out.dim(2) == Dv && ba.dim(0) == T && ba_col >= 0 && ba_col + 2 * Hv <= ba.dim(1) &&
                   A_log.numel() == Hv && dt_bias.numel() == Hv && act(A_log) && A_log.dtype() == dt_bias.dtype(),
               "gated_delta_rule",
               "shapes qkv " + qkv.str() + ", ba " + ba.str() + " (column " + std::to_string(ba_col) + "), A_log " +
                   A_log.str() + ", dt_bias " + dt_bias.str() + ", state " + state.str() + " -> " + out.str());
  if (!gdr_recurrent_supported(static_cast<int>(Dk)))
    fail(ErrorKind::kUnsupported, "CUDA gated_delta_rule supports key head dims 16, 32, 64, 128 and 256, not {}", Dk);
  check_linear_meta(meta, T, "gated_delta_rule");
  dev_.need_cuda(qkv, "gated_delta_rule");
  dev_.need_cuda(state, "gated_delta_rule");
  dev_.bind();
  GatedDeltaRuleArgs a{};
  a.qkv = qkv.raw();
  a.ba = ba.raw();
  a.ba_stride = ba.dim(1);
  a.ba_col = ba_col;
  a.A_log = A_log.raw();
  a.dt_bias = dt_bias.raw();
  a.param_t = A_log.dtype();
  a.state = state.raw();
  a.state_t = state.dtype();
  a.qsl = meta.query_start_loc.data<int32_t>();
  a.slots = meta.state_slots.data<int32_t>();
  a.has_init = meta.has_initial_state.data<int32_t>();
  a.token_slots = meta.token_state_slots.defined() ? meta.token_state_slots.data<int32_t>() : nullptr;
  a.out = out.raw();
  a.num_seqs = meta.num_seqs;
  a.Hk = static_cast<int>(Hk);
  a.Hv = static_cast<int>(Hv);
  a.Dk = static_cast<int>(Dk);
  a.Dv = static_cast<int>(Dv);
  a.scale = 1.0f / std::sqrt(static_cast<float>(Dk));
  // Several tokens in a sequence: the chunked tensor-core path where the head dims allow it
  // (CudaOptions::chunked_gated_delta = false keeps the recurrent kernel, which walks the
  // tokens one by one). Speculative decoding: in a step whose sequences have different token
  // counts (a prompt chunk beside verification chunks; never graph-captured, which takes equal
  // counts only) the prompt chunks still take the chunked path, so a prompt's chunk gives the
  // same numbers whether or not a verification shares its step, and the recurrent kernel takes
  // the rest: the chunks that keep a state per token, and the one-token rows, which then get
  // the numbers of a decode step. A step of equal counts with per-token states (verification
  // only) is all recurrent.
  const int S = meta.num_seqs;
  std::vector<int32_t> chunked_seq;  // per sequence: 1 = the chunked path takes it (the recurrent kernel skips it)
  if (meta.max_query_len > 1 && options_.chunked_gated_delta && gdr_chunked_supported(a.Dk, a.Dv) && S > 0) {
    const auto& qsl = meta.host_query_start_loc;  // (check_linear_meta: S + 1 entries)
    const auto other_count = [&](int32_t x, int32_t y) { return y - x != qsl[1] - qsl[0]; };
    const bool equal_counts = std::adjacent_find(qsl.begin(), qsl.end(), other_count) == qsl.end();
    if (!a.token_slots) {
      chunked_seq.assign(S, 1);
    } else if (!equal_counts && static_cast<int>(meta.host_state_slots.size()) == S &&
               static_cast<int64_t>(meta.host_token_state_slots.size()) == T) {
      chunked_seq.resize(S);
      for (int s = 0; s < S; ++s) chunked_seq[s] = qsl[s + 1] - qsl[s] > 1 && !per_token_states(meta, s);
    }
  }
  const int n_chunked = static_cast<int>(std::count(chunked_seq.begin(), chunked_seq.end(), 1));
  if (n_chunked > 0) {
    std::vector<int32_t> chunks, seq_chunks = {0};
    for (int s = 0; s < S; ++s) {
      const int t0 = meta.host_query_start_loc[s], t1 = meta.host_query_start_loc[s + 1];
      if (chunked_seq[s])
        for (int t = t0; t < t1; t += 64) chunks.insert(chunks.end(), {t, std::min(64, t1 - t), s});
      seq_chunks.push_back(static_cast<int32_t>(chunks.size() / 3));
    }
    GatedDeltaRuleArgs c = a;
    c.token_slots = nullptr;  // its sequences write their final state in place
    c.num_chunks = static_cast<int>(chunks.size() / 3);
    if (c.num_chunks > 0) {
      Tensor chunk_table = dev_.scratch({static_cast<int64_t>(chunks.size())}, DType::kI32);
      Tensor seq_table = dev_.scratch({static_cast<int64_t>(seq_chunks.size())}, DType::kI32);
      dev_.copy_from_host(chunk_table, chunks.data());
      dev_.copy_from_host(seq_table, seq_chunks.data());
      Tensor ws = dev_.scratch(
          {static_cast<int64_t>(gdr_chunked_workspace_bytes(c.num_chunks, c.Hk, c.Hv, c.Dk, c.Dv))}, DType::kU8);
      c.chunks = chunk_table.data<int32_t>();
      c.seq_chunks = seq_table.data<int32_t>();
      gdr_carve_workspace(c, ws.raw());
      launch_gated_delta_rule(c, true, dev_.stream(), dev_.arch().smem_per_block_optin);
    }
    if (n_chunked == S) return;
    Tensor skip = dev_.scratch({S}, DType::kI32);
    dev_.copy_from_host(skip, chunked_seq.data());
    a.skip_seqs = skip.data<int32_t>();
  }
  launch_gated_delta_rule(a, false, dev_.stream(), dev_.arch().smem_per_block_optin);
}

void LinearAttnOps::gated_rms_norm(const Tensor& x, const Tensor& z, int64_t z_col, const Tensor& w, float eps,
                                   const Tensor& out) {
  CUDA_REQUIRE(x.ndim() == 3 && z.ndim() == 2 && out.shape() == x.shape() && x.dtype() == DType::kBF16 &&
                   z.dtype() == DType::kBF16 && out.dtype() == DType::kBF16 && act(w),
               "gated_rms_norm", "x, out bf16 [T, H, D] and z bf16 [T, Z], got " + x.str() + ", " + z.str());
  const int64_t T = x.dim(0), H = x.dim(1), D = x.dim(2);
  CUDA_REQUIRE(w.numel() == D && z.dim(0) == T && z_col >= 0 && z_col + H * D <= z.dim(1), "gated_rms_norm",
               "shapes " + x.str() + ", z " + z.str() + " (column " + std::to_string(z_col) + "), w " + w.str());
  dev_.bind();
  launch_gated_rms_norm(x.raw(), z.raw(), z.dim(1), z_col, w.raw(), w.dtype(), out.raw(), T, static_cast<int>(H),
                        static_cast<int>(D), eps, dev_.stream());
}

}  // namespace tessera::cuda
