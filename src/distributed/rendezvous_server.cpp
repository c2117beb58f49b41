#include "distributed/rendezvous_server.h"

#include <algorithm>

#include "core/error.h"
#include "core/logging.h"
#include "distributed/auth.h"
#include "distributed/nic.h"
#include "distributed/wire.h"

namespace tessera::dist {

struct RendezvousServer::Connection {
  Socket socket;
  std::mutex write_mu;  // the connection thread and broadcasters both write
  std::string peer;
  int node_rank = -1;   // set once a join is admitted; -1 again when the node leaves
  int world_rank = -1;  // set by a rank hello (bootstrap store connections)
  uint64_t id = 0;
  std::string dropped_because;  // set (under the server's mutex) when the head itself closes it
};

namespace {

// Two live processes on different hosts joined with one node rank: the job's nodes got the same rank.
std::string duplicate_rank_message(int node_rank, const NodeFingerprint& first, const NodeFingerprint& second) {
  return fmt::format(
      "two nodes claim node rank {}: host {} ({}) joined first, host {} ({}) now; every node needs its own "
      "--node-rank. If every node got the same rank, the rank was computed once for all of them (a batch "
      "script that expands $SLURM_NODEID in the batch shell, not in each task): let the launcher set it "
      "(srun/mpirun/torchrun variables, LWS_WORKER_INDEX) or escape it (\\$SLURM_NODEID)",
      node_rank, first.hostname, first.ip, second.hostname, second.ip);
}

// A live node holds the rank a newcomer asks for: the newcomer is refused, the holder and its job go on.
std::string rank_held_message(int node_rank, int nnodes, const NodeFingerprint& holder, const std::string& holder_state,
                              const NodeFingerprint& newcomer, const std::string& newcomer_peer) {
  return fmt::format(
      "node rank {} is held by node {} (host {}, {}), which is alive ({}); refused host {} ({}) from {}: every node "
      "needs its own --node-rank (0..{}). To replace that node, stop it first; if its host went down without closing "
      "the connection, the head declares it dead after the heartbeat timeout and this node can join then",
      node_rank, node_rank, holder.hostname, holder.ip, holder_state, newcomer.hostname, newcomer.ip, newcomer_peer,
      nnodes - 1);
}

std::string seconds_ago(Clock::time_point t) {
  return fmt::format("{:.1f} s ago",
                     std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count() / 1000.0);
}

std::string rank_range(int first, int count) {
  return count == 1 ? fmt::format("rank {}", first) : fmt::format("ranks {}-{}", first, first + count - 1);
}

std::string join_ints(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}

}  // namespace

RendezvousServer::RendezvousServer(RendezvousServerOptions options) : options_(std::move(options)) {
  const std::string& ip = options_.bind_ip;
  bool wildcard = ip == "0.0.0.0" || ip == "::";
  if (wildcard && !options_.allow_wildcard)
    fail(ErrorKind::kInvalidArgument,
         "refusing to listen on {} (every interface); pass the chosen NIC's address or allow it explicitly", ip);
  if (options_.token.empty() && !is_loopback_address(ip))
    fail(ErrorKind::kInvalidArgument,
         "a cluster token is required when the control channel listens on {}; pass --cluster-token or set "
         "TESSERA_CLUSTER_TOKEN (the same on every node)",
         ip);
  if (options_.nnodes < 1) fail(ErrorKind::kInvalidArgument, "--nnodes must be at least 1");
  if (options_.persistent) options_.nnodes = 1;  // the head; the others are added as they join
  listener_ = listen_tcp(ip, options_.port);
  port_ = local_port(listener_);
  started_ = Clock::now();
  nodes_.resize(static_cast<size_t>(options_.nnodes));
  NodeSlot& head = nodes_[0];
  head.joined = head.alive = head.welcomed = true;
  head.joins = 1;
  head.fingerprint = options_.head_fingerprint;
  head.last_heartbeat = started_;
  maybe_form_locked();
  if (options_.persistent)
    TLOG_INFO("control channel listening on {}:{} for the nodes of a persistent cluster", ip, port_);
  else
    TLOG_INFO("control channel listening on {}:{} for {} node(s)", ip, port_, options_.nnodes);
  accept_thread_ = std::thread([this] { accept_loop(); });
  monitor_thread_ = std::thread([this] { monitor_loop(); });
}

RendezvousServer::~RendezvousServer() {
  std::map<uint64_t, std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    for (const auto& c : connections_) {
      c->dropped_because = "the head is stopping";
      c->socket.shutdown();
    }
  }
  changed_.notify_all();
  listener_.shutdown();
  if (accept_thread_.joinable()) accept_thread_.join();
  if (monitor_thread_.joinable()) monitor_thread_.join();
  {
    std::lock_guard<std::mutex> lock(mu_);
    threads.swap(connection_threads_);
  }
  for (auto& [_, t] : threads)
    if (t.joinable()) t.join();
}

