// The Gated DeltaNet ops on the Qwen3.5-35B-A3B linear-attention shape (16 key heads, 32 value
// heads, head dims 128, conv kernel 4): first a check against the CPU backend on a small case,
// then CUDA-event timing (median).
//   - prefill: gated_delta_rule over one 8192-token sequence (the chunked tensor-core path),
//     in TFLOP/s of the chunked algorithm's matrix products (formula below), and causal_conv1d
//     over the same tokens;
//   - decode: one gated_delta_rule step per layer at batch 1..256, in GB/s of recurrent state
//     read + written, against the device-to-device copy bandwidth of the same run.
//   gdr_bench [--quick] [--tokens N]
#include <cstring>
#include <string>

#include "backend/attention_metadata.h"
#include "bench_util.h"

using namespace tessera;
using namespace tessera::bench;

namespace {

constexpr int kHk = 16, kHv = 32, kD = 128, kK = 4;
constexpr int kC = 2 * kHk * kD + kHv * kD;

const char* state_name(DType t) { return t == DType::kF32 ? "f32" : "bf16"; }

// Metadata in persistent memory (the timed loop rewinds the scratch arena every run).
LinearAttnMetadata persistent_meta(Backend& be, const std::vector<int>& lens, const std::vector<int>& slots, int init) {
  LinearAttnMetadata m;
  m.num_seqs = static_cast<int>(lens.size());
  m.host_query_start_loc = {0};
  for (int n : lens) {
    m.host_query_start_loc.push_back(m.host_query_start_loc.back() + n);
    m.max_query_len = std::max(m.max_query_len, n);
  }
  m.num_tokens = m.host_query_start_loc.back();
  m.host_state_slots.assign(slots.begin(), slots.end());
  m.host_has_initial_state.assign(lens.size(), init);
  auto up = [&](const std::vector<int32_t>& v) {
    Tensor t = be.alloc({static_cast<int64_t>(v.size())}, DType::kI32);
    be.copy_from_host(t, v.data());
    return t;
  };
  m.query_start_loc = up(m.host_query_start_loc);
  m.state_slots = up(m.host_state_slots);
  m.has_initial_state = up(m.host_has_initial_state);
  return m;
}

struct Inputs {
  std::vector<float> qkv, ba, alog, dtb, state;
};
Inputs make_inputs(int T, int num_slots, uint32_t seed) {
  Inputs in;
  in.qkv = random_bf16_values(static_cast<int64_t>(T) * kC, seed, -1.0f, 1.0f);
  in.ba = random_bf16_values(static_cast<int64_t>(T) * 2 * kHv, seed + 1, -3.0f, 3.0f);
  in.alog = random_bf16_values(kHv, seed + 2, -2.0f, 0.5f);
  in.dtb = random_bf16_values(kHv, seed + 3, -1.0f, 1.0f);
  in.state = random_bf16_values(static_cast<int64_t>(num_slots) * kHv * kD * kD, seed + 4, -0.3f, 0.3f);
  return in;
}

// CUDA against CPU on sequences crossing chunks, from initial states; returns the larger relative
// error of the outputs and the states.
double check(Backend& gpu, Backend& cpu, DType state_t) {
  const std::vector<int> lens = {150, 1, 70, 64};
  const std::vector<int> slots = {2, 0, 3, 1};
  int T = 0;
  for (int n : lens) T += n;
  Inputs in = make_inputs(T, 4, 7);
  const Shape ss{4, kHv, kD, kD};
  Tensor gs = upload(gpu, in.state, ss, state_t), cs = upload(cpu, in.state, ss, state_t);
  Tensor gout = gpu.alloc({T, kHv, kD}, DType::kBF16), cout = cpu.alloc({T, kHv, kD}, DType::kF32);
  LinearAttnMetadata gm = persistent_meta(gpu, lens, slots, 1), cm = persistent_meta(cpu, lens, slots, 1);
  gpu.gated_delta_rule(upload(gpu, in.qkv, {T, kC}, DType::kBF16), upload(gpu, in.ba, {T, 2 * kHv}, DType::kBF16), 0,
                       upload(gpu, in.alog, {kHv}, DType::kF32), upload(gpu, in.dtb, {kHv}, DType::kF32), gs, gm, gout);
  cpu.gated_delta_rule(upload(cpu, in.qkv, {T, kC}, DType::kF32), upload(cpu, in.ba, {T, 2 * kHv}, DType::kF32), 0,
                       upload(cpu, in.alog, {kHv}, DType::kF32), upload(cpu, in.dtb, {kHv}, DType::kF32), cs, cm, cout);
  gpu.synchronize();
  return std::max(rel_err(download(gpu, gout), download(cpu, cout)), rel_err(download(gpu, gs), download(cpu, cs)));
}

// Matrix-product FLOPs of the chunked algorithm per 64-token chunk and value head (C = 64):
// k k^T, q k^T: 2 C^2 Dk each; W = T (k...), U = T (v...): 2 C^2 (Dk + Dv); P V: 2 C^2 Dv;
// W H, k^T V, q H: 2 C Dk Dv each.
double chunked_flops(int64_t T) {
  const double C = 64, chunks = static_cast<double>((T + 63) / 64);
  const double per = 2 * C * C * (3.0 * kD + 2.0 * kD) + 3 * 2 * C * kD * kD;
  return per * chunks * kHv;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  int tokens = 8192;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) quick = true;
    if (!std::strcmp(argv[i], "--tokens") && i + 1 < argc) tokens = std::atoi(argv[++i]);
  }
  if (cuda_device_count() == 0) {
    std::fprintf(stderr, "gdr_bench: no CUDA device\n");
    return 1;
  }
  auto gpu = make_cuda_backend(0);
  auto cpu = make_backend({DeviceType::kCPU, 0, 0});
  for (DType st : {DType::kF32, DType::kBF16}) {
    const double err = check(*gpu, *cpu, st);
    std::printf("check vs CPU (state %s): relative error %.2e%s\n", state_name(st), err, err < 2e-2 ? "" : "  FAIL");
    if (!(err < 2e-2)) return 1;
  }
  const double copy_gbs = copy_bandwidth_gbs(*gpu);
  std::printf("copy bandwidth %.0f GB/s\n", copy_gbs);
  const int iters = quick ? 10 : 30;

  {  // prefill: one sequence of `tokens`
    const int T = tokens;
    Inputs in = make_inputs(T, 1, 11);
    Tensor qkv = upload(*gpu, in.qkv, {T, kC}, DType::kBF16), ba = upload(*gpu, in.ba, {T, 2 * kHv}, DType::kBF16);
    Tensor alog = upload(*gpu, in.alog, {kHv}, DType::kF32), dtb = upload(*gpu, in.dtb, {kHv}, DType::kF32);
    Tensor out = gpu->alloc({T, kHv, kD}, DType::kBF16), conv_out = gpu->alloc({T, kC}, DType::kBF16);
    Tensor w = upload(*gpu, random_bf16_values(int64_t{kC} * kK, 5, -0.5f, 0.5f), {kC, kK}, DType::kBF16);
    LinearAttnMetadata m = persistent_meta(*gpu, {T}, {0}, 0);
    for (DType st : {DType::kF32, DType::kBF16}) {
      Tensor state = gpu->alloc({1, kHv, kD, kD}, st), conv_state = gpu->alloc({1, kK - 1, kC}, st);
      gpu->fill(state, 0.0f);
      gpu->fill(conv_state, 0.0f);
      const double ms = time_ms(
          *gpu,
          [&](int) {
            gpu->reset_scratch();
            gpu->gated_delta_rule(qkv, ba, 0, alog, dtb, state, m, out);
          },
          3, iters);
      const double conv_ms = time_ms(
          *gpu, [&](int) { gpu->causal_conv1d(qkv, 0, w, conv_state, m, conv_out); }, 3, iters);
      std::printf(
          "prefill %d tokens, state %s: gated_delta_rule %.3f ms = %.1f TFLOP/s (chunked-algorithm FLOPs); "
          "causal_conv1d %.3f ms = %.0f GB/s\n",
          T, state_name(st), ms, chunked_flops(T) / (ms * 1e-3) / 1e12, conv_ms,
          2.0 * T * kC * 2 / (conv_ms * 1e-3) / 1e9);
    }
  }

  for (DType st : {DType::kF32, DType::kBF16}) {  // decode: one token per sequence
    for (int S : {1, 8, 64, 256}) {
      if (quick && S > 64) break;
      Inputs in = make_inputs(S, S, 13);
      Tensor qkv = upload(*gpu, in.qkv, {S, kC}, DType::kBF16), ba = upload(*gpu, in.ba, {S, 2 * kHv}, DType::kBF16);
      Tensor alog = upload(*gpu, in.alog, {kHv}, DType::kF32), dtb = upload(*gpu, in.dtb, {kHv}, DType::kF32);
      Tensor state = upload(*gpu, in.state, {S, kHv, kD, kD}, st), out = gpu->alloc({S, kHv, kD}, DType::kBF16);
      std::vector<int> lens(S, 1), slots(S);
      for (int s = 0; s < S; ++s) slots[s] = S - 1 - s;
      LinearAttnMetadata m = persistent_meta(*gpu, lens, slots, 1);
      const double ms = time_ms(
          *gpu, [&](int) { gpu->gated_delta_rule(qkv, ba, 0, alog, dtb, state, m, out); }, 10, iters * 4);
      const double bytes = 2.0 * S * kHv * kD * kD * dtype_size(st);
      std::printf("decode batch %d, state %s: %.1f us per layer, %.0f GB/s of state read + written (%.0f%% of copy)\n",
                  S, state_name(st), ms * 1e3, bytes / (ms * 1e-3) / 1e9, 100.0 * bytes / (ms * 1e-3) / 1e9 / copy_gbs);
    }
  }
  return 0;
}
