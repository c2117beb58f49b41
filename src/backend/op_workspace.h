// Scratch an op takes inside a backend beyond its inputs and outputs, the most any backend takes
// (the CUDA kernels' workspaces), so that the planner's meta backend takes as much at the same
// call and `tessera plan` counts it with the activations. A backend's op family takes at most this.
#pragma once
#include <cstdint>

namespace tessera {

// moe_experts over T tokens of k experts each, H hidden, I intermediate, E_local experts on this
// rank: the gate_up activations [T*k + T, I] and the down outputs [T*k + T, H] in bf16 (the
// shared expert's rows last where a kernel folds it in), and the routing tables of the grouped
// GEMMs (i32: expert and tile offsets [E_local + 1] each, the permutation and positions [T*k] each).
inline int64_t moe_experts_workspace_bytes(int64_t T, int64_t k, int64_t H, int64_t I, int64_t E_local) {
  const int64_t rows = T * k + T;
  return rows * I * 2 + rows * H * 2 + (2 * (E_local + 1) + 2 * T * k) * 4 + 3 * 256;
}

// linear with an FP8 block-scaled weight [N, K] over M rows: the activations quantised to e4m3
// [M, K] with their f32 scales [K/128, M], or the weight dequantised to bf16 [N, K] where no
// block-scaled GEMM takes the shape (the larger of the two), or the small-M kernels' f32 partials.
inline int64_t fp8_linear_workspace_bytes(int64_t M, int64_t N, int64_t K) {
  const int64_t quantised = M * K + (K / 128 + 1) * M * 4;
  const int64_t dequantised = N * K * 2;
  const int64_t partials = 16 * (M < 64 ? M : 64) * N * 4;
  const int64_t most = quantised > dequantised ? quantised : dequantised;
  return (most > partials ? most : partials) + 2 * 256;
}

}  // namespace tessera
