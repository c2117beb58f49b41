// Host-side pieces of the custom all-reduce, no GPU needed: the size policy, the decorator's
// routing (with a fake fast path and a fake inner communicator) and the store all-gather.
// The kernels are tested on GPUs by custom_all_reduce_test (tests/distributed/custom_all_reduce_gpu.cpp).
#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <thread>

#include "backend/cuda/custom_all_reduce.h"
#include "core/error.h"
#include "distributed/custom_all_reduce_communicator.h"

namespace tessera::dist {
namespace {

using cuda::CarAlgo;
using cuda::CarPolicy;
constexpr size_t KiB = 1024, MiB = 1024 * 1024;

TEST(CustomAllReducePolicy, TwoRanksUseOneShotUpToTheBuffer) {
  CarPolicy p;
  EXPECT_EQ(p.choose(2, 2), CarAlgo::kOneShot);
  EXPECT_EQ(p.choose(2, 8 * KiB), CarAlgo::kOneShot);
  EXPECT_EQ(p.choose(2, 8 * MiB), CarAlgo::kOneShot);
  EXPECT_EQ(p.choose(2, 8 * MiB + 2), CarAlgo::kNccl);
  EXPECT_EQ(p.choose(2, 0), CarAlgo::kNccl);
}

TEST(CustomAllReducePolicy, MoreRanksSwitchToTwoShot) {
  CarPolicy p;
  EXPECT_EQ(p.choose(4, 512 * KiB), CarAlgo::kOneShot);
  EXPECT_EQ(p.choose(4, 512 * KiB + 2), CarAlgo::kTwoShot);
  EXPECT_EQ(p.choose(8, 256 * KiB), CarAlgo::kOneShot);
  EXPECT_EQ(p.choose(8, 256 * KiB + 4), CarAlgo::kTwoShot);
  EXPECT_EQ(p.choose(8, 8 * MiB), CarAlgo::kTwoShot);
  EXPECT_EQ(p.choose(8, 9 * MiB), CarAlgo::kNccl);
}

TEST(CustomAllReducePolicy, WorldOutsideTwoToEightIsNccl) {
  CarPolicy p;
  EXPECT_EQ(p.choose(1, 1024), CarAlgo::kNccl);
  EXPECT_EQ(p.choose(9, 1024), CarAlgo::kNccl);
  EXPECT_EQ(p.choose(3, 1024), CarAlgo::kOneShot);
}

TEST(CustomAllReducePolicy, OverridesApply) {
  CarPolicy p;
  p.max_bytes = 1 * MiB;
  p.one_shot_max_bytes = 64 * KiB;
  EXPECT_EQ(p.choose(2, 64 * KiB), CarAlgo::kOneShot);
  EXPECT_EQ(p.choose(2, 64 * KiB + 2), CarAlgo::kTwoShot);
  EXPECT_EQ(p.choose(2, 1 * MiB), CarAlgo::kTwoShot);
  EXPECT_EQ(p.choose(2, 1 * MiB + 2), CarAlgo::kNccl);
}

TEST(CustomAllReducePolicy, DtypesTheKernelSums) {
  EXPECT_TRUE(cuda::CustomAllReduce::supports(DType::kF32));
  EXPECT_TRUE(cuda::CustomAllReduce::supports(DType::kBF16));
  EXPECT_FALSE(cuda::CustomAllReduce::supports(DType::kF16));
  EXPECT_FALSE(cuda::CustomAllReduce::supports(DType::kI32));
}

// ---- the decorator ----

struct Log {
  std::vector<std::string> calls;
};

class FakeInner : public Communicator {
 public:
  FakeInner(Log* log, bool ordered) : log_(log), ordered_(ordered) { group_ = {"tp0", {0, 1}, 0}; }
  const GroupInfo& group() const override { return group_; }
  std::string backend() const override { return "nccl"; }
  bool stream_ordered() const override { return ordered_; }
  void all_reduce(const Tensor& t, ReduceOp) override { log_->calls.push_back("inner.all_reduce " + t.str()); }
  void all_gather(const Tensor&, const Tensor&) override { log_->calls.push_back("inner.all_gather"); }
  void gather(const Tensor&, const Tensor&, int root) override {
    log_->calls.push_back(fmt::format("inner.gather {}", root));
  }
  void broadcast(const Tensor&, int root) override { log_->calls.push_back(fmt::format("inner.broadcast {}", root)); }
  void send(const Tensor&, int peer) override { log_->calls.push_back(fmt::format("inner.send {}", peer)); }
  void recv(const Tensor&, int peer) override { log_->calls.push_back(fmt::format("inner.recv {}", peer)); }
  void barrier() override { log_->calls.push_back("inner.barrier"); }

