// custom_all_reduce_test: the custom all-reduce on N GPUs of one machine (N = the visible
// GPUs, at most 8, or --ranks N). Not a ctest (it needs 2+ GPUs); built with TESSERA_CUDA,
// bundled by scripts/bundle.sh --with-tests. The parent forks one process per GPU before it
// touches CUDA and hosts the bootstrap store; rank 0 prints, every rank reports failures.
//
//   custom_all_reduce_test                  # all checks, then the latency table against NCCL
//   custom_all_reduce_test --quick          # fewer benchmark iterations
//   custom_all_reduce_test --no-bench       # checks only
//   custom_all_reduce_test --isolated       # each rank sees only its own GPU (CUDA_VISIBLE_DEVICES=r)
//
// Checks (bit-exact against a CPU f32 sum in rank order, guards around the tensor):
//   f32 and bf16 x one-shot and two-shot x 1 element .. 8 MiB incl. odd sizes x aligned and
//   unaligned pointers; 96 back-to-back calls with host-side skew and no sync in between;
//   the same inside a CUDA graph (replayed, mixed with eager calls); the Communicator
//   decorator on a real NCCL group (small -> custom, large and f16 -> NCCL); a dead peer:
//   the survivors' kernel aborts after its timeout with a message naming the peer.
// Output: "PASS ..." / "FAIL ..." lines, a latency table, and "RESULT: PASS|FAIL"; exit 0 on
// success, 1 on a failure, 77 when fewer than 2 GPUs are visible.
#include <cuda_runtime.h>
#include <nccl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "backend/cuda/custom_all_reduce.h"
#include "core/error.h"
#include "core/logging.h"
#include "distributed/control_store.h"
#include "distributed/custom_all_reduce_communicator.h"
#include "distributed/nccl_communicator.h"
#include "distributed/process_groups.h"
#include "distributed/rendezvous_server.h"