void RendezvousServer::reap_finished_threads_locked() {
  for (uint64_t id : finished_) {
    auto it = connection_threads_.find(id);
    if (it == connection_threads_.end()) continue;
    if (it->second.joinable()) it->second.join();  // the thread's last act was to list itself here
    connection_threads_.erase(it);
  }
  finished_.clear();
}

void RendezvousServer::accept_loop() {
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      reap_finished_threads_locked();
    }
    Socket s = accept_tcp(listener_, deadline_after(std::chrono::milliseconds(200)));
    if (!s.valid()) continue;
    auto c = std::make_shared<Connection>();
    c->peer = peer_address(s);
    c->socket = std::move(s);
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    if (connections_.size() >= options_.max_connections) {
      TLOG_WARN("dropping control-channel peer {}: {} connections already open", c->peer, connections_.size());
      continue;
    }
    c->id = next_connection_id_++;
    connections_.push_back(c);
    connection_threads_[c->id] = std::thread([this, c] { serve_connection(c); });
  }
}

void RendezvousServer::monitor_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    changed_.wait_for(lock, std::chrono::milliseconds(100));
    if (stopping_) break;
    std::vector<RankFailure> fired;
    std::vector<std::pair<std::shared_ptr<Connection>, RankFailure>> dropped;
    Clock::time_point now = Clock::now();
    for (size_t r = 1; r < nodes_.size(); ++r) {
      NodeSlot& n = nodes_[r];
      if (!n.joined || !n.alive || !n.welcomed || now - n.last_heartbeat <= options_.heartbeat_timeout) continue;
      auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(now - n.last_heartbeat).count();
      std::shared_ptr<Connection> conn = n.connection;
      std::string reason = fmt::format("no heartbeat for {:.1f} s", silent / 1000.0);
      mark_node_failed_locked(static_cast<int>(r), reason, &fired);
      if (conn) {
        conn->dropped_because = "the head declared the node dead: " + reason;
        dropped.emplace_back(conn, fired.back());
      }
    }
    if (!fired.empty()) {
      lock.unlock();
      // A hung node may wake up (SIGCONT, the end of a swap storm): what it reads first is that it
      // was declared dead, so it does not go on as a member (its process ends non-zero).
      for (const auto& [conn, failure] : dropped) {
        try {
          std::lock_guard<std::mutex> write(conn->write_mu);
          send_frame(conn->socket, MessageType::kRankFailed, encode(failure),
                     deadline_after(std::chrono::milliseconds(1000)));
        } catch (const Error&) {
        }
        conn->socket.shutdown();
      }
      fire_failures(fired);
      lock.lock();
    }
  }
}