 private:
  Log* log_;
  bool ordered_;
  GroupInfo group_;
};

class FakeFast : public InPlaceAllReduce {
 public:
  explicit FakeFast(Log* log) : log_(log) {}
  bool should_use(DType dtype, size_t bytes) const override {
    return (dtype == DType::kF32 || dtype == DType::kBF16) && bytes <= 1024;
  }
  void all_reduce(void* data, DType dtype, int64_t n) override {
    log_->calls.push_back(fmt::format("fast {} {}", dtype_name(dtype), n));
  }
  std::string describe() const override { return "fake"; }
  std::optional<std::string> failure() const override { return failed; }
  std::optional<std::string> failed;

 private:
  Log* log_;
};

// A tensor that claims to live on a GPU; nothing dereferences it.
Tensor fake_cuda(Shape shape, DType dtype) {
  static char bytes[1 << 16];
  auto storage = std::make_shared<Storage>(bytes, sizeof bytes, Device{DeviceType::kCUDA, 0}, nullptr);
  return Tensor(storage, 0, shape, dtype);
}

TEST(CustomAllReduceCommunicator, SmallCudaFloatTensorsTakeTheFastPath) {
  Log log;
  CustomAllReduceCommunicator c(std::make_unique<FakeInner>(&log, true), std::make_unique<FakeFast>(&log));
  c.all_reduce(fake_cuda({2, 64}, DType::kBF16));  // 256 bytes
  c.all_reduce(fake_cuda({256}, DType::kF32));     // 1024 bytes: the limit
  c.all_reduce(fake_cuda({257}, DType::kF32));     // above
  c.all_reduce(fake_cuda({8}, DType::kF16));       // dtype the kernel does not sum
  c.all_reduce(host_empty({8}, DType::kF32));      // host tensor
  EXPECT_EQ(log.calls, (std::vector<std::string>{"fast bf16 128", "fast f32 256", "inner.all_reduce f32[257]",
                                                 "inner.all_reduce f16[8]", "inner.all_reduce f32[8]"}));
  EXPECT_EQ(c.fast_calls(), 2);
  EXPECT_EQ(c.inner_calls(), 3);
}

TEST(CustomAllReduceCommunicator, EverythingElseIsDelegated) {
  Log log;
  CustomAllReduceCommunicator c(std::make_unique<FakeInner>(&log, true), std::make_unique<FakeFast>(&log));
  Tensor t = fake_cuda({4}, DType::kF32);
  c.all_gather(t, t);
  c.gather(t, t, 1);
  c.broadcast(t, 1);
  c.send(t, 1);
  c.recv(t, 1);
  c.barrier();
  EXPECT_EQ(log.calls, (std::vector<std::string>{"inner.all_gather", "inner.gather 1", "inner.broadcast 1",
                                                 "inner.send 1", "inner.recv 1", "inner.barrier"}));
  EXPECT_EQ(c.backend(), "nccl");
  EXPECT_TRUE(c.stream_ordered());
  EXPECT_EQ(c.group().name, "tp0");
  EXPECT_EQ(c.size(), 2);
}

TEST(CustomAllReduceCommunicator, RaiseIfFailedReportsTheKernelsTimeout) {
  Log log;
  auto fast = std::make_unique<FakeFast>(&log);
  FakeFast* f = fast.get();
  CustomAllReduceCommunicator c(std::make_unique<FakeInner>(&log, true), std::move(fast));
  c.raise_if_failed();  // nothing yet
  f->failed = "custom all-reduce: rank 0 (block 3) waited 30000 ms at the start barrier for rank 1";
  try {
    c.raise_if_failed();
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kNetwork);
    EXPECT_NE(std::string(e.what()).find("for rank 1 (group tp0)"), std::string::npos) << e.what();
  }
}

TEST(CustomAllReduceCommunicator, HostOrderedInnerNeverTakesTheFastPath) {
  Log log;
  CustomAllReduceCommunicator c(std::make_unique<FakeInner>(&log, false), std::make_unique<FakeFast>(&log));
  c.all_reduce(fake_cuda({8}, DType::kF32));
  EXPECT_EQ(log.calls, (std::vector<std::string>{"inner.all_reduce f32[8]"}));
}

TEST(CustomAllReduceCommunicator, FactoryLeavesTheCommunicatorAloneWhenDisabledOrUnbuilt) {
  Log log;
  auto inner = std::make_unique<FakeInner>(&log, true);
  Communicator* raw = inner.get();
  CustomAllReduceConfig config;
  config.disable = true;
  auto c = with_custom_all_reduce(std::move(inner), config);
  EXPECT_EQ(c.get(), raw);
  if (!custom_all_reduce_built()) {
    config.disable = false;
    c = with_custom_all_reduce(std::move(c), config);
    EXPECT_EQ(c.get(), raw);
  }
  // Host-ordered groups (Gloo) are never wrapped, in any build.
  auto gloo_like = std::make_unique<FakeInner>(&log, false);
  Communicator* g = gloo_like.get();
  config.disable = false;
  EXPECT_EQ(with_custom_all_reduce(std::move(gloo_like), config).get(), g);
}

// ---- the store all-gather ----

class MemoryStore : public KeyValueStore {
 public:
  void set(const std::string& key, std::span<const uint8_t> value) override {
    std::lock_guard lock(mu_);
    map_[key] = std::vector<uint8_t>(value.begin(), value.end());
  }
  std::optional<std::vector<uint8_t>> try_get(const std::string& key) override {
    std::lock_guard lock(mu_);
    auto it = map_.find(key);
    if (it == map_.end()) return std::nullopt;
    return it->second;
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::vector<uint8_t>> map_;
};

TEST(StoreAllGather, EveryRankGetsEveryPayloadInRankOrderRoundAfterRound) {
  auto store = std::make_shared<MemoryStore>();
  const int n = 3;
  std::vector<std::vector<std::vector<uint8_t>>> got(n), got2(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      GroupInfo g{"tp0", {4, 5, 6}, r};
      AllGatherBytes ag = store_all_gather(store, g, "car/tp0/0", std::chrono::milliseconds(5000));
      got[r] = ag({static_cast<uint8_t>(10 + r)});
      got2[r] = ag({static_cast<uint8_t>(20 + r), 7});
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(got[r], (std::vector<std::vector<uint8_t>>{{10}, {11}, {12}}));
    EXPECT_EQ(got2[r], (std::vector<std::vector<uint8_t>>{{20, 7}, {21, 7}, {22, 7}}));
  }
}

TEST(StoreAllGather, AMissingRankTimesOutNamingIt) {
  auto store = std::make_shared<MemoryStore>();
  GroupInfo g{"tp1", {2, 3}, 0};
  AllGatherBytes ag = store_all_gather(store, g, "car/tp1/0", std::chrono::milliseconds(200),
                                       [](int r) { return fmt::format("rank {} (node 1)", r); });
  try {
    ag({1});
    FAIL() << "no timeout";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 3 (node 1)"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessera::dist