namespace tessera::dist {
namespace {

using cuda::CarAlgo;
using cuda::CustomAllReduce;
using std::chrono::milliseconds;
constexpr size_t KiB = 1024, MiB = 1024 * 1024;
constexpr size_t kMaxBytes = 8 * MiB;

struct Args {
  int ranks = 0;
  bool quick = false;
  bool bench = true;
  bool dead_peer = true;
  bool isolated = false;  // each rank sees only its GPU (CUDA_VISIBLE_DEVICES=<rank>)
};

// Counted from /dev, so the parent never initialises CUDA before forking.
int visible_gpus() {
  int n = 0;
  for (int i = 0; i < 16; ++i) n += std::filesystem::exists("/dev/nvidia" + std::to_string(i));
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) {
    int listed = *v ? 1 : 0;
    for (const char* c = v; *c; ++c) listed += *c == ',';
    n = std::min(n, listed);
  }
  return n;
}

#define CK(call)                                                                                \
  do {                                                                                          \
    cudaError_t e_ = (call);                                                                    \
    if (e_ != cudaSuccess) fail(ErrorKind::kInternal, "{}: {}", #call, cudaGetErrorString(e_)); \
  } while (0)
#define NCK(call)                                                                              \
  do {                                                                                         \
    ncclResult_t r_ = (call);                                                                  \
    if (r_ != ncclSuccess) fail(ErrorKind::kNetwork, "{}: {}", #call, ncclGetErrorString(r_)); \
  } while (0)

std::string human(size_t bytes) {
  if (bytes >= MiB && bytes % MiB == 0) return fmt::format("{} MiB", bytes / MiB);
  if (bytes >= KiB && bytes % KiB == 0) return fmt::format("{} KiB", bytes / KiB);
  return fmt::format("{} B", bytes);
}

// ---- deterministic data and the CPU reference ----

float value(int rank, int64_t i, uint32_t seed) {
  uint32_t h =
      static_cast<uint32_t>(i) * 0x9E3779B1u ^ static_cast<uint32_t>(rank + 1) * 0x85EBCA77u ^ seed * 0xC2B2AE3Du;
  h ^= h >> 15;
  h *= 0x2C1B3C6Du;
  h ^= h >> 12;
  h *= 0x297A2D39u;
  h ^= h >> 15;
  return (static_cast<float>(h >> 8) / 16777216.0f * 2.0f - 1.0f) * (1 + (h & 3));
}

std::vector<uint8_t> encode(const std::vector<float>& v, DType t) {
  std::vector<uint8_t> out(v.size() * dtype_size(t));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == DType::kF32) {
      std::memcpy(&out[i * 4], &v[i], 4);
    } else {
      uint16_t b = f32_to_bf16(v[i]);
      std::memcpy(&out[i * 2], &b, 2);
    }
  }
  return out;
}

float decoded(const std::vector<uint8_t>& bytes, DType t, size_t i) {
  if (t == DType::kF32) {
    float f;
    std::memcpy(&f, &bytes[i * 4], 4);
    return f;
  }
  uint16_t b;
  std::memcpy(&b, &bytes[i * 2], 2);
  return bf16_to_f32(b);
}

// The bytes rank `rank` starts with.
std::vector<uint8_t> input_of(int rank, int64_t n, DType t, uint32_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = value(rank, i, seed);
  return encode(v, t);
}

// The sum every rank must end with: f32 in rank order, rounded once (what the kernel does).
std::vector<uint8_t> expected_of(const std::vector<std::vector<uint8_t>>& inputs, int64_t n, DType t) {
  std::vector<float> acc(static_cast<size_t>(n));
  for (size_t r = 0; r < inputs.size(); ++r)
    for (int64_t i = 0; i < n; ++i) {
      float x = decoded(inputs[r], t, static_cast<size_t>(i));
      acc[static_cast<size_t>(i)] = r == 0 ? x : acc[static_cast<size_t>(i)] + x;
    }
  return encode(acc, t);
}

// A device tensor at element `offset` of an allocation filled with guard bytes around it.
struct Guarded {
  static constexpr uint8_t kGuard = 0x5A;
  static constexpr size_t kPad = 256;
  uint8_t* base = nullptr;
  size_t total = 0, start = 0, bytes = 0;
  Guarded(int64_t n, DType t, size_t offset_elems) {
    bytes = static_cast<size_t>(n) * dtype_size(t);
    start = kPad + offset_elems * dtype_size(t);
    total = start + bytes + kPad;
    CK(cudaMalloc(&base, total));
    CK(cudaMemset(base, kGuard, total));
  }
  ~Guarded() { cudaFree(base); }
  void* data() const { return base + start; }
  // cudaMemcpy from pageable memory may return before the DMA lands, and the all-reduce runs on
  // a non-blocking stream: wait for the device.
  void upload(const std::vector<uint8_t>& b) {
    CK(cudaMemcpy(data(), b.data(), bytes, cudaMemcpyHostToDevice));
    CK(cudaDeviceSynchronize());
  }
  // "" when the tensor equals `want` and every guard byte is intact.
  std::string check(const std::vector<uint8_t>& want, DType t) const {
    std::vector<uint8_t> all(total);
    CK(cudaMemcpy(all.data(), base, total, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < total; ++i) {
      if (i >= start && i < start + bytes) continue;
      if (all[i] != kGuard)
        return fmt::format("guard byte {} {} the tensor was overwritten", i < start ? start - i : i - start - bytes + 1,
                           i < start ? "before" : "after");
    }
    const size_t es = dtype_size(t);
    for (size_t i = 0; i < bytes / es; ++i)
      if (std::memcmp(&all[start + i * es], &want[i * es], es) != 0) {
        std::vector<uint8_t> got(all.begin() + static_cast<long>(start),
                                 all.begin() + static_cast<long>(start + bytes));
        return fmt::format("element {} is {} instead of {}", i, decoded(got, t, i), decoded(want, t, i));
      }
    return "";
  }
};

// ---- one rank ----

class Rank {
 public:
  Rank(int rank, int world, uint16_t port, const Args& args)
      : rank_(rank), world_(world), device_(args.isolated ? 0 : rank), args_(args) {
    store_ = std::make_shared<ControlStoreClient>(HeadAddress{"127.0.0.1", port, "t", ""}, rank, milliseconds(30000));
    group_ = ParallelLayout{world, 1}.tp_group(rank);
    verdicts_ = store_all_gather(store_, group_, "test/verdict", milliseconds(120000));
    CK(cudaSetDevice(device_));
    CK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }

  // Every rank calls it at the same point: prints PASS/FAIL for the group (rank 0), returns ok.
  bool verdict(const std::string& what, int checks, const std::string& failure, double seconds = -1) {
    std::vector<uint8_t> mine(failure.begin(), failure.end());
    mine.insert(mine.begin(), failure.empty() ? 1 : 0);
    auto all = verdicts_(mine);
    std::string first;
    for (size_t r = 0; r < all.size() && first.empty(); ++r)
      if (all[r].empty() || all[r][0] == 0)
        first = fmt::format("rank {}: {}", r, std::string(all[r].begin() + (all[r].empty() ? 0 : 1), all[r].end()));
    if (rank_ == 0) {
      std::string t = seconds >= 0 ? fmt::format(" ({:.1f} s)", seconds) : "";
      if (first.empty())
        std::printf("PASS %s: %d checks on each of %d ranks%s\n", what.c_str(), checks, world_, t.c_str());
      else
        std::printf("FAIL %s: %s\n", what.c_str(), first.c_str());
      std::fflush(stdout);
    }
    if (!first.empty()) ++failures_;
    return first.empty();
  }

  void note(const std::string& line) {
    if (rank_ == 0) {
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
    }
  }

  int run() {
    setenv("NCCL_NVLS_ENABLE", "0", 1);
    auto ag = store_all_gather(store_, group_, "test/car/main", milliseconds(60000));
    cuda::CustomAllReduceOptions opts;
    opts.timeout = milliseconds(20000);
    car_ = CustomAllReduce::create(rank_, world_, device_, ag, kMaxBytes, opts);
    if (!verdict("create: IPC buffers opened and P2P read/write checked", 1,
                 car_ ? "" : "CustomAllReduce::create returned null (reason in the log above)"))
      return 1;
    note(car_->describe());
    if (args_.dead_peer) {
      auto ag2 = store_all_gather(store_, group_, "test/car/short", milliseconds(60000));
      cuda::CustomAllReduceOptions short_opts;
      short_opts.timeout = milliseconds(2000);
      car_short_ = CustomAllReduce::create(rank_, world_, device_, ag2, 64 * KiB, short_opts);
    }
    init_nccl();

    sizes_and_layouts();
    back_to_back();
    graphs();
    decorator();
    if (args_.bench) benchmark();
    if (args_.dead_peer && car_short_) dead_peer();  // last: it leaves the CUDA context dead
    return failures_ ? 1 : 0;
  }

 private:
  void init_nccl() {
    ncclUniqueId id;
    if (rank_ == 0) {
      NCK(ncclGetUniqueId(&id));
      store_->set("test/nccl_id", std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(&id), sizeof id));
    } else {
      auto b = store_->wait_get("test/nccl_id", milliseconds(60000), "rank 0's NCCL id");
      std::memcpy(&id, b.data(), sizeof id);
    }
    NCK(ncclCommInitRank(&nccl_, world_, id, rank_));
  }

  void sync_all() {  // a device-side barrier plus a host wait on every rank
    float* one = nullptr;
    CK(cudaMallocAsync(reinterpret_cast<void**>(&one), 4, stream_));
    NCK(ncclAllReduce(one, one, 1, ncclFloat32, ncclSum, nccl_, stream_));
    CK(cudaFreeAsync(one, stream_));
    CK(cudaStreamSynchronize(stream_));
  }

  std::vector<std::vector<uint8_t>> all_inputs(int64_t n, DType t, uint32_t seed) {
    std::vector<std::vector<uint8_t>> in;
    for (int r = 0; r < world_; ++r) in.push_back(input_of(r, n, t, seed));
    return in;
  }

