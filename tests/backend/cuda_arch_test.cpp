// The CUDA backend's architecture table, its profiles, the rule for which GPUs a binary's CUDA
// code runs on, and TESSERA_CUDA_OPTIONS' parser: plain C++, so they run in every build.
#include <gtest/gtest.h>

#include <string>

#include "backend/cuda/cuda_arch.h"
#include "backend/cuda/cuda_options.h"
#include "core/error.h"

namespace tessera {
namespace {

CudaDeviceFacts h100() {
  CudaDeviceFacts f;
  f.name = "NVIDIA H100 80GB HBM3";
  f.major = 9;
  f.minor = 0;
  f.sms = 132;
  f.smem_per_block_optin = 232448;
  f.smem_per_sm = 233472;
  f.max_threads_per_sm = 2048;
  f.total_memory = size_t{80} << 30;
  return f;
}

CudaDeviceFacts rtx5090() {
  CudaDeviceFacts f;
  f.name = "NVIDIA GeForce RTX 5090";
  f.major = 12;
  f.minor = 0;
  f.sms = 170;
  f.smem_per_block_optin = 101376;
  f.smem_per_sm = 102400;
  f.max_threads_per_sm = 1536;
  f.total_memory = size_t{32} << 30;
  return f;
}

CudaDeviceFacts gb10() {
  CudaDeviceFacts f = rtx5090();
  f.name = "NVIDIA GB10";
  f.minor = 1;
  f.sms = 48;
  f.integrated = true;
  f.total_memory = size_t{119} << 30;
  return f;
}

TEST(CudaArch, EveryFamilyHasItsRow) {
  EXPECT_EQ(cuda_arch_family(9, 0), CudaArchFamily::kSm90);
  EXPECT_EQ(cuda_arch_family(10, 0), CudaArchFamily::kSm100);
  EXPECT_EQ(cuda_arch_family(12, 0), CudaArchFamily::kSm120);
  EXPECT_EQ(cuda_arch_family(12, 1), CudaArchFamily::kSm121);
  EXPECT_EQ(cuda_arch_family(8, 9), CudaArchFamily::kOther);
  for (CudaArchFamily f : {CudaArchFamily::kSm90, CudaArchFamily::kSm100, CudaArchFamily::kSm120,
                           CudaArchFamily::kSm121, CudaArchFamily::kOther})
    EXPECT_EQ(cuda_arch_row(f).family, f);
}

TEST(CudaArch, HopperTakesWgmmaAndCublasltBlockFp8) {
  const CudaArch a = make_cuda_arch(h100());
  EXPECT_EQ(a.family, CudaArchFamily::kSm90);
  EXPECT_TRUE(a.wgmma);
  EXPECT_TRUE(a.cublaslt_block_fp8);
  EXPECT_TRUE(a.fp8_mma);
  EXPECT_TRUE(a.pdl);
  EXPECT_EQ(a.smem_per_block_optin, 232448u);
  EXPECT_EQ(a.profile, "");
  EXPECT_TRUE(tuned_cuda_options(a).moe_prefill_wgmma);
}

TEST(CudaArch, BlackwellDesktopAndSparkTakeThePortableTier) {
  for (const CudaDeviceFacts& f : {rtx5090(), gb10()}) {
    const CudaArch a = make_cuda_arch(f);
    EXPECT_FALSE(a.wgmma) << f.name;
    EXPECT_FALSE(a.cublaslt_block_fp8) << f.name;
    EXPECT_TRUE(a.fp8_mma) << f.name;
    EXPECT_EQ(a.smem_per_block_optin, 101376u) << f.name;
    EXPECT_EQ(a.max_threads_per_sm, 1536) << f.name;
    EXPECT_FALSE(tuned_cuda_options(a).moe_prefill_wgmma) << f.name;
    // kFineWide (no spill on sm_120a / sm_121a) failed Fp8MoeSharedExpertAtOneToken under the sm_120
    // profile; the rows keep kFine10 (cuda_arch.cpp).
    EXPECT_EQ(tuned_cuda_options(a).moe_fp8_one_token, CudaMoeFp8OneToken::kFine10) << f.name;
  }
  EXPECT_EQ(tuned_cuda_options(make_cuda_arch(h100())).moe_fp8_one_token, CudaMoeFp8OneToken::kFine10);
  EXPECT_EQ(make_cuda_arch(gb10()).family, CudaArchFamily::kSm121);
  EXPECT_TRUE(make_cuda_arch(gb10()).integrated);
}

// The sm_120 profile makes a Hopper GPU take exactly the sm_120 row's choices: no wgmma, no
// cuBLASLt block FP8, shared memory capped at sm_120's limit, its option defaults.
TEST(CudaArch, Sm120ProfileOnHopperTakesTheSm120Choices) {
  const CudaArch a = profile_cuda_arch(h100(), "sm120");
  const CudaArch native = make_cuda_arch(rtx5090());
  EXPECT_EQ(a.family, CudaArchFamily::kSm120);
  EXPECT_EQ(a.profile, "sm120");
  EXPECT_EQ(a.wgmma, native.wgmma);
  EXPECT_EQ(a.cublaslt_block_fp8, native.cublaslt_block_fp8);
  EXPECT_EQ(a.fp8_mma, native.fp8_mma);
  EXPECT_EQ(a.pdl, native.pdl);
  EXPECT_EQ(a.smem_per_block_optin, native.smem_per_block_optin);
  EXPECT_EQ(a.max_threads_per_sm, native.max_threads_per_sm);
  EXPECT_EQ(a.sms, 132) << "the device's own SMs";
  EXPECT_EQ(a.name, "NVIDIA H100 80GB HBM3 as sm_120");
  EXPECT_EQ(tuned_cuda_options(a).moe_prefill_wgmma, tuned_cuda_options(native).moe_prefill_wgmma);
  EXPECT_EQ(tuned_cuda_options(a).moe_fp8_one_token, tuned_cuda_options(native).moe_fp8_one_token);
  EXPECT_EQ(profile_cuda_arch(h100(), "sm121").family, CudaArchFamily::kSm121);
  EXPECT_EQ(profile_cuda_arch(h100(), "native").family, CudaArchFamily::kSm90);
  EXPECT_EQ(profile_cuda_arch(h100(), "").family, CudaArchFamily::kSm90);
}

// A profile never grants what the device lacks: an sm_120 GPU under the sm_90 profile still has
// no wgmma and keeps its own shared-memory limit.
TEST(CudaArch, ProfileNeverGrantsAMissingCapability) {
  const CudaArch a = profile_cuda_arch(rtx5090(), "sm90");
  EXPECT_EQ(a.family, CudaArchFamily::kSm90);
  EXPECT_FALSE(a.wgmma);
  EXPECT_FALSE(a.cublaslt_block_fp8);
  EXPECT_EQ(a.smem_per_block_optin, 101376u);
}

TEST(CudaArch, UnknownProfileIsANamedError) {
  try {
    profile_cuda_arch(h100(), "sm_120");
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("arch=sm_120 names no architecture profile"), std::string::npos) << m;
    EXPECT_NE(m.find("sm120"), std::string::npos) << m;
  }
}

TEST(CudaArch, DescribeNamesTheRowAndCapabilities) {
  const std::string d = describe_cuda_arch(profile_cuda_arch(h100(), "sm120"));
  EXPECT_NE(d.find("sm_120 row"), std::string::npos) << d;
  EXPECT_NE(d.find("99 KiB"), std::string::npos) << d;
  EXPECT_EQ(d.find("wgmma"), std::string::npos) << d;
  EXPECT_NE(describe_cuda_arch(make_cuda_arch(h100())).find("wgmma"), std::string::npos);
}

// Which GPUs the default build's CUDA code runs on, and how.
TEST(CudaArch, BinarySupportOfTheDefaultArchitectures) {
  const std::string archs = "90a-real,120a-real,121a-real,120-virtual";
  EXPECT_EQ(cuda_binary_support(archs, 9, 0).support, CudaBinarySupport::kNative);
  EXPECT_EQ(cuda_binary_support(archs, 9, 0).detail, "sm_90a cubin");
  EXPECT_EQ(cuda_binary_support(archs, 12, 0).detail, "sm_120a cubin");
  EXPECT_EQ(cuda_binary_support(archs, 12, 1).detail, "sm_121a cubin");
  EXPECT_TRUE(cuda_binary_support(archs, 9, 0).arch_specific);
  EXPECT_FALSE(cuda_binary_support(archs, 12, 3).arch_specific);
  // A later Blackwell-class part: the compute_120 PTX, compiled by the driver.
  EXPECT_EQ(cuda_binary_support(archs, 12, 3).support, CudaBinarySupport::kJit);
  // PTX never runs on an older GPU, and "a" cubins only on their own compute capability.
  EXPECT_EQ(cuda_binary_support(archs, 10, 0).support, CudaBinarySupport::kNone);
  EXPECT_EQ(cuda_binary_support(archs, 8, 9).support, CudaBinarySupport::kNone);
  EXPECT_EQ(cuda_binary_support("90a-real", 9, 0).support, CudaBinarySupport::kNative);
  // A PTX-only build (the JIT proof on Hopper): compute_90 PTX, no cubin.
  EXPECT_EQ(cuda_binary_support("90-virtual", 9, 0).support, CudaBinarySupport::kJit);
  EXPECT_EQ(cuda_binary_support("80-real", 8, 6).support, CudaBinarySupport::kNative);
  EXPECT_EQ(cuda_binary_support("", 9, 0).support, CudaBinarySupport::kNone);
  EXPECT_EQ(describe_cuda_architectures(archs), "sm_90a, sm_120a, sm_121a cubins; compute_120 PTX");
  EXPECT_EQ(describe_cuda_architectures("90-virtual"), "compute_90 PTX");
}

TEST(CudaOptionsText, SetsMembersByName) {
  CudaOptions o;
  apply_cuda_options("chunked_gated_delta=0,fp8_w8a8_min_rows=100000,moe_fp8_decode=cuda_cores,arch=sm120,", o);
  EXPECT_FALSE(o.chunked_gated_delta);
  EXPECT_EQ(o.fp8_w8a8_min_rows, 100000);
  EXPECT_EQ(o.moe_fp8_decode, CudaMoeFp8Decode::kCudaCores);
  apply_cuda_options("pdl=0,moe_gemv=0,moe_one_token=deep", o);
  EXPECT_FALSE(o.pdl);
  EXPECT_FALSE(o.moe_gemv);
  EXPECT_EQ(o.moe_one_token, CudaMoeOneToken::kDeep);
  EXPECT_EQ(cuda_options_profile("pdl=0,arch=sm120"), "sm120");
  EXPECT_EQ(cuda_options_profile("pdl=0"), "");
  EXPECT_EQ(cuda_option_names().front(), "arch");
}

TEST(CudaOptionsText, BadItemsAreNamedErrors) {
  auto message = [](const char* text) -> std::string {
    CudaOptions o;
    try {
      apply_cuda_options(text, o);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message("chunked_gated_delta=2").find("must be 0 or 1"), std::string::npos);
  EXPECT_NE(message("fp8_w8a8_min_rows=x").find("is not an integer"), std::string::npos);
  EXPECT_NE(message("fp8_w8a8_min_rows=").find("is not an integer"), std::string::npos);
  EXPECT_NE(message("decode_attention_max_query=0").find("must be at least 1"), std::string::npos);
  EXPECT_NE(message("moe_fp8_decode=fast").find("cuda_cores"), std::string::npos) << "lists the variants";
  const std::string unknown = message("no_such_option=1");
  EXPECT_NE(unknown.find("unknown option 'no_such_option'"), std::string::npos);
  EXPECT_NE(unknown.find("arch, moe_decode"), std::string::npos) << unknown;
  EXPECT_NE(message("chunked_gated_delta").find("is not name=value"), std::string::npos);
}

}  // namespace
}  // namespace tessera
