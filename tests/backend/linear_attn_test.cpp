// CpuBackend's linear-attention ops (causal_conv1d, gated_delta_rule, gated_rms_norm) against the
// plain double-precision references of op_reference.h (from transformers' Qwen3NextGatedDeltaNet:
// torch_causal_conv1d_update, torch_recurrent_gated_delta_rule, Qwen3NextRMSNormGated), and
// against themselves: a prefill split into chunks that continue from the state, and decode steps
// after a prefill, must give the outputs and states of one prefill of the whole sequence.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "backend/attention_metadata.h"
#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "op_reference.h"

namespace tessera {
namespace {

using Dims = optest::GdrDims;
using optest::ref_conv;
using optest::ref_gdr;

class LinearAttn : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = std::random_device{}();
    rng_.seed(seed_);
  }
  void TearDown() override {
    if (HasFailure()) std::printf("seed %llu\n", static_cast<unsigned long long>(seed_));
  }
  float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(rng_); }
  int randint(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }

  Tensor rand_f32(Shape s, float lo = -1.0f, float hi = 1.0f) {
    Tensor t = be_.alloc(s, DType::kF32);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = uniform(lo, hi);
    return t;
  }
  Tensor poisoned(Shape s) {
    Tensor t = be_.alloc(s, DType::kF32);
    std::fill_n(t.data<float>(), t.numel(), NAN);
    return t;
  }
  Tensor clone(const Tensor& t) {
    Tensor c = be_.alloc(t.shape(), t.dtype());
    be_.copy(c, t);
    return c;
  }
  static std::vector<double> vec(const Tensor& t) {
    std::vector<float> f(static_cast<size_t>(t.numel()));
    convert_host(t.raw(), t.dtype(), f.data(), DType::kF32, f.size());
    return {f.begin(), f.end()};
  }
  static void expect_close(const std::vector<double>& got, const std::vector<double>& want, double atol, double rtol,
                           const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    int reported = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double tol = atol + rtol * std::fabs(want[i]);
      if (!(std::fabs(got[i] - want[i]) <= tol) && reported++ < 5)
        ADD_FAILURE() << what << ": element " << i << " got " << got[i] << " want " << want[i];
    }
  }
  LinearAttnMetadata meta(const std::vector<int>& lens, const std::vector<int>& slots, const std::vector<int>& init) {
    LinearAttnLayout l;
    l.query_start_loc = {0};
    for (int n : lens) l.query_start_loc.push_back(l.query_start_loc.back() + n);
    l.state_slots.assign(slots.begin(), slots.end());
    l.has_initial_state.assign(init.begin(), init.end());
    return upload_linear_attn_metadata(be_, std::move(l));
  }

  // Random gated-delta-rule inputs for T tokens; A_log and dt_bias put the decay per token in
  // about [exp(-4), 1) so that states carry over several chunks.
  struct GdrInputs {
    Tensor qkv, ba, alog, dtb;
    int X, ba_col;
  };
  GdrInputs gdr_inputs(const Dims& d, int T) {
    GdrInputs in;
    in.qkv = rand_f32({T, d.C()}, -1.0f, 1.0f);
    in.ba_col = randint(0, 3);
    in.X = in.ba_col + 2 * d.Hv + randint(0, 2);
    in.ba = rand_f32({T, in.X}, -3.0f, 3.0f);
    in.alog = rand_f32({d.Hv}, -2.0f, 0.5f);
    in.dtb = rand_f32({d.Hv}, -1.0f, 1.0f);
    return in;
  }

  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
  CpuBackend be_;
};

