// Plain double-precision references of the Backend ops, written from the definitions in
// backend/backend.h (and, for the linear-attention ops, transformers' Qwen3NextGatedDeltaNet:
// torch_causal_conv1d_update, torch_recurrent_gated_delta_rule). The op table (op_table.h)
// checks the CPU backend against them; cpu_ops_test and linear_attn_test use them too.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

namespace tessera::optest {

// Rows of D: x / rms(x) * w.
inline std::vector<double> rms_norm_ref(const std::vector<double>& x, const std::vector<double>& w, double eps) {
  const size_t D = w.size();
  std::vector<double> out(x.size());
  for (size_t r = 0; r < x.size() / D; ++r) {
    double ss = 0;
    for (size_t i = 0; i < D; ++i) ss += x[r * D + i] * x[r * D + i];
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(D) + eps);
    for (size_t i = 0; i < D; ++i) out[r * D + i] = x[r * D + i] * inv * w[i];
  }
  return out;
}

// HF rotate_half (neox) or GPT-J pairs (interleaved) on the first rd dims of each head of x [T, H, D],
// at theta^(-2i/rd) per frequency.
inline std::vector<double> rope_ref(std::vector<double> x, int H, int D, const std::vector<int32_t>& pos, int rd,
                                    double theta, bool neox) {
  for (size_t t = 0; t < pos.size(); ++t)
    for (int h = 0; h < H; ++h) {
      double* v = x.data() + (t * H + h) * D;
      for (int i = 0; i < rd / 2; ++i) {
        const double a = pos[t] * std::pow(theta, -2.0 * i / rd), c = std::cos(a), s = std::sin(a);
        const int i1 = neox ? i : 2 * i, i2 = neox ? i + rd / 2 : 2 * i + 1;
        const double x1 = v[i1], x2 = v[i2];
        v[i1] = x1 * c - x2 * s;
        v[i2] = x2 * c + x1 * s;
      }
    }
  return x;
}

// Softmax in double, then the k largest (ties to the lower id), renormalized on request.
inline void moe_topk_ref(const std::vector<double>& logits, int E, int k, bool renormalize, std::vector<int32_t>& ids,
                         std::vector<double>& weights) {
  const size_t T = logits.size() / E;
  ids.clear();
  weights.clear();
  for (size_t t = 0; t < T; ++t) {
    const double* row = logits.data() + t * E;
    double mx = *std::max_element(row, row + E), sum = 0;
    std::vector<double> p(static_cast<size_t>(E));
    for (int i = 0; i < E; ++i) sum += p[i] = std::exp(row[i] - mx);
    for (auto& v : p) v /= sum;
    std::vector<int32_t> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[a] > p[b]; });
    double picked = 0;
    for (int j = 0; j < k; ++j) picked += p[order[j]];
    for (int j = 0; j < k; ++j) {
      ids.push_back(order[j]);
      weights.push_back(renormalize ? p[order[j]] / picked : p[order[j]]);
    }
  }
}

// out[t] = sum_j w[t,j] * down[e] @ (silu(gate[e] @ x[t]) * up[e] @ x[t]) over the local experts.
inline std::vector<double> moe_experts_ref(const std::vector<double>& x, const std::vector<double>& gate_up,
                                           const std::vector<double>& down, const std::vector<int32_t>& ids,
                                           const std::vector<double>& w, int T, int H, int I, int E_local, int k,
                                           int expert_begin) {
  std::vector<double> out(static_cast<size_t>(T) * H, 0.0), act(static_cast<size_t>(I));
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < k; ++j) {
      const int e = ids[t * k + j] - expert_begin;
      if (e < 0 || e >= E_local) continue;
      for (int i = 0; i < I; ++i) {
        double g = 0, u = 0;
        for (int h = 0; h < H; ++h) {
          g += gate_up[(static_cast<size_t>(e) * 2 * I + i) * H + h] * x[t * H + h];
          u += gate_up[(static_cast<size_t>(e) * 2 * I + I + i) * H + h] * x[t * H + h];
        }
        act[i] = g / (1 + std::exp(-g)) * u;
      }
      for (int h = 0; h < H; ++h) {
        double y = 0;
        for (int i = 0; i < I; ++i) y += down[(static_cast<size_t>(e) * H + h) * I + i] * act[i];
        out[t * H + h] += w[t * k + j] * y;
      }
    }
  return out;
}

