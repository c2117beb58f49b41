// Paged decode attention, split-K (flash-decoding) and GQA-aware: a block takes one
// query token, one kv head and up to 8 of its query heads, over one slice of the
// context; a second kernel merges the slices that hold keys. Grid: (head chunk, slice,
// token), slices the slower index, so the blocks with work come first in launch order. Each warp walks 16-key tiles,
// loading all of a tile's K and V before using any: two lanes per key for Q.K (16-byte loads), then every lane owns
// D/32 output dims for P.V. Scores are kept in the log2 domain (q pre-scaled by scale * k_scale * log2 e).
// A sliding window: the slices cut the keys from the first one the sequence's earliest query of the step
// attends (no block before it is read), and each token starts at its own window's first key.
#include <algorithm>

#include "backend/cuda/attention_common.cuh"
#include "backend/cuda/qkv_head.cuh"

namespace tessera::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kTile = 16;       // keys per warp step
constexpr int kMaxGroup = 8;    // query heads per block
constexpr int kMaxSplits = 64;  // key slices per (token, head) at most

// Keys per split when the kernel sizes splits from the sequence's own length: whole
// warp-tile rounds. The merge kernel recomputes it to skip the splits past the context.
__device__ __forceinline__ int split_part(int seq_len, int num_splits) {
  const int part = (seq_len + num_splits - 1) / num_splits;
  return (part + kWarps * kTile - 1) / (kWarps * kTile) * (kWarps * kTile);
}

// With a sliding window (a.window > 0), the keys of query token t of sequence s (qlen query tokens,
// t attends keys [0, kv_len) causally): the sequence's keys from `base` (the first key its earliest
// query of the step attends) are cut into num_splits slices of `part` keys, slice i starting at
// base + i * part; token t attends [lo, kv_len). Without a window: base 0, the slices of
// split_part(seq_len), lo 0.
struct WindowKeys {
  int base, part, lo;
};
__device__ __forceinline__ WindowKeys window_keys(const PagedAttentionArgs& a, int s, int qlen, int kv_len,
                                                  int num_splits) {
  const int seq_len = a.seq_lens[s], base = max(0, seq_len - qlen + 1 - a.window);
  return {base, split_part(seq_len - base, num_splits), max(0, kv_len - a.window)};
}