TEST_F(LinearAttn, CausalConv1dVarlenWithConvStates) {
  for (DType sdt : {DType::kF32, DType::kBF16}) {
    const int C = randint(1, 40) * 2, K = randint(2, 5), num_slots = 6;
    // Sequences: long with a state, a prefill without one, a 1-token decode, 2 tokens (fewer than
    // K-1 when K > 3, so the old state rows stay in the new state), a padding sequence, empty.
    const std::vector<int> lens = {randint(9, 30), randint(5, 12), 1, 2, 3, 0};
    const std::vector<int> slots = {4, 0, 2, 5, -1, 1};
    const std::vector<int> init = {1, 0, 1, 1, 1, 1};
    const int T = std::accumulate(lens.begin(), lens.end(), 0);
    const int x_col = randint(0, 5), X = x_col + C + randint(0, 7);
    Tensor x = rand_f32({T, X}), w = rand_f32({C, K}, -0.7f, 0.7f);
    Tensor state = be_.alloc({num_slots, K - 1, C}, sdt);
    be_.fill_random(state, seed_ + 1, -1.0f, 1.0f);
    const std::vector<double> state0 = vec(state);
    Tensor out = poisoned({T, C});
    LinearAttnMetadata m = meta(lens, slots, init);
    be_.causal_conv1d(x, x_col, w, state, m, out);

    const std::vector<double> xv = vec(x), wv = vec(w);
    std::vector<double> want(static_cast<size_t>(T) * C, 0.0), want_state = state0;
    const size_t per = static_cast<size_t>(K - 1) * C;
    for (size_t s = 0; s < lens.size(); ++s) {
      if (slots[s] < 0) continue;
      std::vector<double> hist(per, 0.0);
      if (init[s]) std::copy_n(state0.begin() + slots[s] * per, per, hist.begin());
      const int t0 = m.host_query_start_loc[s], t1 = m.host_query_start_loc[s + 1];
      ref_conv(xv, X, x_col, t0, t1, wv, C, K, hist, want);
      std::copy(hist.begin(), hist.end(), want_state.begin() + slots[s] * per);
    }
    expect_close(vec(out), want, 1e-5, 1e-5, "conv out");
    const double tol = sdt == DType::kBF16 ? 8e-3 : 0.0;
    expect_close(vec(state), want_state, 0, tol, "conv state");
  }
}

TEST_F(LinearAttn, GatedDeltaRuleMatchesTheRecurrentReference) {
  // Dk != Dv and Hv = 2 Hk catch transposed state layouts and head mappings; the lengths cross
  // the 64-token chunks (exactly one chunk, one more, several, a partial last chunk).
  const Dims d{2, 4, 16, 24};
  const int num_slots = 7;
  const std::vector<int> lens = {1, randint(2, 20), 64, 65, randint(130, 200), 3, 0};
  const std::vector<int> slots = {3, 0, 6, 2, 5, -1, 1};
  const std::vector<int> init = {1, 0, 1, 0, 1, 1, 1};
  const int T = std::accumulate(lens.begin(), lens.end(), 0);
  GdrInputs in = gdr_inputs(d, T);
  Tensor state = rand_f32({num_slots, d.Hv, d.Dk, d.Dv}, -0.5f, 0.5f);
  const std::vector<double> state0 = vec(state);
  Tensor out = poisoned({T, d.Hv, d.Dv});
  LinearAttnMetadata m = meta(lens, slots, init);
  be_.gated_delta_rule(in.qkv, in.ba, in.ba_col, in.alog, in.dtb, state, m, out);

  const std::vector<double> qkv = vec(in.qkv), ba = vec(in.ba), alog = vec(in.alog), dtb = vec(in.dtb);
  std::vector<double> want(static_cast<size_t>(T) * d.Hv * d.Dv, 0.0), want_state = state0;
  const size_t per = static_cast<size_t>(d.Dk) * d.Dv;
  for (size_t s = 0; s < lens.size(); ++s) {
    if (slots[s] < 0) continue;
    for (int h = 0; h < d.Hv; ++h) {
      const size_t off = (static_cast<size_t>(slots[s]) * d.Hv + h) * per;
      std::vector<double> S(per, 0.0);
      if (init[s]) std::copy_n(state0.begin() + off, per, S.begin());
      ref_gdr(d, qkv, ba, in.X, in.ba_col, alog, dtb, m.host_query_start_loc[s], m.host_query_start_loc[s + 1], h, S,
              want);
      if (lens[s] > 0) std::copy(S.begin(), S.end(), want_state.begin() + off);
    }
  }
  expect_close(vec(out), want, 2e-5, 2e-4, "gdr out");
  expect_close(vec(state), want_state, 2e-5, 2e-4, "gdr state");
}

