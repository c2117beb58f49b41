#include "doctor/nvml.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <cstring>
#include <map>

namespace tessera::doctor {

namespace {

// The part of NVML's C interface used here, as its API reference documents it (the header is
// not in Debian's main archive, and the CPU build must not need the driver). Every entry point
// returns an nvmlReturn_t, a C enum: 0 is NVML_SUCCESS, anything else an error that
// nvmlErrorString names. The enums passed by value or through a pointer are int-sized.
using NvmlReturn = int;
struct NvmlDeviceSt;
using NvmlDevice = NvmlDeviceSt*;  // nvmlDevice_t, an opaque handle
struct NvmlMemory {                // nvmlMemory_t (v1), filled by nvmlDeviceGetMemoryInfo; bytes
  unsigned long long total, free, used;
};
constexpr NvmlReturn kSuccess = 0;
constexpr int kP2PCapsIndexRead = 0;               // nvmlGpuP2PCapsIndex_t: NVML_P2P_CAPS_INDEX_READ
constexpr int kP2PStatusOk = 0;                    // nvmlGpuP2PStatus_t: NVML_P2P_STATUS_OK
constexpr unsigned kDriverVersionBufferSize = 80;  // NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE
constexpr unsigned kDeviceNameBufferSize = 96;     // NVML_DEVICE_NAME_V2_BUFFER_SIZE

// nvmlGpuP2PStatus_t's values 1..6, in words.
const char* p2p_status_words(int s) {
  switch (s) {
    case 1:
      return "chipset not supported";
    case 2:
      return "GPU not supported";
    case 3:
      return "IOH topology not supported";
    case 4:
      return "disabled by regkey";
    case 5:
      return "not supported";
    default:
      return "unknown";
  }
}

struct Api {
  NvmlReturn (*init)() = nullptr;      // nvmlInit_v2
  NvmlReturn (*shutdown)() = nullptr;  // nvmlShutdown
  const char* (*error_string)(NvmlReturn) = nullptr;
  NvmlReturn (*driver_version)(char*, unsigned) = nullptr;       // nvmlSystemGetDriverVersion
  NvmlReturn (*cuda_version)(int*) = nullptr;                    // nvmlSystemGetCudaDriverVersion
  NvmlReturn (*device_count)(unsigned*) = nullptr;               // nvmlDeviceGetCount_v2
  NvmlReturn (*device_handle)(unsigned, NvmlDevice*) = nullptr;  // nvmlDeviceGetHandleByIndex_v2
  NvmlReturn (*device_name)(NvmlDevice, char*, unsigned) = nullptr;
  NvmlReturn (*memory_info)(NvmlDevice, NvmlMemory*) = nullptr;           // nvmlDeviceGetMemoryInfo
  NvmlReturn (*compute_capability)(NvmlDevice, int*, int*) = nullptr;     // nvmlDeviceGetCudaComputeCapability
  NvmlReturn (*p2p_status)(NvmlDevice, NvmlDevice, int, int*) = nullptr;  // nvmlDeviceGetP2PStatus

