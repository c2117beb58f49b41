// CpuBackend's linear-attention (Gated DeltaNet) ops: causal conv1d with a conv state, the
// gated delta rule (chunked WY form for prefill, the recurrent step for single tokens) and the
// gated RMSNorm. f32 activations; states f32 or bf16 (read into f32, written back rounded).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_check.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace tessera {

namespace {

using cpu::require;

bool is_state_dtype(DType t) { return t == DType::kF32 || t == DType::kBF16; }

// n values of dtype t at base (element offset i) into f32, and back.
void load_f32(const Tensor& t, int64_t i, float* dst, int64_t n) {
  convert_host(static_cast<const char*>(t.raw()) + i * dtype_size(t.dtype()), t.dtype(), dst, DType::kF32,
               static_cast<size_t>(n));
}
void store_f32(const Tensor& t, int64_t i, const float* src, int64_t n) {
  convert_host(src, DType::kF32, static_cast<char*>(t.raw()) + i * dtype_size(t.dtype()), t.dtype(),
               static_cast<size_t>(n));
}

std::vector<float> as_f32(const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  load_f32(t, 0, v.data(), t.numel());
  return v;
}

void check_meta(const LinearAttnMetadata& m, int64_t T, int64_t num_slots, const char* op) {
  require(static_cast<int>(m.host_query_start_loc.size()) == m.num_seqs + 1 &&
              static_cast<int>(m.host_state_slots.size()) == m.num_seqs &&
              static_cast<int>(m.host_has_initial_state.size()) == m.num_seqs && m.num_tokens == T &&
              (m.num_seqs == 0 || m.host_query_start_loc[m.num_seqs] == T),
          op, "metadata does not describe " + std::to_string(T) + " tokens");
  for (int s = 0; s < m.num_seqs; ++s)
    require(
        m.host_state_slots[s] < num_slots, op,
        "state slot " + std::to_string(m.host_state_slots[s]) + " outside the " + std::to_string(num_slots) + " slots");
  require(m.host_token_state_slots.empty() || static_cast<int64_t>(m.host_token_state_slots.size()) == T, op,
          "token_state_slots must have one entry per token");
  for (int32_t slot : m.host_token_state_slots)
    require(slot < num_slots, op,
            "token state slot " + std::to_string(slot) + " outside the " + std::to_string(num_slots) + " slots");
}

inline float silu(float x) { return x / (1.0f + std::exp(-x)); }
inline float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// One (sequence, value head) of the gated delta rule. q, k: [L, Dk] already l2-normed (q scaled),
// v: [L, Dv], g (log decay) and beta: [L]; S [Dk, Dv] is updated in place; o [L, Dv].
void gdr_recurrent(int64_t L, int64_t Dk, int64_t Dv, const float* q, const float* k, const float* v, const float* g,
                   const float* beta, float* S, float* o) {
  std::vector<float> kv(static_cast<size_t>(Dv));
  for (int64_t t = 0; t < L; ++t) {
    const float* qt = q + t * Dk;
    const float* kt = k + t * Dk;
    const float decay = std::exp(g[t]);
    std::fill(kv.begin(), kv.end(), 0.0f);
    for (int64_t i = 0; i < Dk; ++i) {
      float* row = S + i * Dv;
      for (int64_t j = 0; j < Dv; ++j) {
        row[j] *= decay;
        kv[j] += row[j] * kt[i];
      }
    }
    for (int64_t j = 0; j < Dv; ++j) kv[j] = beta[t] * (v[t * Dv + j] - kv[j]);  // delta
    float* ot = o + t * Dv;
    std::fill(ot, ot + Dv, 0.0f);
    for (int64_t i = 0; i < Dk; ++i) {
      float* row = S + i * Dv;
      for (int64_t j = 0; j < Dv; ++j) {
        row[j] += kt[i] * kv[j];
        ot[j] += row[j] * qt[i];
      }
    }
  }
}

// The same function in chunks of kChunk tokens (WY form, as flash-linear-attention's chunked
// kernels and transformers' torch_chunk_gated_delta_rule). Within a chunk of L tokens, with gc
// the cumulative log decay:
//   A[i][j] = beta_i (k_i . k_j) exp(gc_i - gc_j) (j < i);  T = (I + A)^-1 (forward substitution)
//   U = T (beta v),  W = T (beta k exp(gc)),  V = U - W S      (the corrected values)
//   o_i = exp(gc_i) q_i S + sum_{j <= i} (q_i . k_j) exp(gc_i - gc_j) V_j
//   S = exp(gc_L) S + sum_j exp(gc_L - gc_j) k_j V_j^T
constexpr int64_t kChunk = 64;
void gdr_chunked(int64_t L, int64_t Dk, int64_t Dv, const float* q, const float* k, const float* v, const float* g,
                 const float* beta, float* S, float* o) {
  std::vector<float> gc(kChunk), W(kChunk * Dk), U(kChunk * Dv);
  for (int64_t c0 = 0; c0 < L; c0 += kChunk) {
    const int64_t n = std::min(kChunk, L - c0);
    const float* qc = q + c0 * Dk;
    const float* kc = k + c0 * Dk;
    const float* vc = v + c0 * Dv;
    float acc = 0.0f;
    for (int64_t i = 0; i < n; ++i) gc[i] = acc += g[c0 + i];
    // Forward substitution, row by row: X_i = R_i - sum_{j<i} A[i][j] X_j, for U and W together.
    for (int64_t i = 0; i < n; ++i) {
      const float b = beta[c0 + i];
      float* wi = W.data() + i * Dk;
      float* ui = U.data() + i * Dv;
      const float e = std::exp(gc[i]);
      for (int64_t d = 0; d < Dk; ++d) wi[d] = b * kc[i * Dk + d] * e;
      for (int64_t d = 0; d < Dv; ++d) ui[d] = b * vc[i * Dv + d];
      for (int64_t j = 0; j < i; ++j) {
        float dot = 0.0f;
        for (int64_t d = 0; d < Dk; ++d) dot += kc[i * Dk + d] * kc[j * Dk + d];
        const float a = b * dot * std::exp(gc[i] - gc[j]);
        const float* wj = W.data() + j * Dk;
        const float* uj = U.data() + j * Dv;
        for (int64_t d = 0; d < Dk; ++d) wi[d] -= a * wj[d];
        for (int64_t d = 0; d < Dv; ++d) ui[d] -= a * uj[d];
      }
    }
    // V = U - W S (in U).
    for (int64_t i = 0; i < n; ++i) {
      float* ui = U.data() + i * Dv;
      const float* wi = W.data() + i * Dk;
      for (int64_t d = 0; d < Dk; ++d) {
        const float w = wi[d];
        const float* srow = S + d * Dv;
        for (int64_t j = 0; j < Dv; ++j) ui[j] -= w * srow[j];
      }
    }
    // Outputs: the old state's part, then the chunk's own keys.
    for (int64_t i = 0; i < n; ++i) {
      float* oi = o + (c0 + i) * Dv;
      std::fill(oi, oi + Dv, 0.0f);
      const float e = std::exp(gc[i]);
      for (int64_t d = 0; d < Dk; ++d) {
        const float qd = qc[i * Dk + d] * e;
        const float* srow = S + d * Dv;
        for (int64_t j = 0; j < Dv; ++j) oi[j] += qd * srow[j];
      }
      for (int64_t j = 0; j <= i; ++j) {
        float dot = 0.0f;
        for (int64_t d = 0; d < Dk; ++d) dot += qc[i * Dk + d] * kc[j * Dk + d];
        const float p = dot * std::exp(gc[i] - gc[j]);
        const float* uj = U.data() + j * Dv;
        for (int64_t d = 0; d < Dv; ++d) oi[d] += p * uj[d];
      }
    }
    // State update.
    const float last = gc[n - 1], chunk_decay = std::exp(last);
    for (int64_t i = 0; i < Dk * Dv; ++i) S[i] *= chunk_decay;
    for (int64_t j = 0; j < n; ++j) {
      const float e = std::exp(last - gc[j]);
      const float* uj = U.data() + j * Dv;
      for (int64_t d = 0; d < Dk; ++d) {
        const float kd = kc[j * Dk + d] * e;
        float* srow = S + d * Dv;
        for (int64_t x = 0; x < Dv; ++x) srow[x] += kd * uj[x];
      }
    }
  }
}

}  // namespace