  void sizes_and_layouts() {
    auto start = Clock::now();
    std::vector<int64_t> elems = {1, 2, 3, 5, 7, 8, 9, 15, 17, 31, 33, 127, 1001, 12345, 100003};
    std::vector<size_t> byte_sizes = {4 * KiB, 64 * KiB, 512 * KiB, 8 * MiB, 8 * MiB - 2};
    for (DType t : {DType::kF32, DType::kBF16}) {
      for (CarAlgo algo : {CarAlgo::kOneShot, CarAlgo::kTwoShot}) {
        int checks = 0;
        std::string failure;
        std::vector<int64_t> ns = elems;
        for (size_t b : byte_sizes) ns.push_back(static_cast<int64_t>(b / dtype_size(t)));
        uint32_t seed = 1;
        for (int64_t n : ns) {
          for (size_t offset : {size_t{16} / dtype_size(t), size_t{1}}) {  // aligned, then misaligned by one element
            ++seed;
            auto inputs = all_inputs(n, t, seed);
            Guarded g(n, t, offset);
            g.upload(inputs[static_cast<size_t>(rank_)]);
            try {
              car_->all_reduce(g.data(), t, n, stream_, algo);
              CK(cudaStreamSynchronize(stream_));
              std::string bad = g.check(expected_of(inputs, n, t), t);
              if (!bad.empty() && failure.empty()) failure = fmt::format("n={} offset={}: {}", n, offset, bad);
            } catch (const std::exception& e) {
              if (failure.empty()) failure = fmt::format("n={} offset={}: {}", n, offset, e.what());
            }
            ++checks;
          }
        }
        verdict(fmt::format("{} {} sizes 1 element .. 8 MiB, odd sizes, aligned and misaligned", dtype_name(t),
                            car_algo_name(algo)),
                checks, failure);
      }
    }
    note(fmt::format("  (size checks took {:.1f} s)", std::chrono::duration<double>(Clock::now() - start).count()));
  }

  // Calls queued without a host sync in between, ranks skewed on the host: the staging halves
  // alternate and no end barrier exists, so this is where a missing wait would show.
  void back_to_back() {
    struct Case {
      int64_t n;
      DType t;
      CarAlgo algo;
      std::unique_ptr<Guarded> g;
      std::vector<uint8_t> want;
    };
    const int64_t shapes[] = {1, 4096, 33, 32768, 262144, 100003, 8};
    std::vector<Case> cases;
    for (int i = 0; i < 96; ++i) {
      Case c;
      c.n = shapes[i % 7];
      c.t = i % 3 == 0 ? DType::kF32 : DType::kBF16;
      c.algo = (i / 2) % 2 ? CarAlgo::kTwoShot : CarAlgo::kOneShot;
      auto inputs = all_inputs(c.n, c.t, 1000 + static_cast<uint32_t>(i));
      c.g = std::make_unique<Guarded>(c.n, c.t, i % 5 == 4 ? 1 : 0);
      c.g->upload(inputs[static_cast<size_t>(rank_)]);
      c.want = expected_of(inputs, c.n, c.t);
      cases.push_back(std::move(c));
    }
    CK(cudaDeviceSynchronize());
    sync_all();
    for (size_t i = 0; i < cases.size(); ++i) {
      if (static_cast<int>(i % 11) == rank_ % 11) std::this_thread::sleep_for(std::chrono::microseconds(300));
      car_->all_reduce(cases[i].g->data(), cases[i].t, cases[i].n, stream_, cases[i].algo);
    }
    std::string failure;
    try {
      CK(cudaStreamSynchronize(stream_));
      for (size_t i = 0; i < cases.size() && failure.empty(); ++i) {
        std::string bad = cases[i].g->check(cases[i].want, cases[i].t);
        if (!bad.empty())
          failure = fmt::format("call {} (n={} {} {}): {}", i, cases[i].n, dtype_name(cases[i].t),
                                car_algo_name(cases[i].algo), bad);
      }
    } catch (const std::exception& e) {
      failure = e.what();
    }
    verdict("96 back-to-back calls (mixed sizes, dtypes, algorithms; ranks skewed; no sync between)",
            static_cast<int>(cases.size()), failure);
  }