// GC: query heads a block computes (a power of two >= the group, at most 8); heads
// past the group are zeros and never written. A compile-time count keeps every
// per-head loop branch-free, so the heads' dependency chains interleave.
// kFused: the attention prologue is done here too (decode steps only: one query token per
// sequence): q comes normed and rotated from the fused QKV row `pro.qkv`, and the block whose
// slice holds the newest key writes that key and value into the cache before reading it.
// kWindow: a.window > 0 (a sliding window, window_keys); without it the window's code is compiled out.
// At least one block an SM, not more: given only the thread count, ptxas held the registers to
// an occupancy of its own choosing and spilled 4-64 bytes in a quarter of the variants (sm_90a
// and sm_120a alike); with this bound no variant spills (scripts/ptxas_report.sh).
template <int D, typename CT, int GC, bool kFused, bool kPre, bool kWindow>
__global__ void __launch_bounds__(kWarps * 32, 1)
    decode_attention_kernel(PagedAttentionArgs a, int num_splits, int max_qlen, float* __restrict__ ws,
                            QkvPrologueArgs pro, bool trigger_early) {
  // Q.K: kLpk lanes share a key (kDpl dims each), so a lane takes kKpl keys of the
  // 16-key tile and every q value it reads from shared memory serves kKpl keys.
  // Measured on H200 (Qwen3-8B heads): 2 beats 4 at batch >= 64 (occupancy), 4 wins
  // a little at batch 1.
  constexpr int kLpk = 2, kSlots = 32 / kLpk, kKpl = kTile / kSlots, kDpl = D / kLpk;
  constexpr int kQSeg = kDpl + 4;  // padded q segment per lane group: no bank conflicts
  constexpr int kVDims = D / 32;   // dims per lane in P.V
  __shared__ __align__(16) float q_s[GC][kLpk * kQSeg];
  __shared__ __align__(16) float p_s[kWarps][kTile][GC];  // a key's probabilities, all heads
  __shared__ float red_m[kWarps][GC], red_l[kWarps][GC];
  __shared__ float red_acc[kWarps][GC][D];

  const int split = blockIdx.y, t = blockIdx.z;
  const int group = a.Hq / a.Hk, gchunks = (group + GC - 1) / GC;
  const int kh = blockIdx.x / gchunks, gc = blockIdx.x % gchunks;
  const int h0 = kh * group + gc * GC, ng = min(GC, group - gc * GC);
  const int s = seq_of_token(a.query_start_loc, a.num_seqs, t);
  const int q_begin = a.query_start_loc[s], qlen = a.query_start_loc[s + 1] - q_begin;
  const int kv_len = a.seq_lens[s] - qlen + (t - q_begin) + 1;
  // Slices sized from this sequence's own length (a captured graph's launch serves any lengths).
  int start, end;
  if constexpr (kWindow) {
    const WindowKeys w = window_keys(a, s, qlen, kv_len, num_splits);
    start = max(w.base + split * w.part, w.lo);
    end = min(w.base + (split + 1) * w.part, kv_len);
  } else {
    const int part = split_part(a.seq_lens[s], num_splits);
    start = split * part;
    end = min(start + part, kv_len);
  }
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const CT* kc = static_cast<const CT*>(a.k_cache);
  const CT* vc = static_cast<const CT*>(a.v_cache);
  const int32_t* bt = a.block_tables + static_cast<int64_t>(s) * a.max_blocks_per_seq;
  const int bs = a.block_size;
  const int slot = lane / kLpk, part_id = lane % kLpk;
  // Raw cache vectors: 8 elements of K per load, kVDims of V. A tile's loads all go out
  // before any is used: one memory round trip per tile.
  using KRaw = typename RawVec<CT, 8>::type;
  using VRaw = typename RawVec<CT, kVDims>::type;
  int rows[kKpl];
  bool valid[kKpl];
  KRaw kraw[kKpl][kDpl / 8];
  VRaw vraw[kTile];
  auto load_tile = [&](int tile) {
#pragma unroll
    for (int i = 0; i < kKpl; ++i) {
      const int j = tile + slot + i * kSlots;
      valid[i] = j < end;
      const int jc = valid[i] ? j : end - 1;  // clamped: a readable row whose p is 0
      rows[i] = (bt[jc / bs] * bs + jc % bs) * a.Hk + kh;
      const KRaw* kp = reinterpret_cast<const KRaw*>(kc + static_cast<int64_t>(rows[i]) * D + part_id * kDpl);
#pragma unroll
      for (int c = 0; c < kDpl / 8; ++c) kraw[i][c] = kp[c];
    }
#pragma unroll
    for (int kk = 0; kk < kTile; ++kk) {
      const int r = __shfl_sync(0xffffffffu, rows[kk / kSlots], (kk % kSlots) * kLpk);
      vraw[kk] = *reinterpret_cast<const VRaw*>(vc + static_cast<int64_t>(r) * D + lane * kVDims);
    }
  };
  // kPre (fused, small batches): the cache holds every key but the newest before this kernel
  // runs, so the first tile's loads go out before pdl_wait, overlapping the QKV projection's
  // end and this kernel's prologue; the newest key's row is patched in from shared memory.
  // trigger_early: the merge kernel after this one launches now and waits (its blocks take few
  // slots), instead of launching when this kernel ends.
  if (trigger_early) pdl_launch_dependents();
  // A slice past the context (a captured graph sizes the split count for max_model_len, so at
  // short contexts most are) has nothing to do: the merge kernel reads only the slices that hold
  // keys. It leaves before pdl_wait (the sequence lengths are the host's), freeing its SM slot;
  // the kernel still ends after the ones before it, as slice 0 of every (token, head chunk) holds
  // keys and its block waits (device_utils.cuh).
  if (start >= end) return;
  const int tile0 = start + warp * kTile;
  if constexpr (kPre) {
    if (tile0 < end) load_tile(tile0);
  }
  // Launched with PDL (device_utils.cuh): the step inputs above are the host's; q, the
  // cache and ws are not.
  pdl_wait();
  if (qlen > max_qlen) return;

  auto ws_row = [&](int g) { return ws + ((static_cast<int64_t>(t) * a.Hq + h0 + g) * num_splits + split) * (D + 2); };

  const float qscale = a.scale * a.k_scale * kLog2e;
  __shared__ __align__(16) CT new_kv[2][kPre ? D : 1];  // kPre: the newest key [0] and value [1] as stored
  int newest_row = -1;                                  // kPre: their cache row, if this slice holds it
  if constexpr (kFused) {
    __shared__ float head_buf[kWarps][D];
    QkvHead hd{pro, head_buf[warp], pro.positions[t]};
    const bool pos_ok = hd.pos >= 0 && hd.pos < pro.max_pos;
    if (!pos_ok && tid == 0) raise_error(pro.err, kErrRopePosition);
    for (int g = warp; g < GC; g += kWarps) {  // q heads, one warp each, rounded to bf16 as stored
      if (g < ng && pos_ok) hd.load(t, h0 + g, pro.q_norm, lane);
      for (int d = lane; d < D; d += 32)
        q_s[g][(d / kDpl) * kQSeg + d % kDpl] =
            g < ng && pos_ok ? __bfloat162float(__float2bfloat16_rn(hd.rope_at(d))) * qscale : 0.0f;
      __syncwarp();
    }
    const int32_t new_slot = pro.slots[t];
    // The slice that holds the newest key writes it and its value: the last two warps, which the
    // q heads above keep least busy (none of them at GC <= 2).
    if (end == kv_len && warp >= kWarps - 2 && pos_ok && new_slot >= 0) {
      if (new_slot >= pro.num_slots) {
        if (lane == 0) raise_error(pro.err, kErrKvSlot);
      } else if (warp == kWarps - 2) {  // k: normed and rotated
        hd.load(t, a.Hq + kh, pro.k_norm, lane);
        CT* dst = static_cast<CT*>(pro.k_cache) + (static_cast<int64_t>(new_slot) * a.Hk + kh) * D;
        for (int d = lane; d < D; d += 32) {
          const CT v = from_float<CT>(hd.rope_at(d) * pro.inv_k_scale);
          dst[d] = v;
          if constexpr (kPre) new_kv[0][d] = v;
        }
      } else {  // v: as it is
        hd.load(t, a.Hq + a.Hk + kh, nullptr, lane);
        CT* dst = static_cast<CT*>(pro.v_cache) + (static_cast<int64_t>(new_slot) * a.Hk + kh) * D;
        for (int d = lane; d < D; d += 32) {
          const CT v = from_float<CT>(hd.b[d] * pro.inv_v_scale);
          dst[d] = v;
          if constexpr (kPre) new_kv[1][d] = v;
        }
      }
    }
    if constexpr (kPre)
      if (end == kv_len && pos_ok && new_slot >= 0 && new_slot < pro.num_slots) newest_row = new_slot * a.Hk + kh;
  } else {
    const __nv_bfloat16* q = static_cast<const __nv_bfloat16*>(a.q);
    for (int i = tid; i < GC * D; i += blockDim.x) {
      int g = i / D, d = i % D;
      float v = g < ng ? __bfloat162float(q[(static_cast<int64_t>(t) * a.Hq + h0 + g) * D + d]) * qscale : 0.0f;
      q_s[g][(d / kDpl) * kQSeg + d % kDpl] = v;
    }
  }
  __syncthreads();  // q_s, and (fused) the newest key and value in the cache, seen by every thread

  const float* qh = &q_s[0][part_id * kQSeg];

  float m[GC], l[GC], acc[GC][kVDims];
#pragma unroll
  for (int g = 0; g < GC; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int d = 0; d < kVDims; ++d) acc[g][d] = 0.0f;
  }

  // The preloaded tile was read before this kernel wrote the newest key and value: their row
  // (also where an out-of-range key was clamped onto it) comes from shared memory instead.
  auto patch_newest = [&] {
    if constexpr (kPre) {
      if (newest_row < 0) return;
#pragma unroll
      for (int i = 0; i < kKpl; ++i)
        if (rows[i] == newest_row) {
#pragma unroll
          for (int c = 0; c < kDpl / 8; ++c)
            kraw[i][c] = *reinterpret_cast<const KRaw*>(&new_kv[0][part_id * kDpl + c * 8]);
        }
#pragma unroll
      for (int kk = 0; kk < kTile; ++kk) {
        const int r = __shfl_sync(0xffffffffu, rows[kk / kSlots], (kk % kSlots) * kLpk);
        if (r == newest_row) vraw[kk] = *reinterpret_cast<const VRaw*>(&new_kv[1][lane * kVDims]);
      }
    }
  };
  for (int tile = tile0; tile < end; tile += kWarps * kTile) {
    if (kPre && tile == tile0)
      patch_newest();
    else
      load_tile(tile);

    float dot[kKpl][GC];
#pragma unroll
    for (int i = 0; i < kKpl; ++i)
#pragma unroll
      for (int g = 0; g < GC; ++g) dot[i][g] = 0.0f;
#pragma unroll
    for (int c = 0; c < kDpl / 8; ++c) {
      float kf[kKpl][8];
#pragma unroll
      for (int i = 0; i < kKpl; ++i) load_cache<CT, 8>(reinterpret_cast<const CT*>(&kraw[i][c]), kf[i]);
#pragma unroll
      for (int g = 0; g < GC; ++g) {
        const float4 qa = *reinterpret_cast<const float4*>(qh + g * (kLpk * kQSeg) + c * 8);
        const float4 qb = *reinterpret_cast<const float4*>(qh + g * (kLpk * kQSeg) + c * 8 + 4);
#pragma unroll
        for (int i = 0; i < kKpl; ++i) {  // explicit FMAs: the same bits in every instantiation
          float d = dot[i][g];
          d = fmaf(qa.x, kf[i][0], d);
          d = fmaf(qa.y, kf[i][1], d);
          d = fmaf(qa.z, kf[i][2], d);
          d = fmaf(qa.w, kf[i][3], d);
          d = fmaf(qb.x, kf[i][4], d);
          d = fmaf(qb.y, kf[i][5], d);
          d = fmaf(qb.z, kf[i][6], d);
          dot[i][g] = fmaf(qb.w, kf[i][7], d);
        }
      }
    }
#pragma unroll
    for (int g = 0; g < GC; ++g) {
      float sc[kKpl], tmax = -INFINITY;
#pragma unroll
      for (int i = 0; i < kKpl; ++i) {
        float d = dot[i][g];
#pragma unroll
        for (int o = 1; o < kLpk; o <<= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
        sc[i] = valid[i] ? d : -INFINITY;
        tmax = fmaxf(tmax, sc[i]);
      }
      const float mnew = fmaxf(m[g], warp_max(tmax));  // finite: key `tile` is always valid
      const float alpha = exp2f(m[g] - mnew);
      float psum = 0.0f;
#pragma unroll
      for (int i = 0; i < kKpl; ++i) {
        const float p = valid[i] ? exp2f(sc[i] - mnew) : 0.0f;
        if (part_id == 0) {
          p_s[warp][slot + i * kSlots][g] = p;
          psum += p;
        }
      }
      l[g] = fmaf(l[g], alpha, warp_sum(psum));
      m[g] = mnew;
#pragma unroll
      for (int d = 0; d < kVDims; ++d) acc[g][d] *= alpha;
    }
    __syncwarp();
#pragma unroll
    for (int kk = 0; kk < kTile; ++kk) {
      float vf[kVDims];
      load_cache<CT, kVDims>(reinterpret_cast<const CT*>(&vraw[kk]), vf);
      float pv[GC];  // 0 past the slice
      if constexpr (GC % 4 == 0) {
#pragma unroll
        for (int g4 = 0; g4 < GC / 4; ++g4) {
          const float4 t4 = *reinterpret_cast<const float4*>(&p_s[warp][kk][4 * g4]);
          pv[4 * g4] = t4.x;
          pv[4 * g4 + 1] = t4.y;
          pv[4 * g4 + 2] = t4.z;
          pv[4 * g4 + 3] = t4.w;
        }
      } else if constexpr (GC == 2) {
        const float2 t2 = *reinterpret_cast<const float2*>(&p_s[warp][kk][0]);
        pv[0] = t2.x;
        pv[1] = t2.y;
      } else {
        pv[0] = p_s[warp][kk][0];
      }
#pragma unroll
      for (int g = 0; g < GC; ++g) {
#pragma unroll
        for (int d = 0; d < kVDims; ++d) acc[g][d] = fmaf(pv[g], vf[d], acc[g][d]);
      }
    }
    __syncwarp();
  }

  // Merge the warps' partial softmax states.
#pragma unroll
  for (int g = 0; g < GC; ++g) {
    if (lane == 0) {
      red_m[warp][g] = m[g];
      red_l[warp][g] = l[g];
    }
#pragma unroll
    for (int d = 0; d < kVDims; ++d) red_acc[warp][g][lane * kVDims + d] = acc[g][d];
  }
  __syncthreads();
  for (int i = tid; i < ng * D; i += blockDim.x) {
    const int g = i / D, d = i % D;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, red_m[w][g]);
    float o = 0.0f, sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      if (red_m[w][g] == -INFINITY) continue;  // a warp that saw no key
      const float f = exp2f(red_m[w][g] - mx);
      o = fmaf(red_acc[w][g][d], f, o);
      sum = fmaf(red_l[w][g], f, sum);
    }
    if (num_splits == 1) {
      __nv_bfloat16* out = static_cast<__nv_bfloat16*>(a.out);
      out[(static_cast<int64_t>(t) * a.Hq + h0 + g) * D + d] = __float2bfloat16_rn(o / sum * a.v_scale);
    } else {
      float* w = ws_row(g);
      w[d] = o * a.v_scale;
      if (d == 0) {
        w[D] = mx;
        w[D + 1] = sum;
      }
    }
  }
}

