// Routed experts (Backend::moe_experts), bf16 and FP8 block-scaled (e4m3, one f32 scale per
// 128 x 128 block, as the FP8 checkpoints), at two shapes:
//   qwen3-30b-a3b:     hidden 2048, expert intermediate 768, 128 experts, top-8;
//   qwen3.5-122b-a10b: hidden 3072, expert intermediate 1024, 256 experts, top-8 (the flagship).
// The decode path at T = 1, 8, 32, the grouped GEMM at T = 64 and 512 (where the paths cross
// over) and the prefill path at T = 4096, against the copy bandwidth and the cuBLAS 8192^3 bf16
// GEMM rate measured in the same run. Routing is realistic: random router logits through
// moe_topk, different for each of 4 layers (4 weight copies, so that the experts do not sit in L2).
//   decode: bytes = distinct selected experts of the step x an expert's bytes (FP8: e4m3 weights
//     plus their scales; from the actual routing, read back from the device), GB/s and % of
//     copy; also per layer in a captured graph of the 4 layers (no launch gaps, as in a decode step).
//   prefill: active FLOPs = T * k * 6 * H * I, TFLOP/s and % of the bf16 GEMM rate.
// path: gemv = the decode path (T * k <= 256), gemm = the grouped-GEMM path;
// TESSERA_CUDA_OPTIONS=moe_gemv=0 makes the backend take the grouped GEMM at every T (A/B runs).
// First checks both paths and both formats against the CPU backend on 16 experts.
//   moe_bench [--quick] [--model qwen3-30b-a3b|qwen3.5-122b-a10b] [--dtype bf16|fp8]
// (default: both models, both formats).
// Then the decode variants (CudaMoeDecode, and for the split one each CudaMoeOneToken;
// backend/cuda/cuda_options.h) side by side: each on a
// backend of its own, checked against the CPU, then microseconds per layer (moe_topk_experts: router
// top-k + experts, as a decode step runs them) replayed from a captured graph of the 4 layers, at T = 1 ... 32,
// for the Qwen3-30B-A3B shape and the Qwen3.5-35B-A3B one (256 experts of I 512, a gated shared expert).
//   moe_bench [--quick] [--variants]   (--variants: the checks, the copy figure and that table only)
#include <cstring>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "bench_util.h"

using namespace tessera;
using namespace tessera::bench;