  // Captured once, replayed with fresh inputs, eager calls in between (the counters are shared).
  void graphs() {
    struct Case {
      int64_t n;
      DType t;
      std::unique_ptr<Guarded> pristine, work;
    };
    std::vector<Case> cases;
    cases.push_back({32 * 1024, DType::kBF16, nullptr, nullptr});  // 64 KiB
    cases.push_back({1001, DType::kF32, nullptr, nullptr});
    cases.push_back({256 * 1024, DType::kBF16, nullptr, nullptr});  // 512 KiB
    cases.push_back({7, DType::kBF16, nullptr, nullptr});
    for (auto& c : cases) {
      c.pristine = std::make_unique<Guarded>(c.n, c.t, 0);
      c.work = std::make_unique<Guarded>(c.n, c.t, 0);
    }
    std::string failure;
    int checks = 0;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    try {
      CK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
      for (size_t i = 0; i < cases.size(); ++i) {
        auto& c = cases[i];
        CK(cudaMemcpyAsync(c.work->data(), c.pristine->data(), c.work->bytes, cudaMemcpyDeviceToDevice, stream_));
        car_->all_reduce(c.work->data(), c.t, c.n, stream_, i == 1 ? CarAlgo::kTwoShot : CarAlgo::kOneShot);
      }
      CK(cudaStreamEndCapture(stream_, &graph));
      CK(cudaGraphInstantiate(&exec, graph, 0));
      for (int replay = 0; replay < 6; ++replay) {
        std::vector<std::vector<uint8_t>> want;
        for (auto& c : cases) {
          auto inputs = all_inputs(c.n, c.t, 5000 + static_cast<uint32_t>(replay * 10 + checks));
          c.pristine->upload(inputs[static_cast<size_t>(rank_)]);
          want.push_back(expected_of(inputs, c.n, c.t));
        }
        CK(cudaGraphLaunch(exec, stream_));
        if (replay % 2) {  // an eager call between replays
          Guarded e(4096, DType::kBF16, 0);
          auto in = all_inputs(4096, DType::kBF16, 77 + static_cast<uint32_t>(replay));
          e.upload(in[static_cast<size_t>(rank_)]);
          car_->all_reduce(e.data(), DType::kBF16, 4096, stream_);
          CK(cudaStreamSynchronize(stream_));
          std::string bad = e.check(expected_of(in, 4096, DType::kBF16), DType::kBF16);
          if (!bad.empty() && failure.empty()) failure = fmt::format("eager call after replay {}: {}", replay, bad);
          ++checks;
        }
        CK(cudaStreamSynchronize(stream_));
        for (size_t i = 0; i < cases.size(); ++i) {
          std::string bad = cases[i].work->check(want[i], cases[i].t);
          if (!bad.empty() && failure.empty())
            failure = fmt::format("replay {} all-reduce {} (n={}): {}", replay, i, cases[i].n, bad);
          ++checks;
        }
      }
    } catch (const std::exception& e) {
      if (failure.empty()) failure = e.what();
    }
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    verdict("CUDA graph: 4 all-reduces captured, 6 replays with new inputs, eager calls in between", checks, failure);
  }

  Tensor cuda_tensor(Shape shape, DType dtype) {
    size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
    void* p = nullptr;
    CK(cudaMalloc(&p, bytes));
    auto storage =
        std::make_shared<Storage>(p, bytes, Device{DeviceType::kCUDA, device_}, [](void* q) { cudaFree(q); });
    return Tensor(storage, 0, shape, dtype);
  }