// Merges the slices of one (token, head); only the slices that hold keys are read.
template <int D, bool kWindow>
__global__ void decode_reduce_kernel(PagedAttentionArgs a, int num_splits, int max_qlen, const float* __restrict__ ws) {
  const int h = blockIdx.x, t = blockIdx.y, d = threadIdx.x;
  const int s = seq_of_token(a.query_start_loc, a.num_seqs, t);
  const int q_begin = a.query_start_loc[s], qlen = a.query_start_loc[s + 1] - q_begin;
  const int kv_len = a.seq_lens[s] - qlen + (t - q_begin) + 1;
  // The slices that hold keys of token t: [first, used).
  int first = 0, used;
  if constexpr (kWindow) {
    const WindowKeys w = window_keys(a, s, qlen, kv_len, num_splits);
    used = min(num_splits, (kv_len - w.base + w.part - 1) / w.part);
    first = (w.lo - w.base) / w.part;
  } else {
    const int part = split_part(a.seq_lens[s], num_splits);
    used = min(num_splits, (kv_len + part - 1) / part);
  }
  static_assert(D >= kMaxSplits, "a thread per split loads its max and sum");
  __shared__ float s_m[kMaxSplits], s_l[kMaxSplits];
  pdl_wait();  // launched with PDL (device_utils.cuh)
  if (qlen > max_qlen) return;
  const float* base = ws + (static_cast<int64_t>(t) * a.Hq + h) * num_splits * (D + 2);
  // The slices' maxima and sums, one load a thread, and their outputs 8 loads at a time: a loop of
  // dependent L2 round trips (one a slice, twice) was most of this kernel's time at batch 1.
  if ((!kWindow || d >= first) && d < used) {
    s_m[d] = base[d * (D + 2) + D];
    s_l[d] = base[d * (D + 2) + D + 1];
  }
  __syncthreads();
  float mx = -INFINITY;
  for (int sp = first; sp < used; ++sp) mx = fmaxf(mx, s_m[sp]);
  float o = 0.0f, sum = 0.0f;
  for (int sp0 = first; sp0 < used; sp0 += 8) {
    float wv[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) wv[j] = sp0 + j < used ? base[(sp0 + j) * (D + 2) + d] : 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {  // in slice order, as one at a time
      const int sp = sp0 + j;
      if (sp >= used || s_l[sp] == 0.0f) continue;
      const float f = exp2f(s_m[sp] - mx);
      o = fmaf(wv[j], f, o);
      sum = fmaf(s_l[sp], f, sum);
    }
  }
  static_cast<__nv_bfloat16*>(a.out)[(static_cast<int64_t>(t) * a.Hq + h) * D + d] = __float2bfloat16_rn(o / sum);
}