void RendezvousServer::serve_connection(std::shared_ptr<Connection> c) {
  std::string closed_because = "closed by the node";
  try {
    authenticate_client(c->socket, options_.token, deadline_after(options_.handshake_timeout));
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stopping_) break;
      }
      if (!wait_readable(c->socket, std::chrono::milliseconds(200))) continue;
      std::optional<Frame> f = recv_frame(c->socket, kMaxFrame, deadline_after(options_.handshake_timeout));
      if (!f) {
        std::lock_guard<std::mutex> lock(mu_);
        if (!c->dropped_because.empty()) closed_because = c->dropped_because;  // the head closed it, not the node
        break;
      }
      if (!handle_frame(c, *f)) {
        closed_because = "dropped";
        break;
      }
    }
  } catch (const Error& e) {
    bool quiet;
    {
      std::lock_guard<std::mutex> lock(mu_);
      quiet = stopping_ || !c->dropped_because.empty();
      closed_because = c->dropped_because.empty() ? e.what() : c->dropped_because;
    }
    if (!quiet) TLOG_WARN("dropping control-channel peer {}: {}", c->peer, e.what());
  }
  on_connection_closed(c, closed_because);
  std::lock_guard<std::mutex> lock(mu_);
  connections_.erase(std::remove(connections_.begin(), connections_.end(), c), connections_.end());
  finished_.push_back(c->id);
}

void RendezvousServer::send_to(const std::shared_ptr<Connection>& c, MessageType type,
                               std::span<const uint8_t> payload) {
  std::lock_guard<std::mutex> lock(c->write_mu);
  send_frame(c->socket, type, payload, deadline_after(options_.handshake_timeout));
}

bool RendezvousServer::handle_frame(const std::shared_ptr<Connection>& c, const Frame& f) {
  switch (f.type) {
    case MessageType::kJoin:
      return handle_join(c, f);
    case MessageType::kHeartbeat: {
      uint64_t seq = decode_u64(f.payload);
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (c->node_rank < 0 || nodes_[c->node_rank].connection != c) {
          TLOG_WARN("dropping control-channel peer {}: heartbeat from a connection that has not joined", c->peer);
          return false;
        }
        nodes_[c->node_rank].last_heartbeat = Clock::now();
      }
      send_to(c, MessageType::kHeartbeat, encode_u64(seq));
      return true;
    }
    case MessageType::kLeave: {
      decode_any(f.type, f.payload);
      std::lock_guard<std::mutex> lock(mu_);
      if (c->world_rank >= 0) ranks_left_.insert(c->world_rank);
      if (c->node_rank > 0 && nodes_[static_cast<size_t>(c->node_rank)].connection == c) {
        NodeSlot& slot = nodes_[static_cast<size_t>(c->node_rank)];
        TLOG_INFO("node {} ({}) left the cluster", c->node_rank, slot.fingerprint.ip);
        slot.alive = false;
        slot.connection = nullptr;
        c->node_rank = -1;
      }
      return false;
    }
    case MessageType::kStatusQuery: {
      decode_any(f.type, f.payload);
      ClusterStatus s = status();
      send_to(c, MessageType::kStatusReply, encode(s));
      return true;
    }
    case MessageType::kStoreSet: {
      StoreEntry e = decode_store_entry(f.payload);
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = store_.find(e.key);
        size_t old = it == store_.end() ? 0 : it->first.size() + it->second.size();
        size_t added = e.key.size() + e.value.size();
        if (store_bytes_ - old + added > options_.max_store_bytes) {
          TLOG_WARN("dropping control-channel peer {}: bootstrap store full ({} bytes)", c->peer, store_bytes_);
          return false;
        }
        store_bytes_ = store_bytes_ - old + added;
        store_[e.key] = std::move(e.value);
      }
      send_to(c, MessageType::kStoreOk, {});
      return true;
    }
    case MessageType::kStoreGet: {
      std::string key = decode_text(f.payload, kMaxStoreKey);
      std::vector<uint8_t> value;
      bool found;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = store_.find(key);
        found = it != store_.end();
        if (found) value = it->second;
      }
      send_to(c, MessageType::kStoreValue, encode_store_value(found, value));
      return true;
    }
    case MessageType::kRankHello: {
      std::vector<int32_t> ranks = decode_ranks(f.payload);
      if (ranks.size() != 1) {
        TLOG_WARN("dropping control-channel peer {}: rank hello with {} ranks", c->peer, ranks.size());
        return false;
      }
      std::lock_guard<std::mutex> lock(mu_);
      c->world_rank = ranks[0];
      ranks_connected_.insert(ranks[0]);
      ranks_gone_.erase(ranks[0]);
      return true;
    }
    case MessageType::kJobSubmit:
      return handle_job_submit(c, f);
    case MessageType::kLivenessQuery: {
      std::vector<int32_t> asked = decode_ranks(f.payload);
      std::vector<int32_t> gone;
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (int32_t r : asked)
          if (ranks_gone_.count(r) || !ranks_connected_.count(r)) gone.push_back(r);
      }
      send_to(c, MessageType::kLivenessReply, encode_ranks(gone));
      return true;
    }
    default:
      TLOG_WARN("dropping control-channel peer {}: sent a {} frame, which only the head sends", c->peer,
                message_type_name(f.type));
      return false;
  }
}