// A prefill in pieces (chunked prefill, a prefix-cache hit) and decode steps after it give what
// one prefill of the whole sequence gives, for the conv and the delta rule together.
TEST_F(LinearAttn, PiecesAndDecodeStepsEqualOnePrefill) {
  for (DType sdt : {DType::kF32, DType::kBF16}) {
    const Dims d{1, 3, 32, 16};
    const int C = d.C(), K = 4, L = randint(140, 220), cut = randint(20, 100), decode = 5;
    GdrInputs in = gdr_inputs(d, L);
    Tensor x = rand_f32({L, C}), w = rand_f32({C, K}, -0.5f, 0.5f);
    auto run = [&](const std::vector<int>& pieces, Tensor& out) {
      Tensor conv_state = be_.alloc({2, K - 1, C}, sdt), state = be_.alloc({2, d.Hv, d.Dk, d.Dv}, sdt);
      be_.fill(conv_state, 7.0f), be_.fill(state, 7.0f);  // garbage that has_initial_state = 0 must ignore
      out = poisoned({L, d.Hv, d.Dv});
      int t = 0;
      for (size_t i = 0; i < pieces.size(); ++i) {
        const int n = pieces[i];
        LinearAttnMetadata m = meta({n}, {1}, {i == 0 ? 0 : 1});
        Tensor conv_out = be_.alloc({n, C}, DType::kF32);
        be_.causal_conv1d(x.rows(t, t + n), 0, w, conv_state, m, conv_out);
        be_.gated_delta_rule(conv_out, in.ba.rows(t, t + n), in.ba_col, in.alog, in.dtb, state, m, out.rows(t, t + n));
        t += n;
      }
      return std::make_pair(vec(conv_state), vec(state));
    };
    Tensor whole, split, stepped;
    const auto s_whole = run({L}, whole);
    const auto s_split = run({cut, L - cut}, split);
    std::vector<int> steps = {L - decode};
    steps.insert(steps.end(), decode, 1);
    const auto s_steps = run(steps, stepped);
    const double tol = sdt == DType::kBF16 ? 2e-2 : 2e-4;
    expect_close(vec(split), vec(whole), tol, tol, "split out");
    expect_close(vec(stepped), vec(whole), tol, tol, "decode out");
    expect_close(s_split.first, s_whole.first, 0, 0, "split conv state");
    expect_close(s_steps.first, s_whole.first, 0, 0, "decode conv state");
    expect_close(s_split.second, s_whole.second, tol, tol, "split state");
    expect_close(s_steps.second, s_whole.second, tol, tol, "decode state");
  }
}

