// Helpers shared by the distributed tests: fake model directories, free ports, and the
// rank-process check macro.
#pragma once
#include <unistd.h>

#include <fmt/format.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "distributed/socket.h"

// In a forked rank's body (a function returning the rank's exit status): on failure, print
// the condition and a formatted message, and exit the body with status 3.
#define RANK_CHECK(cond, ...)                                                                       \
  do {                                                                                              \
    if (!(cond)) {                                                                                  \
      std::fprintf(stderr, "rank check failed: %s: %s\n", #cond, fmt::format(__VA_ARGS__).c_str()); \
      return 3;                                                                                     \
    }                                                                                               \
  } while (0)

namespace tessera::dist::testing {

// A directory with config.json and `shards` tiny safetensors files, removed on destruction.
class FakeModelDir {
 public:
  explicit FakeModelDir(int shards = 2, const std::string& tag = "m") {
    path_ = std::filesystem::temp_directory_path() /
            ("tessera_dist_" + tag + "_" + std::to_string(getpid()) + "_" + std::to_string(counter()++));
    std::filesystem::create_directories(path_);
    std::ofstream(path_ / "config.json") << R"({"architectures": ["LlamaForCausalLM"], "torch_dtype": "bfloat16"})";
    for (int i = 1; i <= shards; ++i) write_shard(name(i, shards), 64 * i);
  }
  ~FakeModelDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  static std::string name(int i, int n) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "model-%05d-of-%05d.safetensors", i, n);
    return buf;
  }
  // A safetensors file: 8-byte header length, JSON header, `data_bytes` of zeros.
  void write_shard(const std::string& file, size_t data_bytes, const std::string& tensor = "w") {
    std::string header = R"({"__metadata__":{"format":"pt"},")" + tensor + R"(":{"dtype":"BF16","shape":[)" +
                         std::to_string(data_bytes / 2) + R"(],"data_offsets":[0,)" + std::to_string(data_bytes) +
                         "]}}";
    std::ofstream out(path_ / file, std::ios::binary | std::ios::trunc);
    uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>(n >> (8 * i)));
    out << header << std::string(data_bytes, '\0');
  }
  std::string path() const { return path_.string(); }

 private:
  static int& counter() {
    static int c = 0;
    return c;
  }
  std::filesystem::path path_;
};

// A port that was free a moment ago (bind to 0, read, close).
inline uint16_t free_port() {
  Socket s = listen_tcp("127.0.0.1", 0);
  return local_port(s);
}

}  // namespace tessera::dist::testing