// A persistent cluster's node rank for a joining host: the same host and address is the same node
// restarting and gets its old rank back; else a slot a refused join left empty, else a new one
// (-1 and `refusal` set when the cluster is full).
int RendezvousServer::persistent_rank_locked(const NodeFingerprint& fp, std::string& refusal) {
  for (size_t r = 1; r < nodes_.size(); ++r)
    if (nodes_[r].joins > 0 && nodes_[r].fingerprint.hostname == fp.hostname && nodes_[r].fingerprint.ip == fp.ip)
      return static_cast<int>(r);
  for (size_t r = 1; r < nodes_.size(); ++r)
    if (nodes_[r].joins == 0 && !nodes_[r].connection) return static_cast<int>(r);
  if (nodes_.size() >= 4096) {
    refusal = "the cluster has 4096 nodes already";
    return -1;
  }
  nodes_.emplace_back();
  return static_cast<int>(nodes_.size()) - 1;
}

bool RendezvousServer::handle_join(const std::shared_ptr<Connection>& c, const Frame& f) {
  JoinRequest j = decode_join(f.payload);
  std::string refusal;
  std::vector<std::shared_ptr<Connection>> to_welcome;
  std::vector<uint8_t> welcome;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (options_.persistent && j.nnodes == 0) j.node_rank = persistent_rank_locked(j.fingerprint, refusal);
    std::string who = j.fingerprint.ip.empty() ? fmt::format("node {}", j.node_rank)
                                               : fmt::format("node {} ({})", j.node_rank, j.fingerprint.ip);
    if (!refusal.empty()) {
    } else if (options_.persistent && j.nnodes != 0) {
      refusal = fmt::format(
          "{}: this head at {}:{} is a persistent cluster (`tessera node start --head`); join it with `tessera node "
          "start --address {}:{}`, or give the job with --nnodes its own --master-port",
          who, options_.bind_ip, port_, options_.bind_ip, port_);
    } else if (!options_.persistent && j.nnodes == 0) {
      refusal = fmt::format(
          "{}: this head at {}:{} runs one job with --nnodes {}, not a persistent cluster; start the cluster's head "
          "with `tessera node start --head`",
          who, options_.bind_ip, port_, options_.nnodes);
    } else if (j.nnodes != options_.nnodes && !options_.persistent) {
      refusal =
          fmt::format("{}: started with --nnodes {} but the head has --nnodes {}", who, j.nnodes, options_.nnodes);
    } else if (j.node_rank == 0) {
      refusal = fmt::format("{} from {}: node rank 0 is the head; give this node --node-rank 1..{}", who, c->peer,
                            options_.nnodes - 1);
    } else if (std::optional<std::string> mismatch =
                   fingerprint_mismatch(options_.head_fingerprint, j.fingerprint, j.node_rank)) {
      refusal = *mismatch;
    } else {
      NodeSlot& slot = nodes_[static_cast<size_t>(j.node_rank)];
      // A rank whose holder is connected and alive is never taken over: a second process with that
      // rank is a mistake (or a restart whose old process still runs), and evicting the holder would
      // end its job. A holder whose process ended has lost its connection and the rank is free.
      const bool held = slot.connection && slot.connection != c && slot.alive;
      const bool other_host =
          slot.fingerprint.ip != j.fingerprint.ip || slot.fingerprint.hostname != j.fingerprint.hostname;
      if (held && !options_.persistent && other_host && !formed_) {
        // Two live processes on different hosts with one node rank before the job formed: a job
        // whose nodes got the same rank. It cannot form; the head fails with this too.
        refusal = duplicate_rank_message(j.node_rank, slot.fingerprint, j.fingerprint);
        duplicate_rank_ = refusal;
        changed_.notify_all();
      } else if (held && options_.persistent) {
        refusal = fmt::format(
            "this host ({}, {}) is node {} of the cluster already, and that node is alive (last heartbeat {}); run "
            "one `tessera node start` per host: stop the running one first (or give this one another "
            "--node-ip-address)",
            j.fingerprint.hostname, j.fingerprint.ip, j.node_rank, seconds_ago(slot.last_heartbeat));
      } else if (held) {
        std::string state =
            slot.welcomed ? fmt::format("last heartbeat {}{}", seconds_ago(slot.last_heartbeat),
                                        formed_ ? ", in the running job" : "")
                          : fmt::format("joined {}, waiting for the other nodes", seconds_ago(slot.last_heartbeat));
        refusal = rank_held_message(j.node_rank, options_.nnodes, slot.fingerprint, state, j.fingerprint, c->peer);
      } else if (!options_.persistent && formed_ && slot.joins > 0 &&
                 slot.fingerprint.num_ranks != j.fingerprint.num_ranks) {
        refusal = fmt::format("{} rejoined with {} ranks but had {}; restart the whole cluster to change it", who,
                              j.fingerprint.num_ranks, slot.fingerprint.num_ranks);
      } else {
        slot.joined = slot.alive = true;
        slot.welcomed = false;
        slot.joins++;
        slot.fingerprint = j.fingerprint;
        slot.last_heartbeat = Clock::now();
        slot.connection = c;
        c->node_rank = j.node_rank;
        TLOG_INFO("{} joined: host {}, {} rank(s), {} GPU(s), NIC {}, tessera {}", who, j.fingerprint.hostname,
                  j.fingerprint.num_ranks, j.fingerprint.gpus.size(), j.fingerprint.nic, j.fingerprint.version);
        if (options_.persistent) {  // rank slots of the live nodes
          world_size_ = 0;
          for (size_t r = 0; r < nodes_.size(); ++r)
            if (nodes_[r].alive) world_size_ += nodes_[r].fingerprint.num_ranks;
          world_size_ = std::max(world_size_, 1);
        }
        maybe_form_locked();
        if (formed_) {
          welcome = encode(table_locked());
          for (NodeSlot& n : nodes_)
            if (n.connection && n.alive && !n.welcomed) {
              n.welcomed = true;
              n.last_heartbeat = Clock::now();  // heartbeats start once the node has its table
              to_welcome.push_back(n.connection);
            }
        }
      }
    }
  }
  if (!refusal.empty()) {
    TLOG_WARN("refused {}: {}", c->peer, refusal);
    try {
      send_to(c, MessageType::kReject, encode_text(refusal));
    } catch (const Error&) {
    }
    return false;
  }
  changed_.notify_all();
  for (const auto& w : to_welcome) {
    try {
      send_to(w, MessageType::kWelcome, welcome);
    } catch (const Error& e) {
      TLOG_WARN("could not send the cluster table to {}: {}", w->peer, e.what());
      w->socket.shutdown();
    }
  }
  return true;
}

