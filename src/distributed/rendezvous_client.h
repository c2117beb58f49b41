// A worker node's side of the control channel. The constructor connects to the head
// (retrying until it is up), authenticates, sends the join with this node's fingerprint
// and waits for the cluster table, all within join_timeout. Afterwards one background
// thread (owned and joined by this object) sends heartbeats, watches the head's echoes,
// queues jobs and records failure notices.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "distributed/connect.h"
#include "distributed/messages.h"

namespace tessera::dist {

struct RendezvousClientOptions {
  HeadAddress head;
  int node_rank = 1;
  int nnodes = 2;  // 0 (node_rank -1): a node of a persistent cluster; the head assigns the rank
  NodeFingerprint fingerprint;
  std::chrono::milliseconds join_timeout{std::chrono::seconds(300)};
  std::chrono::milliseconds heartbeat_interval{std::chrono::seconds(1)};
  std::chrono::milliseconds heartbeat_timeout{std::chrono::seconds(10)};  // head silent this long = gone
  std::chrono::milliseconds handshake_timeout{std::chrono::seconds(5)};
};

class RendezvousClient {
 public:
  explicit RendezvousClient(RendezvousClientOptions options);  // throws Error with the head's reason if refused
  ~RendezvousClient();
  RendezvousClient(const RendezvousClient&) = delete;
  RendezvousClient& operator=(const RendezvousClient&) = delete;

  const ClusterTable& cluster() const { return cluster_; }
  // This node's rank: the one asked for, or the one the head of a persistent cluster assigned.
  int node_rank() const { return node_rank_; }
  // A persistent cluster's node: the next job the head forwarded; nullopt on timeout.
  std::optional<JobStart> wait_job(std::chrono::milliseconds timeout);
  // The first failure seen: node_rank 0 when the head is lost (it closed the connection or stopped
  // answering heartbeats), this node's own rank when the head declared this node dead (it missed
  // heartbeats: a hung or stopped process), another node's rank when the head announced its failure.
  std::optional<RankFailure> failure() const;
  // One heartbeat round trip started now: true once the head has echoed a heartbeat sent after this
  // call (it still counts this node as a member: it echoes only its members), false when the
  // connection ended first or after `timeout`. A node checks this before it calls its job finished:
  // ranks that ended cleanly do not prove the head kept the node.
  bool confirm_membership(std::chrono::milliseconds timeout);

  // Test hook: drop the connection abruptly, as a crash would (no goodbye, thread stopped).
  void simulate_crash();

 private:
  void run();
  void run_loop();
  void record_failure(RankFailure f);

  RendezvousClientOptions options_;
  Socket socket_;
  ClusterTable cluster_;

  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::deque<JobStart> jobs_;
  int node_rank_ = -1;
  std::optional<RankFailure> failure_;
  uint64_t sent_seq_ = 0, echoed_seq_ = 0;    // heartbeats sent and the highest echoed (under mu_)
  bool ended_ = false;                        // the thread has returned (under mu_)
  std::atomic<bool> heartbeat_asked_{false};  // confirm_membership: send one now
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

// One status query to a running head (for `tessera cluster status`); throws Error on failure.
ClusterStatus query_cluster_status(const HeadAddress& head, std::chrono::milliseconds timeout);
// Hands a job to the head of a persistent cluster, which forwards it to the nodes it names;
// returns once every one got it. Throws Error with the head's reason if it refused.
void submit_job(const HeadAddress& head, const JobSubmit& job, std::chrono::milliseconds timeout);

}  // namespace tessera::dist
