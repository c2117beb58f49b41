// bf16 GEMM (cuBLASLt through CudaBackend::linear) at the projection shapes of
// Qwen3-8B (hidden 4096, intermediate 12288, 32 q / 8 kv heads of 128, vocab
// 151936), decode and prefill token counts, against the 8192^3 rate of the same
// library in the same run. Decode shapes are memory-bound: their figure of merit is
// weight bytes per second against the copy bandwidth.
//   gemm_bench [--quick]
#include <cstring>
#include <string>

#include "bench_util.h"

using namespace tessera;
using namespace tessera::bench;

namespace {

struct Proj {
  const char* name;
  int64_t N, K;
};

// CPU reference for a sample of outputs, in double.
double check(Backend& gpu, int64_t M, int64_t N, int64_t K) {
  auto x = random_bf16_values(M * K, 1), w = random_bf16_values(N * K, 2, -0.05f, 0.05f);
  Tensor gx = upload(gpu, x, {M, K}, DType::kBF16), gw = upload(gpu, w, {N, K}, DType::kBF16);
  Tensor out = gpu.alloc({M, N}, DType::kF32);
  gpu.fill(out, NAN);
  gpu.linear(gx, gw, nullptr, out);
  auto got = download(gpu, out);
  std::vector<float> a, b;
  std::mt19937 rng(3);
  for (int i = 0; i < 256; ++i) {
    int64_t m = rng() % M, n = rng() % N;
    double acc = 0;
    for (int64_t k = 0; k < K; ++k) acc += double(x[m * K + k]) * w[n * K + k];
    a.push_back(got[m * N + n]);
    b.push_back(static_cast<float>(acc));
  }
  return rel_err(a, b);
}

}  // namespace

int run(int argc, char** argv) {
  bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  auto gpu = make_cuda_backend(0);
  std::printf("device: %s\n", gpu->name().c_str());

  double err = check(*gpu, 33, 6144, 4096);
  std::printf("check: x[33,4096] @ w[6144,4096]^T vs CPU (256 samples, f64): rel_err %.2e %s\n", err,
              err < 1e-2 ? "OK" : "FAIL");
  if (!(err < 1e-2)) return 1;

  double copy_gbs = copy_bandwidth_gbs(*gpu);
  std::printf("device-to-device copy: %.0f GB/s (read + write)\n", copy_gbs);

  // Reference rate: 8192^3.
  {
    int64_t n = 8192;
    Tensor a = gpu->alloc({n, n}, DType::kBF16), b = gpu->alloc({n, n}, DType::kBF16),
           c = gpu->alloc({n, n}, DType::kBF16);
    gpu->fill_random(a, 1, -1, 1);
    gpu->fill_random(b, 2, -1, 1);
    double ms = time_ms(
        *gpu, [&](int) { gpu->linear(a, b, nullptr, c); }, 5, quick ? 10 : 30);
    std::printf("reference 8192^3 bf16: %.3f ms, %.0f TFLOP/s\n", ms, 2.0 * n * n * n / (ms * 1e-3) / 1e12);
  }

  const Proj projs[] = {{"qkv_proj", (32 + 2 * 8) * 128, 4096},
                        {"o_proj", 4096, 4096},
                        {"gate_up_proj", 2 * 12288, 4096},
                        {"down_proj", 4096, 12288},
                        {"lm_head", 151936, 4096}};
  const int64_t tokens[] = {1, 2, 4, 8, 32, 64, 128, 256, 512, 2048, 4096};
  std::printf("\n%-13s %6s %8s %8s %10s %9s %9s %7s\n", "proj", "M", "N", "K", "time_us", "TFLOP/s", "w_GB/s", "%copy");
  for (const Proj& p : projs) {
    // Rotate over enough weight copies that they do not sit in the 60 MB L2.
    int64_t wbytes = p.N * p.K * 2;
    int copies = static_cast<int>(std::min<int64_t>(8, std::max<int64_t>(1, (int64_t{256} << 20) / wbytes + 1)));
    std::vector<Tensor> ws;
    for (int i = 0; i < copies; ++i) {
      ws.push_back(gpu->alloc({p.N, p.K}, DType::kBF16));
      gpu->fill_random(ws.back(), 10 + i, -0.05f, 0.05f);
    }
    for (int64_t M : tokens) {
      if (quick && M != 1 && M != 64 && M != 4096) continue;
      Tensor x = gpu->alloc({M, p.K}, DType::kBF16);
      gpu->fill_random(x, 7, -1, 1);
      Tensor out = gpu->alloc({M, p.N}, std::strcmp(p.name, "lm_head") == 0 ? DType::kF32 : DType::kBF16);
      double ms = time_ms(
          *gpu, [&](int i) { gpu->linear(x, ws[i % copies], nullptr, out); }, 5, quick ? 10 : 40);
      double tflops = 2.0 * M * p.N * p.K / (ms * 1e-3) / 1e12;
      double gbs = double(wbytes) / (ms * 1e-3) / 1e9;
      std::printf("%-13s %6ld %8ld %8ld %10.1f %9.1f %9.0f %6.0f%%\n", p.name, long(M), long(p.N), long(p.K), ms * 1e3,
                  tflops, gbs, 100.0 * gbs / copy_gbs);
    }
  }
  std::printf(
      "\n%%copy: weight bytes read per second over the copy figure (read + write), as the decode ceiling counts it.\n");
  return 0;
}

int main(int argc, char** argv) { return run_main(run, argc, argv); }
