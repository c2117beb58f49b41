// Host side of the custom all-reduce: the shared region, the IPC handle exchange, the P2P
// checks and the launch. Kernels in custom_all_reduce.cu; design in custom_all_reduce.h.
#include "backend/cuda/custom_all_reduce.h"

#include <cuda_runtime.h>

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "backend/cuda/cuda_facts.h"
#include "backend/cuda/custom_all_reduce_kernels.h"
#include "core/error.h"
#include "core/logging.h"

namespace tessera::cuda {

const char* car_algo_name(CarAlgo a) {
  switch (a) {
    case CarAlgo::kNccl:
      return "nccl";
    case CarAlgo::kOneShot:
      return "one-shot";
    case CarAlgo::kTwoShot:
      return "two-shot";
  }
  return "?";
}

namespace {

constexpr uint32_t kInfoMagic = 0x52414354;  // "TCAR"
constexpr uint32_t kInfoVersion = 1;
constexpr size_t kReasonBytes = 200;

// Round 1 payload; fixed size so that any all-gather (Gloo's included) can carry it.
struct PeerInfo {
  uint32_t magic = kInfoMagic;
  uint32_t version = kInfoVersion;
  int32_t rank = 0;
  int32_t world = 0;
  uint64_t max_bytes = 0;
  int32_t blocks = 0;  // what this rank can run (SM count, option); the group takes the minimum
  int32_t ok = 0;
  char bus_id[32] = {};
  char host[64] = {};  // IPC works within one machine only
  cudaIpcMemHandle_t handle{};
  char reason[kReasonBytes] = {};
};

// Rounds 2 and 3: did the checks pass here?
struct Verdict {
  int32_t ok = 0;
  char reason[kReasonBytes] = {};
};

template <typename T>
std::vector<uint8_t> to_bytes(const T& v) {
  std::vector<uint8_t> b(sizeof(T));
  std::memcpy(b.data(), &v, sizeof(T));
  return b;
}

void set_reason(char (&dst)[kReasonBytes], const std::string& s) {
  std::memset(dst, 0, kReasonBytes);
  std::memcpy(dst, s.data(), std::min(s.size(), kReasonBytes - 1));
}

std::string reason_of(const char (&r)[kReasonBytes]) { return std::string(r, strnlen(r, kReasonBytes)); }

std::string cuda_why(cudaError_t e, const char* what) {
  cudaGetLastError();  // IPC and peer errors are not sticky; clear them
  return fmt::format("{}: {}", what, cudaGetErrorString(e));
}

std::string mib(size_t bytes) {
  if (bytes % (1 << 20) == 0) return fmt::format("{} MiB", bytes >> 20);
  if (bytes % (1 << 10) == 0) return fmt::format("{} KiB", bytes >> 10);
  return fmt::format("{} B", bytes);
}

// Every rank's payload of one round, with the size checked.
template <typename T>
std::vector<T> exchange(const AllGatherBytes& all_gather, const T& mine, int world, const char* round) {
  std::vector<std::vector<uint8_t>> got = all_gather(to_bytes(mine));
  if (static_cast<int>(got.size()) != world)
    fail(ErrorKind::kInternal, "custom all-reduce: the all-gather of the {} returned {} entries for {} ranks", round,
         got.size(), world);
  std::vector<T> out(got.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i].size() != sizeof(T))
      fail(ErrorKind::kCorrupt, "custom all-reduce: rank {} sent {} bytes of {} ({} expected)", i, got[i].size(), round,
           sizeof(T));
    std::memcpy(&out[i], got[i].data(), sizeof(T));
  }
  return out;
}

// The first failed rank's reason, or "" when every rank is ready.
template <typename T>
std::string first_failure(const std::vector<T>& all) {
  for (size_t r = 0; r < all.size(); ++r)
    if (!all[r].ok) return fmt::format("rank {}: {}", r, reason_of(all[r].reason));
  return "";
}

uint32_t token_of(int rank) { return 0xCA7E0000u | static_cast<uint32_t>(rank); }
uint32_t mark_of(int from, int to) {
  return 0xA11D0000u | static_cast<uint32_t>(from << 8) | static_cast<uint32_t>(to);
}