// Power of two >= group, at most 8.
int full_group_chunk(int group) { return group <= 1 ? 1 : group <= 2 ? 2 : group <= 4 ? 4 : 8; }
// Query heads a block takes at most: 8, or 4 at head_dim 256 (8 heads of 256 dims need more than
// 255 registers a thread, and ptxas spilled them).
constexpr int max_group_chunk(int D) { return D >= 256 ? 4 : 8; }

template <int D, typename CT, bool kFused, bool kPre, bool kWindow>
void decode_launch(const PagedAttentionArgs& a, int num_splits, int max_qlen, float* ws, const QkvPrologueArgs& pro,
                   int gc, bool early_merge, cudaStream_t s) {
  const int group = a.Hq / a.Hk;
  gc = std::min(gc, max_group_chunk(D));
  dim3 grid(a.Hk * ((group + gc - 1) / gc), num_splits, a.num_tokens);
  const bool trigger_early = early_merge && num_splits > 1;
  switch (gc) {
    case 1:
      launch_pdl(decode_attention_kernel<D, CT, 1, kFused, kPre, kWindow>, grid, kWarps * 32, 0, s, a, num_splits,
                 max_qlen, ws, pro, trigger_early);
      break;
    case 2:
      launch_pdl(decode_attention_kernel<D, CT, 2, kFused, kPre, kWindow>, grid, kWarps * 32, 0, s, a, num_splits,
                 max_qlen, ws, pro, trigger_early);
      break;
    case 4:
      launch_pdl(decode_attention_kernel<D, CT, 4, kFused, kPre, kWindow>, grid, kWarps * 32, 0, s, a, num_splits,
                 max_qlen, ws, pro, trigger_early);
      break;
    default:
      if constexpr (max_group_chunk(D) >= 8)
        launch_pdl(decode_attention_kernel<D, CT, 8, kFused, kPre, kWindow>, grid, kWarps * 32, 0, s, a, num_splits,
                   max_qlen, ws, pro, trigger_early);
      break;
  }
}