bool RendezvousServer::handle_job_submit(const std::shared_ptr<Connection>& c, const Frame& f) {
  JobSubmit j = decode_job_submit(f.payload);
  std::string refusal;
  std::vector<std::shared_ptr<Connection>> targets;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!options_.persistent) {
      refusal = "this head runs one job with --nnodes, not a persistent cluster; it takes no job submissions";
    } else {
      for (int32_t n : j.nodes) {
        bool ok = n > 0 && static_cast<size_t>(n) < nodes_.size() && nodes_[static_cast<size_t>(n)].alive &&
                  nodes_[static_cast<size_t>(n)].connection;
        if (!ok) {
          refusal = fmt::format("node {} is not joined and alive; see `tessera cluster status`", n);
          break;
        }
        targets.push_back(nodes_[static_cast<size_t>(n)].connection);
      }
    }
  }
  for (size_t i = 0; i < targets.size() && refusal.empty(); ++i) {
    JobStart js = j.job;
    js.node_rank = static_cast<int32_t>(i + 1);
    try {
      send_to(targets[i], MessageType::kJobStart, encode(js));
    } catch (const Error& e) {
      refusal = fmt::format("could not send the job to node {}: {}", j.nodes[i], e.what());
    }
  }
  if (!refusal.empty()) {
    TLOG_WARN("refused the job from {}: {}", c->peer, refusal);
    try {
      send_to(c, MessageType::kReject, encode_text(refusal));
    } catch (const Error&) {
    }
    return false;
  }
  TLOG_INFO("job from {} started on node(s) {}: tessera {}", c->peer, join_ints(j.nodes),
            j.job.args.empty() ? std::string() : j.job.args[0]);
  send_to(c, MessageType::kJobAccepted, {});
  return true;
}