void CpuBackend::causal_conv1d(const Tensor& x, int64_t x_col, const Tensor& weight, const Tensor& conv_state,
                               const LinearAttnMetadata& meta, const Tensor& out) {
  require(x.dtype() == DType::kF32 && out.dtype() == DType::kF32 && x.ndim() == 2 && out.ndim() == 2, "causal_conv1d",
          "x and out must be f32 [T, *], got " + x.str() + ", " + out.str());
  require(conv_state.ndim() == 3 && is_state_dtype(conv_state.dtype()), "causal_conv1d",
          "conv_state must be f32 or bf16 [num_slots, K-1, C], got " + conv_state.str());
  const int64_t T = x.dim(0), X = x.dim(1), C = out.dim(1), Km1 = conv_state.dim(1), K = Km1 + 1;
  require(out.dim(0) == T && conv_state.dim(2) == C && weight.numel() == C * K && weight.dim(0) == C && x_col >= 0 &&
              x_col + C <= X && K >= 2,
          "causal_conv1d",
          "shapes " + x.str() + " (column " + std::to_string(x_col) + "), " + weight.str() + ", " + conv_state.str() +
              " -> " + out.str());
  check_meta(meta, T, conv_state.dim(0), "causal_conv1d");
  const std::vector<float> w = as_f32(weight);
  const float* xp = x.data<float>();
  float* op = out.data<float>();
  ThreadPool::global().parallel_for(meta.num_seqs, 1, [&](int64_t b, int64_t e) {
    std::vector<float> hist(static_cast<size_t>(Km1 * C));  // the last K-1 inputs, oldest first
    for (int64_t s = b; s < e; ++s) {
      const int32_t t0 = meta.host_query_start_loc[s], t1 = meta.host_query_start_loc[s + 1];
      const int32_t slot = meta.host_state_slots[s];
      if (slot < 0) {
        std::fill(op + t0 * C, op + t1 * C, 0.0f);
        continue;
      }
      if (t1 == t0) continue;  // the state stays as it is
      const bool per_token = per_token_states(meta, static_cast<int>(s));
      if (meta.host_has_initial_state[s])
        load_f32(conv_state, slot * Km1 * C, hist.data(), Km1 * C);
      else
        std::fill(hist.begin(), hist.end(), 0.0f);
      for (int32_t t = t0; t < t1; ++t) {
        const float* xt = xp + t * X + x_col;
        float* ot = op + t * C;
        for (int64_t c = 0; c < C; ++c) {
          const float* wc = w.data() + c * K;
          float acc = wc[Km1] * xt[c];
          for (int64_t j = 0; j < Km1; ++j) acc += wc[j] * hist[j * C + c];
          ot[c] = silu(acc);
        }
        std::memmove(hist.data(), hist.data() + C, static_cast<size_t>((Km1 - 1) * C) * 4);
        std::memcpy(hist.data() + (Km1 - 1) * C, xt, static_cast<size_t>(C) * 4);
        if (per_token && meta.host_token_state_slots[t] >= 0)
          store_f32(conv_state, meta.host_token_state_slots[t] * Km1 * C, hist.data(), Km1 * C);
      }
      if (!per_token) store_f32(conv_state, slot * Km1 * C, hist.data(), Km1 * C);
    }
  });
}

