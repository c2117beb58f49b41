// The host's memory as integrated GPUs size their cache by: MemAvailable, within a cgroup's room.
#include <gtest/gtest.h>

#include "backend/host_memory.h"

namespace tessera {
namespace {

constexpr const char* kSpark =
    "MemTotal:       124918708 kB\nMemFree:         3021300 kB\nMemAvailable:   101232496 kB\n"
    "Buffers:          100212 kB\nCached:         96351200 kB\n";

TEST(HostMemory, AvailableCountsReclaimablePageCache) {
  const HostMemory m = host_memory_from(kSpark, "", "");
  EXPECT_EQ(m.total, 124918708ull * 1024);
  EXPECT_EQ(m.available, 101232496ull * 1024) << "MemAvailable, not MemFree";
  EXPECT_FALSE(m.cgroup_limited);
}

TEST(HostMemory, CgroupLimitCapsTotalAndAvailable) {
  const HostMemory m = host_memory_from(kSpark, "68719476736\n", "17179869184\n");  // 64 GiB max, 16 GiB used
  EXPECT_TRUE(m.cgroup_limited);
  EXPECT_EQ(m.total, size_t{64} << 30);
  EXPECT_EQ(m.available, size_t{48} << 30);
  EXPECT_FALSE(host_memory_from(kSpark, "max\n", "17179869184\n").cgroup_limited);
  EXPECT_EQ(host_memory_from(kSpark, "max\n", "").available, 101232496ull * 1024);
}

TEST(HostMemory, OldKernelsAndBadTextDoNotCrash) {
  EXPECT_EQ(host_memory_from("MemTotal: 1000 kB\nMemFree: 400 kB\n", "", "").available, 400u * 1024);
  const HostMemory junk = host_memory_from("garbage\nMemTotal:\n", "x", "y");
  EXPECT_EQ(junk.total, 0u);
  EXPECT_EQ(junk.available, 0u);
  EXPECT_GT(read_host_memory().total, 0u);
}

}  // namespace
}  // namespace tessera