namespace {

// Whether the backends of this process take the decode path (TESSERA_CUDA_OPTIONS's moe_gemv).
bool moe_gemv_on() {
  CudaOptions o;
  apply_cuda_options(cuda_options_from_env(), o);
  return o.moe_gemv;
}
const char* decode_path() { return cuda_moe_decode_name(CudaOptions{}.moe_decode); }

constexpr int64_t kK = 8, kLayers = 4;

struct Shape3 {
  const char* name;
  int64_t H, I, E;
};
constexpr Shape3 kModels[] = {{"qwen3-30b-a3b", 2048, 768, 128}, {"qwen3.5-122b-a10b", 3072, 1024, 256}};

// An expert stack [E, R, C] in the format: bf16 values in [-0.05, 0.05], or e4m3 over the
// whole range with one scale (so that the values span the same range).
Tensor experts_on(Backend& be, bool fp8, Shape shape, uint64_t seed) {
  if (!fp8) {
    Tensor t = be.alloc(shape, DType::kBF16);
    be.fill_random(t, seed, -0.05f, 0.05f);
    return t;
  }
  Tensor q = be.alloc(shape, DType::kF8E4M3), s = be.alloc(block_scale_shape(shape), DType::kF32);
  be.fill_random(q, seed, -448.0f, 448.0f);
  be.fill_random(s, seed + 1, 0.5f * 0.05f / 448.0f, 0.05f / 448.0f);
  return q.with_block_scale(s);
}

// Host e4m3 bytes (from random values over e4m3's range) and block scales of [E, R, C], on `be`.
Tensor fp8_host_experts(Backend& be, Shape shape, uint32_t seed) {
  const auto v = random_bf16_values(shape.numel(), seed, -448.0f, 448.0f);
  std::vector<uint8_t> q(v.size());
  for (size_t i = 0; i < v.size(); ++i) q[i] = f32_to_fp8e4m3(v[i]);
  const Shape ss = block_scale_shape(shape);
  const auto sc = random_bf16_values(ss.numel(), seed + 1, 0.5f * 0.05f / 448.0f, 0.05f / 448.0f);
  Tensor t = be.alloc(shape, DType::kF8E4M3), s = be.alloc(ss, DType::kF32);
  be.copy_from_host(t, q.data());
  be.copy_from_host(s, sc.data());
  return t.with_block_scale(s);
}

double check(Backend& gpu, const Shape3& m, bool fp8, int64_t T) {
  const int64_t E = 16, H = m.H, I = m.I, k = kK;
  auto cpu = make_backend({DeviceType::kCPU, 0, 0});
  auto x = random_bf16_values(T * H, 1), logits = random_bf16_values(T * E, 4, -3, 3);
  auto host = [&](const std::vector<float>& v, Shape s) {
    Tensor t = cpu->alloc(s, DType::kF32);
    std::memcpy(t.raw(), v.data(), v.size() * 4);
    return t;
  };
  Tensor ids = cpu->alloc({T, k}, DType::kI32), w = cpu->alloc({T, k}, DType::kF32);
  cpu->moe_topk(host(logits, {T, E}), static_cast<int>(k), true, ids, w);
  Tensor ref = cpu->alloc({T, H}, DType::kF32);
  Tensor out = gpu.alloc({T, H}, DType::kBF16);
  gpu.fill(out, NAN);
  Tensor gids = gpu.alloc({T, k}, DType::kI32);
  gpu.copy_from_host(gids, ids.raw());
  Tensor gw = gpu.alloc({T, k}, DType::kF32);
  gpu.copy_from_host(gw, w.raw());
  if (fp8) {
    cpu->moe_experts(host(x, {T, H}), fp8_host_experts(*cpu, {E, 2 * I, H}, 2), fp8_host_experts(*cpu, {E, H, I}, 3),
                     ids, w, 0, ref);
    gpu.moe_experts(upload(gpu, x, {T, H}, DType::kBF16), fp8_host_experts(gpu, {E, 2 * I, H}, 2),
                    fp8_host_experts(gpu, {E, H, I}, 3), gids, gw, 0, out);
  } else {
    auto gu = random_bf16_values(E * 2 * I * H, 2, -0.05f, 0.05f), dn = random_bf16_values(E * H * I, 3, -0.05f, 0.05f);
    cpu->moe_experts(host(x, {T, H}), host(gu, {E, 2 * I, H}), host(dn, {E, H, I}), ids, w, 0, ref);
    gpu.moe_experts(upload(gpu, x, {T, H}, DType::kBF16), upload(gpu, gu, {E, 2 * I, H}, DType::kBF16),
                    upload(gpu, dn, {E, H, I}, DType::kBF16), gids, gw, 0, out);
  }
  std::vector<float> want(static_cast<size_t>(T * H));
  std::memcpy(want.data(), ref.raw(), want.size() * 4);
  double err = rel_err(download(gpu, out), want);
  gpu.reset_scratch();
  return err;
}

// The timing table of one shape and format; false when a check failed.
bool bench_model(Backend& gpu, const Shape3& m, bool fp8, bool quick, double copy_gbs, double gemm_tflops) {
  const char* fmt = fp8 ? "fp8" : "bf16";
  for (int64_t T : {1, 3, 16, 300}) {
    const double err = check(gpu, m, fp8, T);
    std::printf("check: %s %s moe_experts T=%ld (%s path), 16 experts, vs CPU: rel_err %.2e %s\n", m.name, fmt, long(T),
                moe_gemv_on() && T * kK <= 256 ? decode_path() : "gemm", err, err < 1e-2 ? "OK" : "FAIL");
    if (!(err < 1e-2)) return false;
  }
  const int64_t kH = m.H, kI = m.I, kE = m.E;
  std::vector<Tensor> gate_up, down;
  for (int64_t l = 0; l < kLayers; ++l) {
    gate_up.push_back(experts_on(gpu, fp8, {kE, 2 * kI, kH}, 100 + 2 * l));
    down.push_back(experts_on(gpu, fp8, {kE, kH, kI}, 200 + 2 * l));
  }
  // Bytes of one expert: its weights, and for FP8 its f32 block scales.
  const double scale_bytes =
      fp8 ? 4.0 * (block_scale_shape({2 * kI, kH}).numel() + block_scale_shape({kH, kI}).numel()) : 0;
  const double expert_bytes = 3.0 * kH * kI * (fp8 ? 1 : 2) + scale_bytes;
  std::printf("\n%s experts, %s: H=%ld I=%ld E=%ld k=%ld, %.2f MB per expert, %ld layers rotated (%.1f GB)\n", m.name,
              fmt, long(kH), long(kI), long(kE), long(kK), expert_bytes / 1e6, long(kLayers),
              kLayers * kE * expert_bytes / 1e9);
  std::printf("%-8s %6s %9s %10s %10s %9s %7s %10s %9s %7s %9s %7s\n", "path", "T", "experts", "MB/layer", "topk_us",
              "us/layer", "GB/s", "%copy", "graph_us", "%copy", "TFLOP/s", "%gemm");
  for (int64_t T : {1, 8, 32, 64, 512, 4096}) {
    Tensor x = gpu.alloc({T, kH}, DType::kBF16), out = gpu.alloc({T, kH}, DType::kBF16);
    gpu.fill_random(x, 7, -1, 1);
    std::vector<Tensor> logits, ids, w;
    double distinct = 0;
    for (int64_t l = 0; l < kLayers; ++l) {
      logits.push_back(gpu.alloc({T, kE}, DType::kF32));
      gpu.fill_random(logits.back(), 300 + 10 * T + l, -4, 4);
      ids.push_back(gpu.alloc({T, kK}, DType::kI32));
      w.push_back(gpu.alloc({T, kK}, DType::kF32));
      gpu.moe_topk(logits[l], static_cast<int>(kK), true, ids[l], w[l]);
      std::vector<int32_t> h(static_cast<size_t>(T * kK));
      gpu.copy_to_host(h.data(), ids[l]);
      distinct += static_cast<double>(std::set<int32_t>(h.begin(), h.end()).size()) / kLayers;
    }
    const int iters = quick ? 10 : 40;
    const double topk_ms = time_ms(
        gpu,
        [&](int i) { gpu.moe_topk(logits[i % kLayers], static_cast<int>(kK), true, ids[i % kLayers], w[i % kLayers]); },
        5, iters);
    auto layer = [&](int64_t l) {  // each layer's workspace released after it, as the model does
      const size_t mark = gpu.scratch_mark();
      gpu.moe_experts(x, gate_up[l], down[l], ids[l], w[l], 0, out);
      gpu.scratch_rewind(mark);
    };
    gpu.reset_scratch();
    const double ms = time_ms(
                          gpu,
                          [&](int) {
                            for (int64_t l = 0; l < kLayers; ++l) layer(l);
                          },
                          3, iters) /
                      kLayers;
    const double bytes = distinct * expert_bytes;
    const double gbs = bytes / (ms * 1e-3) / 1e9;
    const double tflops = 6.0 * T * kK * kH * kI / (ms * 1e-3) / 1e12;
    // The backend's choice (moe_gemv=0 forces the grouped GEMM at every T).
    const bool gemv = moe_gemv_on() && T * kK <= 256, decode = T <= 32;
    double graph_ms = 0;
    if (decode) {
      gpu.reset_scratch();
      for (int64_t l = 0; l < kLayers; ++l) layer(l);  // sizes the scratch arena before capture
      gpu.synchronize();
      gpu.reset_scratch();
      gpu.begin_capture();
      for (int64_t l = 0; l < kLayers; ++l) layer(l);
      std::unique_ptr<CapturedGraph> g = gpu.end_capture();
      graph_ms = time_ms(
                     gpu, [&](int) { gpu.replay(*g); }, 3, iters) /
                 kLayers;
    }
    const double graph_gbs = decode ? bytes / (graph_ms * 1e-3) / 1e9 : 0;
    std::printf("%-8s %6ld %9.1f %10.1f %10.1f %9.1f %7.0f %9.0f%% %9.1f %6.0f%% %9.1f %6.0f%%\n",
                gemv ? decode_path() : "gemm", long(T), distinct, bytes / 1e6, topk_ms * 1e3, ms * 1e3, gbs,
                100.0 * gbs / copy_gbs, graph_ms * 1e3, decode ? 100.0 * graph_gbs / copy_gbs : 0.0, tflops,
                100.0 * tflops / gemm_tflops);
    gpu.reset_scratch();
  }
  return true;
}

// A model's MoE layer shape for the variant table: routed experts and an optional shared expert
// (its intermediate size; gated by sigmoid(gate . x) when `shared_gate`).
struct MoeShape {
  const char* name;
  int64_t H, I, E, k, shared_I;
  bool shared_gate;
};

// The decode variants side by side: per variant a backend, its CPU check, 4 layers of weights,
// then per T the graph-replayed microseconds per layer (moe_topk_experts, the shared expert too).
void decode_variants(const MoeShape& m, double copy_gbs, bool quick) {
  const std::vector<int64_t> Ts = {1, 2, 4, 8, 16, 32};
  std::vector<std::vector<double>> us;  // [variant][T]
  std::vector<double> distinct_of_T(Ts.size(), 0.0);
  // Each CudaMoeDecode variant; the split one with each CudaMoeOneToken kernel pair (T = 1).
  std::vector<std::pair<std::string, CudaOptions>> configs;
  for (CudaMoeDecode v : kAllCudaMoeDecode) {
    if (v != CudaMoeDecode::kSplit) {
      configs.emplace_back(cuda_moe_decode_name(v), CudaOptions{v});
      continue;
    }
    for (CudaMoeOneToken o : kAllCudaMoeOneToken) {
      CudaOptions opt{v};
      opt.moe_one_token = o;
      configs.emplace_back(std::string("split/") + cuda_moe_one_token_name(o), opt);
    }
  }
  for (const auto& [name, options] : configs) {
    auto gpu = make_cuda_backend(0, options);
    for (int64_t T : {1, 3, 16}) {
      const double err = check(*gpu, kModels[0], false, T);
      std::printf("check: %s T=%ld vs CPU: rel_err %.2e %s\n", name.c_str(), long(T), err, err < 1e-2 ? "OK" : "FAIL");
      if (!(err < 1e-2)) throw std::runtime_error("moe_experts does not match the CPU backend");
    }
    std::vector<Tensor> gate_up, down, sgu, sdn, sg;
    for (int64_t l = 0; l < kLayers; ++l) {
      gate_up.push_back(gpu->alloc({m.E, 2 * m.I, m.H}, DType::kBF16));
      down.push_back(gpu->alloc({m.E, m.H, m.I}, DType::kBF16));
      gpu->fill_random(gate_up.back(), 100 + l, -0.05f, 0.05f);
      gpu->fill_random(down.back(), 200 + l, -0.05f, 0.05f);
      if (m.shared_I > 0) {
        sgu.push_back(gpu->alloc({2 * m.shared_I, m.H}, DType::kBF16));
        sdn.push_back(gpu->alloc({m.H, m.shared_I}, DType::kBF16));
        sg.push_back(gpu->alloc({1, m.H}, DType::kBF16));
        gpu->fill_random(sgu.back(), 400 + l, -0.05f, 0.05f);
        gpu->fill_random(sdn.back(), 500 + l, -0.05f, 0.05f);
        gpu->fill_random(sg.back(), 600 + l, -0.05f, 0.05f);
      }
    }
    us.emplace_back();
    for (size_t ti = 0; ti < Ts.size(); ++ti) {
      const int64_t T = Ts[ti];
      Tensor x = gpu->alloc({T, m.H}, DType::kBF16), out = gpu->alloc({T, m.H}, DType::kBF16);
      gpu->fill_random(x, 7, -1, 1);
      std::vector<Tensor> logits, ids, w;
      double distinct = 0;
      for (int64_t l = 0; l < kLayers; ++l) {
        logits.push_back(gpu->alloc({T, m.E}, DType::kF32));
        gpu->fill_random(logits.back(), 300 + 10 * T + l, -4, 4);
        ids.push_back(gpu->alloc({T, m.k}, DType::kI32));
        w.push_back(gpu->alloc({T, m.k}, DType::kF32));
        gpu->moe_topk(logits[l], static_cast<int>(m.k), true, ids[l], w[l]);
        std::vector<int32_t> h(static_cast<size_t>(T * m.k));
        gpu->copy_to_host(h.data(), ids[l]);
        distinct += static_cast<double>(std::set<int32_t>(h.begin(), h.end()).size()) / kLayers;
      }
      distinct_of_T[ti] = distinct;
      auto layers = [&] {
        for (int64_t l = 0; l < kLayers; ++l) {
          const size_t mark = gpu->scratch_mark();
          Backend::MoeSharedExpert shared{};
          if (m.shared_I > 0) shared = {&sgu[l], &sdn[l], m.shared_gate ? &sg[l] : nullptr};
          gpu->moe_topk_experts(logits[l], static_cast<int>(m.k), true, x, gate_up[l], down[l], ids[l], w[l], 0, out,
                                m.shared_I > 0 ? &shared : nullptr);
          gpu->scratch_rewind(mark);
        }
      };
      gpu->reset_scratch();
      layers();  // sizes the scratch arena before capture
      gpu->synchronize();
      gpu->reset_scratch();
      gpu->begin_capture();
      layers();
      std::unique_ptr<CapturedGraph> g = gpu->end_capture();
      const double ms = time_ms(
                            *gpu, [&](int) { gpu->replay(*g); }, 5, quick ? 20 : 100) /
                        kLayers;
      gpu->synchronize();  // a device error (the fused kernel's barrier) shows here
      us.back().push_back(ms * 1e3);
      g.reset();
      gpu->reset_scratch();
    }
  }
  const double expert_bytes = 3.0 * m.H * m.I * 2, shared_bytes = 3.0 * m.H * m.shared_I * 2;
  std::printf(
      "\n%s MoE decode variants (H %ld, I %ld, %ld experts, top-%ld, shared expert I %ld%s): us per layer of "
      "moe_topk_experts in a captured graph of %ld layers; %%copy = bytes of the distinct experts (and the shared one) "
      "per second over the copy figure (%.0f GB/s)\n",
      m.name, long(m.H), long(m.I), long(m.E), long(m.k), long(m.shared_I), m.shared_gate ? ", gated" : "",
      long(kLayers), copy_gbs);
  std::printf("%6s %9s %9s", "T", "experts", "MB/layer");
  for (const auto& c : configs) std::printf(" %20s %6s", c.first.c_str(), "%copy");
  std::printf("\n");
  for (size_t ti = 0; ti < Ts.size(); ++ti) {
    const double bytes = distinct_of_T[ti] * expert_bytes + shared_bytes;
    std::printf("%6ld %9.1f %9.1f", long(Ts[ti]), distinct_of_T[ti], bytes / 1e6);
    for (size_t vi = 0; vi < us.size(); ++vi)
      std::printf(" %20.1f %5.0f%%", us[vi][ti], 100.0 * bytes / (us[vi][ti] * 1e-6) / 1e9 / copy_gbs);
    std::printf("\n");
  }
  std::printf("(default: %s, one token: %s)\n", decode_path(), cuda_moe_one_token_name(CudaOptions{}.moe_one_token));
}

void all_decode_variants(double copy_gbs, bool quick) {
  decode_variants({"Qwen3-30B-A3B", 2048, 768, 128, kK, 0, false}, copy_gbs, quick);
  decode_variants({"Qwen3.5-35B-A3B", 2048, 512, 256, 8, 512, true}, copy_gbs, quick);
}

}  // namespace

