// The host's memory as the kernel reports it: what the CPU backend sizes itself by, and what a
// GPU that shares the host's memory (DGX Spark's GB10, Jetson: integrated in the CUDA backend's
// architecture record) sizes its cache by, since cudaMemGetInfo there counts the page cache that
// the kernel would give back as used.
#pragma once
#include <cstddef>
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

}  // namespace tessera
