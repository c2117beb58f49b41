// host_memory.h.
#include "backend/host_memory.h"

#include <charconv>
#include <fstream>
#include <sstream>

namespace tessera {

namespace {

// The kB value of `key` in /proc/meminfo's text, in bytes; 0 when absent.
size_t meminfo_bytes(std::string_view text, std::string_view key) {
  size_t at = 0;
  while ((at = text.find(key, at)) != std::string_view::npos) {
    if ((at == 0 || text[at - 1] == '\n') && at + key.size() < text.size() && text[at + key.size()] == ':') {
      std::string_view rest = text.substr(at + key.size() + 1);
      while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
      unsigned long long kib = 0;
      if (std::from_chars(rest.data(), rest.data() + rest.size(), kib).ec == std::errc()) return kib * 1024;
      return 0;
    }
    at += key.size();
  }
  return 0;
}

// A cgroup file's number; false for "max", empty or unreadable text.
bool cgroup_bytes(std::string_view text, size_t* out) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  unsigned long long v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) return false;
  *out = static_cast<size_t>(v);
  return true;
}

std::string read_text(const char* path) {
  std::ifstream f(path);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

}  // namespace

HostMemory host_memory_from(std::string_view meminfo, std::string_view cgroup_max, std::string_view cgroup_current) {
  HostMemory m;
  m.total = meminfo_bytes(meminfo, "MemTotal");
  m.available = meminfo_bytes(meminfo, "MemAvailable");
  if (m.available == 0) m.available = meminfo_bytes(meminfo, "MemFree");  // kernels before 3.14
  size_t limit = 0, current = 0;
  if (cgroup_bytes(cgroup_max, &limit) && (m.total == 0 || limit < m.total)) {
    m.cgroup_limited = true;
    m.total = limit;
    const size_t room = cgroup_bytes(cgroup_current, &current) && current < limit ? limit - current : 0;
    if (room < m.available) m.available = room;
  }
  if (m.available > m.total) m.available = m.total;
  return m;
}

DeviceMemory device_memory(bool integrated, const HostMemorySource& host, const DeviceMemorySource& device) {
  if (!integrated) return device();
  const HostMemory m = host();
  return DeviceMemory{m.available, m.total};
}

HostMemory read_host_memory() {
  return host_memory_from(read_text("/proc/meminfo"), read_text("/sys/fs/cgroup/memory.max"),
                          read_text("/sys/fs/cgroup/memory.current"));
}

}  // namespace tessera