void CpuBackend::gated_delta_rule(const Tensor& qkv, const Tensor& ba, int64_t ba_col, const Tensor& A_log,
                                  const Tensor& dt_bias, const Tensor& state, const LinearAttnMetadata& meta,
                                  const Tensor& out) {
  require(qkv.dtype() == DType::kF32 && ba.dtype() == DType::kF32 && out.dtype() == DType::kF32 && qkv.ndim() == 2 &&
              ba.ndim() == 2 && out.ndim() == 3,
          "gated_delta_rule", "qkv [T, C], ba [T, X], out [T, Hv, Dv] must be f32");
  require(state.ndim() == 4 && is_state_dtype(state.dtype()), "gated_delta_rule",
          "state must be f32 or bf16 [num_slots, Hv, Dk, Dv], got " + state.str());
  const int64_t T = qkv.dim(0), Hv = state.dim(1), Dk = state.dim(2), Dv = state.dim(3);
  const int64_t C = qkv.dim(1), Hk = (C - Hv * Dv) / (2 * Dk);
  require(Hk > 0 && 2 * Hk * Dk + Hv * Dv == C && Hv % Hk == 0 && out.dim(0) == T && out.dim(1) == Hv &&
              out.dim(2) == Dv && ba.dim(0) == T && ba_col >= 0 && ba_col + 2 * Hv <= ba.dim(1) &&
              A_log.numel() == Hv && dt_bias.numel() == Hv,
          "gated_delta_rule",
          "shapes qkv " + qkv.str() + ", ba " + ba.str() + " (column " + std::to_string(ba_col) + "), state " +
              state.str() + " -> " + out.str());
  check_meta(meta, T, state.dim(0), "gated_delta_rule");
  const std::vector<float> alog = as_f32(A_log), dtb = as_f32(dt_bias);
  const int64_t ratio = Hv / Hk, X = ba.dim(1);
  const float scale = 1.0f / std::sqrt(static_cast<float>(Dk));
  const float* qp = qkv.data<float>();
  const float* bap = ba.data<float>();
  float* op = out.data<float>();
  ThreadPool::global().parallel_for(static_cast<int64_t>(meta.num_seqs) * Hv, 1, [&](int64_t b, int64_t e) {
    std::vector<float> q, k, v, g, beta, S(static_cast<size_t>(Dk * Dv)), o;
    for (int64_t it = b; it < e; ++it) {
      const int64_t s = it / Hv, h = it % Hv, kh = h / ratio;
      const int32_t t0 = meta.host_query_start_loc[s], t1 = meta.host_query_start_loc[s + 1];
      const int64_t L = t1 - t0;
      const int32_t slot = meta.host_state_slots[s];
      if (slot < 0) {
        for (int32_t t = t0; t < t1; ++t) std::fill_n(op + (t * Hv + h) * Dv, Dv, 0.0f);
        continue;
      }
      if (L == 0) continue;  // the state stays as it is
      q.resize(L * Dk), k.resize(L * Dk), v.resize(L * Dv), g.resize(L), beta.resize(L), o.resize(L * Dv);
      for (int64_t i = 0; i < L; ++i) {
        const float* row = qp + (t0 + i) * C;
        const float* qh = row + kh * Dk;
        const float* kh_ = row + Hk * Dk + kh * Dk;
        float sq = 0.0f, sk = 0.0f;
        for (int64_t d = 0; d < Dk; ++d) sq += qh[d] * qh[d], sk += kh_[d] * kh_[d];
        const float rq = scale / std::sqrt(sq + 1e-6f), rk = 1.0f / std::sqrt(sk + 1e-6f);
        for (int64_t d = 0; d < Dk; ++d) q[i * Dk + d] = qh[d] * rq, k[i * Dk + d] = kh_[d] * rk;
        std::memcpy(v.data() + i * Dv, row + 2 * Hk * Dk + h * Dv, static_cast<size_t>(Dv) * 4);
        const float bv = bap[(t0 + i) * X + ba_col + h], av = bap[(t0 + i) * X + ba_col + Hv + h];
        g[i] = -std::exp(alog[h]) * softplus(av + dtb[h]);
        beta[i] = 1.0f / (1.0f + std::exp(-bv));
      }
      const int64_t soff = (static_cast<int64_t>(slot) * Hv + h) * Dk * Dv;
      if (meta.host_has_initial_state[s])
        load_f32(state, soff, S.data(), Dk * Dv);
      else
        std::fill(S.begin(), S.end(), 0.0f);
      if (per_token_states(meta, static_cast<int>(s))) {
        // Token by token, keeping the state after each token that names a slot.
        for (int64_t i = 0; i < L; ++i) {
          gdr_recurrent(1, Dk, Dv, q.data() + i * Dk, k.data() + i * Dk, v.data() + i * Dv, g.data() + i,
                        beta.data() + i, S.data(), o.data() + i * Dv);
          const int32_t ts = meta.host_token_state_slots[t0 + i];
          if (ts >= 0) store_f32(state, (static_cast<int64_t>(ts) * Hv + h) * Dk * Dv, S.data(), Dk * Dv);
        }
      } else {
        if (L == 1)
          gdr_recurrent(L, Dk, Dv, q.data(), k.data(), v.data(), g.data(), beta.data(), S.data(), o.data());
        else
          gdr_chunked(L, Dk, Dv, q.data(), k.data(), v.data(), g.data(), beta.data(), S.data(), o.data());
        store_f32(state, soff, S.data(), Dk * Dv);
      }
      for (int64_t i = 0; i < L; ++i) std::memcpy(op + ((t0 + i) * Hv + h) * Dv, o.data() + i * Dv, Dv * 4);
    }
  });
}

