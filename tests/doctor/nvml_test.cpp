// The doctor's GPU facts through NVML, against the fake libnvidia-ml.so.1 (fake_nvml.cpp): what
// it answers becomes the GPUs, CUDA kernels and P2P lines; every failed call is named with
// nvmlErrorString's words in a line of the report, never a crash; without NVML the GPUs line
// says what was tried.
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "doctor/doctor.h"
#include "doctor/gpus.h"
#include "doctor/nvml.h"

namespace tessera::doctor {
namespace {

constexpr const char* kTwo5090 = "NVIDIA GeForce RTX 5090 D|32607|12.0;NVIDIA GeForce RTX 5090 D|32607|12.0";

class DoctorNvml : public testing::Test {
 protected:
  void SetUp() override { clear(); }
  void TearDown() override { clear(); }
  static void clear() {
    for (const char* v : {"FAKE_NVML_INIT", "FAKE_NVML_GPUS", "FAKE_NVML_DRIVER", "FAKE_NVML_CUDA", "FAKE_NVML_P2P",
                          "FAKE_NVML_FAIL", "TESSERA_DOCTOR_NVML"})
      unsetenv(v);
  }
  // This node's checks with the doctor's GPU query pointed at `library`.
  static std::vector<Check> checks_with(const char* library) {
    setenv("TESSERA_DOCTOR_NVML", library, 1);
    DoctorOptions o;
    return local_checks(collect_local_facts(o), o);
  }
  static std::optional<Check> find(const std::vector<Check>& v, const std::string& name) {
    for (const auto& c : v)
      if (c.name == name) return c;
    return std::nullopt;
  }
};

TEST_F(DoctorNvml, TwoGpusDriverAndCuda) {
  setenv("FAKE_NVML_GPUS", kTwo5090, 1);
  setenv("FAKE_NVML_DRIVER", "580.95.05", 1);
  const NvmlFacts n = query_nvml(TESSERA_FAKE_NVML);
  EXPECT_EQ(n.unavailable, "");
  EXPECT_EQ(n.driver, "580.95.05");
  EXPECT_EQ(n.cuda, "13.0");
  ASSERT_EQ(n.gpus.size(), 2u);
  EXPECT_EQ(n.gpus[1].name, "NVIDIA GeForce RTX 5090 D");
  EXPECT_EQ(n.gpus[1].memory_bytes, 32607ull << 20);
  EXPECT_EQ(n.gpus[1].cc_major, 12);
  EXPECT_EQ(n.gpus[1].cc_minor, 0);
  EXPECT_EQ(n.p2p_pairs, 1);
  EXPECT_EQ(n.p2p_ok, 1);
  EXPECT_TRUE(n.errors.empty()) << n.errors.front();

  setenv("TESSERA_DOCTOR_NVML", TESSERA_FAKE_NVML, 1);
  const NodeFacts f = collect_local_facts({});
  EXPECT_EQ(f.gpus, std::vector<std::string>(2, "NVIDIA GeForce RTX 5090 D, 32607 MiB"));
  EXPECT_EQ(f.compute_caps, (std::vector<std::pair<int, int>>{{12, 0}, {12, 0}}));
  EXPECT_EQ(f.driver, "580.95.05");
  EXPECT_EQ(f.cuda, "13.0");
  EXPECT_EQ(f.gpu_query, "");

  const auto c = checks_with(TESSERA_FAKE_NVML);
  auto gpus = find(c, "GPUs");
  ASSERT_TRUE(gpus);
  EXPECT_EQ(gpus->status, Status::kOk);
  EXPECT_EQ(gpus->detail, "2 x NVIDIA GeForce RTX 5090 D, 32607 MiB; driver 580.95.05, CUDA 13.0");
  auto p2p = find(c, "P2P between GPUs");
  ASSERT_TRUE(p2p);
  EXPECT_EQ(p2p->status, Status::kOk);
  EXPECT_EQ(p2p->detail, "1 pairs with P2P, 0 without");
  auto kernels = find(c, "CUDA kernels");  // this build against compute capability 12.0
  ASSERT_TRUE(kernels);
  EXPECT_NE(kernels->status, Status::kFail) << kernels->detail;
  EXPECT_FALSE(find(c, "NVML"));
}

TEST_F(DoctorNvml, InitFailureIsNamedAndTheKernelModuleTried) {
  setenv("FAKE_NVML_GPUS", kTwo5090, 1);
  setenv("FAKE_NVML_INIT", "9", 1);  // NVML_ERROR_DRIVER_NOT_LOADED
  EXPECT_EQ(query_nvml(TESSERA_FAKE_NVML).unavailable, "nvmlInit_v2: Driver Not Loaded (NVML error 9)");
  auto gpus = find(checks_with(TESSERA_FAKE_NVML), "GPUs");
  ASSERT_TRUE(gpus);
  EXPECT_NE(gpus->status, Status::kFail);
  EXPECT_NE(gpus->detail.find("no NVIDIA GPU visible: CPU backend (tried NVML: nvmlInit_v2: Driver Not Loaded (NVML "
                              "error 9); /proc/driver/nvidia/version: "),
            std::string::npos)
      << gpus->detail;
}

TEST_F(DoctorNvml, FailedCallsAreNamedAndTheRestStillAnswers) {
  setenv("FAKE_NVML_GPUS", kTwo5090, 1);
  setenv("FAKE_NVML_FAIL",
         "nvmlDeviceGetMemoryInfo=3,nvmlDeviceGetP2PStatus=999,nvmlSystemGetCudaDriverVersion=18,nvmlShutdown=15", 1);
  const auto c = checks_with(TESSERA_FAKE_NVML);
  auto gpus = find(c, "GPUs");
  ASSERT_TRUE(gpus);
  EXPECT_EQ(gpus->status, Status::kOk);
  EXPECT_EQ(gpus->detail, "2 x NVIDIA GeForce RTX 5090 D; driver 580.95.05, CUDA ?");
  auto p2p = find(c, "P2P between GPUs");
  ASSERT_TRUE(p2p);
  EXPECT_EQ(p2p->status, Status::kWarn);
  EXPECT_EQ(p2p->detail, "0 pairs with P2P, 0 without, 1 unknown (the query failed)");
  auto nvml = find(c, "NVML");
  ASSERT_TRUE(nvml);
  EXPECT_EQ(nvml->status, Status::kWarn);
  for (const char* want :
       {"nvmlSystemGetCudaDriverVersion: RM has detected an NVML/RM version mismatch. (NVML error 18)",
        "nvmlDeviceGetMemoryInfo (GPU 0): Not Supported (NVML error 3)",
        "nvmlDeviceGetMemoryInfo (GPU 1): Not Supported (NVML error 3)",
        "nvmlDeviceGetP2PStatus: Unknown Error (NVML error 999) (1 of 1 pairs)",
        "nvmlShutdown: GPU is lost (NVML error 15)"})
    EXPECT_NE(nvml->detail.find(want), std::string::npos) << want << " not in: " << nvml->detail;
  EXPECT_FALSE(nvml->fix.empty());
}

TEST_F(DoctorNvml, NoDeviceAnswersAtAll) {
  setenv("FAKE_NVML_GPUS", kTwo5090, 1);
  setenv("FAKE_NVML_FAIL", "nvmlDeviceGetCount_v2=4", 1);
  EXPECT_EQ(query_nvml(TESSERA_FAKE_NVML).unavailable,
            "nvmlDeviceGetCount_v2: Insufficient Permissions (NVML error 4)");
  setenv("FAKE_NVML_FAIL", "nvmlDeviceGetHandleByIndex_v2=15,nvmlDeviceGetName=3", 1);
  const NvmlFacts n = query_nvml(TESSERA_FAKE_NVML);
  EXPECT_TRUE(n.gpus.empty());
  ASSERT_EQ(n.errors.size(), 2u);
  EXPECT_EQ(n.errors[1], "nvmlDeviceGetHandleByIndex_v2 (GPU 1): GPU is lost (NVML error 15)");
  auto nvml = find(checks_with(TESSERA_FAKE_NVML), "NVML");
  ASSERT_TRUE(nvml);
  EXPECT_NE(nvml->detail.find("(GPU 0): GPU is lost"), std::string::npos) << nvml->detail;
}

TEST_F(DoctorNvml, PairsWithoutP2PSayWhy) {
  setenv("FAKE_NVML_GPUS", kTwo5090, 1);
  setenv("FAKE_NVML_P2P", "1", 1);  // NVML_P2P_STATUS_CHIPSET_NOT_SUPPORED
  auto p2p = find(checks_with(TESSERA_FAKE_NVML), "P2P between GPUs");
  ASSERT_TRUE(p2p);
  EXPECT_EQ(p2p->status, Status::kWarn);
  EXPECT_EQ(p2p->detail, "0 pairs with P2P, 1 without (GPU 0-1: chipset not supported)");
}

TEST_F(DoctorNvml, DriverWithoutGpusIsAWarning) {
  const auto c = checks_with(TESSERA_FAKE_NVML);  // NVML answers: driver 580.95.05, no GPU
  auto gpus = find(c, "GPUs");
  ASSERT_TRUE(gpus);
  EXPECT_EQ(gpus->status, Status::kWarn);
  EXPECT_EQ(gpus->detail,
            "no NVIDIA GPU visible: CPU backend (tried NVML: driver 580.95.05, 0 GPU(s)); yet driver 580.95.05 is "
            "loaded");
  EXPECT_NE(gpus->fix.find("--gpus all"), std::string::npos) << gpus->fix;
}

TEST_F(DoctorNvml, MissingLibrarySaysWhatWasTried) {
  const char* missing = "/nonexistent/libnvidia-ml.so.1";
  const NvmlFacts n = query_nvml(missing);
  EXPECT_NE(n.unavailable.find("/nonexistent/libnvidia-ml.so.1: cannot open shared object file"), std::string::npos)
      << n.unavailable;
  EXPECT_TRUE(n.gpus.empty());
  auto gpus = find(checks_with(missing), "GPUs");
  ASSERT_TRUE(gpus);
  EXPECT_NE(gpus->status, Status::kFail);
  EXPECT_NE(gpus->detail.find("no NVIDIA GPU visible: CPU backend (tried NVML: /nonexistent/libnvidia-ml.so.1: "
                              "cannot open shared object file"),
            std::string::npos)
      << gpus->detail;
  EXPECT_NE(gpus->detail.find("; /proc/driver/nvidia/version: "), std::string::npos) << gpus->detail;
}

TEST_F(DoctorNvml, ALibraryThatIsNotNvml) {
  EXPECT_EQ(query_nvml("libc.so.6").unavailable, "libc.so.6: no nvmlInit_v2 in it (not an NVML this doctor knows)");
}

TEST(DoctorGpus, DriverFromTheKernelModule) {
  EXPECT_EQ(driver_from_proc_version(
                "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.15  Thu Jan 23 22:50:17 UTC 2025"),
            "570.86.15");
  EXPECT_EQ(driver_from_proc_version("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release "
                                     "Build  (dvs-builder@U16-I3-B03-4-3)  Tue Sep 23 09:55:41 UTC 2025"),
            "580.95.05");
  EXPECT_EQ(driver_from_proc_version(""), "");
}

}  // namespace
}  // namespace tessera::doctor