TEST_F(LinearAttn, DecodeBatchUpdatesEachSlotInPlace) {
  // A decode step of several sequences in shuffled slots, one of them padding: each slot moves
  // by one token, the others keep their bytes.
  const Dims d{2, 2, 8, 8};
  const int S = 5, num_slots = 8;
  const std::vector<int> slots = {6, 1, -1, 3, 0};
  GdrInputs in = gdr_inputs(d, S);
  Tensor state = rand_f32({num_slots, d.Hv, d.Dk, d.Dv}, -0.5f, 0.5f);
  const std::vector<double> state0 = vec(state);
  Tensor out = poisoned({S, d.Hv, d.Dv});
  be_.gated_delta_rule(in.qkv, in.ba, in.ba_col, in.alog, in.dtb, state, meta({1, 1, 1, 1, 1}, slots, {1, 1, 1, 1, 1}),
                       out);
  const std::vector<double> qkv = vec(in.qkv), ba = vec(in.ba), alog = vec(in.alog), dtb = vec(in.dtb);
  std::vector<double> want(static_cast<size_t>(S) * d.Hv * d.Dv, 0.0), want_state = state0;
  const size_t per = static_cast<size_t>(d.Dk) * d.Dv;
  for (int s = 0; s < S; ++s) {
    if (slots[s] < 0) continue;
    for (int h = 0; h < d.Hv; ++h) {
      const size_t off = (static_cast<size_t>(slots[s]) * d.Hv + h) * per;
      std::vector<double> st(state0.begin() + off, state0.begin() + off + per);
      ref_gdr(d, qkv, ba, in.X, in.ba_col, alog, dtb, s, s + 1, h, st, want);
      std::copy(st.begin(), st.end(), want_state.begin() + off);
    }
  }
  expect_close(vec(out), want, 1e-5, 1e-4, "decode out");
  expect_close(vec(state), want_state, 1e-5, 1e-4, "decode state");
}

TEST_F(LinearAttn, TokenStateSlotsKeepTheStateAfterEachToken) {
  // Speculative decoding: sequence A (slot 1) verifies 4 tokens after a prefill, keeping the state
  // after token j in slot group[j] (group[0] is its own slot); sequence B (slot 2), a prefill in
  // the same step, writes its final state in place. Reference: the same tokens one step at a time.
  for (DType sdt : {DType::kF32, DType::kBF16}) {
    const Dims d{1, 2, 16, 8};
    const int C = d.C(), K = 4, P = 9, V = 4, B = 3, num_slots = 8;
    const std::vector<int> group = {1, 5, 6, 3};
    GdrInputs in = gdr_inputs(d, P + V + B);
    Tensor x = rand_f32({P + V + B, C}), w = rand_f32({C, K}, -0.5f, 0.5f);
    // Reference: A's prefill, then its V tokens as decode steps (snapshots after each), then B.
    Tensor rconv = be_.alloc({num_slots, K - 1, C}, sdt), rstate = be_.alloc({num_slots, d.Hv, d.Dk, d.Dv}, sdt);
    be_.fill(rconv, 0.0f), be_.fill(rstate, 0.0f);
    Tensor rout = poisoned({P + V + B, d.Hv, d.Dv});
    auto step = [&](Tensor& conv, Tensor& state, Tensor& out, int t, int n, int slot, int init) {
      LinearAttnMetadata m = meta({n}, {slot}, {init});
      Tensor co = be_.alloc({n, C}, DType::kF32);
      be_.causal_conv1d(x.rows(t, t + n), 0, w, conv, m, co);
      be_.gated_delta_rule(co, in.ba.rows(t, t + n), in.ba_col, in.alog, in.dtb, state, m, out.rows(t, t + n));
    };
    step(rconv, rstate, rout, 0, P, 1, 0);
    Tensor conv = clone(rconv), state = clone(rstate);  // the state after the prefill
    std::vector<std::vector<double>> want_conv, want_state;
    for (int j = 0; j < V; ++j) {
      step(rconv, rstate, rout, P + j, 1, 1, 1);
      want_conv.push_back(vec(rconv.rows(1, 2)));
      want_state.push_back(vec(rstate.rows(1, 2)));
    }
    step(rconv, rstate, rout, P + V, B, 2, 0);

    LinearAttnLayout l;
    l.query_start_loc = {0, V, V + B};
    l.state_slots = {1, 2};
    l.has_initial_state = {1, 0};
    l.token_state_slots = {group[0], group[1], group[2], group[3], -1, -1, 2};
    LinearAttnMetadata m = upload_linear_attn_metadata(be_, l);
    Tensor co = be_.alloc({V + B, C}, DType::kF32), out = poisoned({V + B, d.Hv, d.Dv});
    be_.causal_conv1d(x.rows(P, P + V + B), 0, w, conv, m, co);
    be_.gated_delta_rule(co, in.ba.rows(P, P + V + B), in.ba_col, in.alog, in.dtb, state, m, out);
    const double tol = sdt == DType::kBF16 ? 2e-2 : 1e-5;
    expect_close(vec(out), vec(rout.rows(P, P + V + B)), tol, tol, "outputs");
    for (int j = 0; j < V; ++j) {
      expect_close(vec(conv.rows(group[j], group[j] + 1)), want_conv[j], 0, 0,
                   "conv state after token " + std::to_string(j));
      expect_close(vec(state.rows(group[j], group[j] + 1)), want_state[j], tol, tol,
                   "recurrent state after token " + std::to_string(j));
    }
    expect_close(vec(conv.rows(2, 3)), vec(rconv.rows(2, 3)), 0, 0, "B's conv state in place");
    expect_close(vec(state.rows(2, 3)), vec(rstate.rows(2, 3)), tol, tol, "B's state in place");
  }
}