// Round 1 on this rank: the shared buffer (flags, then two halves of `half` bytes) allocated,
// its token written and exported for IPC, the mapped failure record; `me` filled (ok = 1).
// What failed, or "" (what was made is the caller's to free, as `base` and `failure_host`).
std::string export_buffer(int rank, int device, size_t half, int blocks_option, PeerInfo& me, char*& base,
                          car::FailureRecord*& failure_host, car::FailureRecord*& failure_dev) {
  cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess) {
    return cuda_why(e, "cudaSetDevice");
  }
  int sms = 0;
  try {
    sms = read_cuda_device_facts(device).sms;  // the one reader of the device's properties
  } catch (const Error& err) {
    return err.what();
  }
  me.blocks = std::min({blocks_option > 0 ? blocks_option : car::kDefaultBlocks, sms, car::kMaxBlocks});
  if ((e = cudaDeviceGetPCIBusId(me.bus_id, sizeof me.bus_id, device)) != cudaSuccess) {
    return cuda_why(e, "cudaDeviceGetPCIBusId");
  }
  void* p = nullptr;
  if ((e = cudaMalloc(&p, car::kFlagsBytes + 2 * half)) != cudaSuccess) {
    return cuda_why(e, "cudaMalloc of the shared buffer") + fmt::format(" ({} bytes)", car::kFlagsBytes + 2 * half);
  }
  base = static_cast<char*>(p);
  uint32_t token = token_of(rank);
  if ((e = cudaMemset(p, 0, car::kFlagsBytes)) != cudaSuccess ||
      (e = cudaMemcpy(&reinterpret_cast<car::Flags*>(p)->token, &token, 4, cudaMemcpyHostToDevice)) != cudaSuccess ||
      (e = cudaDeviceSynchronize()) != cudaSuccess) {
    return cuda_why(e, "initialising the shared buffer");
  }
  if ((e = cudaIpcGetMemHandle(&me.handle, p)) != cudaSuccess) {
    return cuda_why(e, "cudaIpcGetMemHandle");
  }
  void* mapped = nullptr;
  if ((e = cudaHostAlloc(&mapped, sizeof(car::FailureRecord), cudaHostAllocMapped)) != cudaSuccess) {
    return cuda_why(e, "cudaHostAlloc");
  }
  failure_host = static_cast<car::FailureRecord*>(mapped);
  std::memset(mapped, 0, sizeof(car::FailureRecord));
  void* dev = nullptr;
  if ((e = cudaHostGetDevicePointer(&dev, mapped, 0)) != cudaSuccess) {
    return cuda_why(e, "cudaHostGetDevicePointer");
  }
  failure_dev = static_cast<car::FailureRecord*>(dev);
  me.ok = 1;
  return "";
}

// What round 2 learnt of the links.
struct PeerLinks {
  bool all_nvlink = true, any_unknown = false;
};