// Tokens up to which the fused kernel loads its first tile before the PDL wait (more
// registers held across the prologue; at large batches occupancy matters more).
constexpr int kPreloadMaxTokens = 8;
// decode_attention_heads_per_block's rule: a one-token step takes at most this many heads a block.
constexpr int kOneTokenHeads = 2;

template <int D, typename CT, bool kFused, bool kWindow>
void decode_t(const PagedAttentionArgs& a, int num_splits, int max_qlen, float* ws, const QkvPrologueArgs& pro, int gc,
              bool early_merge, cudaStream_t s) {
  if (kFused && a.num_tokens <= kPreloadMaxTokens)
    decode_launch<D, CT, kFused, kFused, kWindow>(a, num_splits, max_qlen, ws, pro, gc, early_merge, s);
  else
    decode_launch<D, CT, kFused, false, kWindow>(a, num_splits, max_qlen, ws, pro, gc, early_merge, s);
  TCUDA_LAUNCH_CHECK();
  if (num_splits > 1) {
    launch_pdl(decode_reduce_kernel<D, kWindow>, dim3(a.Hq, a.num_tokens), D, 0, s, a, num_splits, max_qlen, ws);
    TCUDA_LAUNCH_CHECK();
  }
}

template <int D, typename CT>
void decode_dispatch(const PagedAttentionArgs& a, int num_splits, int max_qlen, float* ws, const QkvPrologueArgs* fused,
                     int gc, bool early_merge, cudaStream_t s) {
  const bool window = a.window > 0;
  if (fused && window)
    decode_t<D, CT, true, true>(a, num_splits, max_qlen, ws, *fused, gc, early_merge, s);
  else if (fused)
    decode_t<D, CT, true, false>(a, num_splits, max_qlen, ws, *fused, gc, early_merge, s);
  else if (window)
    decode_t<D, CT, false, true>(a, num_splits, max_qlen, ws, QkvPrologueArgs{}, gc, early_merge, s);
  else
    decode_t<D, CT, false, false>(a, num_splits, max_qlen, ws, QkvPrologueArgs{}, gc, early_merge, s);
}

}  // namespace

