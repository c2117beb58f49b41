// The dynamic shared memory of every kernel configuration the CUDA launchers can launch, from the
// constants they size their launches with (src/backend/cuda/kernel_smem.h), for
// scripts/ptxas_report.sh. One line a configuration, fields separated by tabs:
//   KERNEL BYTES launched|unused NOTE
// KERNEL is the kernel as c++filt names it without namespaces and parameters, a glob ('*': any
// template argument); `unused` marks a configuration the launcher does not take on a device
// whose blocks may opt into MAX_SMEM bytes (--wgmma: one with Hopper's warpgroup MMA).
//   smem_table MAX_SMEM [--wgmma]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "backend/cuda/kernel_smem.h"

namespace {

using namespace tessera::cuda;

void row(const std::string& kernel, size_t bytes, bool launched, const char* note) {
  std::printf("%s\t%zu\t%s\t%s\n", kernel.c_str(), bytes, launched ? "launched" : "unused", note);
}

void prefill_rows() {
  for (int D : {64, 128, 256})
    for (int cache_bytes : {2, 1}) {
      for (bool long_query : {true, false}) {
        const PrefillTile t = prefill_tile(D, long_query), lt = prefill_tile(D, true), st = prefill_tile(D, false);
        const bool one_tile = lt.row_frags == st.row_frags && lt.keys == st.keys;
        if (!long_query && one_tile) continue;
        const std::string name = "prefill_attention_kernel<" + std::to_string(D) + ", " +
                                 (cache_bytes == 2 ? "__nv_bfloat16" : "__nv_fp8_e4m3") + ", " +
                                 std::to_string(t.row_frags) + ", " + std::to_string(t.keys) + ">";
        row(name, prefill_smem_bytes(D, cache_bytes, t.row_frags, t.keys), true,
            one_tile     ? "every query length"
            : long_query ? "more than 64 query tokens"
                         : "up to 64 query tokens");
      }
    }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MAX_SMEM [--wgmma]\n", argv[0]);
    return 2;
  }
  const size_t max_smem = std::strtoull(argv[1], nullptr, 10);
  const bool wgmma = argc > 2 && std::strcmp(argv[2], "--wgmma") == 0;
  (void)max_smem;
  row("moe_grouped_gemm_kernel<*, false>", moe_gemm_smem_bytes(false), true, "bf16 experts, 4 stages");
  row("moe_grouped_gemm_kernel<*, true>", moe_gemm_smem_bytes(true), true, "FP8 weights, 4 stages, 2 widened tiles");
  row("moe_grouped_wgmma_kernel<*>", kMoeWgmmaSmemBytes, wgmma, "bf16 experts, sm_90 only");
  prefill_rows();
  row("gdr_wy_kernel<128, 128>", sizeof(gdr::WySmem<128, 128>), true, "Dk = Dv = 128");
  row("gdr_state_kernel<128, 128, *>", sizeof(gdr::StateSmem<128, 128>), true, "Dk = Dv = 128");
  row("gdr_output_kernel<128, 128>", sizeof(gdr::OutSmem<128>), true, "Dk = Dv = 128");
  row("qkv_prologue_kernel<*>", qkv_prologue_smem_bytes(256), true, "at head dim 256 (16 bytes a dim)");
  return 0;
}