void RendezvousServer::maybe_form_locked() {
  if (formed_) return;
  for (const NodeSlot& n : nodes_)
    if (!n.joined) return;
  int next = 0;
  for (NodeSlot& n : nodes_) {
    n.first_rank = next;
    next += n.fingerprint.num_ranks;
  }
  world_size_ = next;
  formed_ = true;
  TLOG_INFO("all {} node(s) joined: {} rank(s) in the world", nodes_.size(), world_size_);
}

ClusterTable RendezvousServer::table_locked() const {
  ClusterTable t;
  t.world_size = world_size_;
  for (size_t r = 0; r < nodes_.size(); ++r)
    t.nodes.push_back({static_cast<int32_t>(r), nodes_[r].first_rank, nodes_[r].fingerprint});
  return t;
}

ClusterTable RendezvousServer::wait_for_nodes() {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait_until(lock, started_ + options_.join_timeout,
                      [&] { return formed_ || stopping_ || !duplicate_rank_.empty(); });
  if (!duplicate_rank_.empty()) fail(ErrorKind::kInvalidArgument, "{}", duplicate_rank_);
  if (formed_) return table_locked();
  std::vector<int> missing;
  std::string joined;
  for (size_t r = 0; r < nodes_.size(); ++r) {
    if (!nodes_[r].joined) {
      missing.push_back(static_cast<int>(r));
    } else {
      joined += fmt::format("{}node {}{}", joined.empty() ? "" : ", ", r,
                            nodes_[r].fingerprint.ip.empty() ? "" : " (" + nodes_[r].fingerprint.ip + ")");
    }
  }
  fail(ErrorKind::kNetwork,
       "node{} {} never joined within {:.0f} s (joined: {}); check that they run with --master-addr {} "
       "--master-port {} and the same --cluster-token, and that this port is reachable from them",
       missing.size() == 1 ? "" : "s", join_ints(missing), options_.join_timeout.count() / 1000.0, joined,
       options_.bind_ip, port_);
}

ClusterStatus RendezvousServer::status_locked() const {
  ClusterStatus s;
  s.nnodes = options_.persistent ? 0 : static_cast<int32_t>(nodes_.size());  // 0: a persistent cluster
  s.world_size = world_size_;
  s.formed = formed_;
  Clock::time_point now = Clock::now();
  for (size_t r = 0; r < nodes_.size(); ++r) {
    const NodeSlot& n = nodes_[r];
    if (!n.joined && n.joins == 0) continue;
    NodeStatus ns;
    ns.node_rank = static_cast<int32_t>(r);
    ns.first_rank = n.first_rank;
    ns.alive = n.alive;
    ns.joins = n.joins;
    ns.ms_since_heartbeat =
        r == 0 ? 0 : std::chrono::duration_cast<std::chrono::milliseconds>(now - n.last_heartbeat).count();
    ns.fingerprint = n.fingerprint;
    s.nodes.push_back(std::move(ns));
  }
  return s;
}

