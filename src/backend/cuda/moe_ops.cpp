// MoeOps (moe_ops.h).
#include "backend/cuda/moe_ops.h"

#include <algorithm>
#include <string>

namespace tessera::cuda {

MoeOps::MoeOps(CudaDevice& dev, const CudaOptions& options, Backend& be) : dev_(dev), options_(options), be_(be) {
  // The fused MoE decode kernel's barrier and counters: zero now, left zero by every launch.
  moe_sync_ = dev_.alloc({kMoeSyncInts}, DType::kI32);
  dev_.bind();
  TCUDA_CHECK(cudaMemsetAsync(moe_sync_.raw(), 0, moe_sync_.nbytes(), dev_.stream()));
}

void MoeOps::moe_topk(const Tensor& router_logits, int k, bool renormalize, const Tensor& topk_ids,
                      const Tensor& topk_weights) {
  CUDA_REQUIRE(router_logits.dtype() == DType::kF32 && router_logits.ndim() == 2, "moe_topk",
               "router logits must be f32 [T, E], got " + router_logits.str());
  const int64_t T = router_logits.dim(0), E = router_logits.dim(1);
  CUDA_REQUIRE(topk_ids.dtype() == DType::kI32 && topk_ids.numel() == T * k && topk_weights.dtype() == DType::kF32 &&
                   topk_weights.numel() == T * k,
               "moe_topk", "outputs " + topk_ids.str() + ", " + topk_weights.str() + " for " + router_logits.str());
  if (k < 1 || k > 32 || k > E || E > kMoeMaxExperts || T >= (int64_t{1} << 31))
    fail(ErrorKind::kUnsupported,
         "CUDA moe_topk takes up to {} experts, k from 1 to min(32, experts) and fewer than 2^31 tokens, not E={} "
         "k={} T={}",
         kMoeMaxExperts, E, k, T);
  dev_.need_cuda(router_logits, "moe_topk");
  dev_.need_cuda(topk_ids, "moe_topk");
  dev_.need_cuda(topk_weights, "moe_topk");
  dev_.bind();
  launch_moe_topk(router_logits.data<float>(), T, static_cast<int>(E), k, renormalize, topk_ids.data<int32_t>(),
                  topk_weights.data<float>(), dev_.stream());
}

// Decode (T * k <= kMoeDecodeMaxPairs): grouped GEMVs reading each selected expert once.
// Prefill: routing, permutation and tile offsets on the device, grouped GEMMs on tensor cores.
// FP8 block-scaled experts take the same two paths (dequantised in registers / shared memory).
// Neither reads the routing on the host, so both run inside captured graphs.
void MoeOps::moe_experts(const Tensor& x, const Tensor& gate_up, const Tensor& down, const Tensor& topk_ids,
                         const Tensor& topk_weights, int expert_begin, const Tensor& out) {
  moe_experts_impl(x, gate_up, down, topk_ids, topk_weights, expert_begin, out, nullptr, nullptr);
}

// The fused decode variants fold the top-k and the shared expert into their kernel
// (CudaMoeDecode); otherwise (and where that kernel does not apply) moe_topk, moe_experts and
// the shared expert's ops.
// The decode variant of a T-token call (CudaOptions::moe_decode; kAuto picks by the measured rule).
CudaMoeDecode MoeOps::moe_decode_for(int64_t T, bool shared, int64_t routed_bytes) const {
  if (options_.moe_decode != CudaMoeDecode::kAuto) return options_.moe_decode;
  const bool one_token =
      T == 1 && options_.moe_one_token != CudaMoeOneToken::kGrouped && routed_bytes >= kOneTokenSplitMinBytes;
  return shared && T <= 2 && !one_token ? CudaMoeDecode::kFusedTopkKernel : CudaMoeDecode::kSplit;
}
// The bytes of the k experts a token reads (bf16 gate_up and down of [E, 2I, H] / [E, H, I]).
int64_t MoeOps::routed_expert_bytes(const Tensor& gate_up, int k) {
  return gate_up.ndim() == 3 ? int64_t{k} * 3 * (gate_up.dim(1) / 2) * gate_up.dim(2) * 2 : 0;
}

void MoeOps::moe_topk_experts(const Tensor& router_logits, int k, bool renormalize, const Tensor& x,
                              const Tensor& gate_up, const Tensor& down, const Tensor& topk_ids,
                              const Tensor& topk_weights, int expert_begin, const Tensor& out,
                              const MoeSharedExpert* shared) {
  const bool fold = moe_decode_for(x.ndim() == 2 ? x.dim(0) : 0, shared != nullptr, routed_expert_bytes(gate_up, k)) !=
                        CudaMoeDecode::kSplit &&
                    options_.moe_gemv && router_logits.ndim() == 2 && router_logits.dtype() == DType::kF32 &&
                    x.ndim() == 2 && router_logits.dim(0) == x.dim(0) && x.dim(0) * k <= kMoeDecodeMaxPairs &&
                    topk_ids.numel() == x.dim(0) * k && topk_weights.numel() == x.dim(0) * k &&
                    topk_ids.dtype() == DType::kI32 && topk_weights.dtype() == DType::kF32 &&
                    moe_decode_fused_topk_supported(static_cast<int>(router_logits.dim(1)), k) &&
                    !gate_up.format().quantized() && !down.format().quantized();
  if (!fold) {
    if (shared && one_token_folds_shared(x, gate_up, k, *shared)) {  // the shared expert in the one-token kernels
      moe_topk(router_logits, k, renormalize, topk_ids, topk_weights);
      moe_experts_impl(x, gate_up, down, topk_ids, topk_weights, expert_begin, out, nullptr, shared);
      return;
    }
    moe_topk(router_logits, k, renormalize, topk_ids, topk_weights);
    moe_experts(x, gate_up, down, topk_ids, topk_weights, expert_begin, out);
    if (shared) be_.moe_shared_expert_add(x, *shared, out);
    return;
  }
  dev_.need_cuda(router_logits, "moe_topk_experts");
  const MoeFusedTopk topk{router_logits.data<float>(), static_cast<int>(router_logits.dim(1)), renormalize};
  moe_experts_impl(x, gate_up, down, topk_ids, topk_weights, expert_begin, out, &topk, shared);
}

// Whether the fused decode kernel can take this shared expert: bf16, the routed experts' I,
// 16-byte aligned, on this device.
bool MoeOps::fusable_shared(const MoeSharedExpert& s, int64_t H, int64_t I) {
  auto ok = [](const Tensor& t) {
    return t.dtype() == DType::kBF16 && !t.format().quantized() && t.device().type == DeviceType::kCUDA &&
           reinterpret_cast<uintptr_t>(t.raw()) % 16 == 0;
  };
  return s.gate_up && s.down && ok(*s.gate_up) && ok(*s.down) && s.gate_up->ndim() == 2 && s.gate_up->dim(0) == 2 * I &&
         s.gate_up->dim(1) == H && s.down->ndim() == 2 && s.down->dim(0) == H && s.down->dim(1) == I &&
         (!s.gate || (ok(*s.gate) && s.gate->numel() == H));
}

// Whether a one-token split step takes the shared expert as one more pair of its kernels
// (CudaOptions::moe_one_token_shared), k <= 32: bf16 experts and shared expert of the same I on the
// bf16 one-token kernels, or FP8 ones on the FP8 one-token kernels (CudaMoeFp8OneToken).
bool MoeOps::one_token_folds_shared(const Tensor& x, const Tensor& gate_up, int64_t k,
                                    const MoeSharedExpert& shared) const {
  if (!options_.moe_one_token_shared || !options_.moe_gemv || x.ndim() != 2 || x.dim(0) != 1 || gate_up.ndim() != 3 ||
      k > 32)
    return false;
  const int64_t H = x.dim(1), I = gate_up.dim(1) / 2;
  if (gate_up.format().kind == WeightFormatKind::kFp8Block)
    return options_.moe_fp8_decode == CudaMoeFp8Decode::kMma &&
           options_.moe_fp8_one_token != CudaMoeFp8OneToken::kGrouped && fusable_fp8_shared(shared, H, I);
  if (options_.moe_one_token == CudaMoeOneToken::kGrouped ||
      moe_decode_for(1, true, routed_expert_bytes(gate_up, static_cast<int>(k))) != CudaMoeDecode::kSplit)
    return false;
  return fusable_shared(shared, H, I);
}
// An FP8 shared expert the FP8 one-token kernels take as one expert: e4m3 gate_up [2I, H] and down
// [H, I] with f32 block scales, the routed experts' I; the gate bf16 [1, H] or none.
bool MoeOps::fusable_fp8_shared(const MoeSharedExpert& s, int64_t H, int64_t I) {
  auto fp8 = [](const Tensor* t, int64_t rows, int64_t cols) {
    return t && t->format().kind == WeightFormatKind::kFp8Block && t->ndim() == 2 && t->dim(0) == rows &&
           t->dim(1) == cols && t->device().type == DeviceType::kCUDA && t->block_scale()->dtype() == DType::kF32 &&
           t->block_scale()->ndim() == 2 && t->block_scale()->dim(0) == (rows + 127) / 128 &&
           t->block_scale()->dim(1) == (cols + 127) / 128;
  };
  const bool gate_ok =
      !s.gate || (s.gate->dtype() == DType::kBF16 && !s.gate->format().quantized() && s.gate->numel() == H &&
                  s.gate->device().type == DeviceType::kCUDA && reinterpret_cast<uintptr_t>(s.gate->raw()) % 16 == 0);
  return fp8(s.gate_up, 2 * I, H) && fp8(s.down, H, I) && gate_ok;
}

// moe_experts; with `fold`, the routing is computed from its logits into topk_ids / topk_weights
// first (inside the fused decode kernel, or by the top-k kernel on the other paths).
void MoeOps::moe_experts_impl(const Tensor& x, const Tensor& gate_up, const Tensor& down, const Tensor& topk_ids,
                              const Tensor& topk_weights, int expert_begin, const Tensor& out, const MoeFusedTopk* fold,
                              const MoeSharedExpert* shared) {
  CUDA_REQUIRE(x.ndim() == 2 && gate_up.ndim() == 3 && down.ndim() == 3, "moe_experts",
               "x " + x.str() + ", gate_up " + gate_up.str() + ", down " + down.str());
  const int64_t T = x.dim(0), H = x.dim(1), E_local = gate_up.dim(0), I = gate_up.dim(1) / 2;
  // FP8 experts: e4m3 with f32 scales per 128 x 128 block (Tensor::block_scale), both matrices.
  for (const Tensor* w : {&gate_up, &down})
    if (!w->format().supported()) fail_unsupported_format("CUDA moe_experts", w->str(), w->format());
  const bool fp8 = gate_up.format().kind == WeightFormatKind::kFp8Block;
  CUDA_REQUIRE(
      down.format() == gate_up.format(), "moe_experts",
      "gate_up and down must both be FP8 block-scaled or both bf16, got " + gate_up.str() + " and " + down.str());
  const DType wt = fp8 ? DType::kF8E4M3 : DType::kBF16;
  CUDA_REQUIRE(x.dtype() == DType::kBF16 && gate_up.dtype() == wt && down.dtype() == wt && out.dtype() == DType::kBF16,
               "moe_experts",
               "expects bf16 x and out with bf16 or block-scaled e4m3 weights, got " + x.str() + ", " + gate_up.str() +
                   ", " + down.str());
  if (fp8)
    CUDA_REQUIRE(
        gate_up.block_scale()->dtype() == DType::kF32 && down.block_scale()->dtype() == DType::kF32 &&
            gate_up.block_scale()->ndim() == 3 && down.block_scale()->ndim() == 3,
        "moe_experts",
        "FP8 experts need f32 block scales, got " + gate_up.block_scale()->str() + " and " + down.block_scale()->str());
  CUDA_REQUIRE(gate_up.dim(1) == 2 * I && gate_up.dim(2) == H && down.dim(0) == E_local && down.dim(1) == H &&
                   down.dim(2) == I && out.numel() == T * H,
               "moe_experts",
               "x " + x.str() + ", gate_up " + gate_up.str() + ", down " + down.str() + ", out " + out.str());
  CUDA_REQUIRE(topk_ids.dtype() == DType::kI32 && topk_weights.dtype() == DType::kF32 && topk_ids.ndim() == 2 &&
                   topk_ids.dim(0) == T && topk_weights.numel() == topk_ids.numel(),
               "moe_experts", "routing " + topk_ids.str() + ", " + topk_weights.str() + " for " + x.str());
  if (T == 0) return;
  const int64_t k = topk_ids.dim(1);
  if (fold) CUDA_REQUIRE(topk_ids.dim(1) == topk_weights.dim(1), "moe_topk_experts", "routing " + topk_ids.str());
  const bool aligned = ((reinterpret_cast<uintptr_t>(x.raw()) | reinterpret_cast<uintptr_t>(gate_up.raw()) |
                         reinterpret_cast<uintptr_t>(down.raw()) | reinterpret_cast<uintptr_t>(out.raw())) &
                        15) == 0;
  const int64_t mult = fp8 ? 16 : 8;  // 16-byte loads of the weights: 8 bf16 or 16 e4m3
  if (H % mult != 0 || I % mult != 0 || E_local > kMoeMaxExperts || !aligned || T * k > (int64_t{1} << 30) ||
      (fp8 && std::max(H, I) > kMaxFp8GemmK))
    fail(ErrorKind::kUnsupported,
         "CUDA moe_experts needs hidden and intermediate sizes that are multiples of {} ({} experts{}), 16-byte "
         "aligned tensors and at most {} experts per rank (got H={}, I={}, {} experts)",
         mult, fp8 ? "FP8" : "bf16", fp8 ? ", at most " + std::to_string(kMaxFp8GemmK) : "", kMoeMaxExperts, H, I,
         E_local);
  for (const Tensor* t : {&x, &gate_up, &down, &topk_ids, &topk_weights, &out}) dev_.need_cuda(*t, "moe_experts");
  dev_.bind();
  MoeArgs a{};
  a.x = x.raw();
  a.gate_up = gate_up.raw();
  a.down = down.raw();
  a.ids = topk_ids.data<int32_t>();
  a.weights = topk_weights.data<float>();
  a.out = out.raw();
  a.T = static_cast<int>(T);
  a.k = static_cast<int>(k);
  a.H = static_cast<int>(H);
  a.I = static_cast<int>(I);
  a.E_local = static_cast<int>(E_local);
  a.expert_begin = expert_begin;
  if (fp8) {
    dev_.need_cuda(*gate_up.block_scale(), "moe_experts");
    dev_.need_cuda(*down.block_scale(), "moe_experts");
    a.gate_up_scale = gate_up.block_scale()->data<float>();
    a.down_scale = down.block_scale()->data<float>();
  }
  const int64_t P = T * k;
  const bool decode = options_.moe_gemv && P <= kMoeDecodeMaxPairs;
  const CudaMoeDecode variant = moe_decode_for(T, shared != nullptr, routed_expert_bytes(gate_up, static_cast<int>(k)));
  const bool fused = decode && !fp8 && variant != CudaMoeDecode::kSplit &&
                     moe_decode_sync_ints(H) <= kMoeSyncInts;  // the fused kernel reads bf16 experts
  const bool fold_shared =
      fused && shared && fusable_shared(*shared, H, I) && moe_decode_fused_shared_supported(variant, a.T, a.k);
  const bool one_token_shared = !fused && decode && shared && one_token_folds_shared(x, gate_up, k, *shared);
  const int64_t rows = P + (fold_shared || one_token_shared ? T : 0);  // the shared expert's pairs last
  Tensor act = dev_.scratch({rows, I}, DType::kBF16), y = dev_.scratch({rows, H}, DType::kBF16);
  if (fused) {
    const MoeFusedShared sh{fold_shared ? shared->gate_up->raw() : nullptr, fold_shared ? shared->down->raw() : nullptr,
                            fold_shared && shared->gate ? shared->gate->raw() : nullptr};
    launch_moe_decode_fused(
        a, MoeDecodeWorkspace{act.raw(), y.raw(), static_cast<unsigned*>(moe_sync_.raw()), dev_.error_flag()}, variant,
        dev_.arch().sms, dev_.stream(), fold, fold_shared ? &sh : nullptr);
    if (shared && !fold_shared) be_.moe_shared_expert_add(x, *shared, out);
    return;
  }
  if (fold)
    launch_moe_topk(fold->logits, T, fold->E, static_cast<int>(k), fold->renormalize, topk_ids.data<int32_t>(),
                    topk_weights.data<float>(), dev_.stream());
  bool shared_done = false;
  if (decode) {
    MoeFusedShared sh{one_token_shared ? shared->gate_up->raw() : nullptr,
                      one_token_shared ? shared->down->raw() : nullptr,
                      one_token_shared && shared->gate ? shared->gate->raw() : nullptr};
    if (one_token_shared && fp8) {
      sh.gate_up_scale = shared->gate_up->block_scale()->data<float>();
      sh.down_scale = shared->down->block_scale()->data<float>();
    }
    shared_done =
        launch_moe_decode(a, act.raw(), y.raw(), dev_.stream(), options_.moe_fp8_decode, options_.moe_one_token,
                          options_.moe_fp8_one_token, one_token_shared ? &sh : nullptr);
  } else {
    Tensor route = dev_.scratch({2 * (E_local + 1) + 2 * P}, DType::kI32);
    int32_t* r = route.data<int32_t>();
    MoePrefillWorkspace ws{r, r + E_local + 1, r + 2 * (E_local + 1), r + 2 * (E_local + 1) + P, act.raw(), y.raw()};
    launch_moe_prefill(a, ws, options_.moe_prefill_wgmma && dev_.arch().wgmma, dev_.stream(),
                       dev_.arch().smem_per_block_optin);
  }
  if (shared && !shared_done) be_.moe_shared_expert_add(x, *shared, out);
}

}  // namespace tessera::cuda