  // "Driver Not Loaded (NVML error 9)".
  std::string error(NvmlReturn rc) const {
    const char* s = error_string ? error_string(rc) : nullptr;
    return fmt::format("{} (NVML error {})", s && *s ? s : "no description", rc);
  }
};

template <class F>
bool bind(void* lib, const char* symbol, F& f) {
  f = reinterpret_cast<F>(dlsym(lib, symbol));
  return f != nullptr;
}

// The entry points every NVML since 2015 has; "" when all are there, else the first missing.
std::string bind_required(void* lib, Api& api) {
  if (!bind(lib, "nvmlInit_v2", api.init)) return "nvmlInit_v2";
  if (!bind(lib, "nvmlShutdown", api.shutdown)) return "nvmlShutdown";
  if (!bind(lib, "nvmlErrorString", api.error_string)) return "nvmlErrorString";
  if (!bind(lib, "nvmlDeviceGetCount_v2", api.device_count)) return "nvmlDeviceGetCount_v2";
  if (!bind(lib, "nvmlDeviceGetHandleByIndex_v2", api.device_handle)) return "nvmlDeviceGetHandleByIndex_v2";
  return "";
}

// The others: one that is missing (an older driver) is an error line, the rest still asked.
void bind_optional(void* lib, Api& api, const std::string& library, std::vector<std::string>& errors) {
  auto optional = [&](const char* symbol, auto& f) {
    if (!bind(lib, symbol, f)) errors.push_back(fmt::format("{}: not in {} (an older driver)", symbol, library));
  };
  optional("nvmlSystemGetDriverVersion", api.driver_version);
  optional("nvmlSystemGetCudaDriverVersion", api.cuda_version);
  optional("nvmlDeviceGetName", api.device_name);
  optional("nvmlDeviceGetMemoryInfo", api.memory_info);
  optional("nvmlDeviceGetCudaComputeCapability", api.compute_capability);
  optional("nvmlDeviceGetP2PStatus", api.p2p_status);
}

void query_system(const Api& api, NvmlFacts& out) {
  if (api.driver_version) {
    char buf[kDriverVersionBufferSize] = {};
    if (NvmlReturn rc = api.driver_version(buf, sizeof buf); rc == kSuccess)
      out.driver = std::string(buf, strnlen(buf, sizeof buf));
    else
      out.errors.push_back("nvmlSystemGetDriverVersion: " + api.error(rc));
  }
  if (api.cuda_version) {
    int v = 0;
    if (NvmlReturn rc = api.cuda_version(&v); rc == kSuccess)
      out.cuda = fmt::format("{}.{}", v / 1000, v % 1000 / 10);  // 13000 -> 13.0, as nvidia-smi prints it
    else
      out.errors.push_back("nvmlSystemGetCudaDriverVersion: " + api.error(rc));
  }
}

// One GPU's name, memory and compute capability; each call that fails leaves its part unknown.
NvmlGpu query_device(const Api& api, NvmlDevice h, unsigned index, std::vector<std::string>& errors) {
  NvmlGpu g;
  auto failed = [&](const char* call, NvmlReturn rc) {
    errors.push_back(fmt::format("{} (GPU {}): {}", call, index, api.error(rc)));
  };
  if (api.device_name) {
    char buf[kDeviceNameBufferSize] = {};
    if (NvmlReturn rc = api.device_name(h, buf, sizeof buf); rc == kSuccess)
      g.name = std::string(buf, strnlen(buf, sizeof buf));
    else
      failed("nvmlDeviceGetName", rc);
  }
  if (api.memory_info) {
    NvmlMemory m{};
    if (NvmlReturn rc = api.memory_info(h, &m); rc == kSuccess)
      g.memory_bytes = m.total;
    else
      failed("nvmlDeviceGetMemoryInfo", rc);
  }
  if (api.compute_capability) {
    int major = -1, minor = -1;
    if (NvmlReturn rc = api.compute_capability(h, &major, &minor); rc == kSuccess) {
      g.cc_major = major;
      g.cc_minor = minor;
    } else {
      failed("nvmlDeviceGetCudaComputeCapability", rc);
    }
  }
  return g;
}

// Peer-to-peer read between every pair of GPUs whose handle NVML gave. The failures of the
// query itself are grouped by error, not repeated for each of n(n-1)/2 pairs.
void query_p2p(const Api& api, const std::vector<std::pair<unsigned, NvmlDevice>>& handles, NvmlFacts& out) {
  if (!api.p2p_status || handles.size() < 2) return;
  std::map<std::string, int> failures;
  int pairs = 0;
  for (size_t i = 0; i < handles.size(); ++i)
    for (size_t j = i + 1; j < handles.size(); ++j) {
      ++pairs;
      int status = -1;
      const NvmlReturn rc = api.p2p_status(handles[i].second, handles[j].second, kP2PCapsIndexRead, &status);
      if (rc != kSuccess) {
        ++failures[api.error(rc)];
        continue;
      }
      ++out.p2p_pairs;
      if (status == kP2PStatusOk)
        ++out.p2p_ok;
      else
        out.p2p_without.push_back(
            fmt::format("GPU {}-{}: {}", handles[i].first, handles[j].first, p2p_status_words(status)));
    }
  for (const auto& [what, n] : failures)
    out.errors.push_back(fmt::format("nvmlDeviceGetP2PStatus: {} ({} of {} pairs)", what, n, pairs));
}

void query_devices(const Api& api, NvmlFacts& out) {
  unsigned count = 0;
  if (NvmlReturn rc = api.device_count(&count); rc != kSuccess) {
    out.unavailable = "nvmlDeviceGetCount_v2: " + api.error(rc);
    return;
  }
  std::vector<std::pair<unsigned, NvmlDevice>> handles;
  for (unsigned i = 0; i < count; ++i) {
    NvmlDevice h = nullptr;
    if (NvmlReturn rc = api.device_handle(i, &h); rc != kSuccess) {
      out.errors.push_back(fmt::format("nvmlDeviceGetHandleByIndex_v2 (GPU {}): {}", i, api.error(rc)));
      continue;
    }
    handles.emplace_back(i, h);
    out.gpus.push_back(query_device(api, h, i, out.errors));
  }
  query_p2p(api, handles, out);
}

}  // namespace

NvmlFacts query_nvml(const std::string& library) {
  NvmlFacts out;
  dlerror();
  // Never closed: unloading a driver library that may have started threads is not worth it for
  // a process that asks once.
  void* lib = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* e = dlerror();
    out.unavailable = e ? e : library + ": cannot be loaded";
    return out;
  }
  Api api;
  if (const std::string missing = bind_required(lib, api); !missing.empty()) {
    out.unavailable = fmt::format("{}: no {} in it (not an NVML this doctor knows)", library, missing);
    return out;
  }
  if (NvmlReturn rc = api.init(); rc != kSuccess) {
    out.unavailable = "nvmlInit_v2: " + api.error(rc);
    return out;
  }
  bind_optional(lib, api, library, out.errors);
  query_system(api, out);
  query_devices(api, out);
  if (NvmlReturn rc = api.shutdown(); rc != kSuccess) out.errors.push_back("nvmlShutdown: " + api.error(rc));
  return out;
}

}  // namespace tessera::doctor