bool decode_attention_supported(int D, DType cache_dtype) {
  return (D == 64 || D == 128 || D == 256) && (cache_dtype == DType::kBF16 || cache_dtype == DType::kF8E4M3);
}

int decode_attention_num_splits(int num_tokens, int Hk, int group, int max_seq_len, int num_sms) {
  const int blocks = num_tokens * Hk * ((group + kMaxGroup - 1) / kMaxGroup);
  const int want = (2 * num_sms + blocks - 1) / std::max(blocks, 1);
  const int most = std::max(1, (max_seq_len + 63) / 64);  // at least one 16-key tile per warp
  return std::clamp(want, 1, std::min(most, kMaxSplits));
}

int decode_attention_heads_per_block(int num_tokens, int group) {
  // One token: a block of 4 warps over its slice's keys is bound by the issue rate of its Q.K and
  // P.V FMAs for 8 heads, not by its loads, and the grid leaves SMs idle; chunks of 2 heads spread
  // the same work over 4x the blocks (each chunk reads the slice's keys, from L2 after the first).
  // attention_bench --heads on the H200 (us a layer, fused decode, 48 layers; 2 heads against the
  // whole group of 8): batch 1 at 640 keys 11.1 vs 16.1 (Qwen3-30B-A3B heads) and 12.9 vs 21.5
  // (Qwen3.5-35B-A3B), at 4,096 keys 29.5 vs 25.7 and 30.9 vs 29.0. A captured graph serves every
  // context length, so the choice can follow only the batch: from 2 tokens on no chunk size won at
  // both lengths (Qwen3.5 at 4,096 keys, batch 2: 49.1 with 2 heads, 34.5 with 8).
  const int full = full_group_chunk(group);
  return num_tokens == 1 ? std::min(full, kOneTokenHeads) : full;
}

