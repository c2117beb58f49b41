// A stand-in libnvidia-ml.so.1 for the doctor's tests on machines without the NVIDIA driver: the
// entry points src/doctor/nvml.cpp uses, with NVML's C signatures, answering from environment
// variables read by nvmlInit_v2:
//   FAKE_NVML_INIT    the nvmlReturn_t nvmlInit_v2 returns (default 0, success)
//   FAKE_NVML_GPUS    the GPUs, "NAME|MIB|MAJOR.MINOR" separated by ';' (default none)
//   FAKE_NVML_DRIVER  nvmlSystemGetDriverVersion's answer (default 580.95.05)
//   FAKE_NVML_CUDA    nvmlSystemGetCudaDriverVersion's answer (default 13000, CUDA 13.0)
//   FAKE_NVML_P2P     the nvmlGpuP2PStatus_t of every pair (default 0, OK)
//   FAKE_NVML_FAIL    "ENTRY=CODE,...": these entry points return CODE instead of answering
// Every call before nvmlInit_v2 (or after nvmlShutdown) returns NVML_ERROR_UNINITIALIZED, as
// the real library does, so that the tests catch a doctor that skips it.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Gpu {
  std::string name;
  unsigned long long mib = 0;
  int major = 0, minor = 0;
};

struct State {
  bool initialized = false;
  std::vector<Gpu> gpus;
  std::string driver = "580.95.05";
  int cuda = 13000;
  int p2p = 0;
  std::map<std::string, int> fail;
};
State state;

constexpr int kUninitialized = 1, kInvalidArgument = 2, kInsufficientSize = 7;

std::string env(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string part; std::getline(in, part, sep);)
    if (!part.empty()) out.push_back(part);
  return out;
}

void read_environment() {
  state = State{};
  for (const std::string& g : split(env("FAKE_NVML_GPUS", ""), ';')) {
    const std::vector<std::string> f = split(g, '|');
    Gpu gpu;
    gpu.name = f.empty() ? "" : f[0];
    if (f.size() > 1) gpu.mib = std::strtoull(f[1].c_str(), nullptr, 10);
    if (f.size() > 2) std::sscanf(f[2].c_str(), "%d.%d", &gpu.major, &gpu.minor);
    state.gpus.push_back(gpu);
  }
  state.driver = env("FAKE_NVML_DRIVER", "580.95.05");
  state.cuda = std::atoi(env("FAKE_NVML_CUDA", "13000").c_str());
  state.p2p = std::atoi(env("FAKE_NVML_P2P", "0").c_str());
  for (const std::string& f : split(env("FAKE_NVML_FAIL", ""), ',')) {
    const size_t eq = f.find('=');
    if (eq != std::string::npos) state.fail[f.substr(0, eq)] = std::atoi(f.c_str() + eq + 1);
  }
}

// 0 when `entry` may answer; else the error it returns.
int refuse(const char* entry) {
  if (!state.initialized) return kUninitialized;
  auto it = state.fail.find(entry);
  return it == state.fail.end() ? 0 : it->second;
}

const Gpu* device(void* handle) {
  const auto i = reinterpret_cast<uintptr_t>(handle);
  return i >= 1 && i <= state.gpus.size() ? &state.gpus[i - 1] : nullptr;
}

int copy_string(const std::string& s, char* out, unsigned length) {
  if (!out) return kInvalidArgument;
  if (s.size() + 1 > length) return kInsufficientSize;
  std::memcpy(out, s.c_str(), s.size() + 1);
  return 0;
}

}  // namespace

extern "C" {

struct FakeMemory {  // nvmlMemory_t
  unsigned long long total, free, used;
};

int nvmlInit_v2() {
  read_environment();
  const int rc = std::atoi(env("FAKE_NVML_INIT", "0").c_str());
  state.initialized = rc == 0;
  return rc;
}

int nvmlShutdown() {
  if (int rc = refuse("nvmlShutdown")) return rc;
  state.initialized = false;
  return 0;
}

const char* nvmlErrorString(int rc) {
  switch (rc) {
    case 0:
      return "Success";
    case 1:
      return "Uninitialized";
    case 2:
      return "Invalid Argument";
    case 3:
      return "Not Supported";
    case 4:
      return "Insufficient Permissions";
    case 7:
      return "Insufficient Size";
    case 9:
      return "Driver Not Loaded";
    case 15:
      return "GPU is lost";
    case 18:
      return "RM has detected an NVML/RM version mismatch.";
    default:
      return "Unknown Error";
  }
}

int nvmlSystemGetDriverVersion(char* version, unsigned length) {
  if (int rc = refuse("nvmlSystemGetDriverVersion")) return rc;
  return copy_string(state.driver, version, length);
}

int nvmlSystemGetCudaDriverVersion(int* version) {
  if (int rc = refuse("nvmlSystemGetCudaDriverVersion")) return rc;
  if (!version) return kInvalidArgument;
  *version = state.cuda;
  return 0;
}

int nvmlDeviceGetCount_v2(unsigned* count) {
  if (int rc = refuse("nvmlDeviceGetCount_v2")) return rc;
  if (!count) return kInvalidArgument;
  *count = static_cast<unsigned>(state.gpus.size());
  return 0;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned index, void** handle) {
  if (int rc = refuse("nvmlDeviceGetHandleByIndex_v2")) return rc;
  if (!handle || index >= state.gpus.size()) return kInvalidArgument;
  *handle = reinterpret_cast<void*>(static_cast<uintptr_t>(index) + 1);
  return 0;
}

int nvmlDeviceGetName(void* handle, char* name, unsigned length) {
  if (int rc = refuse("nvmlDeviceGetName")) return rc;
  const Gpu* g = device(handle);
  return g ? copy_string(g->name, name, length) : kInvalidArgument;
}

int nvmlDeviceGetMemoryInfo(void* handle, FakeMemory* memory) {
  if (int rc = refuse("nvmlDeviceGetMemoryInfo")) return rc;
  const Gpu* g = device(handle);
  if (!g || !memory) return kInvalidArgument;
  memory->total = g->mib << 20;
  memory->used = 0;
  memory->free = memory->total;
  return 0;
}

int nvmlDeviceGetCudaComputeCapability(void* handle, int* major, int* minor) {
  if (int rc = refuse("nvmlDeviceGetCudaComputeCapability")) return rc;
  const Gpu* g = device(handle);
  if (!g || !major || !minor) return kInvalidArgument;
  *major = g->major;
  *minor = g->minor;
  return 0;
}

int nvmlDeviceGetP2PStatus(void* a, void* b, int caps_index, int* status) {
  if (int rc = refuse("nvmlDeviceGetP2PStatus")) return rc;
  if (!device(a) || !device(b) || !status || caps_index < 0) return kInvalidArgument;
  *status = state.p2p;
  return 0;
}

}  // extern "C"