// Causal conv (kernel K) with SiLU over tokens [t0, t1) of one sequence: x rows of X, channels at
// x_col; hist (K-1 rows of C, oldest first) is updated to the last K-1 inputs.
inline void ref_conv(const std::vector<double>& x, int X, int x_col, int t0, int t1, const std::vector<double>& w,
                     int C, int K, std::vector<double>& hist, std::vector<double>& out) {
  for (int t = t0; t < t1; ++t) {
    std::vector<double> row(static_cast<size_t>(C));
    for (int c = 0; c < C; ++c) row[c] = x[static_cast<size_t>(t) * X + x_col + c];
    for (int c = 0; c < C; ++c) {
      double acc = w[static_cast<size_t>(c) * K + K - 1] * row[c];
      for (int j = 0; j < K - 1; ++j) acc += w[static_cast<size_t>(c) * K + j] * hist[static_cast<size_t>(j) * C + c];
      out[static_cast<size_t>(t) * C + c] = acc / (1.0 + std::exp(-acc));
    }
    hist.erase(hist.begin(), hist.begin() + C);
    hist.insert(hist.end(), row.begin(), row.end());
  }
}

// Head layout of a Gated DeltaNet layer: Hk key heads of Dk, Hv value heads of Dv.
struct GdrDims {
  int Hk, Hv, Dk, Dv;
  int C() const { return 2 * Hk * Dk + Hv * Dv; }
};

// The recurrent gated delta rule over tokens [t0, t1) for value head h; S [Dk*Dv] in place;
// out [T, Hv, Dv].
inline void ref_gdr(const GdrDims& d, const std::vector<double>& qkv, const std::vector<double>& ba, int X, int ba_col,
                    const std::vector<double>& alog, const std::vector<double>& dtb, int t0, int t1, int h,
                    std::vector<double>& S, std::vector<double>& out) {
  const int C = d.C(), kh = h / (d.Hv / d.Hk);
  for (int t = t0; t < t1; ++t) {
    const double* row = qkv.data() + static_cast<size_t>(t) * C;
    std::vector<double> q(row + kh * d.Dk, row + (kh + 1) * d.Dk);
    std::vector<double> k(row + d.Hk * d.Dk + kh * d.Dk, row + d.Hk * d.Dk + (kh + 1) * d.Dk);
    const double* v = row + 2 * d.Hk * d.Dk + h * d.Dv;
    double sq = 0, sk = 0;
    for (int i = 0; i < d.Dk; ++i) sq += q[i] * q[i], sk += k[i] * k[i];
    for (int i = 0; i < d.Dk; ++i) q[i] = q[i] / std::sqrt(sq + 1e-6) / std::sqrt(static_cast<double>(d.Dk));
    for (int i = 0; i < d.Dk; ++i) k[i] = k[i] / std::sqrt(sk + 1e-6);
    const double b = ba[static_cast<size_t>(t) * X + ba_col + h],
                 a = ba[static_cast<size_t>(t) * X + ba_col + d.Hv + h];
    const double sp = a + dtb[h] > 20 ? a + dtb[h] : std::log1p(std::exp(a + dtb[h]));
    const double g = -std::exp(alog[h]) * sp, beta = 1.0 / (1.0 + std::exp(-b));
    for (double& s : S) s *= std::exp(g);
    for (int j = 0; j < d.Dv; ++j) {
      double mem = 0;
      for (int i = 0; i < d.Dk; ++i) mem += S[static_cast<size_t>(i) * d.Dv + j] * k[i];
      const double delta = (v[j] - mem) * beta;
      for (int i = 0; i < d.Dk; ++i) S[static_cast<size_t>(i) * d.Dv + j] += k[i] * delta;
    }
    for (int j = 0; j < d.Dv; ++j) {
      double o = 0;
      for (int i = 0; i < d.Dk; ++i) o += S[static_cast<size_t>(i) * d.Dv + j] * q[i];
      out[(static_cast<size_t>(t) * d.Hv + h) * d.Dv + j] = o;
    }
  }
}

}  // namespace tessera::optest
