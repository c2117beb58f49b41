// The host's memory as the kernel reports it: what the CPU backend sizes itself by, and what a
// GPU that shares the host's memory (DGX Spark's GB10, Jetson: integrated in the CUDA backend's
// architecture record) sizes its cache by, since cudaMemGetInfo there counts the page cache that
// the kernel would give back as used.
#pragma once
#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

namespace tessera {

struct HostMemory {
  size_t total = 0;      // MemTotal, or the cgroup's memory.max where that is lower
  size_t available = 0;  // MemAvailable (free pages plus reclaimable page cache), within the cgroup's room
  bool cgroup_limited = false;
};

// From the texts of /proc/meminfo and the cgroup v2 files memory.max and memory.current ("" where
// absent; memory.max "max" means no limit).
HostMemory host_memory_from(std::string_view meminfo, std::string_view cgroup_max, std::string_view cgroup_current);
// This process's: /proc/meminfo and /sys/fs/cgroup/memory.{max,current}.
HostMemory read_host_memory();

// What a GPU sizes its cache by (Backend::free_memory / total_memory). An integrated GPU (one that
// shares the host's memory: CudaArch::integrated) takes the host's figures, MemAvailable as free
// and the total within the cgroup, from `host`; a discrete GPU its own (cudaMemGetInfo), from
// `device`. Only the source the rule picks is called. The CUDA backend passes read_host_memory
// and cudaMemGetInfo; tests pass fixed figures.
struct DeviceMemory {
  size_t free = 0, total = 0;
};
using HostMemorySource = std::function<HostMemory()>;
using DeviceMemorySource = std::function<DeviceMemory()>;
DeviceMemory device_memory(bool integrated, const HostMemorySource& host, const DeviceMemorySource& device);

}  // namespace tessera
