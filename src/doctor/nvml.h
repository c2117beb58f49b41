// This node's GPUs as NVML, the driver's management library, sees them. NVML ships with the
// driver (libnvidia-ml.so.1) and is loaded at run time with dlopen: the build needs no NVML
// header or library, and a machine without the driver runs the same code and is told that the
// library is not there. Only the few entry points used are declared (nvml.cpp).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace tessera::doctor {

inline constexpr const char* kNvmlLibrary = "libnvidia-ml.so.1";

struct NvmlGpu {
  std::string name;                  // "" when nvmlDeviceGetName failed
  uint64_t memory_bytes = 0;         // total; 0 when nvmlDeviceGetMemoryInfo failed
  int cc_major = -1, cc_minor = -1;  // compute capability; -1 when not known
};

struct NvmlFacts {
  // Empty when NVML answered; else why it could not, naming what was tried: the library that
  // did not open (dlerror's words), an entry point it lacks, or the call that failed
  // ("nvmlInit_v2: Driver Not Loaded (NVML error 9)").
  std::string unavailable;
  std::string driver;  // nvmlSystemGetDriverVersion: "580.95.05"
  std::string cuda;    // nvmlSystemGetCudaDriverVersion: "13.0"
  std::vector<NvmlGpu> gpus;
  // Peer-to-peer read between every pair of GPUs (nvmlDeviceGetP2PStatus): the pairs that
  // answered, those with P2P, and "GPU 0-1: chipset not supported" for the others.
  int p2p_pairs = 0, p2p_ok = 0;
  std::vector<std::string> p2p_without;
  // Every call after nvmlInit_v2 that failed, with nvmlErrorString's words:
  // "nvmlDeviceGetMemoryInfo (GPU 1): Not Supported (NVML error 3)".
  std::vector<std::string> errors;
};

// Asks the NVML at `library` (a file name the dynamic loader looks up, or a path). Never
// throws: what fails is in the answer.
NvmlFacts query_nvml(const std::string& library = kNvmlLibrary);

}  // namespace tessera::doctor
