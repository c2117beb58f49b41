// The head's side of the control channel: one listening socket on the chosen interface.
// It authenticates every connection, admits nodes whose fingerprint matches the head's,
// forms the cluster table, tracks heartbeats, serves the bootstrap key-value store and
// status queries, and pushes jobs and failure notices to the nodes.
//
// Threads (all owned and joined by this object): one accept thread, one thread per
// connection (bounded by max_connections), one monitor thread for heartbeat deadlines.
// Public methods are thread-safe.
#pragma once
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "distributed/fingerprint.h"
#include "distributed/messages.h"
#include "distributed/socket.h"

namespace tessera::dist {

struct RendezvousServerOptions {
  std::string bind_ip = "127.0.0.1";  // the chosen NIC's address
  uint16_t port = 0;                  // 0: any free port (tests)
  bool allow_wildcard = false;        // listening on 0.0.0.0 / :: must be asked for
  std::string token;                  // required unless bind_ip is loopback
  int nnodes = 1;
  // A persistent cluster (`tessera node start --head`): nodes join and leave at any time
  // (node rank -1, nnodes 0 in their join; the head numbers them), failures are not
  // announced to the other nodes, and job submissions are forwarded to the nodes they name.
  bool persistent = false;
  NodeFingerprint head_fingerprint;  // node 0's, the reference every node must match
  std::chrono::milliseconds join_timeout{std::chrono::seconds(300)};
  std::chrono::milliseconds heartbeat_timeout{std::chrono::seconds(10)};
  std::chrono::milliseconds handshake_timeout{std::chrono::seconds(5)};
  size_t max_connections = 256;
  size_t max_store_bytes = 64 << 20;
};

class RendezvousServer {
 public:
  explicit RendezvousServer(RendezvousServerOptions options);  // binds and starts; throws on failure
  ~RendezvousServer();
  RendezvousServer(const RendezvousServer&) = delete;
  RendezvousServer& operator=(const RendezvousServer&) = delete;

  uint16_t port() const { return port_; }
  const std::string& bind_ip() const { return options_.bind_ip; }

  // Blocks until every node has joined; throws Error(kNetwork) naming the node ranks that
  // never came once join_timeout (counted from construction) has passed.
  ClusterTable wait_for_nodes();
  ClusterStatus status() const;

  // Tells every live node that ranks are gone (also done automatically on a missed heartbeat, when
  // the silent node itself is told too, before its connection is closed).
  void announce_failure(const RankFailure& failure);
  // Called (from a server thread) when a joined node dies or misses heartbeats.
  void set_on_node_failure(std::function<void(const RankFailure&)> callback);
  // Called (on a server thread) when a rank's bootstrap-store connection closes without `leave`
  // once the cluster has formed: its process died. Names the rank ("rank 3 (node 1, 10.0.0.2)").
  void set_on_rank_lost(std::function<void(const std::string&)> callback);

 private:
  struct Connection;
  struct NodeSlot {
    bool joined = false;  // has joined at least once and is currently admitted
    bool alive = false;
    bool welcomed = false;
    int joins = 0;
    int first_rank = 0;
    NodeFingerprint fingerprint;
    Clock::time_point last_heartbeat{};
    std::shared_ptr<Connection> connection;
  };

  void accept_loop();
  void monitor_loop();
  void serve_connection(std::shared_ptr<Connection> c);
  // Returns false when the connection must close.
  bool handle_frame(const std::shared_ptr<Connection>& c, const Frame& f);
  bool handle_join(const std::shared_ptr<Connection>& c, const Frame& f);
  int persistent_rank_locked(const NodeFingerprint& fp, std::string& refusal);
  bool handle_job_submit(const std::shared_ptr<Connection>& c, const Frame& f);
  void on_connection_closed(const std::shared_ptr<Connection>& c, const std::string& why);
  void mark_node_failed_locked(int node_rank, const std::string& reason, std::vector<RankFailure>* fired);
  void maybe_form_locked();
  ClusterTable table_locked() const;
  ClusterStatus status_locked() const;
  void send_to(const std::shared_ptr<Connection>& c, MessageType type, std::span<const uint8_t> payload);
  void fire_failures(const std::vector<RankFailure>& fired);
  void reap_finished_threads_locked();

  RendezvousServerOptions options_;
  Socket listener_;
  uint16_t port_ = 0;
  Clock::time_point started_;

  mutable std::mutex mu_;
  std::condition_variable changed_;
  bool stopping_ = false;
  bool formed_ = false;
  std::string duplicate_rank_;  // set when two live nodes on different hosts claim one node rank
  int world_size_ = 0;
  std::vector<NodeSlot> nodes_;
  std::map<std::string, std::vector<uint8_t>> store_;
  size_t store_bytes_ = 0;
  std::set<int> ranks_connected_, ranks_gone_, ranks_left_;
  std::function<void(const RankFailure&)> on_failure_;
  std::function<void(const std::string&)> on_rank_lost_;
  std::vector<std::shared_ptr<Connection>> connections_;
  std::map<uint64_t, std::thread> connection_threads_;  // by Connection::id (addresses get reused)
  std::vector<uint64_t> finished_;
  uint64_t next_connection_id_ = 0;

  std::thread accept_thread_;
  std::thread monitor_thread_;
};

}  // namespace tessera::dist