void launch_decode_attention(const PagedAttentionArgs& a, int num_splits, int max_qlen, float* ws,
                             const QkvPrologueArgs* fused, cudaStream_t s, int heads_per_block, bool early_merge) {
  if (a.num_tokens == 0) return;
  const int group = a.Hq / a.Hk;
  // decode_launch takes at most max_group_chunk(D) of them.
  const int gc = heads_per_block > 0 ? std::min(full_group_chunk(heads_per_block), full_group_chunk(group))
                                     : decode_attention_heads_per_block(a.num_tokens, group);
  const bool fp8 = a.cache_dtype == DType::kF8E4M3;
  if (a.D == 128) {
    fp8 ? decode_dispatch<128, __nv_fp8_e4m3>(a, num_splits, max_qlen, ws, fused, gc, early_merge, s)
        : decode_dispatch<128, __nv_bfloat16>(a, num_splits, max_qlen, ws, fused, gc, early_merge, s);
  } else if (a.D == 256) {  // Qwen3-Next / Qwen3.5 gated attention (2 kv heads)
    fp8 ? decode_dispatch<256, __nv_fp8_e4m3>(a, num_splits, max_qlen, ws, fused, gc, early_merge, s)
        : decode_dispatch<256, __nv_bfloat16>(a, num_splits, max_qlen, ws, fused, gc, early_merge, s);
  } else {
    fp8 ? decode_dispatch<64, __nv_fp8_e4m3>(a, num_splits, max_qlen, ws, fused, gc, early_merge, s)
        : decode_dispatch<64, __nv_bfloat16>(a, num_splits, max_qlen, ws, fused, gc, early_merge, s);
  }
}

}  // namespace tessera::cuda