  // The Communicator decorator over a real NCCL group on the same stream.
  void decorator() {
    std::string failure;
    int checks = 0;
    try {
      NcclOptions o;
      o.store = store_;
      o.device_index = device_;
      o.stream = stream_;
      NcclCommunicatorFactory factory(o);
      std::unique_ptr<Communicator> tp = factory.create(ParallelLayout{world_, 1}.tp_group(rank_));
      CustomAllReduceConfig config;
      config.store = store_;
      config.device_index = device_;
      config.stream = stream_;
      tp = with_custom_all_reduce(std::move(tp), config);
      auto* dec = dynamic_cast<CustomAllReduceCommunicator*>(tp.get());
      if (!dec) fail(ErrorKind::kInternal, "with_custom_all_reduce did not wrap the NCCL group");
      struct Case {
        Shape shape;
        DType t;
      };
      const Case cases[] = {
          {{4, 4096}, DType::kBF16}, {{5, 4097}, DType::kF32}, {{4, 1 << 20}, DType::kF32}, {{8, 512}, DType::kF16}};
      for (const Case& c : cases) {
        Tensor x = cuda_tensor(c.shape, c.t);
        int64_t n = x.numel();
        std::vector<std::vector<uint8_t>> inputs;
        DType enc = c.t == DType::kF16 ? DType::kF32 : c.t;  // f16 data: f32 inputs cast below
        for (int r = 0; r < world_; ++r) {
          std::vector<float> v(static_cast<size_t>(n));
          for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = std::round(value(r, i, 9) * 8) / 8;
          if (c.t == DType::kF16) {
            std::vector<uint8_t> b(static_cast<size_t>(n) * 2);
            for (int64_t i = 0; i < n; ++i) {
              uint16_t h = f32_to_f16(v[static_cast<size_t>(i)]);
              std::memcpy(&b[static_cast<size_t>(i) * 2], &h, 2);
            }
            inputs.push_back(b);
          } else {
            inputs.push_back(encode(v, enc));
          }
        }
        CK(cudaMemcpy(x.raw(), inputs[static_cast<size_t>(rank_)].data(), x.nbytes(), cudaMemcpyHostToDevice));
        CK(cudaDeviceSynchronize());
        tp->all_reduce(x);
        CK(cudaStreamSynchronize(stream_));
        std::vector<uint8_t> got(x.nbytes());
        CK(cudaMemcpy(got.data(), x.raw(), x.nbytes(), cudaMemcpyDeviceToHost));
        // Inputs are multiples of 1/8 below 4 in magnitude: every path and order sums them exactly.
        for (int64_t i = 0; i < n && failure.empty(); ++i) {
          float want = 0, have;
          for (int r = 0; r < world_; ++r) {
            if (c.t == DType::kF16) {
              uint16_t h;
              std::memcpy(&h, &inputs[static_cast<size_t>(r)][static_cast<size_t>(i) * 2], 2);
              want += f16_to_f32(h);
            } else {
              want += decoded(inputs[static_cast<size_t>(r)], c.t, static_cast<size_t>(i));
            }
          }
          if (c.t == DType::kF16) {
            uint16_t h;
            std::memcpy(&h, &got[static_cast<size_t>(i) * 2], 2);
            have = f16_to_f32(h);
          } else {
            have = decoded(got, c.t, static_cast<size_t>(i));
          }
          if (have != want)
            failure = fmt::format("{}{} element {}: {} instead of {}", dtype_name(c.t), x.shape().str(), i, have, want);
        }
        ++checks;
      }
      if (failure.empty() && (dec->fast_calls() != 2 || dec->inner_calls() != 2))
        failure = fmt::format("{} calls took the custom path and {} NCCL (expected 2 and 2)", dec->fast_calls(),
                              dec->inner_calls());
      ++checks;
    } catch (const std::exception& e) {
      if (failure.empty()) failure = e.what();
    }
    verdict("decorator over an NCCL group: bf16 32 KiB and f32 80 KiB -> custom; f32 16 MiB and f16 -> NCCL", checks,
            failure);
  }

