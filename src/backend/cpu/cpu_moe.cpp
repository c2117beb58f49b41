// Mixture-of-experts ops of the CPU backend (see backend.h, "mixture of experts"): the
// router's softmax + top-k, the routed experts as one pair of OpenBLAS GEMMs per expert over
// the tokens routed to it, and the sigmoid gate.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_check.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace tessera {

namespace {

using cpu::require;

}  // namespace

void CpuBackend::moe_topk(const Tensor& router_logits, int k, bool renormalize, const Tensor& topk_ids,
                          const Tensor& topk_weights) {
  require(router_logits.dtype() == DType::kF32 && router_logits.ndim() == 2, "moe_topk",
          "router logits must be f32 [T, E], got " + router_logits.str());
  const int64_t T = router_logits.dim(0), E = router_logits.dim(1);
  require(k >= 1 && k <= E, "moe_topk", "k = " + std::to_string(k) + " with " + std::to_string(E) + " experts");
  require(topk_ids.dtype() == DType::kI32 && topk_ids.numel() == T * k && topk_weights.dtype() == DType::kF32 &&
              topk_weights.numel() == T * k,
          "moe_topk", "outputs " + topk_ids.str() + ", " + topk_weights.str() + " for " + router_logits.str());
  ThreadPool::global().parallel_for(T, 16, [&](int64_t b, int64_t e) {
    std::vector<float> p(static_cast<size_t>(E));
    std::vector<int32_t> order(static_cast<size_t>(E));
    for (int64_t t = b; t < e; ++t) {
      const float* row = router_logits.data<float>() + t * E;
      float mx = -INFINITY;
      for (int64_t i = 0; i < E; ++i) mx = std::max(mx, row[i]);
      float sum = 0;
      for (int64_t i = 0; i < E; ++i) {
        p[i] = std::exp(row[i] - mx);
        sum += p[i];
      }
      for (int64_t i = 0; i < E; ++i) p[i] /= sum;
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + k, order.end(),
                        [&](int32_t a, int32_t c) { return p[a] > p[c] || (p[a] == p[c] && a < c); });
      float picked = 0;
      for (int j = 0; j < k; ++j) picked += p[order[j]];
      const float scale = renormalize ? 1.0f / picked : 1.0f;
      for (int j = 0; j < k; ++j) {
        topk_ids.data<int32_t>()[t * k + j] = order[j];
        topk_weights.data<float>()[t * k + j] = p[order[j]] * scale;
      }
    }
  });
}

