// This node's facts (no network), and their wire form for the head.
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "distributed/crypto.h"
#include "distributed/nic.h"
#include "distributed/wire.h"
#include "doctor/doctor.h"
#include "doctor/gpus.h"
#include "doctor/internal.h"
#include "doctor/nvml.h"
#include "loader/safetensors.h"

namespace tessera::doctor {

namespace fs = std::filesystem;

std::string gib(uint64_t b) { return fmt::format("{:.2f} GiB", static_cast<double>(b) / 1073741824.0); }

std::string read_line(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  std::getline(in, s);
  return s;
}

std::string node_name(const NodeFacts& f) {
  return f.ip.empty() ? fmt::format("node {}", f.node_rank) : fmt::format("node {} ({})", f.node_rank, f.ip);
}

const InterfaceFacts* find_interface(const NodeFacts& f, const std::string& name) {
  for (const auto& i : f.interfaces)
    if (i.name == name) return &i;
  return nullptr;
}

namespace {

void collect_interfaces(NodeFacts& f) {
  for (const auto& i : dist::list_interfaces()) {
    if (i.is_ipv6 || !i.is_up) continue;
    InterfaceFacts x;
    x.name = i.name;
    x.ip = i.ip;
    const std::string sys = "/sys/class/net/" + i.name + "/";
    try {
      x.mtu = std::stoi(read_line(sys + "mtu"));
    } catch (...) {
    }
    try {
      x.speed_mbps = std::stoll(read_line(sys + "speed"));
    } catch (...) {
    }
    f.interfaces.push_back(x);
  }
}

// SHA-256 of a safetensors file's data section (the header is compared separately).
std::string content_hash(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  uint64_t header = 0;
  in.read(reinterpret_cast<char*>(&header), 8);
  if (!in) fail(ErrorKind::kCorrupt, "{}: too short for a safetensors file", file.string());
  in.seekg(static_cast<std::streamoff>(8 + header));
  dist::Sha256 h;
  std::vector<char> buf(size_t{4} << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    if (in.gcount() > 0) h.update(buf.data(), static_cast<size_t>(in.gcount()));
  }
  auto d = h.finish();
  return dist::to_hex(d);
}

// --verify-weights: every tensor of one safetensors file whose values hold NaN or Inf (read
// through the mapping, on the bits).
void scan_nonfinite(const fs::path& file, NodeFacts& f) {
  const SafetensorsFile st(file.string());
  for (const auto& [name, t] : st.tensors()) {
    ++f.tensors_scanned;
    const size_t esize = dtype_size(t.dtype);
    if (esize == 0 || count_nonfinite_host(st.data(t), t.dtype, t.bytes / esize) == 0) continue;
    if (f.nonfinite_tensors.size() < NodeFacts::kNamedNonFinite)
      f.nonfinite_tensors.push_back(fmt::format("{}: {}", file.filename().string(), name));
    ++f.nonfinite_count;
  }
}

}  // namespace

std::vector<uint8_t> encode_facts(const NodeFacts& f) {
  dist::WireWriter w;
  w.i32(f.node_rank);
  for (const std::string* s : {&f.hostname, &f.version, &f.nic, &f.ip, &f.route_interface, &f.driver, &f.cuda, &f.nccl,
                               &f.p2p, &f.model_error, &f.probe_ip})
    w.str(*s);
  w.u32(static_cast<uint32_t>(f.interfaces.size()));
  for (const auto& i : f.interfaces) {
    w.str(i.name);
    w.str(i.ip);
    w.i32(i.mtu);
    w.i64(i.speed_mbps);
  }
  w.u32(static_cast<uint32_t>(f.gpus.size()));
  for (const auto& g : f.gpus) w.str(g);
  w.u64(f.shm_bytes);
  w.i64(f.memlock_bytes);
  w.u8(f.has_model ? 1 : 0);
  if (f.has_model) dist::encode_fingerprint(w, f.model);
  w.u32(static_cast<uint32_t>(f.content_sha256.size()));
  for (const auto& [name, hash] : f.content_sha256) {
    w.str(name);
    w.str(hash);
  }
  w.u32(static_cast<uint32_t>(f.nonfinite_tensors.size()));
  for (const auto& name : f.nonfinite_tensors) w.str(name);
  w.u64(f.nonfinite_count);
  w.u64(f.tensors_scanned);
  w.u16(f.probe_port);
  return w.take();
}

NodeFacts decode_facts(std::span<const uint8_t> bytes) {
  dist::WireReader r(bytes, "doctor facts");
  NodeFacts f;
  f.node_rank = r.i32();
  for (std::string* s : {&f.hostname, &f.version, &f.nic, &f.ip, &f.route_interface, &f.driver, &f.cuda, &f.nccl,
                         &f.p2p, &f.model_error, &f.probe_ip})
    *s = r.str(4096);
  for (uint32_t n = r.count(16, 4096), i = 0; i < n; ++i) {
    InterfaceFacts x;
    x.name = r.str(256);
    x.ip = r.str(256);
    x.mtu = r.i32();
    x.speed_mbps = r.i64();
    f.interfaces.push_back(x);
  }
  for (uint32_t n = r.count(4, 1024), i = 0; i < n; ++i) f.gpus.push_back(r.str(1024));
  f.shm_bytes = r.u64();
  f.memlock_bytes = r.i64();
  f.has_model = r.u8() != 0;
  if (f.has_model) f.model = dist::decode_fingerprint(r);
  for (uint32_t n = r.count(8, 1 << 16), i = 0; i < n; ++i) {
    std::string name = r.str(4096), hash = r.str(128);
    f.content_sha256.emplace_back(name, hash);
  }
  for (uint32_t n = r.count(4, static_cast<uint32_t>(NodeFacts::kNamedNonFinite)), i = 0; i < n; ++i)
    f.nonfinite_tensors.push_back(r.str(8192));
  f.nonfinite_count = r.u64();
  f.tensors_scanned = r.u64();
  f.probe_port = r.u16();
  r.expect_end();
  return f;
}

NodeFacts collect_local_facts(const DoctorOptions& o) {
  NodeFacts f;
  f.node_rank = o.node_rank;
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  f.hostname = host;
  f.version = dist::this_version();
  // Tests fake a second build with this (docs/plan.md, "doctor"); nothing else reads it.
  if (const char* v = std::getenv("TESSERA_DOCTOR_FAKE_VERSION")) f.version = v;
  // Tests point the GPU query at a fake or a missing NVML with this (tests/doctor/); nothing
  // else reads it.
  const char* nvml = std::getenv("TESSERA_DOCTOR_NVML");
  collect_gpus(f, nvml && *nvml ? nvml : kNvmlLibrary);
  struct statvfs sv {};
  if (statvfs("/dev/shm", &sv) == 0) f.shm_bytes = static_cast<uint64_t>(sv.f_blocks) * sv.f_frsize;
  struct rlimit rl {};
  if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0)
    f.memlock_bytes = rl.rlim_cur == RLIM_INFINITY ? -1 : static_cast<int64_t>(rl.rlim_cur);
  collect_interfaces(f);
  if (!o.model_dir.empty()) {
    try {
      f.model = dist::compute_fingerprint(o.model_dir);
      f.has_model = true;
      if (o.verify_weights)
        for (const auto& s : f.model.shards) {
          f.content_sha256.emplace_back(s.name, content_hash(fs::path(o.model_dir) / s.name));
          scan_nonfinite(fs::path(o.model_dir) / s.name, f);
        }
    } catch (const Error& e) {
      f.model_error = e.what();
    }
  }
  return f;
}

}  // namespace tessera::doctor