// Round 2 on this rank: P2P checks against every peer, their buffers opened through IPC (into
// `peer_bases`, marked in `opened`), each peer's token read and this rank's mark written there.
Verdict open_peers(int rank, int device, const std::vector<PeerInfo>& all, const PeerInfo& me,
                   std::vector<char*>& peer_bases, std::vector<bool>& opened, PeerLinks& links) {
  Verdict v2;
  v2.ok = 1;
  for (int r = 0; r < static_cast<int>(all.size()) && v2.ok; ++r) {
    if (r == rank) continue;
    const PeerInfo& p = all[static_cast<size_t>(r)];
    int peer_dev = -1;
    if (cudaDeviceGetByPCIBusId(&peer_dev, p.bus_id) != cudaSuccess) {
      cudaGetLastError();
      links.any_unknown = true;  // not visible in this process: IPC may still work; the read/write check decides
    } else if (peer_dev == device) {
      v2.ok = 0;
      set_reason(v2.reason, fmt::format("ranks {} and {} share GPU {}", rank, r, p.bus_id));
      break;
    } else {
      int can = 0;
      cudaDeviceCanAccessPeer(&can, device, peer_dev);
      if (!can) {
        v2.ok = 0;
        set_reason(v2.reason,
                   fmt::format("GPU {} cannot access GPU {} (rank {}) peer-to-peer", me.bus_id, p.bus_id, r));
        break;
      }
      int atomics = 0;
      cudaDeviceGetP2PAttribute(&atomics, cudaDevP2PAttrNativeAtomicSupported, device, peer_dev);
      if (!atomics) links.all_nvlink = false;
    }
    void* q = nullptr;
    cudaError_t e = cudaIpcOpenMemHandle(&q, p.handle, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
      v2.ok = 0;
      set_reason(v2.reason,
                 cuda_why(e, "cudaIpcOpenMemHandle") + fmt::format(" (rank {}'s buffer, GPU {})", r, p.bus_id));
      break;
    }
    peer_bases[static_cast<size_t>(r)] = static_cast<char*>(q);
    opened[static_cast<size_t>(r)] = true;
    auto* theirs = reinterpret_cast<car::Flags*>(q);
    uint32_t token = 0, mark = mark_of(rank, r);
    if ((e = cudaMemcpy(&token, &theirs->token, 4, cudaMemcpyDeviceToHost)) != cudaSuccess ||
        (e = cudaMemcpy(&theirs->marks[rank], &mark, 4, cudaMemcpyHostToDevice)) != cudaSuccess) {
      v2.ok = 0;
      set_reason(v2.reason, cuda_why(e, "P2P copy through the IPC mapping") + fmt::format(" (rank {})", r));
      break;
    }
    if (token != token_of(r)) {
      v2.ok = 0;
      set_reason(v2.reason, fmt::format("reading rank {}'s buffer gave {:#x}, not {:#x}: P2P reads do not work between "
                                        "GPU {} and GPU {}",
                                        r, token, token_of(r), me.bus_id, p.bus_id));
      break;
    }
  }
  if (v2.ok && cudaDeviceSynchronize() != cudaSuccess) {
    v2.ok = 0;
    set_reason(v2.reason, cuda_why(cudaErrorUnknown, "cudaDeviceSynchronize after the P2P check"));
  }
  return v2;
}

}  // namespace

struct CustomAllReduce::Impl {
  int rank = 0;
  int world = 0;
  int device = 0;
  size_t max_bytes = 0;
  CustomAllReduceOptions options;
  char* base = nullptr;           // my region
  std::vector<char*> peer_bases;  // every rank's region in my address space (mine = base)
  std::vector<bool> opened;       // peer_bases[r] came from cudaIpcOpenMemHandle
  car::FailureRecord* failure_host = nullptr;
  car::FailureRecord* failure_dev = nullptr;
  car::KernelArgs args{};
  std::string links;  // "NVLink" / "P2P (no NVLink)" / "P2P (link not visible here)"

  ~Impl() {
    if (world == 0) return;
    cudaSetDevice(device);
    for (size_t r = 0; r < peer_bases.size(); ++r)
      if (opened[r] && peer_bases[r]) cudaIpcCloseMemHandle(peer_bases[r]);
    if (base) cudaFree(base);
    if (failure_host) cudaFreeHost(failure_host);
    cudaGetLastError();
  }
};