// Groups the (token, slot) pairs by local expert, then per expert: gather the tokens' rows,
// h = rows @ gate_up[e]^T, a = silu(h[:, :I]) * h[:, I:], y = a @ down[e]^T, out[t] += w * y.
// Experts are visited in ascending order, so the sum order per token is fixed.
void CpuBackend::moe_experts(const Tensor& x, const Tensor& gate_up, const Tensor& down, const Tensor& topk_ids,
                             const Tensor& topk_weights, int expert_begin, const Tensor& out) {
  if (gate_up.format().quantized() || down.format().quantized()) {  // FP8 experts: the dequantising reference
    auto plain = [](const Tensor& w) {
      switch (w.format().kind) {
        case WeightFormatKind::kPlain:
          return w;
        case WeightFormatKind::kFp8Block:
          return dequantize_block_scaled_host(w);
        default:
          fail_unsupported_format("CPU moe_experts", w.str(), w.format());
      }
    };
    moe_experts(x, plain(gate_up), plain(down), topk_ids, topk_weights, expert_begin, out);
    return;
  }
  require(x.dtype() == DType::kF32 && gate_up.dtype() == DType::kF32 && down.dtype() == DType::kF32 &&
              out.dtype() == DType::kF32,
          "moe_experts", "expects f32 activations and weights");
  require(x.ndim() == 2 && gate_up.ndim() == 3 && down.ndim() == 3, "moe_experts",
          "x " + x.str() + ", gate_up " + gate_up.str() + ", down " + down.str());
  const int64_t T = x.dim(0), H = x.dim(1), E_local = gate_up.dim(0), I = gate_up.dim(1) / 2;
  require(gate_up.dim(1) == 2 * I && gate_up.dim(2) == H && down.dim(0) == E_local && down.dim(1) == H &&
              down.dim(2) == I && out.numel() == T * H,
          "moe_experts", "x " + x.str() + ", gate_up " + gate_up.str() + ", down " + down.str() + ", out " + out.str());
  require(topk_ids.dtype() == DType::kI32 && topk_weights.dtype() == DType::kF32 && topk_ids.ndim() == 2 &&
              topk_ids.dim(0) == T && topk_weights.numel() == topk_ids.numel(),
          "moe_experts", "routing " + topk_ids.str() + ", " + topk_weights.str() + " for " + x.str());
  float* o = out.data<float>();
  if (T == 0) return;
  std::fill_n(o, T * H, 0.0f);
  const int64_t k = topk_ids.dim(1);
  const int32_t* ids = topk_ids.data<int32_t>();
  const float* wts = topk_weights.data<float>();

  // Counting sort of the pairs by local expert (stable: token order within an expert).
  std::vector<int64_t> offsets(static_cast<size_t>(E_local) + 1, 0);
  for (int64_t i = 0; i < T * k; ++i) {
    const int64_t e = static_cast<int64_t>(ids[i]) - expert_begin;
    if (e >= 0 && e < E_local) ++offsets[e + 1];
  }
  for (int64_t e = 0; e < E_local; ++e) offsets[e + 1] += offsets[e];
  std::vector<int64_t> pairs(static_cast<size_t>(offsets[E_local]));
  {
    std::vector<int64_t> fill(offsets.begin(), offsets.end() - 1);
    for (int64_t i = 0; i < T * k; ++i) {
      const int64_t e = static_cast<int64_t>(ids[i]) - expert_begin;
      if (e >= 0 && e < E_local) pairs[fill[e]++] = i;
    }
  }
  int64_t most = 0;
  for (int64_t e = 0; e < E_local; ++e) most = std::max(most, offsets[e + 1] - offsets[e]);
  if (most == 0) return;
  std::vector<float> rows(static_cast<size_t>(most * H)), h(static_cast<size_t>(most * 2 * I)),
      act(static_cast<size_t>(most * I)), y(static_cast<size_t>(most * H));
  for (int64_t e = 0; e < E_local; ++e) {
    const int64_t n = offsets[e + 1] - offsets[e];
    if (n == 0) continue;
    const int64_t* pe = pairs.data() + offsets[e];
    for (int64_t r = 0; r < n; ++r) std::memcpy(rows.data() + r * H, x.data<float>() + (pe[r] / k) * H, H * 4);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n), static_cast<int>(2 * I),
                static_cast<int>(H), 1.0f, rows.data(), static_cast<int>(H), gate_up.data<float>() + e * 2 * I * H,
                static_cast<int>(H), 0.0f, h.data(), static_cast<int>(2 * I));
    for (int64_t r = 0; r < n; ++r)
      for (int64_t i = 0; i < I; ++i) {
        const float g = h[r * 2 * I + i], u = h[r * 2 * I + I + i];
        act[r * I + i] = g / (1.0f + std::exp(-g)) * u;
      }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n), static_cast<int>(H), static_cast<int>(I),
                1.0f, act.data(), static_cast<int>(I), down.data<float>() + e * H * I, static_cast<int>(I), 0.0f,
                y.data(), static_cast<int>(H));
    for (int64_t r = 0; r < n; ++r) {
      const float w = wts[pe[r]];
      float* orow = o + (pe[r] / k) * H;
      const float* yr = y.data() + r * H;
      for (int64_t c = 0; c < H; ++c) orow[c] += w * yr[c];
    }
  }
}

void CpuBackend::sigmoid_mul(const Tensor& x, const Tensor& gate, const Tensor& out) {
  require(x.dtype() == DType::kF32 && gate.dtype() == DType::kF32 && out.dtype() == DType::kF32, "sigmoid_mul",
          "expects f32");
  const int64_t n = x.numel();
  require(out.numel() == n && x.ndim() >= 1, "sigmoid_mul", x.str() + " -> " + out.str());
  const int64_t row = x.dim(-1), T = row > 0 ? n / row : 0;
  require(gate.numel() == n || gate.numel() == T, "sigmoid_mul",
          "gate " + gate.str() + " must have x's shape " + x.str() + " or one value per row");
  const float* xp = x.data<float>();
  const float* gp = gate.data<float>();
  float* op = out.data<float>();
  if (gate.numel() == n) {
    for (int64_t i = 0; i < n; ++i) op[i] = xp[i] / (1.0f + std::exp(-gp[i]));
  } else {
    for (int64_t t = 0; t < T; ++t) {
      const float s = 1.0f / (1.0f + std::exp(-gp[t]));
      for (int64_t c = 0; c < row; ++c) op[t * row + c] = xp[t * row + c] * s;
    }
  }
}

}  // namespace tessera
