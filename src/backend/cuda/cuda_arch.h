// The architecture record of a CUDA device and the per-architecture tuning table (ggml's
// per-architecture constants, read once): every kernel choice of the CUDA backend reads this
// record and CudaOptions, never the device properties directly. Plain C++ (no CUDA headers):
// the CPU build compiles it too, so the table, the profiles and the binary-support rule are
// tested on any machine, and `tessera --version` names the architectures a binary carries.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "backend/cuda/cuda_options.h"
#include "backend/devices.h"

namespace tessera {

// The families the tuning table has a row for. kOther: any other compute capability (it gets
// the most conservative row, sm_80-like: no Hopper or Blackwell-only paths).
enum class CudaArchFamily { kSm90, kSm100, kSm120, kSm121, kOther };
const char* cuda_arch_family_name(CudaArchFamily f);  // "sm_90", ...
CudaArchFamily cuda_arch_family(int major, int minor);

// What the driver reports of a device (cuda_facts.cpp fills it from cudaGetDeviceProperties;
// tests build one by hand).
struct CudaDeviceFacts {
  std::string name;
  int major = 0, minor = 0;
  int sms = 0;
  size_t smem_per_block_optin = 0;  // dynamic + static shared memory a block may opt into
  size_t smem_per_sm = 0;
  int max_threads_per_sm = 0;
  size_t total_memory = 0;
  bool integrated = false;  // the GPU shares the host's memory (DGX Spark GB10, Jetson)
};

// The record kernels choose by: the device's facts, capped by its family's row, and the
// capabilities of that row.
struct CudaArch {
  std::string name;                                // "NVIDIA H200", or "NVIDIA H200 as sm_120" under a profile
  int major = 0, minor = 0;                        // the device's own compute capability
  CudaArchFamily family = CudaArchFamily::kOther;  // the row whose choices apply (a profile's)
  std::string profile;                             // "" on the device's own row; "sm120" etc. under a profile
  int sms = 0;
  size_t smem_per_block_optin = 0;  // what a kernel may ask for (the row's cap applied)
  size_t smem_per_sm = 0;
  int max_threads_per_sm = 0;
  size_t total_memory = 0;
  bool integrated = false;
  bool wgmma = false;               // Hopper's warpgroup MMA (sm_90a code)
  bool cublaslt_block_fp8 = false;  // cuBLASLt's 128x128 block-scaled FP8 GEMM (documented for sm_90 only)
  bool fp8_mma = false;             // mma.sync with e4m3 operands (m16n8k32, sm_89 and newer)
  bool pdl = false;                 // programmatic dependent launch (griddepcontrol, sm_90 and newer)
};

// One row of the tuning table: a family's limits, capabilities and option defaults.
struct CudaArchRow {
  CudaArchFamily family;
  const char* profile_name;  // the TESSERA_CUDA_OPTIONS arch= value that selects it
  int major, minor;          // the compute capability the row describes
  size_t smem_per_block_cap;
  int max_threads_per_sm_cap;
  bool wgmma, cublaslt_block_fp8, fp8_mma, pdl;
  void (*tune)(CudaOptions& o);  // the row's option defaults over CudaOptions' (null: none differ)
};
const std::vector<CudaArchRow>& cuda_arch_table();
const CudaArchRow& cuda_arch_row(CudaArchFamily f);

// The record of a device on its own row.
CudaArch make_cuda_arch(const CudaDeviceFacts& facts);
// The record of a device made to take another family's choices (the sm_120 profile on a Hopper
// GPU): that row's capabilities, limits capped to the smaller of the two, the device's SMs and
// memory. A capability the device lacks stays off. profile "" or "native": the device's own row.
CudaArch profile_cuda_arch(const CudaDeviceFacts& facts, std::string_view profile);
// The option defaults for a record: CudaOptions' defaults with its row's tuning applied.
CudaOptions tuned_cuda_options(const CudaArch& arch);
// One line for logs and `tessera doctor`: "NVIDIA H200: sm_90 row, 132 SMs, 227 KiB smem/block, wgmma, ...".
std::string describe_cuda_arch(const CudaArch& arch);

}  // namespace tessera
