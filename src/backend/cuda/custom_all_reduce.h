// Custom all-reduce for small tensor-parallel messages inside one node (vLLM's
// custom_all_reduce design, written afresh): every rank owns one cudaMalloc'd region
// (barrier flags + two staging buffers) exported with cudaIpcGetMemHandle and opened by
// the peers, and one kernel does the whole collective over NVLink/PCIe P2P loads:
//
//   one-shot  copy the input into my staging buffer -> start barrier -> every rank reads
//             all N staging buffers, sums in f32 in rank order, writes its output.
//   two-shot  copy in -> start barrier -> rank r reduces slice r of all N buffers and
//             writes it back into its own buffer -> middle barrier -> every rank copies
//             the other ranks' reduced slices (reduce-scatter + all-gather; for N > 2
//             each rank reads 2/N of the bytes instead of N-1 times them).
//
// Barriers are per block: block b of every rank writes a counter into slot [b][rank] of
// every peer's flags (st.release.sys) and waits for the N slots of its own flags
// (ld.acquire.sys). The counter increases by one per call (kept per block in device
// memory), so flags are never reset and the kernel can be captured in a CUDA graph; the
// grid is the same for every call. The staging buffer alternates between two halves by
// the counter's parity, which removes the end barrier: a rank can start call k+2 (and
// overwrite the half of call k) only once all its blocks passed the start barrier of
// call k+1, i.e. once every peer finished call k. Sums are in a fixed rank order, so all
// ranks get bitwise identical results (and equal a CPU f32 sum in rank order).
//
// No NVLink multicast/NVLS/multimem: plain loads and stores to peer memory only.
// A barrier that waits longer than `timeout` records who it waited for (failure()) and
// traps, so a dead peer ends the job instead of hanging the GPU.
//
// This header needs no CUDA headers (the CPU unit test includes it for the policy).
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace tessera::cuda {

// Every rank passes its bytes and gets every rank's, in rank order (a Gloo all_gather, the
// control store...). Every rank's payload has the same size in a given call.
using AllGatherBytes = std::function<std::vector<std::vector<uint8_t>>(const std::vector<uint8_t>&)>;

enum class CarAlgo : uint8_t { kNccl, kOneShot, kTwoShot };
const char* car_algo_name(CarAlgo a);

inline constexpr int kCarMaxRanks = 8;

// Which algorithm to run for a message (kNccl: leave it to NCCL). Defaults follow vLLM's
// choice for Hopper with NVLink: up to max_bytes with one-shot on 2 GPUs; with more, one-shot
// for small messages and two-shot above `one_shot_max_bytes`.
struct CarPolicy {
  size_t max_bytes = size_t{8} << 20;  // larger messages go to NCCL (also the buffer size)
  size_t one_shot_max_bytes = 0;       // 0: by world size (2: max_bytes, 3-4: 512 KiB, 5-8: 256 KiB)

  size_t one_shot_limit(int world) const {
    if (one_shot_max_bytes) return one_shot_max_bytes;
    if (world <= 2) return max_bytes;
    return world <= 4 ? size_t{512} << 10 : size_t{256} << 10;
  }
  CarAlgo choose(int world, size_t bytes) const {
    if (world < 2 || world > kCarMaxRanks || bytes == 0 || bytes > max_bytes) return CarAlgo::kNccl;
    return bytes <= one_shot_limit(world) ? CarAlgo::kOneShot : CarAlgo::kTwoShot;
  }
};

struct CustomAllReduceOptions {
  CarPolicy policy;
  // How long a barrier waits for a peer before the kernel gives up (records failure(), traps).
  // Zero: forever. Take the communicator's timeout.
  std::chrono::milliseconds timeout{std::chrono::seconds(30)};
  // Allow more than two GPUs without NVLink between every pair (vLLM refuses: P2P over PCIe
  // among 4+ GPUs is slower than NCCL). NVLink is told from cudaDevP2PAttrNativeAtomicSupported.
  bool allow_pcie_beyond_two = false;
  // Blocks of 512 threads per call (0: 36, vLLM's choice; capped by the SM count). Every
  // rank must run the same grid, so the group takes the smallest value any rank offers.
  int blocks = 0;
};

class CustomAllReduce {
 public:
  // Collective over the `world` ranks of a group (every rank calls it, in the same order as
  // the group's other collectives): allocates max_bytes x 2 + flags on `device`, exchanges
  // IPC handles through `all_gather`, opens the peers' buffers and checks that a peer's
  // memory reads back what it wrote. Returns null on every rank, with the reason logged,
  // when any rank cannot take part (world outside 2..8, no P2P between two of the GPUs, IPC
  // failed, a GPU not visible to a rank, more than two GPUs without NVLink...). Throws only
  // when the all-gather itself fails.
  static std::unique_ptr<CustomAllReduce> create(int rank, int world, int device, const AllGatherBytes& all_gather,
                                                 size_t max_bytes = size_t{8} << 20,
                                                 CustomAllReduceOptions options = {});
  ~CustomAllReduce();
  CustomAllReduce(const CustomAllReduce&) = delete;
  CustomAllReduce& operator=(const CustomAllReduce&) = delete;

  int rank() const;
  int world() const;
  size_t max_bytes() const;
  // The policy's choice for a message of `bytes` (kNccl: not this class's job).
  CarAlgo algo_for(size_t bytes) const;
  bool should_use(size_t bytes) const { return algo_for(bytes) != CarAlgo::kNccl; }
  // True for the dtypes the kernel sums (f32, bf16).
  static bool supports(DType dtype) { return dtype == DType::kF32 || dtype == DType::kBF16; }

  // In place: data (n elements of dtype on this rank's GPU, any alignment) becomes the sum
  // over the ranks. Queued on `stream`; no host synchronisation or allocation, so it can be
  // captured in a CUDA graph. Every rank calls it with the same n and dtype, in the same
  // order. Throws Error(kInvalidArgument) for an unsupported dtype or n * size > max_bytes.
  void all_reduce(void* data, DType dtype, int64_t n, CUstream_st* stream);
  // Same with an explicit algorithm (tests and benchmarks; kNccl is refused).
  void all_reduce(void* data, DType dtype, int64_t n, CUstream_st* stream, CarAlgo algo);

  // Set once a barrier timed out: "rank 0 block 3 waited 30000 ms at the start barrier for
  // rank 1 ...". The kernel then traps, so the stream's next synchronisation fails; this
  // says why.
  std::optional<std::string> failure() const;
  std::string describe() const;  // "custom all-reduce: 2 ranks, one-shot up to 8 MiB, ..."

  struct Impl;

 private:
  explicit CustomAllReduce(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::cuda