  // Mean microseconds per call over `iters` calls queued back to back (eager) or replayed from a
  // graph of `iters` captured calls. Max over ranks.
  template <typename F>
  double time_calls(F&& call, int iters, bool graph) {
    for (int i = 0; i < 10; ++i) call();
    sync_all();
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    float ms = 0;
    if (!graph) {
      CK(cudaEventRecord(a, stream_));
      for (int i = 0; i < iters; ++i) call();
      CK(cudaEventRecord(b, stream_));
      CK(cudaEventSynchronize(b));
      CK(cudaEventElapsedTime(&ms, a, b));
    } else {
      cudaGraph_t g;
      cudaGraphExec_t ge;
      CK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
      for (int i = 0; i < iters; ++i) call();
      CK(cudaStreamEndCapture(stream_, &g));
      CK(cudaGraphInstantiate(&ge, g, 0));
      CK(cudaGraphLaunch(ge, stream_));  // warm
      CK(cudaStreamSynchronize(stream_));
      sync_all();
      CK(cudaEventRecord(a, stream_));
      CK(cudaGraphLaunch(ge, stream_));
      CK(cudaEventRecord(b, stream_));
      CK(cudaEventSynchronize(b));
      CK(cudaEventElapsedTime(&ms, a, b));
      cudaGraphExecDestroy(ge);
      cudaGraphDestroy(g);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    double us = ms * 1000.0 / iters;
    std::vector<uint8_t> mine(sizeof(double));
    std::memcpy(mine.data(), &us, sizeof us);
    double worst = 0;
    for (auto& v : verdicts_(mine)) {
      double x;
      std::memcpy(&x, v.data(), sizeof x);
      worst = std::max(worst, x);
    }
    return worst;
  }

  void benchmark() {
    const int iters = args_.quick ? 50 : 200;
    note("");
    note(
        fmt::format("Latency per bf16 all-reduce, {} GPUs, mean of {} calls, slowest rank (us). eager: calls queued "
                    "back to back (includes launch gaps); graph: {} calls replayed from one CUDA graph.",
                    world_, iters, iters));
    note(fmt::format("{:>9} | {:>8} {:>8} {:>8} | {:>8} {:>8} {:>8} | {:>8} {:>8} | {:>9} {:>8}", "size", "1shot/g",
                     "2shot/g", "nccl/g", "1shot/e", "2shot/e", "nccl/e", "policy", "speedup", "busbw/g", "pick"));
    void* buf = nullptr;
    CK(cudaMalloc(&buf, kMaxBytes));
    CK(cudaMemset(buf, 0, kMaxBytes));
    size_t wins_up_to = 0;
    bool lost = false;
    for (size_t bytes : {8 * KiB, 64 * KiB, 256 * KiB, 1 * MiB, 2 * MiB, 4 * MiB, 8 * MiB}) {
      int64_t n = static_cast<int64_t>(bytes / 2);
      double r[2][3];
      for (int g = 0; g < 2; ++g) {
        r[g][0] =
            time_calls([&] { car_->all_reduce(buf, DType::kBF16, n, stream_, CarAlgo::kOneShot); }, iters, g == 0);
        r[g][1] =
            time_calls([&] { car_->all_reduce(buf, DType::kBF16, n, stream_, CarAlgo::kTwoShot); }, iters, g == 0);
        r[g][2] = time_calls(
            [&] { NCK(ncclAllReduce(buf, buf, static_cast<size_t>(n), ncclBfloat16, ncclSum, nccl_, stream_)); }, iters,
            g == 0);
      }
      CarAlgo pick = car_->algo_for(bytes);
      double policy_us = pick == CarAlgo::kTwoShot ? r[0][1] : r[0][0];
      double best_custom = std::min(r[0][0], r[0][1]);
      if (best_custom < r[0][2] && !lost)
        wins_up_to = bytes;
      else
        lost = true;
      double busbw = 2.0 * (world_ - 1) / world_ * bytes / (policy_us * 1e-6) / 1e9;
      note(fmt::format(
          "{:>9} | {:>8.1f} {:>8.1f} {:>8.1f} | {:>8.1f} {:>8.1f} {:>8.1f} | {:>8.1f} {:>7.2f}x | {:>6.0f} GB/s "
          "{:>8}",
          human(bytes), r[0][0], r[0][1], r[0][2], r[1][0], r[1][1], r[1][2], policy_us, r[0][2] / policy_us, busbw,
          car_algo_name(pick)));
    }
    cudaFree(buf);
    note(
        fmt::format("Custom (best of one-/two-shot, graph) beats NCCL up to {} here; the policy sends up to {} to the "
                    "custom kernel (CarPolicy::max_bytes) and picks the 'pick' column.",
                    wins_up_to ? human(wins_up_to) : std::string("no size"), human(car_->max_bytes())));
    note("");
  }

  void dead_peer() {
    sync_all();
    verdict("ready for the dead-peer check", 0, "");
    if (rank_ == world_ - 1) {
      std::fflush(nullptr);
      _exit(0);  // gone without a word; its peers' next all-reduce must not hang
    }
    std::this_thread::sleep_for(milliseconds(200));
    void* buf = nullptr;
    CK(cudaMalloc(&buf, 8192));
    auto start = Clock::now();
    car_short_->all_reduce(buf, DType::kBF16, 4096, stream_);
    cudaError_t e = cudaErrorNotReady;
    while ((e = cudaStreamQuery(stream_)) == cudaErrorNotReady && Clock::now() - start < std::chrono::seconds(30))
      std::this_thread::sleep_for(milliseconds(5));
    double s = std::chrono::duration<double>(Clock::now() - start).count();
    auto why = car_short_->failure();
    bool ok = e != cudaSuccess && e != cudaErrorNotReady && why &&
              why->find("for rank " + std::to_string(world_ - 1)) != std::string::npos;
    if (rank_ == 0) {
      std::printf(
          "%s dead peer: rank %d exited; the all-reduce (barrier timeout 2 s) ended after %.2f s with \"%s\"; "
          "failure(): %s\n",
          ok ? "PASS" : "FAIL", world_ - 1, s, cudaGetErrorString(e), why ? why->c_str() : "(none)");
      std::fflush(stdout);
    } else if (!ok) {
      std::fprintf(stderr, "[rank %d] dead-peer check failed: %s\n", rank_, cudaGetErrorString(e));
    }
    if (!ok) ++failures_;
    std::fflush(nullptr);
    _exit(failures_ ? 1 : 0);  // the context is unusable after the trap: skip every destructor
  }

  int rank_, world_, device_;
  Args args_;
  std::shared_ptr<ControlStoreClient> store_;
  GroupInfo group_;
  AllGatherBytes verdicts_;
  cudaStream_t stream_ = nullptr;
  ncclComm_t nccl_ = nullptr;
  std::unique_ptr<CustomAllReduce> car_, car_short_;
  int failures_ = 0;
};

int run(const Args& args) {
  int gpus = visible_gpus();
  int world = args.ranks ? args.ranks : std::min(gpus, 8);
  std::printf("custom_all_reduce_test: %d GPUs visible, %d ranks%s\n", gpus, world,
              args.isolated ? ", each seeing only its own GPU" : "");
  if (world < 2 || world > gpus) {
    std::printf("SKIP: needs at least 2 GPUs (and --ranks <= visible GPUs)\nRESULT: SKIP\n");
    return 77;
  }
  Socket probe = listen_tcp("127.0.0.1", 0);
  uint16_t port = local_port(probe);
  probe.close();
  std::fflush(nullptr);
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      int code = 1;
      if (args.isolated) setenv("CUDA_VISIBLE_DEVICES", std::to_string(r).c_str(), 1);
      try {
        Rank rank(r, world, port, args);
        code = rank.run();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "[rank %d] FAIL: %s\n", r, e.what());
        code = 2;
      }
      std::fflush(nullptr);
      _exit(code);
    }
    pids.push_back(pid);
  }
  RendezvousServerOptions so;
  so.port = port;
  so.token = "t";
  RendezvousServer server(so);
  std::vector<int> codes;
  auto deadline = Clock::now() + std::chrono::seconds(540);
  for (pid_t pid : pids) {
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (Clock::now() > deadline) {
        std::printf("FAIL: rank pid %d still running after 540 s; killing it\n", pid);
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        break;
      }
      std::this_thread::sleep_for(milliseconds(20));
    }
    codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status));
  }
  bool ok = true;
  for (size_t r = 0; r < codes.size(); ++r)
    if (codes[r] != 0) {
      std::printf("rank %zu exited with %d\n", r, codes[r]);
      ok = false;
    }
  std::printf("RESULT: %s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace tessera::dist

int main(int argc, char** argv) {
  tessera::dist::Args args;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--quick")
      args.quick = true;
    else if (a == "--no-bench")
      args.bench = false;
    else if (a == "--no-dead-peer")
      args.dead_peer = false;
    else if (a == "--isolated")
      args.isolated = true;
    else if (a == "--ranks" && i + 1 < argc)
      args.ranks = std::atoi(argv[++i]);
    else {
      std::printf("usage: %s [--ranks N] [--quick] [--no-bench] [--no-dead-peer] [--isolated]\n", argv[0]);
      return 2;
    }
  }
  return tessera::dist::run(args);
}
