// An integrated GPU (DGX Spark's GB10) sizes by the host's MemAvailable, not cudaMemGetInfo, and
// an over-ask of --gpu-memory-utilization fails in the plan made before any weight is read
// (cli::plan_or_fail runs make_plan on measured_target). The device here is a fake: a CPU backend
// dressed as CUDA device 0 whose architecture record is GB10's (integrated) or H100's, and whose
// memory comes from a fixed /proc/meminfo text and fixed cudaMemGetInfo figures, through
// device_memory(), the rule the CUDA backend uses.
#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_arch.h"
#include "backend/forwarding_backend.h"
#include "backend/host_memory.h"
#include "plan/planner.h"

namespace tessera {
namespace {

constexpr size_t kGiB = size_t{1} << 30;
// A 128 GB Spark after a checkpoint was read once: 96 GB of it page cache, reclaimable.
constexpr const char* kSparkMeminfo =
    "MemTotal:       124918708 kB\nMemFree:         3021300 kB\nMemAvailable:   101232496 kB\n"
    "Buffers:          100212 kB\nCached:         96351200 kB\n";
constexpr size_t kMemTotal = 124918708ull * 1024, kMemAvailable = 101232496ull * 1024;
// What cudaMemGetInfo says there: the page cache counted as used.
constexpr size_t kCudaFree = size_t{3} * kGiB, kCudaTotal = size_t{119} * kGiB;

CudaDeviceFacts facts(bool integrated) {
  CudaDeviceFacts f;
  f.name = integrated ? "NVIDIA GB10" : "NVIDIA H100 80GB HBM3";
  f.major = integrated ? 12 : 9;
  f.minor = integrated ? 1 : 0;
  f.sms = integrated ? 48 : 132;
  f.smem_per_block_optin = integrated ? 101376 : 232448;
  f.smem_per_sm = integrated ? 102400 : 233472;
  f.max_threads_per_sm = integrated ? 1536 : 2048;
  f.total_memory = integrated ? kCudaTotal : size_t{80} * kGiB;
  f.integrated = integrated;
  return f;
}

class FakeCudaDevice final : public ForwardingBackend {
 public:
  FakeCudaDevice(Backend& inner, const CudaDeviceFacts& f, DeviceMemory cuda)
      : ForwardingBackend(inner), arch_(make_cuda_arch(f)), cuda_(cuda) {}
  Device device() const override { return {DeviceType::kCUDA, 0}; }
  std::string name() const override { return "cuda:0 (" + arch_.name + ", fake)"; }
  DType compute_dtype() const override { return DType::kBF16; }
  size_t free_memory() const override { return figures().free; }
  size_t total_memory() const override { return figures().total; }
  bool unified_memory() const override { return arch_.integrated; }

 private:
  DeviceMemory figures() const {
    return device_memory(
        arch_.integrated, [] { return host_memory_from(kSparkMeminfo, "", ""); }, [this] { return cuda_; });
  }
  CudaArch arch_;
  DeviceMemory cuda_;
};

plan::PlanInputs inputs(const plan::Target& t, double utilization) {
  plan::PlanInputs in;
  in.model_dir = std::string(TESSERA_SOURCE_DIR) + "/configs/qwen3-30b-a3b";  // ~57 GiB of bf16 weights
  in.max_model_len = 4096;
  in.gpu_memory_utilization = utilization;
  in.load_format = "dummy";
  in.target = t;
  in.target.gpus_per_node = 1;
  return in;
}

TEST(IntegratedMemory, BudgetComesFromMemAvailable) {
  CpuBackend cpu(1);
  FakeCudaDevice gb10(cpu, facts(true), {kCudaFree, kCudaTotal});
  EXPECT_EQ(gb10.free_memory(), kMemAvailable) << "MemAvailable, not cudaMemGetInfo's free";
  EXPECT_EQ(gb10.total_memory(), kMemTotal);
  const plan::Target t = plan::measured_target(gb10);
  EXPECT_TRUE(t.unified);
  EXPECT_EQ(t.memory_bytes, kMemTotal);
  EXPECT_EQ(t.baseline_used.value_or(0), kMemTotal - kMemAvailable);
  const plan::Plan p = plan::make_plan(inputs(t, 0.85));
  EXPECT_TRUE(p.fits) << p.verdict;
  EXPECT_GT(p.num_blocks, 0);
  // Sized by cudaMemGetInfo instead, the same machine would look full: 116 GiB "in use".
  plan::Target by_cuda = t;
  by_cuda.baseline_used = kCudaTotal - kCudaFree;
  by_cuda.memory_bytes = kCudaTotal;
  EXPECT_FALSE(plan::make_plan(inputs(by_cuda, 0.85)).fits);
}

TEST(IntegratedMemory, OverAskFailsBeforeLoadingNamingWhatFits) {
  CpuBackend cpu(1);
  FakeCudaDevice gb10(cpu, facts(true), {kCudaFree, kCudaTotal});
  const plan::Plan p = plan::make_plan(inputs(plan::measured_target(gb10), 0.97));
  ASSERT_FALSE(p.fits);
  EXPECT_EQ(p.flag_to_change, "--gpu-memory-utilization");
  // 8 GiB left for the OS of 116.3 GiB: up to 0.93.
  EXPECT_NE(p.verdict.find("use --gpu-memory-utilization 0.93"), std::string::npos) << p.verdict;
  EXPECT_NE(p.verdict.find("other processes hold 22.59 GiB now"), std::string::npos) << p.verdict;
  EXPECT_GT(p.min_utilization, 0.0);
  EXPECT_LE(p.min_utilization, p.max_utilization);
}

TEST(IntegratedMemory, DiscreteGpuKeepsItsOwnFigures) {
  CpuBackend cpu(1);
  const DeviceMemory h100_info{size_t{79} * kGiB, size_t{80} * kGiB};
  FakeCudaDevice h100(cpu, facts(false), h100_info);
  EXPECT_EQ(h100.free_memory(), h100_info.free) << "cudaMemGetInfo, untouched by MemAvailable";
  EXPECT_EQ(h100.total_memory(), h100_info.total);
  const plan::Target t = plan::measured_target(h100);
  EXPECT_FALSE(t.unified);
  EXPECT_EQ(t.baseline_used.value_or(0), size_t{1} * kGiB);
  const plan::Plan p = plan::make_plan(inputs(t, 0.97));
  EXPECT_EQ(p.max_utilization, 0.0) << "no unified-memory range on a discrete GPU";
  EXPECT_TRUE(p.fits) << p.verdict;
}

}  // namespace
}  // namespace tessera