TEST_F(LinearAttn, GatedRmsNormReadsTheGateColumnsInPlace) {
  const int T = randint(1, 20), H = randint(1, 5), D = randint(1, 40) * 4;
  const int z_col = randint(0, 9), Z = z_col + H * D + randint(0, 5);
  Tensor x = rand_f32({T, H, D}, -2.0f, 2.0f), z = rand_f32({T, Z}, -4.0f, 4.0f), w = rand_f32({D}, 0.5f, 1.5f);
  Tensor out = poisoned({T, H, D});
  const float eps = 1e-6f;
  be_.gated_rms_norm(x, z, z_col, w, eps, out);
  const std::vector<double> xv = vec(x), zv = vec(z), wv = vec(w);
  std::vector<double> want(xv.size());
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) {
      const size_t r = (static_cast<size_t>(t) * H + h) * D;
      double ss = 0;
      for (int i = 0; i < D; ++i) ss += xv[r + i] * xv[r + i];
      const double inv = 1.0 / std::sqrt(ss / D + eps);
      for (int i = 0; i < D; ++i) {
        const double g = zv[static_cast<size_t>(t) * Z + z_col + h * D + i];
        want[r + i] = xv[r + i] * inv * wv[i] * g / (1.0 + std::exp(-g));
      }
    }
  expect_close(vec(out), want, 1e-5, 1e-5, "gated norm");
  be_.gated_rms_norm(x, z, z_col, w, eps, x);  // in place
  expect_close(vec(x), want, 1e-5, 1e-5, "gated norm in place");
}

TEST_F(LinearAttn, BadSlotsAndShapesAreRefused) {
  const Dims d{1, 1, 4, 4};
  GdrInputs in = gdr_inputs(d, 2);
  Tensor state = rand_f32({2, 1, 4, 4}), out = poisoned({2, 1, 4});
  EXPECT_THROW(be_.gated_delta_rule(in.qkv, in.ba, in.ba_col, in.alog, in.dtb, state, meta({2}, {2}, {1}), out), Error);
  Tensor small = poisoned({2, 1, 3});
  EXPECT_THROW(be_.gated_delta_rule(in.qkv, in.ba, in.ba_col, in.alog, in.dtb, state, meta({2}, {0}, {1}), small),
               Error);
  Tensor conv_state = rand_f32({2, 3, d.C()}), conv_out = poisoned({2, d.C()});
  EXPECT_THROW(be_.causal_conv1d(in.qkv, 1, rand_f32({d.C(), 4}), conv_state, meta({2}, {0}, {1}), conv_out), Error);
  EXPECT_THROW(be_.causal_conv1d(in.qkv, 0, rand_f32({d.C(), 4}), conv_state, meta({1}, {0}, {1}), conv_out), Error);
}

}  // namespace
}  // namespace tessera
