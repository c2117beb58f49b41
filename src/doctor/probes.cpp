#include "doctor/probes.h"

#include <algorithm>

#include "core/error.h"
#include "core/tensor.h"
#include "distributed/control_store.h"
#include "distributed/gloo_communicator.h"
#include "distributed/wire.h"
#include "doctor/internal.h"

namespace tessera::doctor {

using namespace std::chrono_literals;

ProbeServer::ProbeServer(const std::string& ip)
    : listener_(dist::listen_tcp(ip, 0)), port_(dist::local_port(listener_)) {
  thread_ = std::thread([this] { loop(); });
}

ProbeServer::~ProbeServer() {
  stop_ = true;
  listener_.shutdown();
  thread_.join();
  for (auto& t : conns_) t.join();
}

void ProbeServer::loop() {
  while (!stop_) {
    if (!dist::wait_readable(listener_, 100ms)) continue;
    try {
      dist::Socket s = dist::accept_tcp(listener_, dist::deadline_after(1s));
      conns_.emplace_back([this, sock = std::make_shared<dist::Socket>(std::move(s))] { serve(*sock); });
    } catch (const Error&) {
    }
  }
}

void ProbeServer::serve(const dist::Socket& s) {
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
  // The slowest pair as the plan's --link (one-way latency: half the round trip).
  double slowest_gbps = 0, worst_rtt_ms = 0;
  for (const auto& p : pairs)
    if (p.reachable && p.error.empty() && p.gbps > 0) {
      slowest_gbps = slowest_gbps > 0 ? std::min(slowest_gbps, p.gbps) : p.gbps;
      worst_rtt_ms = std::max(worst_rtt_ms, p.rtt_ms);
    }
  if (slowest_gbps > 0)
    checks.push_back({"", "link for tessera plan", Status::kInfo,
                      fmt::format("--link {:.1f},{:.0f} (the slowest pair: Gb/s of one TCP stream, half its round trip "
                                  "in µs)",
                                  slowest_gbps, worst_rtt_ms * 1e3 / 2),
                      "tessera plan MODEL --nodes N --gpus-per-node G ... --link: the network's share of a decode "
                      "step for TP or PP across the nodes"});
  if (!err.empty())
    checks.push_back({"", "all-reduce (Gloo)", Status::kFail, err, "fix the unreachable ports above first"});
  else
    checks.push_back({"", "all-reduce (Gloo)", bw >= o.min_bandwidth_gbps ? Status::kOk : Status::kFail,
                      fmt::format("bus bandwidth {:.2f} Gb/s, {} MiB f32 over {} nodes (rule: >= {} Gb/s)", bw,
                                  o.all_reduce_bytes >> 20, o.nnodes, o.min_bandwidth_gbps),
                      bw >= o.min_bandwidth_gbps ? "" : "use the fast NIC (--nic); keep TP inside nodes"});
  return checks;
}

}  // namespace tessera::doctor
