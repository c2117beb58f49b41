#include "distributed/fingerprint.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/version.h"
#include "distributed/crypto.h"

namespace tessera::dist {

namespace fs = std::filesystem;

namespace {

// Safetensors headers are JSON; 100 MB is far above any real one and bounds what a
// corrupt length field can make us read.
constexpr uint64_t kMaxSafetensorsHeader = 100ull << 20;

std::string hash_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ErrorKind::kNotFound, "cannot read {}", path.string());
  Sha256 h;
  std::vector<char> buf(1 << 16);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    h.update(buf.data(), static_cast<size_t>(in.gcount()));
  }
  return to_hex(h.finish());
}

ShardFingerprint fingerprint_shard(const fs::path& path) {
  ShardFingerprint s;
  s.name = path.filename().string();
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) fail(ErrorKind::kNotFound, "cannot stat {}", path.string());
  s.size = static_cast<uint64_t>(st.st_size);
  std::ifstream in(path, std::ios::binary);
  uint8_t len_bytes[8];
  if (!in.read(reinterpret_cast<char*>(len_bytes), 8))
    fail(ErrorKind::kCorrupt, "{} is shorter than a safetensors header (8 bytes)", path.string());
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= uint64_t(len_bytes[i]) << (8 * i);
  if (header_len > kMaxSafetensorsHeader || header_len > s.size - 8)
    fail(ErrorKind::kCorrupt, "{} claims a {}-byte header in a {}-byte file; the file is truncated or not safetensors",
         path.string(), header_len, s.size);
  std::string header(header_len, '\0');
  if (!in.read(header.data(), static_cast<std::streamsize>(header_len)))
    fail(ErrorKind::kCorrupt, "{}: header cut short", path.string());
  Sha256 h;
  h.update(len_bytes, 8);
  h.update(header.data(), header.size());
  s.header_sha256 = to_hex(h.finish());
  return s;
}

std::string node_label(const NodeFingerprint& node, int node_rank) {
  return node.ip.empty() ? fmt::format("node {}", node_rank) : fmt::format("node {} ({})", node_rank, node.ip);
}

}  // namespace

std::string this_version() { return fmt::format("{} ({})", TESSERA_VERSION_STRING, TESSERA_GIT_COMMIT); }

std::string human_bytes(uint64_t n) {
  if (n >= 1000ull * 1000 * 1000) return fmt::format("{:.1f} GB", n / 1e9);
  if (n >= 1000ull * 1000) return fmt::format("{:.1f} MB", n / 1e6);
  if (n >= 1000ull) return fmt::format("{:.1f} kB", n / 1e3);
  return fmt::format("{} bytes", n);
}

NodeFingerprint compute_fingerprint(const std::string& model_dir) {
  NodeFingerprint f;
  f.version = this_version();
  fs::path dir(model_dir);
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) fail(ErrorKind::kNotFound, "model directory {} does not exist", model_dir);
  fs::path config = dir / "config.json";
  if (fs::exists(config, ec)) {
    f.config_sha256 = hash_file(config);
    std::ifstream in(config);
    nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (j.is_object()) {
      for (const char* key : {"torch_dtype", "dtype"})
        if (j.contains(key) && j[key].is_string()) f.dtype = j[key].get<std::string>();
    }
  }
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    if (e.is_regular_file() && e.path().extension() == ".safetensors") f.shards.push_back(fingerprint_shard(e.path()));
  }
  std::sort(f.shards.begin(), f.shards.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  return f;
}

std::optional<std::string> fingerprint_mismatch(const NodeFingerprint& head, const NodeFingerprint& node,
                                                int node_rank) {
  std::string who = node_label(node, node_rank);
  if (head.version != node.version)
    return fmt::format("{}: runs tessera {} but the head runs {}; install the same version on every node", who,
                       node.version, head.version);
  if (head.config_sha256 != node.config_sha256)
    return fmt::format("{}: config.json differs from the head's (sha256 {} vs {}); copy the same model to every node",
                       who, node.config_sha256.substr(0, 12), head.config_sha256.substr(0, 12));
  if (head.dtype != node.dtype)
    return fmt::format("{}: dtype {} differs from the head's {}", who, node.dtype, head.dtype);
  std::map<std::string, const ShardFingerprint*> theirs;
  for (const ShardFingerprint& s : node.shards) theirs[s.name] = &s;
  for (const ShardFingerprint& mine : head.shards) {
    auto it = theirs.find(mine.name);
    if (it == theirs.end()) return fmt::format("{}: {} is missing (the head has it)", who, mine.name);
    const ShardFingerprint& other = *it->second;
    if (other.size != mine.size)
      return fmt::format("{}: {} differs from the head's (size {} vs {})", who, mine.name, human_bytes(other.size),
                         human_bytes(mine.size));
    if (other.header_sha256 != mine.header_sha256)
      return fmt::format("{}: {} differs from the head's (same size, different header: sha256 {} vs {})", who,
                         mine.name, other.header_sha256.substr(0, 12), mine.header_sha256.substr(0, 12));
    theirs.erase(it);
  }
  if (!theirs.empty())
    return fmt::format("{}: has {} which the head does not; copy the same model to every node", who,
                       theirs.begin()->first);
  return std::nullopt;
}

void encode_fingerprint(WireWriter& w, const NodeFingerprint& f) {
  w.str(f.version);
  w.str(f.config_sha256);
  w.u32(static_cast<uint32_t>(f.shards.size()));
  for (const ShardFingerprint& s : f.shards) {
    w.str(s.name);
    w.u64(s.size);
    w.str(s.header_sha256);
  }
  w.str(f.dtype);
  w.u32(static_cast<uint32_t>(f.gpus.size()));
  for (const std::string& g : f.gpus) w.str(g);
  w.i32(f.num_ranks);
  w.str(f.hostname);
  w.str(f.nic);
  w.str(f.ip);
}

NodeFingerprint decode_fingerprint(WireReader& r) {
  NodeFingerprint f;
  f.version = r.str(256);
  f.config_sha256 = r.str(64);
  uint32_t n = r.count(/*min item*/ 16, 100000);
  for (uint32_t i = 0; i < n; ++i) {
    ShardFingerprint s;
    s.name = r.str(4096);
    s.size = r.u64();
    s.header_sha256 = r.str(64);
    f.shards.push_back(std::move(s));
  }
  f.dtype = r.str(64);
  uint32_t g = r.count(4, 1024);
  for (uint32_t i = 0; i < g; ++i) f.gpus.push_back(r.str(256));
  f.num_ranks = r.i32();
  if (f.num_ranks < 1 || f.num_ranks > 4096) fail(ErrorKind::kCorrupt, "fingerprint: {} ranks", f.num_ranks);
  f.hostname = r.str(256);
  f.nic = r.str(64);
  f.ip = r.str(64);
  return f;
}

}  // namespace tessera::dist