ClusterStatus RendezvousServer::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return status_locked();
}

void RendezvousServer::on_connection_closed(const std::shared_ptr<Connection>& c, const std::string& why) {
  std::vector<RankFailure> fired;
  std::function<void(const std::string&)> rank_lost;
  std::string lost_what;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (c->world_rank >= 0) {
      ranks_gone_.insert(c->world_rank);
      // A rank whose process ended without `leave` died (killed, crashed): under a launcher that
      // started it, nobody else supervises it.
      if (!ranks_left_.count(c->world_rank) && !stopping_ && formed_ && on_rank_lost_) {
        rank_lost = on_rank_lost_;
        lost_what = fmt::format("{}: its process ended without finishing (its control connection closed: {})",
                                table_locked().describe_rank(c->world_rank), why);
      }
    }
    if (c->node_rank > 0 && nodes_[static_cast<size_t>(c->node_rank)].connection == c) {
      NodeSlot& slot = nodes_[static_cast<size_t>(c->node_rank)];
      if (stopping_) {
        slot.connection = nullptr;
      } else if (slot.welcomed) {
        mark_node_failed_locked(c->node_rank, "control connection lost (" + why + ")", &fired);
      } else {
        // Left before the cluster formed: forget it, so a restarted node can still join in time.
        TLOG_WARN("node {} ({}) left before every node had joined: {}", c->node_rank, c->peer, why);
        slot.joined = slot.alive = false;
        slot.connection = nullptr;
      }
    }
  }
  changed_.notify_all();
  fire_failures(fired);
  if (rank_lost) {
    TLOG_ERROR("{}", lost_what);
    rank_lost(lost_what);
  }
}

void RendezvousServer::mark_node_failed_locked(int node_rank, const std::string& reason,
                                               std::vector<RankFailure>* fired) {
  NodeSlot& n = nodes_[static_cast<size_t>(node_rank)];
  if (!n.alive) return;
  n.alive = false;
  n.connection = nullptr;
  RankFailure f;
  f.node_rank = node_rank;
  f.first_rank = n.first_rank;
  f.num_ranks = n.fingerprint.num_ranks;
  std::string who = n.fingerprint.ip.empty() ? fmt::format("node {}", node_rank)
                                             : fmt::format("node {} ({})", node_rank, n.fingerprint.ip);
  f.reason = fmt::format("{}, {}: {}", who, rank_range(f.first_rank, f.num_ranks), reason);
  TLOG_ERROR("{} is gone: {}", who, f.reason);
  fired->push_back(std::move(f));
}

void RendezvousServer::fire_failures(const std::vector<RankFailure>& fired) {
  for (const RankFailure& f : fired) {
    if (!options_.persistent) announce_failure(f);  // a persistent cluster's nodes are independent
    std::function<void(const RankFailure&)> callback;
    {
      std::lock_guard<std::mutex> lock(mu_);
      callback = on_failure_;
    }
    if (!callback) continue;
    try {
      callback(f);
    } catch (const std::exception& e) {
      TLOG_ERROR("node-failure callback threw: {}", e.what());
    }
  }
}

void RendezvousServer::announce_failure(const RankFailure& failure) {
  std::vector<uint8_t> payload = encode(failure);
  std::vector<std::shared_ptr<Connection>> targets;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t r = 1; r < nodes_.size(); ++r)
      if (nodes_[r].alive && nodes_[r].connection) targets.push_back(nodes_[r].connection);
  }
  for (const auto& c : targets) {
    try {
      send_to(c, MessageType::kRankFailed, payload);
    } catch (const Error&) {
    }
  }
}

void RendezvousServer::set_on_rank_lost(std::function<void(const std::string&)> callback) {
  std::lock_guard<std::mutex> lock(mu_);
  on_rank_lost_ = std::move(callback);
}

void RendezvousServer::set_on_node_failure(std::function<void(const RankFailure&)> callback) {
  std::lock_guard<std::mutex> lock(mu_);
  on_failure_ = std::move(callback);
}

}  // namespace tessera::dist