int run(int argc, char** argv) {
  bool quick = false, variants_only = false;
  CudaOptions options;
  std::string only_model, only_dtype;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      quick = true;
    } else if (a == "--variants") {
      variants_only = true;
    } else if (a == "--prefill-mma") {
      options.moe_prefill_wgmma = false;
    } else if (a == "--fp8-decode" && i + 1 < argc) {
      if (!pick_named(argv[++i], kAllCudaMoeFp8Decode, cuda_moe_fp8_decode_name, &options.moe_fp8_decode)) {
        std::fprintf(stderr, "moe_bench: --fp8-decode takes %s\n",
                     names_of(kAllCudaMoeFp8Decode, cuda_moe_fp8_decode_name).c_str());
        return 2;
      }
    } else if (a == "--one-token" && i + 1 < argc) {
      if (!pick_named(argv[++i], kAllCudaMoeOneToken, cuda_moe_one_token_name, &options.moe_one_token)) {
        std::fprintf(stderr, "moe_bench: --one-token takes %s\n",
                     names_of(kAllCudaMoeOneToken, cuda_moe_one_token_name).c_str());
        return 2;
      }
    } else if (a == "--fp8-one-token" && i + 1 < argc) {
      if (!pick_named(argv[++i], kAllCudaMoeFp8OneToken, cuda_moe_fp8_one_token_name, &options.moe_fp8_one_token)) {
        std::fprintf(stderr, "moe_bench: --fp8-one-token takes %s\n",
                     names_of(kAllCudaMoeFp8OneToken, cuda_moe_fp8_one_token_name).c_str());
        return 2;
      }
    } else if (a == "--model" && i + 1 < argc) {
      only_model = argv[++i];
    } else if (a == "--dtype" && i + 1 < argc) {
      only_dtype = argv[++i];
    } else {
      std::fprintf(
          stderr,
          "usage: moe_bench [--quick] [--variants] [--prefill-mma] [--fp8-decode KERNEL] [--one-token KERNELS] "
          "[--fp8-one-token KERNELS] "
          "[--model qwen3-30b-a3b|qwen3.5-122b-a10b] [--dtype bf16|fp8]\n"
          "  --prefill-mma: bf16 prefill (the grouped GEMMs) on the mma.sync kernel instead of wgmma\n"
          "  --fp8-decode: the FP8 experts' decode GEMVs: %s (the first is the default)\n"
          "  --one-token: bf16 experts' decode kernels at T = 1: %s (default %s)\n"
          "  --fp8-one-token: FP8 experts' decode kernels at T = 1: %s (default %s)\n",
          names_of(kAllCudaMoeFp8Decode, cuda_moe_fp8_decode_name).c_str(),
          names_of(kAllCudaMoeOneToken, cuda_moe_one_token_name).c_str(),
          cuda_moe_one_token_name(CudaOptions{}.moe_one_token),
          names_of(kAllCudaMoeFp8OneToken, cuda_moe_fp8_one_token_name).c_str(),
          cuda_moe_fp8_one_token_name(CudaOptions{}.moe_fp8_one_token));
      return 2;
    }
  }
  if (variants_only) {
    std::unique_ptr<Backend> probe = make_cuda_backend(0);
    std::printf("device: %s\n", probe->name().c_str());
    const double copy_gbs = copy_bandwidth_gbs(*probe);
    std::printf("device-to-device copy: %.0f GB/s (read + write)\n", copy_gbs);
    probe.reset();
    all_decode_variants(copy_gbs, quick);
    return 0;
  }
  auto gpu = make_cuda_backend(0, options);
  std::printf("device: %s%s, FP8 decode GEMVs: %s, at one token: bf16 %s, FP8 %s\n", gpu->name().c_str(),
              options.moe_prefill_wgmma ? "" : " (prefill: mma.sync)", cuda_moe_fp8_decode_name(options.moe_fp8_decode),
              cuda_moe_one_token_name(options.moe_one_token), cuda_moe_fp8_one_token_name(options.moe_fp8_one_token));

  const double copy_gbs = copy_bandwidth_gbs(*gpu);
  std::printf("device-to-device copy: %.0f GB/s (read + write)\n", copy_gbs);
  double gemm_tflops = 0;
  {
    const int64_t n = 8192;
    Tensor a = gpu->alloc({n, n}, DType::kBF16), b = gpu->alloc({n, n}, DType::kBF16),
           c = gpu->alloc({n, n}, DType::kBF16);
    gpu->fill_random(a, 1, -1, 1);
    gpu->fill_random(b, 2, -1, 1);
    const double ms = time_ms(
        *gpu, [&](int) { gpu->linear(a, b, nullptr, c); }, 5, quick ? 10 : 30);
    gemm_tflops = 2.0 * n * n * n / (ms * 1e-3) / 1e12;
    std::printf("reference 8192^3 bf16 GEMM (cuBLASLt): %.3f ms, %.0f TFLOP/s\n", ms, gemm_tflops);
  }
  bool ran = false;
  for (const Shape3& m : kModels) {
    if (!only_model.empty() && only_model != m.name) continue;
    for (bool fp8 : {false, true}) {
      if (!only_dtype.empty() && only_dtype != (fp8 ? "fp8" : "bf16")) continue;
      ran = true;
      if (!bench_model(*gpu, m, fp8, quick, copy_gbs, gemm_tflops)) return 1;
      gpu->synchronize();
    }
  }
  if (!ran) {
    std::fprintf(stderr, "moe_bench: no model / dtype matches the filters\n");
    return 2;
  }
  std::printf(
      "\nexperts: distinct experts selected per layer (mean of %ld layers); MB/layer: their bytes (FP8: e4m3 "
      "weights plus f32 block scales); %%copy: expert bytes read per second over the copy figure (read + write); "
      "%%gemm: active FLOP/s over the 8192^3 bf16 cuBLASLt rate; graph_us: per layer, replaying a captured graph of "
      "the %ld layers.\n",
      long(kLayers), long(kLayers));
  return 0;  // the decode variants side by side: --variants
}

int main(int argc, char** argv) { return run_main(run, argc, argv); }
