// The dynamic shared memory of every kernel configuration the CUDA launchers can launch, from the
// constants they size their launches with (src/backend/cuda/kernel_smem.h), for
// scripts/ptxas_report.sh. One line a configuration, fields separated by tabs:
//   KERNEL BYTES launched|unused|none NOTE
// KERNEL is the kernel as c++filt names it without namespaces and parameters, a glob ('*': any
// template argument); `unused` marks a configuration the launcher does not take on a device
// whose blocks may opt into MAX_SMEM bytes (--wgmma: one with Hopper's warpgroup MMA), `none` a
// launcher none of whose variants fits there.
//   smem_table MAX_SMEM [--wgmma]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "backend/cuda/kernel_smem.h"

namespace {

using namespace tessera::cuda;

void row(const std::string& kernel, size_t bytes, const char* status, const char* note) {
  std::printf("%s\t%zu\t%s\t%s\n", kernel.c_str(), bytes, status, note);
}
void row(const std::string& kernel, size_t bytes, bool launched, const char* note) {
  row(kernel, bytes, launched ? "launched" : "unused", note);
}

// The grouped GEMM's variants, the one moe_gemm_variant picks launched; the warpgroup-MMA kernel
// on sm_90 (bf16 experts; the mma.sync GEMM stays for CudaOptions::moe_prefill_wgmma off).
void moe_gemm_rows(size_t max_smem, bool wgmma) {
  for (bool fp8 : {false, true}) {
    const int picked = moe_gemm_variant(fp8, max_smem);
    for (int i = 0; i < kMoeGemmNumVariants; ++i) {
      const MoeGemmVariant v = kMoeGemmVariants[i];
      const std::string name = std::string("moe_grouped_gemm_kernel<*, ") + (fp8 ? "true" : "false") + ", " +
                               std::to_string(v.stages) + ", " + std::to_string(fp8 ? v.wide_tiles : 0) + ">";
      const std::string note = std::string(fp8 ? "FP8 weights, " : "bf16 experts, ") + std::to_string(v.stages) +
                               " stages" + (fp8 ? ", " + std::to_string(v.wide_tiles) + " widened tile(s)" : "");
      row(name, moe_gemm_smem_bytes(fp8, v), i == picked, note.c_str());
    }
    if (picked < 0)
      row(std::string("moe_grouped_gemm_kernel<*, ") + (fp8 ? "true" : "false") + ", *>", 0, "none",
          "no variant fits: launch_moe_prefill throws, launch_fp8_w16_gemm returns false");
  }
  row("moe_grouped_wgmma_kernel<*>", kMoeWgmmaSmemBytes, wgmma && kMoeWgmmaSmemBytes <= max_smem,
      "bf16 experts, sm_90 only");
}

// Prefill attention: the tiles of prefill_tile, launched where they fit (else the launcher throws).
void prefill_rows(size_t max_smem) {
  for (int D : {64, 128, 256})
    for (int cache_bytes : {2, 1}) {
      for (bool long_query : {true, false}) {
        const PrefillTile t = prefill_tile(D, long_query), lt = prefill_tile(D, true), st = prefill_tile(D, false);
        const bool one_tile = lt.row_frags == st.row_frags && lt.keys == st.keys;
        if (!long_query && one_tile) continue;
        const std::string name = "prefill_attention_kernel<" + std::to_string(D) + ", " +
                                 (cache_bytes == 2 ? "__nv_bfloat16" : "__nv_fp8_e4m3") + ", " +
                                 std::to_string(t.row_frags) + ", " + std::to_string(t.keys) + ">";
        const size_t bytes = prefill_smem_bytes(D, cache_bytes, t.row_frags, t.keys);
        row(name, bytes, bytes <= max_smem ? "launched" : "none",
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
  moe_gemm_rows(max_smem, wgmma);
  prefill_rows(max_smem);
  // The chunked gated delta rule launches its kernels where all three fit (else throws).
  const size_t wy = sizeof(gdr::WySmem<128, 128>), state = sizeof(gdr::StateSmem<128, 128>),
               out = sizeof(gdr::OutSmem<128>);
  const char* gdr_status = wy <= max_smem && state <= max_smem && out <= max_smem ? "launched" : "none";
  row("gdr_wy_kernel<128, 128>", wy, gdr_status, "Dk = Dv = 128");
  row("gdr_state_kernel<128, 128, *>", state, gdr_status, "Dk = Dv = 128");
  row("gdr_output_kernel<128, 128>", out, gdr_status, "Dk = Dv = 128");
  row("qkv_prologue_kernel<*>", qkv_prologue_smem_bytes(256), true, "at head dim 256 (16 bytes a dim)");
  return 0;
}
