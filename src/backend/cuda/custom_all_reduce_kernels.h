// Private to custom_all_reduce.{cpp,cu}: the shared region's layout, the kernel arguments
// and the launcher. See custom_all_reduce.h for the algorithm.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/custom_all_reduce.h"

namespace tessera::cuda::car {

inline constexpr int kThreads = 512;
inline constexpr int kMaxBlocks = 64;
inline constexpr int kDefaultBlocks = 36;  // vLLM's grid search on A100/H100; capped by the SM count

// Start of every rank's region (cudaMalloc'd, zeroed). Peers write start/mid slots; only the
// owner touches counter. token/marks serve the P2P read/write check at creation.
struct Flags {
  alignas(128) uint32_t start[kMaxBlocks][kCarMaxRanks];  // [block][source rank]
  alignas(128) uint32_t mid[kMaxBlocks][kCarMaxRanks];    // two-shot, after the reduce-scatter
  alignas(128) uint32_t counter[kMaxBlocks];              // calls made by each block of this rank
  alignas(128) uint32_t token;                            // written by the owner, read by peers
  uint32_t marks[kCarMaxRanks];                           // [r]: written by rank r
};
inline constexpr size_t kFlagsBytes = 16384;  // the staging halves start 16 KiB in
static_assert(sizeof(Flags) <= kFlagsBytes);

// Host-mapped (cudaHostAllocMapped): written by a barrier that timed out, before it traps.
struct FailureRecord {
  volatile int32_t set;
  volatile int32_t rank;
  volatile int32_t waiting_for;
  volatile int32_t block;
  volatile int32_t phase;  // 0 start barrier, 1 middle barrier
  volatile uint32_t flag;
  volatile uint32_t seen;
  volatile uint64_t waited_ns;
};

struct KernelArgs {
  Flags* flags[kCarMaxRanks];  // every rank's region start (mine at [rank]; peers IPC-mapped)
  char* bufs[kCarMaxRanks];    // every rank's staging half 0; half 1 is half_bytes further
  size_t half_bytes;
  int rank = 0;
  int world = 0;
  int blocks = kDefaultBlocks;
  uint64_t timeout_ns = 0;           // 0: wait forever
  FailureRecord* failure = nullptr;  // device alias of the host-mapped record
};

// data: n elements of dtype (f32 or bf16) on this GPU, reduced in place.
// Returns cudaGetLastError() after the launch.
cudaError_t launch_custom_all_reduce(const KernelArgs& args, void* data, DType dtype, int64_t n, CarAlgo algo,
                                     cudaStream_t stream);

}  // namespace tessera::cuda::car
