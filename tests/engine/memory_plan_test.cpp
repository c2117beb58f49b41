// The KV budget of processes that share a GPU (engine/memory_plan.h): each counts only its own
// growth since its backend started (vLLM's per-instance --gpu-memory-utilization), and a start on
// a GPU where others hold too much fails before any weight is read, naming what fits.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "backend/forwarding_backend.h"
#include "core/error.h"
#include "engine/engine.h"
#include "engine/memory_plan.h"
#include "engine/model_loader.h"
#include "fixture_util.h"

namespace tessera {
namespace {

constexpr size_t GiB = size_t{1} << 30, MiB = size_t{1} << 20;

std::string failure(const StartMemory& m) {
  try {
    check_memory_at_start(m);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kOutOfMemory);
    return e.what();
  }
  return "";
}

TEST(MemoryInUse, ThisProcessesGrowthSinceItsBackendStarted) {
  // 80 GiB device; 30 GiB were free at start (others hold 50), 18 GiB are free now: 12 GiB ours.
  EXPECT_EQ(memory_in_use(80 * GiB, 18 * GiB, 30 * GiB), 12 * GiB);
  // Another process freed more than we took meanwhile: nothing counted, never negative.
  EXPECT_EQ(memory_in_use(80 * GiB, 31 * GiB, 30 * GiB), 0u);
  // Not recorded (CPU backend, unified memory): everything in use on the device.
  EXPECT_EQ(memory_in_use(80 * GiB, 18 * GiB, 0), 62 * GiB);
  EXPECT_EQ(memory_in_use(8 * GiB, 9 * GiB, 0), 0u);
}

TEST(MemoryInUse, TwoProcessesOnOneGpuEachGetTheirShare) {
  // vLLM's rule: two instances on one GPU, 0.45 each. A has loaded (10 GiB of weights and runtime)
  // and taken its cache; B starts after it and loads the same 10 GiB.
  CacheFootprint fp;
  fp.paged_layers = 1;
  fp.kv_bytes_per_block = 1 * MiB;
  KvBudgetInputs in;
  in.total = 80 * GiB;
  in.utilization = 0.45;
  in.max_num_seqs = 1 << 20;  // no cap from the sequences
  in.max_model_len = 16;
  in.used = memory_in_use(80 * GiB, 70 * GiB, 80 * GiB);  // A, before its cache
  const KvBudget a = plan_kv_budget(in, fp);
  EXPECT_EQ(a.budget, static_cast<size_t>(0.45 * 80 * GiB) - 10 * GiB);
  const size_t a_holds = 10 * GiB + a.budget;  // its weights and its cache
  const size_t b_start = 80 * GiB - a_holds;
  in.used = memory_in_use(80 * GiB, b_start - 10 * GiB, b_start);
  const KvBudget b = plan_kv_budget(in, fp);
  EXPECT_EQ(b.budget, a.budget);
  EXPECT_EQ(b.num_blocks, a.num_blocks);
  // Counting all that is in use, B would count A's 36 GiB as its own and get no cache at all.
  in.used = memory_in_use(80 * GiB, b_start - 10 * GiB, 0);
  EXPECT_EQ(plan_kv_budget(in, fp).num_blocks, 0);
}

TEST(StartMemory, FitsWhenTheShareIsFree) {
  StartMemory m{"cuda:0 (test GPU)", 80 * GiB, 80 * GiB, 0.9, 0};
  EXPECT_EQ(failure(m), "");
  m.free_at_start = 40 * GiB;  // another process holds 40 GiB: 0.5 just fits
  m.utilization = 0.5;
  EXPECT_EQ(failure(m), "");
  m.free_at_start = 0;  // not recorded (CPU, unified memory): nothing to check
  m.utilization = 1.0;
  EXPECT_EQ(failure(m), "");
}

TEST(StartMemory, AnOverAskFailsNamingFreeAskedAndTheShareThatFits) {
  StartMemory m{"cuda:0 (test GPU)", 80 * GiB, 44 * GiB, 0.9, 0};
  EXPECT_DOUBLE_EQ(max_start_utilization(m), 0.55);
  const std::string e = failure(m);
  EXPECT_NE(e.find("Free memory on device cuda:0 (test GPU) (44.00/80.00 GiB) on startup is less than desired GPU "
                   "memory utilization (0.90, 72.00 GiB)"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("other processes hold 36.00 GiB"), std::string::npos) << e;
  EXPECT_NE(e.find("use --gpu-memory-utilization 0.55 or less"), std::string::npos) << e;
  EXPECT_NE(e.find("--kv-cache-memory-bytes"), std::string::npos) << e;
  // Rounded down: 0.459 of the device free allows 0.45, not 0.46.
  m.free_at_start = static_cast<size_t>(0.459 * 80 * GiB);
  EXPECT_DOUBLE_EQ(max_start_utilization(m), 0.45);
  // Nothing left: no share to suggest.
  m.free_at_start = 100 * MiB;
  EXPECT_NE(failure(m).find("no --gpu-memory-utilization fits beside them"), std::string::npos);
}

TEST(StartMemory, AnExplicitCacheSizeReplacesTheUtilization) {
  // vLLM: --kv-cache-memory-bytes ignores --gpu-memory-utilization.
  StartMemory m{"cuda:0 (test GPU)", 80 * GiB, 20 * GiB, 0.9, 4 * GiB};
  EXPECT_EQ(failure(m), "");
  m.kv_cache_memory_bytes = 24 * GiB;
  const std::string e = failure(m);
  EXPECT_NE(e.find("--kv-cache-memory-bytes 25769803776 (24.00 GiB) is more than the free memory on device cuda:0 "
                   "(test GPU) (20.00 GiB of 80.00 GiB)"),
            std::string::npos)
      << e;
}

// A backend whose device reports fixed figures: `total`, the free memory at its start, and the
// free memory now (this process's growth since then is at_start - now).
class SharedGpu : public ForwardingBackend {
 public:
  SharedGpu(Backend& inner, size_t total, size_t at_start, size_t now)
      : ForwardingBackend(inner), total_(total), at_start_(at_start), now_(now) {}
  size_t total_memory() const override { return total_; }
  size_t free_memory() const override { return now_; }
  size_t free_memory_at_start() const override { return at_start_; }

 private:
  size_t total_, at_start_, now_;
};

TEST(EngineBudget, IsThisProcessesShareOfTheDevice) {
  auto cpu = testing::make_test_backend();
  if (cpu->device().type != DeviceType::kCPU) GTEST_SKIP() << "figures for the CPU backend's f32 cache";
  LoadOptions lo;
  lo.model_dir = testing::fixtures_dir() + "/qwen3_gqa4_hd32";
  const auto probe = load_model(lo, *cpu);
  const size_t block = cache_footprint(probe->cache_specs(), DType::kF32, 16).kv_bytes_per_block;
  ASSERT_GT(block, 0u);
  // A device of 256 blocks, utilization 0.5 (128 blocks). Another process holds 64 blocks' worth;
  // this one grew by 100 since its start: 28 blocks left for its cache. Counting all in use (164)
  // would leave none.
  const size_t total = 256 * block, at_start = 192 * block, now = 92 * block;
  SharedGpu gpu(*cpu, total, at_start, now);
  EngineConfig ec;
  ec.gpu_memory_utilization = 0.5;
  ec.scheduler.max_num_seqs = 16;
  ec.scheduler.max_num_batched_tokens = 256;
  ec.scheduler.max_model_len = 64;
  LLMEngine engine(std::make_unique<LocalExecutor>(load_model(lo, gpu), gpu), ec);
  EXPECT_EQ(engine.num_blocks(), 28);
}

}  // namespace
}  // namespace tessera
