#include "doctor/gpus.h"

#include <fmt/format.h>

#include <cctype>
#include <filesystem>
#include <sstream>

#include "doctor/internal.h"
#include "doctor/nvml.h"

namespace tessera::doctor {

namespace {

constexpr const char* kProcVersion = "/proc/driver/nvidia/version";

// The kernel module's driver, and what reading it found, for the "tried" text.
std::string driver_from_kernel_module(NodeFacts& f) {
  if (!std::filesystem::exists(kProcVersion))
    return fmt::format("{}: absent (no NVIDIA kernel module loaded)", kProcVersion);
  const std::string driver = driver_from_proc_version(read_line(kProcVersion));
  if (driver.empty()) return fmt::format("{}: no driver version in it", kProcVersion);
  if (f.driver.empty()) f.driver = driver;
  return fmt::format("{}: kernel module of driver {} loaded", kProcVersion, driver);
}

std::string gpu_line(const NvmlGpu& g, size_t index) {
  const std::string name = g.name.empty() ? fmt::format("GPU {} (name unknown)", index) : g.name;
  return g.memory_bytes == 0 ? name : fmt::format("{}, {} MiB", name, g.memory_bytes >> 20);
}

// "1 pairs with P2P, 0 without", then the pairs without and why, and the pairs NVML did not answer for.
std::string p2p_line(const NvmlFacts& n) {
  const int pairs = static_cast<int>(n.gpus.size() * (n.gpus.size() - 1) / 2);
  std::string s = fmt::format("{} pairs with P2P, {} without", n.p2p_ok, n.p2p_pairs - n.p2p_ok);
  if (!n.p2p_without.empty()) s += fmt::format(" ({})", fmt::join(n.p2p_without, "; "));
  if (n.p2p_pairs < pairs) s += fmt::format(", {} unknown (the query failed)", pairs - n.p2p_pairs);
  return s;
}

}  // namespace

std::string driver_from_proc_version(const std::string& line) {
  const size_t p = line.find("Kernel Module");
  if (p == std::string::npos) return "";
  std::istringstream words(line.substr(p + 13));
  for (std::string w; words >> w;)
    if (std::isdigit(static_cast<unsigned char>(w[0]))) return w;
  return "";
}

void collect_gpus(NodeFacts& f, const std::string& nvml_library) {
  const NvmlFacts n = query_nvml(nvml_library);
  f.nvml_errors = n.errors;
  f.driver = n.driver;
  f.cuda = n.cuda;
  for (size_t i = 0; i < n.gpus.size(); ++i) {
    f.gpus.push_back(gpu_line(n.gpus[i], i));
    if (n.gpus[i].cc_major >= 0) f.compute_caps.emplace_back(n.gpus[i].cc_major, n.gpus[i].cc_minor);
  }
  if (f.gpus.size() > 1) f.p2p = p2p_line(n);
  if (!n.unavailable.empty()) {
    f.gpu_query = fmt::format("NVML: {}; {}", n.unavailable, driver_from_kernel_module(f));
  } else {
    if (f.driver.empty()) driver_from_kernel_module(f);  // NVML did not say which driver
    if (f.gpus.empty())
      f.gpu_query = fmt::format("NVML: driver {}, {} GPU(s)", f.driver.empty() ? "?" : f.driver, n.gpus.size());
  }
}

}  // namespace tessera::doctor
