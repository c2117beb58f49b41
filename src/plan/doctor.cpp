#include "plan/doctor.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "backend/devices.h"
#include "core/error.h"
#include "core/tensor.h"
#include "dist/control_store.h"
#include "dist/crypto.h"
#include "dist/gloo_communicator.h"
#include "dist/nic.h"
#include "dist/rendezvous_client.h"
#include "dist/rendezvous_server.h"
#include "dist/socket.h"
#include "dist/wire.h"
#include "loader/safetensors.h"

namespace tessera::doctor {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

const char* status_mark(Status s) {
  switch (s) {
    case Status::kOk:
      return "\u2713";
    case Status::kWarn:
      return "!";
    case Status::kFail:
      return "\u2717";
    case Status::kInfo:
      break;
  }
  return "\u00b7";
}

bool Report::ok() const {
  return std::none_of(checks.begin(), checks.end(), [](const Check& c) { return c.status == Status::kFail; });
}

namespace {

std::string gib(uint64_t b) { return fmt::format("{:.2f} GiB", static_cast<double>(b) / 1073741824.0); }

// stdout of a short command (empty when it fails or is missing); `timeout` bounds it.
std::string run_command(const std::string& cmd) {
  std::string out;
  FILE* p = popen(("timeout 10 " + cmd + " 2>/dev/null").c_str(), "r");
  if (!p) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  if (pclose(p) != 0) return {};
  return out;
}

std::string read_line(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  std::getline(in, s);
  return s;
}

std::string trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  return s.substr(i);
}

void collect_gpus(NodeFacts& f) {
  // compute_cap needs a driver of 2021 or later; older ones refuse the whole query. The fallback
  // repeats name in its place, so its lines parse alike (with no compute capability).
  std::string q =
      run_command("nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader");
  if (q.find("MiB") == std::string::npos)
    q = run_command("nvidia-smi --query-gpu=name,memory.total,driver_version,name --format=csv,noheader");
  std::istringstream in(q);
  for (std::string line; std::getline(in, line);) {
    line = trim(line);
    if (line.empty()) continue;
    const size_t cap = line.rfind(','), last = cap == std::string::npos ? cap : line.rfind(',', cap - 1);
    if (last != std::string::npos) {
      f.driver = trim(line.substr(last + 1, cap - last - 1));
      f.gpus.push_back(trim(line.substr(0, last)));
      int major = 0, minor = 0;
      if (std::sscanf(trim(line.substr(cap + 1)).c_str(), "%d.%d", &major, &minor) == 2)
        f.compute_caps.emplace_back(major, minor);
    }
  }
  if (f.driver.empty()) {  // no nvidia-smi: the kernel module says which driver is loaded
    std::string v = read_line("/proc/driver/nvidia/version");
    if (auto p = v.find("Kernel Module"); p != std::string::npos) f.driver = trim(v.substr(p + 13, 12));
  }
  if (!f.gpus.empty()) {
    std::string smi = run_command("nvidia-smi");
    if (auto p = smi.find("CUDA Version:"); p != std::string::npos) {
      std::istringstream s(smi.substr(p + 13));
      s >> f.cuda;
    }
    if (f.gpus.size() > 1) {
      // Peer-to-peer read capability between every pair (OK / NS / CNS...).
      std::string topo = run_command("nvidia-smi topo -p2p r");
      int ok = 0, bad = 0;
      std::istringstream t(topo);
      for (std::string line; std::getline(t, line);) {
        if (line.rfind("GPU", 0) != 0 || line.find("GPU", 3) == std::string::npos) {
          std::istringstream w(line);
          std::string cell;
          w >> cell;
          if (cell.rfind("GPU", 0) != 0) continue;
          while (w >> cell) {
            if (cell == "OK")
              ++ok;
            else if (cell != "X")
              ++bad;
          }
        }
      }
      f.p2p = topo.empty() ? "unknown" : fmt::format("{} pairs with P2P, {} without", ok / 2, bad / 2);
    }
  }
}

void collect_interfaces(NodeFacts& f) {
  std::set<std::string> seen;
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

const InterfaceFacts* find_interface(const NodeFacts& f, const std::string& name) {
  for (const auto& i : f.interfaces)
    if (i.name == name) return &i;
  return nullptr;
}

std::string node_name(const NodeFacts& f) {
  return f.ip.empty() ? fmt::format("node {}", f.node_rank) : fmt::format("node {} ({})", f.node_rank, f.ip);
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
  collect_gpus(f);
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

// Whether this binary's CUDA code runs on each GPU of the node: a cubin, PTX the driver compiles
// at first start, or nothing (a named failure that says how to rebuild).
Check kernel_check(const std::string& who, const std::vector<std::pair<int, int>>& caps) {
  const std::string_view archs = cuda_built_architectures();
  if (archs.empty())
    return {who, "CUDA kernels", Status::kWarn, "this tessera build has no CUDA backend",
            "build the CUDA backend (scripts/setup.sh --cuda) to use the GPUs"};
  Status worst = Status::kOk;
  std::string list, fix;
  for (const auto& [major, minor] : caps) {
    const CudaBinaryMatch m = cuda_binary_support(archs, major, minor);
    const std::string what = m.support == CudaBinarySupport::kNone ? "no code" : m.detail;
    if (list.find(what) == std::string::npos)
      list += fmt::format("{}{}.{}: {}", list.empty() ? "" : "; ", major, minor, what);
    if (m.support == CudaBinarySupport::kJit && worst == Status::kOk) worst = Status::kWarn;
    if (m.support == CudaBinarySupport::kNone) {
      worst = Status::kFail;
      fix = fmt::format("rebuild with -DCMAKE_CUDA_ARCHITECTURES including {}{}-real", major * 10 + minor,
                        major >= 9 ? "a" : "");
    }
  }
  return {who, "CUDA kernels", worst, fmt::format("{} (this build: {})", list, describe_cuda_architectures(archs)),
          fix.empty() && worst == Status::kWarn ? "the first start compiles the PTX (minutes); a build with a cubin "
                                                  "for this GPU starts at once"
                                                : fix};
}

std::vector<Check> local_checks(const NodeFacts& f, const DoctorOptions& o) {
  std::vector<Check> c;
  const std::string who = node_name(f);
  c.push_back({who, "tessera", Status::kInfo, fmt::format("{} on {}", f.version, f.hostname), ""});
  if (f.gpus.empty()) {
    c.push_back({who, "GPUs", Status::kInfo, "no NVIDIA GPU visible (nvidia-smi missing or failed): CPU backend", ""});
  } else {
    std::map<std::string, int> kinds;
    for (const auto& g : f.gpus) ++kinds[g];
    std::string list;
    for (const auto& [k, n] : kinds) list += (list.empty() ? "" : "; ") + fmt::format("{} x {}", n, k);
    c.push_back(
        {who, "GPUs", Status::kOk,
         fmt::format("{}; driver {}, CUDA {}", list, f.driver.empty() ? "?" : f.driver, f.cuda.empty() ? "?" : f.cuda),
         ""});
    if (!f.compute_caps.empty()) c.push_back(kernel_check(who, f.compute_caps));
    if (!f.p2p.empty())
      c.push_back({who, "P2P between GPUs", f.p2p.find(" 0 without") != std::string::npos ? Status::kOk : Status::kWarn,
                   f.p2p,
                   "GPUs without peer access send tensor-parallel traffic through host memory: keep a TP group on "
                   "GPUs with P2P (nvidia-smi topo -m), or check the BIOS's IOMMU/ACS settings"});
  }
  const bool shm_ok = f.shm_bytes >= o.min_shm_bytes;
  c.push_back({who, "/dev/shm", shm_ok ? Status::kOk : Status::kFail,
               fmt::format("{} (at least {} wanted: NCCL and the CPU ranks share memory through it)", gib(f.shm_bytes),
                           gib(o.min_shm_bytes)),
               shm_ok ? ""
                      : "give the container more shared memory (docker run --shm-size=16g; compose: shm_size: 16G) "
                        "or remount it: mount -o remount,size=16G /dev/shm"});
  const bool lock_ok = f.memlock_bytes < 0 || f.memlock_bytes >= (int64_t{64} << 20);
  c.push_back(
      {who, "memlock limit", lock_ok ? Status::kOk : Status::kWarn,
       f.memlock_bytes < 0 ? "unlimited" : fmt::format("{} KiB", f.memlock_bytes / 1024),
       lock_ok ? "" : "NCCL over InfiniBand/RoCE pins memory: ulimit -l unlimited (docker: --ulimit memlock=-1)"});
  for (const auto& i : f.interfaces) {
    const bool chosen = i.name == f.nic;
    std::string d = fmt::format("{} mtu {}, {}{}", i.ip, i.mtu,
                                i.speed_mbps > 0 ? fmt::format("{} Mb/s", i.speed_mbps) : std::string("speed unknown"),
                                chosen ? " (chosen)" : "");
    if (i.name == f.route_interface) d += ", routes to the head";
    c.push_back({who, "NIC " + i.name, Status::kInfo, d, ""});
  }
  if (!f.nic.empty() && !f.route_interface.empty() && f.nic != f.route_interface && f.route_interface != "lo") {
    c.push_back({who, "NIC choice", Status::kFail,
                 fmt::format("the chosen NIC is {} ({}), but the kernel routes to the head through {}", f.nic, f.ip,
                             f.route_interface),
                 fmt::format("use --nic ={} (or leave --nic out: the NIC that routes to --master-addr is chosen), and "
                             "set NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME to it if you set them",
                             f.route_interface)});
  } else if (!f.nic.empty()) {
    const InterfaceFacts* i = find_interface(f, f.nic);
    const bool slow = i && i->speed_mbps > 0 && i->speed_mbps < o.min_bandwidth_gbps * 1000;
    c.push_back(
        {who, "NIC choice", slow ? Status::kWarn : Status::kOk,
         fmt::format("{} ({}){}", f.nic, f.ip, i && i->speed_mbps > 0 ? fmt::format(", {} Mb/s", i->speed_mbps) : ""),
         slow ? fmt::format("the link is slower than {} Gb/s: tensor parallelism across nodes will crawl; use "
                            "the fast NIC (--nic) or keep TP inside nodes and use PP across them",
                            o.min_bandwidth_gbps)
              : ""});
  }
  if (!o.model_dir.empty()) {
    if (!f.model_error.empty())
      c.push_back({who, "model files", Status::kFail, f.model_error, "copy the model to this path on every node"});
    else
      c.push_back({who, "model files", Status::kOk,
                   fmt::format("config.json and {} safetensors file(s){}", f.model.shards.size(),
                               o.verify_weights ? ", contents hashed"
                                                : " (headers hashed; --verify-weights hashes the "
                                                  "tensor data too)"),
                   ""});
    if (f.model_error.empty() && o.verify_weights) {
      if (f.nonfinite_count == 0)
        c.push_back({who, "weight values", Status::kOk,
                     fmt::format("no NaN or Inf in the {} tensors of the safetensors files", f.tensors_scanned), ""});
      else
        c.push_back({who, "weight values", Status::kFail,
                     fmt::format("NaN or Inf in {} of {} tensors: {}{}", f.nonfinite_count, f.tensors_scanned,
                                 fmt::join(f.nonfinite_tensors, ", "),
                                 f.nonfinite_count > f.nonfinite_tensors.size()
                                     ? fmt::format(" (and {} more)", f.nonfinite_count - f.nonfinite_tensors.size())
                                     : ""),
                     "the checkpoint is damaged (an interrupted download, a broken conversion or fine-tune): "
                     "download or convert it again; such weights give NaN logits and no usable output"});
    }
  }
  return c;
}

std::vector<Check> compare_nodes(const std::vector<NodeFacts>& nodes) {
  std::vector<Check> c;
  if (nodes.size() < 2) return c;
  const NodeFacts& head = nodes.front();
  auto same = [&](const char* what, auto get, const char* fix) {
    std::vector<std::string> diffs;
    for (size_t i = 1; i < nodes.size(); ++i)
      if (get(nodes[i]) != get(head))
        diffs.push_back(fmt::format("{} has {}, the head {}", node_name(nodes[i]),
                                    get(nodes[i]).empty() ? "none" : get(nodes[i]),
                                    get(head).empty() ? "none" : get(head)));
    if (diffs.empty())
      c.push_back({"", what, Status::kOk, fmt::format("{} on every node", get(head).empty() ? "none" : get(head)), ""});
    else
      c.push_back({"", what, Status::kFail, fmt::format("{}", fmt::join(diffs, "; ")), fix});
  };
  same(
      "tessera version", [](const NodeFacts& f) { return f.version; },
      "install the same tessera build on every node (tessera version prints it)");
  same(
      "GPU driver", [](const NodeFacts& f) { return f.driver; }, "install the same NVIDIA driver on every node");
  same(
      "CUDA", [](const NodeFacts& f) { return f.cuda; }, "install the same CUDA version on every node");
  // MTU of the chosen NICs.
  std::vector<std::string> mtus;
  std::set<int> distinct;
  for (const auto& n : nodes) {
    const InterfaceFacts* i = find_interface(n, n.nic);
    int m = i ? i->mtu : 0;
    distinct.insert(m);
    mtus.push_back(fmt::format("{} {} {}", node_name(n), n.nic, m));
  }
  if (distinct.size() == 1)
    c.push_back({"", "MTU", Status::kOk, fmt::format("{} on every chosen NIC", *distinct.begin()), ""});
  else
    c.push_back({"", "MTU", Status::kFail, fmt::format("differs: {}", fmt::join(mtus, ", ")),
                 fmt::format("set one MTU on every node's NIC and the switch (ip link set dev {} mtu {}); mismatched "
                             "MTUs drop large packets and stall NCCL",
                             nodes.back().nic, *distinct.begin())});
  // Model files.
  if (head.has_model) {
    std::vector<std::string> diffs;
    for (size_t i = 1; i < nodes.size(); ++i) {
      const NodeFacts& n = nodes[i];
      if (!n.has_model) {
        diffs.push_back(fmt::format("{}: {}", node_name(n), n.model_error.empty() ? "no model" : n.model_error));
        continue;
      }
      dist::NodeFingerprint a = head.model, b = n.model;
      b.version = a.version;  // compared above
      if (auto m = dist::fingerprint_mismatch(a, b, n.node_rank)) {
        diffs.push_back(*m);
        continue;
      }
      std::map<std::string, std::string> theirs(n.content_sha256.begin(), n.content_sha256.end());
      for (const auto& [file, hash] : head.content_sha256)
        if (auto it = theirs.find(file); it != theirs.end() && it->second != hash)
          diffs.push_back(
              fmt::format("{}: {} has the same header but different tensor data (sha256 {} vs the head's {})",
                          node_name(n), file, it->second.substr(0, 12), hash.substr(0, 12)));
    }
    const bool hashed = !head.content_sha256.empty();
    if (diffs.empty())
      c.push_back({"", "model files", Status::kOk,
                   fmt::format("identical on every node ({}{})", hashed ? "contents" : "config and headers",
                               hashed ? " hashed" : "; --verify-weights also hashes the tensor data"),
                   ""});
    else
      c.push_back({"", "model files", Status::kFail, fmt::format("{}", fmt::join(diffs, "; ")),
                   "copy the head's model directory to the others (rsync -a --checksum HEAD:DIR/ DIR/)"});
  }
  return c;
}

// ---------------------------------------------------------------- the cluster part

namespace {

// Answers probes: 'P' echoes one byte; 'B' + u64 n reads n bytes then answers 'K'.
class ProbeServer {
 public:
  explicit ProbeServer(const std::string& ip) : listener_(dist::listen_tcp(ip, 0)), port_(dist::local_port(listener_)) {
    thread_ = std::thread([this] { loop(); });
  }
  ~ProbeServer() {
    stop_ = true;
    listener_.shutdown();
    thread_.join();
    for (auto& t : conns_) t.join();
  }
  uint16_t port() const { return port_; }

 private:
  void loop() {
    while (!stop_) {
      if (!dist::wait_readable(listener_, 100ms)) continue;
      try {
        dist::Socket s = dist::accept_tcp(listener_, dist::deadline_after(1s));
        conns_.emplace_back([this, sock = std::make_shared<dist::Socket>(std::move(s))] { serve(*sock); });
      } catch (const Error&) {
      }
    }
  }
  void serve(const dist::Socket& s) {
    std::vector<char> buf(size_t{1} << 20);
    try {
      for (;;) {
        char op = 0;
        if (!dist::read_exact(s, &op, 1, dist::deadline_after(30s))) return;
        if (op == 'P') {
          dist::write_all(s, &op, 1, dist::deadline_after(5s));
        } else if (op == 'B') {
          uint64_t n = 0;
          if (!dist::read_exact(s, &n, 8, dist::deadline_after(5s))) return;
          while (n > 0) {
            size_t k = static_cast<size_t>(std::min<uint64_t>(n, buf.size()));
            if (!dist::read_exact(s, buf.data(), k, dist::deadline_after(30s))) return;
            n -= k;
          }
          char ok = 'K';
          dist::write_all(s, &ok, 1, dist::deadline_after(5s));
        } else {
          return;
        }
      }
    } catch (const Error&) {
    }
  }
  dist::Socket listener_;
  uint16_t port_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::vector<std::thread> conns_;
};

struct PairResult {
  int from = 0, to = 0;
  bool reachable = false;
  std::string error;
  double rtt_ms = -1, gbps = -1;
};

PairResult probe(const NodeFacts& me, const NodeFacts& peer, const DoctorOptions& o) {
  PairResult r;
  r.from = me.node_rank;
  r.to = peer.node_rank;
  try {
    dist::Socket s = dist::connect_tcp(peer.probe_ip, peer.probe_port, dist::deadline_after(o.probe_timeout), me.ip);
    r.reachable = true;
    std::vector<double> rtts;
    for (int i = 0; i < 20; ++i) {
      auto t0 = dist::Clock::now();
      char op = 'P';
      dist::write_all(s, &op, 1, dist::deadline_after(o.probe_timeout));
      if (!dist::read_exact(s, &op, 1, dist::deadline_after(o.probe_timeout)))
        fail(ErrorKind::kNetwork, "the peer closed the connection");
      rtts.push_back(std::chrono::duration<double, std::milli>(dist::Clock::now() - t0).count());
    }
    std::sort(rtts.begin(), rtts.end());
    r.rtt_ms = rtts[rtts.size() / 2];
    std::vector<char> buf(size_t{1} << 20, 'x');
    uint64_t n = o.stream_bytes;
    auto t0 = dist::Clock::now();
    char op = 'B';
    dist::write_all(s, &op, 1, dist::deadline_after(o.probe_timeout));
    dist::write_all(s, &n, 8, dist::deadline_after(o.probe_timeout));
    for (uint64_t left = n; left > 0;) {
      size_t k = static_cast<size_t>(std::min<uint64_t>(left, buf.size()));
      dist::write_all(s, buf.data(), k, dist::deadline_after(30s));
      left -= k;
    }
    if (!dist::read_exact(s, &op, 1, dist::deadline_after(30s))) fail(ErrorKind::kNetwork, "no answer to the stream");
    const double secs = std::chrono::duration<double>(dist::Clock::now() - t0).count();
    r.gbps = static_cast<double>(n) * 8 / secs / 1e9;
    op = 'Q';
    dist::write_all(s, &op, 1, dist::deadline_after(1s));
  } catch (const Error& e) {
    r.error = e.what();
  }
  return r;
}

std::vector<uint8_t> encode_pairs(const std::vector<PairResult>& v, double allreduce_gbps,
                                  const std::string& ar_error) {
  dist::WireWriter w;
  w.u32(static_cast<uint32_t>(v.size()));
  for (const auto& p : v) {
    w.i32(p.from);
    w.i32(p.to);
    w.u8(p.reachable);
    w.str(p.error);
    w.i64(static_cast<int64_t>(p.rtt_ms * 1e6));
    w.i64(static_cast<int64_t>(p.gbps * 1e6));
  }
  w.i64(static_cast<int64_t>(allreduce_gbps * 1e6));
  w.str(ar_error);
  return w.take();
}

std::vector<PairResult> decode_pairs(std::span<const uint8_t> b, double* allreduce_gbps, std::string* ar_error) {
  dist::WireReader r(b, "doctor probes");
  std::vector<PairResult> v;
  for (uint32_t n = r.count(29, 4096), i = 0; i < n; ++i) {
    PairResult p;
    p.from = r.i32();
    p.to = r.i32();
    p.reachable = r.u8() != 0;
    p.error = r.str(4096);
    p.rtt_ms = static_cast<double>(r.i64()) / 1e6;
    p.gbps = static_cast<double>(r.i64()) / 1e6;
    v.push_back(p);
  }
  *allreduce_gbps = static_cast<double>(r.i64()) / 1e6;
  *ar_error = r.str(4096);
  r.expect_end();
  return v;
}

std::span<const uint8_t> as_span(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

// Bus bandwidth of a Gloo all-reduce among the nodes (nccl-tests' busbw: 2(n-1)/n x bytes / time).
double all_reduce_busbw(const std::shared_ptr<dist::ControlStoreClient>& store, const std::string& ip, int rank, int n,
                        size_t bytes) {
  dist::GlooOptions go;
  go.store = store;
  go.ip = ip;
  go.timeout = 30s;
  dist::GlooCommunicatorFactory factory(go);
  dist::GroupInfo g;
  g.name = "doctor";
  for (int i = 0; i < n; ++i) g.world_ranks.push_back(i);
  g.rank = rank;
  auto comm = factory.create(g);
  Tensor t = host_empty({static_cast<int64_t>(bytes / 4)}, DType::kF32);
  std::fill(t.data<float>(), t.data<float>() + t.numel(), 1.0f);
  comm->all_reduce(t);  // warm-up (connections)
  const int iters = 3;
  auto t0 = dist::Clock::now();
  for (int i = 0; i < iters; ++i) comm->all_reduce(t);
  const double secs = std::chrono::duration<double>(dist::Clock::now() - t0).count() / iters;
  return 2.0 * (n - 1) / n * static_cast<double>(bytes) * 8 / secs / 1e9;
}

// The head's checks of every link (reachability, latency, one TCP stream) and of the
// all-reduce's bus bandwidth `bw` (or its error).
std::vector<Check> link_checks(const std::vector<NodeFacts>& all, const std::vector<PairResult>& pairs, double bw,
                               const std::string& err, const DoctorOptions& o) {
  std::vector<Check> checks;
  auto who = [&](int r) { return node_name(all[static_cast<size_t>(r)]); };
  for (const auto& p : pairs) {
    const NodeFacts& to = all[static_cast<size_t>(p.to)];
    const std::string name = fmt::format("{} -> {}", who(p.from), who(p.to));
    if (!p.reachable) {
      checks.push_back(
          {"", name + " port " + std::to_string(to.probe_port), Status::kFail,
           fmt::format("an ephemeral port, as NCCL and Gloo use: {}", p.error),
           fmt::format("open TCP between the nodes on {}: nft add rule inet filter input ip saddr {} accept (or ufw "
                       "allow from {}); a firewall that only opens the control port breaks NCCL and Gloo",
                       to.nic, all[static_cast<size_t>(p.from)].ip, all[static_cast<size_t>(p.from)].ip)});
      continue;
    }
    if (!p.error.empty()) {
      checks.push_back({"", name, Status::kFail, p.error, "check the link between these nodes"});
      continue;
    }
    const bool lat_ok = p.rtt_ms < o.max_latency_ms;
    checks.push_back({"", name + " latency", lat_ok ? Status::kOk : Status::kFail,
                      fmt::format("{:.3f} ms round trip (rule: < {} ms)", p.rtt_ms, o.max_latency_ms),
                      lat_ok ? "" : "use a direct high-speed link between the nodes (not the management network)"});
    const bool bw_ok = p.gbps >= o.min_bandwidth_gbps;
    checks.push_back({"", name + " TCP stream", bw_ok ? Status::kOk : Status::kFail,
                      fmt::format("{:.2f} Gb/s over one connection (rule: >= {} Gb/s)", p.gbps, o.min_bandwidth_gbps),
                      bw_ok ? "" : "use the fast NIC (--nic), check its link speed (ethtool) and MTU"});
  }
  if (!err.empty())
    checks.push_back({"", "all-reduce (Gloo)", Status::kFail, err, "fix the unreachable ports above first"});
  else
    checks.push_back({"", "all-reduce (Gloo)", bw >= o.min_bandwidth_gbps ? Status::kOk : Status::kFail,
                      fmt::format("bus bandwidth {:.2f} Gb/s, {} MiB f32 over {} nodes (rule: >= {} Gb/s)", bw,
                                  o.all_reduce_bytes >> 20, o.nnodes, o.min_bandwidth_gbps),
                      bw >= o.min_bandwidth_gbps ? "" : "use the fast NIC (--nic); keep TP inside nodes"});
  return checks;
}

// Every node learns whether every node reached every other (then the all-reduce is tried).
bool every_node_reaches(dist::ControlStoreClient& store, const std::vector<PairResult>& mine, const DoctorOptions& o) {
  bool all_reach = true;
  for (const auto& p : mine) all_reach &= p.reachable;
  store.set("doctor/reach/" + std::to_string(o.node_rank), as_span(all_reach ? "1" : "0"));
  bool everyone = true;
  for (int r = 0; r < o.nnodes; ++r) {
    auto v = store.wait_get("doctor/reach/" + std::to_string(r), o.join_timeout, fmt::format("node {}", r));
    everyone &= !v.empty() && v[0] == '1';
  }
  return everyone;
}

// The doctor's own rendezvous: the head serves the control port (and waits for every node),
// the others join it. The fingerprint never refuses: the doctor compares versions and model
// files itself, to name every difference.
void join_doctor_rendezvous(const DoctorOptions& o, const NodeFacts& me, bool is_head, dist::HeadAddress& head,
                            std::unique_ptr<dist::RendezvousServer>& server,
                            std::unique_ptr<dist::RendezvousClient>& client) {
  dist::NodeFingerprint neutral;
  neutral.version = "tessera doctor";
  neutral.hostname = me.hostname;
  neutral.nic = me.nic;
  neutral.ip = me.ip;
  if (is_head) {
    dist::RendezvousServerOptions so;
    so.bind_ip = me.ip;
    so.port = o.master_port;
    so.token = o.token;
    so.nnodes = o.nnodes;
    so.head_fingerprint = neutral;
    so.join_timeout = o.join_timeout;
    server = std::make_unique<dist::RendezvousServer>(so);
    head.host = me.ip;
    server->wait_for_nodes();
    return;
  }
  dist::RendezvousClientOptions co;
  co.head = head;
  co.node_rank = o.node_rank;
  co.nnodes = o.nnodes;
  co.fingerprint = neutral;
  co.join_timeout = o.join_timeout;
  client = std::make_unique<dist::RendezvousClient>(co);
}

// Lets the other nodes read the verdict before the head's control channel closes (10 s at most).
void wait_for_nodes_to_leave(dist::RendezvousServer& server) {
  auto deadline = dist::Clock::now() + 10s;
  while (dist::Clock::now() < deadline) {
    bool others_gone = true;
    for (const auto& n : server.status().nodes) others_gone &= n.node_rank == 0 || !n.alive;
    if (others_gone) break;
    std::this_thread::sleep_for(20ms);
  }
}

}  // namespace

Report run_doctor(const DoctorOptions& o) {
  Report rep;
  NodeFacts me = collect_local_facts(o);
  const bool cluster = o.nnodes > 1;
  if (!cluster) {
    rep.checks = local_checks(me, o);
    return rep;
  }
  rep.is_head = o.node_rank == 0;
  auto fail_line = [&](const std::string& name, const std::string& what, const std::string& fix) {
    rep.checks.push_back({node_name(me), name, Status::kFail, what, fix});
  };
  // 1. NIC: the same choice serve makes, and where the kernel routes to the head.
  dist::NicChoice nic;
  try {
    nic = dist::choose_nic({o.master_addr, o.nic, o.node_ip_address});
  } catch (const Error& e) {
    rep.checks = local_checks(me, o);
    fail_line("NIC choice", e.what(), "pass --nic with the interface on the network the nodes share");
    return rep;
  }
  me.nic = nic.interface_name;
  me.ip = nic.ip;
  if (auto src = dist::route_source_address(o.master_addr))
    for (const auto& i : me.interfaces)
      if (i.ip == *src) me.route_interface = i.name;
  if (rep.is_head && dist::is_loopback_address(o.master_addr)) me.route_interface = me.nic;
  auto probe_server = std::make_unique<ProbeServer>(me.ip);
  me.probe_ip = me.ip;
  me.probe_port = probe_server->port();
  // 2. The rendezvous (the control port), with a fingerprint that never refuses: the doctor
  // compares versions and model files itself, to name every difference.
  std::unique_ptr<dist::RendezvousServer> server;
  std::unique_ptr<dist::RendezvousClient> client;
  dist::HeadAddress head{o.master_addr, o.master_port, o.token, me.ip};
  try {
    join_doctor_rendezvous(o, me, rep.is_head, head, server, client);
  } catch (const Error& e) {
    auto local = local_checks(me, o);
    rep.checks.insert(rep.checks.end(), local.begin(), local.end());
    fail_line(fmt::format("control port {}:{}", o.master_addr, o.master_port), e.what(),
              rep.is_head ? fmt::format("start `tessera doctor` on every node with the same --nnodes, --master-addr "
                                        "and --cluster-token; open TCP {} on this node's firewall",
                                        o.master_port)
                          : fmt::format("check --master-addr and --nic, and open TCP {} on the head's firewall (nft "
                                        "add rule inet filter input tcp dport {} accept; ufw allow {}/tcp)",
                                        o.master_port, o.master_port, o.master_port));
    return rep;
  }
  // 3. Facts through the store, probes of every peer, an all-reduce, results back to the head.
  std::vector<NodeFacts> all;
  std::vector<PairResult> pairs;
  std::map<int, std::pair<double, std::string>> allreduce;
  try {
    auto store = std::make_shared<dist::ControlStoreClient>(head, o.node_rank, o.join_timeout);
    store->set("doctor/facts/" + std::to_string(o.node_rank), encode_facts(me));
    for (int r = 0; r < o.nnodes; ++r)
      all.push_back(r == o.node_rank ? me
                                     : decode_facts(store->wait_get("doctor/facts/" + std::to_string(r), o.join_timeout,
                                                                    fmt::format("node {}'s facts", r))));
    std::vector<PairResult> mine;
    for (const auto& peer : all)
      if (peer.node_rank != o.node_rank) mine.push_back(probe(me, peer, o));
    store->set("doctor/probed/" + std::to_string(o.node_rank), as_span("1"));
    for (int r = 0; r < o.nnodes; ++r)
      store->wait_get("doctor/probed/" + std::to_string(r), o.join_timeout, fmt::format("node {}'s probes", r));
    // Every node decides the same way whether the data plane can be tried: all probes passed.
    const bool everyone = every_node_reaches(*store, mine, o);
    double busbw = -1;
    std::string ar_error = everyone ? "" : "skipped: some node cannot reach another";
    if (everyone) try {
        busbw = all_reduce_busbw(store, me.ip, o.node_rank, o.nnodes, o.all_reduce_bytes);
      } catch (const Error& e) {
        ar_error = e.what();
      }
    store->set("doctor/result/" + std::to_string(o.node_rank), encode_pairs(mine, busbw, ar_error));
    if (rep.is_head) {
      for (int r = 0; r < o.nnodes; ++r) {
        double bw = -1;
        std::string err;
        auto v = decode_pairs(
            store->wait_get("doctor/result/" + std::to_string(r), o.join_timeout, fmt::format("node {}'s results", r)),
            &bw, &err);
        pairs.insert(pairs.end(), v.begin(), v.end());
        allreduce[r] = {bw, err};
      }
    }
    if (!rep.is_head) {
      // The head's verdict decides this node's exit status too.
      for (const auto& f : all) {
        auto local = local_checks(f, o);
        if (f.node_rank == o.node_rank) rep.checks.insert(rep.checks.end(), local.begin(), local.end());
      }
      auto v = store->wait_get("doctor/verdict", o.join_timeout, "the head's verdict");
      const bool ok = !v.empty() && v[0] == '1';
      rep.checks.push_back(
          {"", "cluster", ok ? Status::kOk : Status::kFail,
           ok ? "every check passed (the head printed the report)" : "the head found problems (its report names them)",
           ok ? "" : "see the head's output"});
      return rep;
    }
    // The head's report.
    for (const auto& f : all) {
      auto local = local_checks(f, o);
      rep.checks.insert(rep.checks.end(), local.begin(), local.end());
    }
    auto cmp = compare_nodes(all);
    rep.checks.insert(rep.checks.end(), cmp.begin(), cmp.end());
    const auto& [bw, err] = allreduce[0];
    const std::vector<Check> links = link_checks(all, pairs, bw, err, o);
    rep.checks.insert(rep.checks.end(), links.begin(), links.end());
    store->set("doctor/verdict", as_span(rep.ok() ? "1" : "0"));
    wait_for_nodes_to_leave(*server);
  } catch (const Error& e) {
    auto local = local_checks(me, o);
    rep.checks.insert(rep.checks.end(), local.begin(), local.end());
    fail_line("cluster checks", e.what(), "check that every node runs `tessera doctor` with the same flags");
  }
  return rep;
}

std::string render_report(const Report& r) {
  std::string out;
  std::string last_node = "\x01";
  for (const auto& c : r.checks) {
    if (c.node != last_node) {
      out += c.node.empty() ? "cluster\n" : c.node + "\n";
      last_node = c.node;
    }
    out += fmt::format("  {} {:<24} {}\n", status_mark(c.status), c.name, c.detail);
    if (!c.fix.empty() && (c.status == Status::kFail || c.status == Status::kWarn)) out += "      fix: " + c.fix + "\n";
  }
  int fails = 0, warns = 0;
  for (const auto& c : r.checks) {
    fails += c.status == Status::kFail;
    warns += c.status == Status::kWarn;
  }
  out += fails ? fmt::format("\n{} problem(s), {} warning(s)\n", fails, warns)
               : fmt::format("\nall checks passed ({} warning(s))\n", warns);
  return out;
}

}  // namespace tessera::doctor
