// The checks: one node's facts by themselves, the head's comparison of every node, the report.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

#include "backend/devices.h"
#include "doctor/doctor.h"
#include "doctor/internal.h"

namespace tessera::doctor {

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

// The GPU lines: what was found (or what was tried), the kernels for them, P2P, NVML's failures.
void gpu_checks(const NodeFacts& f, const std::string& who, std::vector<Check>& c) {
  if (f.gpus.empty()) {
    std::string d = "no NVIDIA GPU visible: CPU backend";
    if (!f.gpu_query.empty()) d += " (tried " + f.gpu_query + ")";
    // A driver without a GPU to show: the user-space part is missing or the container has no GPUs.
    if (f.driver.empty())
      c.push_back({who, "GPUs", Status::kInfo, d, ""});
    else
      c.push_back({who, "GPUs", Status::kWarn, fmt::format("{}; yet driver {} is loaded", d, f.driver),
                   "in a container, pass the GPUs (docker run --gpus all, the NVIDIA Container Toolkit); on the "
                   "host, install the driver's user-space libraries (libnvidia-ml.so.1, libcuda.so.1) of the "
                   "kernel module's version, or reboot after a driver upgrade"});
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
    if (!f.p2p.empty()) {
      const bool all = f.p2p.find(" 0 without") != std::string::npos && f.p2p.find("unknown") == std::string::npos;
      c.push_back({who, "P2P between GPUs", all ? Status::kOk : Status::kWarn, f.p2p,
                   "GPUs without peer access send tensor-parallel traffic through host memory: keep a TP group on "
                   "GPUs with P2P (nvidia-smi topo -m), or check the BIOS's IOMMU/ACS settings"});
    }
  }
  if (!f.nvml_errors.empty())
    c.push_back(
        {who, "NVML", Status::kWarn, fmt::format("{}", fmt::join(f.nvml_errors, "; ")),
         "the lines above lack what these calls would have said; nvidia-smi -q asks the driver the same questions"});
}

}  // namespace

std::vector<Check> local_checks(const NodeFacts& f, const DoctorOptions& o) {
  std::vector<Check> c;
  const std::string who = node_name(f);
  c.push_back({who, "tessera", Status::kInfo, fmt::format("{} on {}", f.version, f.hostname), ""});
  gpu_checks(f, who, c);
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