CustomAllReduce::CustomAllReduce(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CustomAllReduce::~CustomAllReduce() = default;
int CustomAllReduce::rank() const { return impl_->rank; }
int CustomAllReduce::world() const { return impl_->world; }
size_t CustomAllReduce::max_bytes() const { return impl_->max_bytes; }

CarAlgo CustomAllReduce::algo_for(size_t bytes) const {
  CarPolicy p = impl_->options.policy;
  p.max_bytes = std::min(p.max_bytes, impl_->max_bytes);
  return p.choose(impl_->world, bytes);
}

std::unique_ptr<CustomAllReduce> CustomAllReduce::create(int rank, int world, int device,
                                                         const AllGatherBytes& all_gather, size_t max_bytes,
                                                         CustomAllReduceOptions options) {
  auto disabled = [&](const std::string& why) -> std::unique_ptr<CustomAllReduce> {
    if (rank == 0)
      TLOG_WARN("custom all-reduce disabled ({}); all-reduce goes to NCCL", why);
    else
      TLOG_INFO("custom all-reduce disabled ({})", why);
    return nullptr;
  };
  // Decided identically on every rank, so no exchange is needed to agree.
  if (world < 2 || world > kCarMaxRanks)
    return disabled(fmt::format("{} ranks; it handles 2 to {}", world, kCarMaxRanks));
  if (rank < 0 || rank >= world) fail(ErrorKind::kInvalidArgument, "custom all-reduce: rank {} of {}", rank, world);
  if (max_bytes == 0) return disabled("max_bytes is 0");

  auto impl = std::make_unique<Impl>();
  impl->rank = rank;
  impl->device = device;
  impl->max_bytes = max_bytes;
  impl->options = options;
  impl->peer_bases.assign(static_cast<size_t>(world), nullptr);
  impl->opened.assign(static_cast<size_t>(world), false);
  impl->world = world;  // from here the destructor frees what was made
  const size_t half = (max_bytes + 255) / 256 * 256;

  // ---- round 1: allocate, export, tell the others ----
  PeerInfo me;
  me.rank = rank;
  me.world = world;
  me.max_bytes = max_bytes;
  gethostname(me.host, sizeof me.host - 1);
  const std::string why =
      export_buffer(rank, device, half, options.blocks, me, impl->base, impl->failure_host, impl->failure_dev);
  impl->peer_bases[static_cast<size_t>(rank)] = impl->base;
  if (!me.ok) set_reason(me.reason, why);
  std::vector<PeerInfo> all = exchange(all_gather, me, world, "handles");
  for (int r = 0; r < world && me.ok; ++r) {
    const PeerInfo& p = all[static_cast<size_t>(r)];
    if (p.magic != kInfoMagic || p.version != kInfoVersion || p.rank != r || p.world != world ||
        p.max_bytes != max_bytes) {
      me.ok = 0;
      set_reason(me.reason, fmt::format("rank {} disagrees (rank {}, {} ranks, max {} bytes, version {})", r, p.rank,
                                        p.world, p.max_bytes, p.version));
    }
  }
  for (int r = 0; r < world && me.ok; ++r)
    if (std::strncmp(all[static_cast<size_t>(r)].host, me.host, sizeof me.host) != 0)
      return disabled(fmt::format(
          "rank {} runs on {} and rank {} on {}: the group spans hosts", rank, me.host, r,
          std::string(all[static_cast<size_t>(r)].host, strnlen(all[static_cast<size_t>(r)].host, sizeof me.host))));
  if (std::string f = first_failure(all); !f.empty()) return disabled(f);

  // ---- round 2: P2P checks, open the peers' buffers, read their token, write my mark ----
  PeerLinks links;
  Verdict v2 = open_peers(rank, device, all, me, impl->peer_bases, impl->opened, links);
  const bool all_nvlink = links.all_nvlink, any_unknown = links.any_unknown;
  int blocks = car::kMaxBlocks;
  for (const PeerInfo& p : all) blocks = std::min(blocks, static_cast<int>(p.blocks));
  if (v2.ok && world > 2 && (!all_nvlink || any_unknown) && !options.allow_pcie_beyond_two) {
    v2.ok = 0;
    set_reason(v2.reason, any_unknown
                              ? std::string("the peers' GPUs are not visible in this process, so NVLink cannot be "
                                            "confirmed (more than 2 GPUs over PCIe: NCCL is faster)")
                              : std::string("no NVLink between every pair of GPUs (more than 2 GPUs over PCIe: "
                                            "NCCL is faster)"));
  }
  std::vector<Verdict> v2all = exchange(all_gather, v2, world, "P2P checks");
  if (std::string f = first_failure(v2all); !f.empty()) return disabled(f);

  // ---- round 3: did every peer's write land in my buffer? ----
  Verdict v3;
  v3.ok = 1;
  uint32_t marks[kCarMaxRanks] = {};
  cudaError_t e =
      cudaMemcpy(marks, reinterpret_cast<car::Flags*>(impl->base)->marks, sizeof marks, cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) {
    v3.ok = 0;
    set_reason(v3.reason, cuda_why(e, "reading my buffer"));
  }
  for (int r = 0; r < world && v3.ok; ++r) {
    if (r != rank && marks[r] != mark_of(r, rank)) {
      v3.ok = 0;
      set_reason(v3.reason, fmt::format("rank {}'s P2P write did not arrive (read {:#x}): P2P writes do not work from "
                                        "GPU {} to GPU {}",
                                        r, marks[r], all[static_cast<size_t>(r)].bus_id, me.bus_id));
    }
  }
  std::vector<Verdict> v3all = exchange(all_gather, v3, world, "P2P write check");
  if (std::string f = first_failure(v3all); !f.empty()) return disabled(f);

  car::KernelArgs& a = impl->args;
  for (int r = 0; r < world; ++r) {
    a.flags[r] = reinterpret_cast<car::Flags*>(impl->peer_bases[static_cast<size_t>(r)]);
    a.bufs[r] = impl->peer_bases[static_cast<size_t>(r)] + car::kFlagsBytes;
  }
  a.half_bytes = half;
  a.rank = rank;
  a.world = world;
  a.blocks = blocks;
  a.timeout_ns = static_cast<uint64_t>(options.timeout.count()) * 1000000ull;
  a.failure = impl->failure_dev;
  impl->links = any_unknown ? "P2P (peers not visible here)" : all_nvlink ? "NVLink" : "P2P without NVLink";
  auto car = std::unique_ptr<CustomAllReduce>(new CustomAllReduce(std::move(impl)));
  if (rank == 0) TLOG_INFO("{}", car->describe());
  return car;
}

std::string CustomAllReduce::describe() const {
  const Impl& m = *impl_;
  CarPolicy p = m.options.policy;
  p.max_bytes = std::min(p.max_bytes, m.max_bytes);
  size_t one = std::min(p.one_shot_limit(m.world), p.max_bytes);
  std::string algos = one >= p.max_bytes
                          ? fmt::format("one-shot up to {}", mib(p.max_bytes))
                          : fmt::format("one-shot up to {}, two-shot up to {}", mib(one), mib(p.max_bytes));
  return fmt::format(
      "custom all-reduce: {} ranks over {}, {}, NCCL above; {} blocks x {} threads; barrier timeout {} ms", m.world,
      m.links, algos, m.args.blocks, car::kThreads, m.options.timeout.count());
}

void CustomAllReduce::all_reduce(void* data, DType dtype, int64_t n, CUstream_st* stream) {
  size_t bytes = static_cast<size_t>(n) * dtype_size(dtype);
  CarAlgo algo = algo_for(bytes);
  if (algo == CarAlgo::kNccl) {
    if (n == 0) return;
    // The caller asked anyway (should_use said no): the buffer still bounds what fits.
    algo = bytes <= impl_->max_bytes ? CarAlgo::kOneShot : CarAlgo::kNccl;
  }
  all_reduce(data, dtype, n, stream, algo);
}

void CustomAllReduce::all_reduce(void* data, DType dtype, int64_t n, CUstream_st* stream, CarAlgo algo) {
  if (!supports(dtype)) fail(ErrorKind::kUnsupported, "custom all-reduce sums f32 and bf16, not {}", dtype_name(dtype));
  if (n < 0) fail(ErrorKind::kInvalidArgument, "custom all-reduce of {} elements", n);
  size_t bytes = static_cast<size_t>(n) * dtype_size(dtype);
  if (bytes > impl_->max_bytes)
    fail(ErrorKind::kInvalidArgument, "custom all-reduce of {} bytes: its buffer holds {} (use NCCL)", bytes,
         impl_->max_bytes);
  if (algo == CarAlgo::kNccl) fail(ErrorKind::kInvalidArgument, "custom all-reduce asked to run NCCL's algorithm");
  if (n == 0) return;
  if (auto f = failure()) fail(ErrorKind::kNetwork, "{}", *f);
  cudaError_t e = car::launch_custom_all_reduce(impl_->args, data, dtype, n, algo, stream);
  if (e != cudaSuccess)
    fail(ErrorKind::kInternal, "custom all-reduce ({}, {} elements of {}): launch failed: {}", car_algo_name(algo), n,
         dtype_name(dtype), cudaGetErrorString(e));
}

std::optional<std::string> CustomAllReduce::failure() const {
  const car::FailureRecord* f = impl_->failure_host;
  if (!f || !f->set) return std::nullopt;
  return fmt::format(
      "custom all-reduce: rank {} (block {}) waited {} ms at the {} barrier for rank {} (call {}; that rank had "
      "reached "
      "call {}); the peer is dead or stuck, so the kernel was aborted",
      f->rank, f->block, f->waited_ns / 1000000, f->phase == 0 ? "start" : "middle", f->waiting_for, f->flag, f->seen);
}

}  // namespace tessera::cuda