void CpuBackend::gated_rms_norm(const Tensor& x, const Tensor& z, int64_t z_col, const Tensor& w, float eps,
                                const Tensor& out) {
  require(x.dtype() == DType::kF32 && z.dtype() == DType::kF32 && out.dtype() == DType::kF32 && x.ndim() == 3 &&
              z.ndim() == 2 && out.shape() == x.shape(),
          "gated_rms_norm", "x, out f32 [T, H, D] and z f32 [T, Z], got " + x.str() + ", " + z.str());
  const int64_t T = x.dim(0), H = x.dim(1), D = x.dim(2), Z = z.dim(1);
  require(w.numel() == D && z.dim(0) == T && z_col >= 0 && z_col + H * D <= Z, "gated_rms_norm",
          "shapes " + x.str() + ", z " + z.str() + " (column " + std::to_string(z_col) + "), w " + w.str());
  const std::vector<float> wv = as_f32(w);
  const float* xp = x.data<float>();
  const float* zp = z.data<float>();
  float* op = out.data<float>();
  ThreadPool::global().parallel_for(T * H, 16, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const int64_t t = r / H, h = r % H;
      const float* xr = xp + r * D;
      const float* zr = zp + t * Z + z_col + h * D;
      double ss = 0;
      for (int64_t i = 0; i < D; ++i) ss += static_cast<double>(xr[i]) * xr[i];
      const float inv = 1.0f / std::sqrt(static_cast<float>(ss / D) + eps);
      float* orow = op + r * D;
      for (int64_t i = 0; i < D; ++i) orow[i] = xr[i] * inv * wv[i] * silu(zr[i]);
    }
  });
}

}  // namespace tessera
