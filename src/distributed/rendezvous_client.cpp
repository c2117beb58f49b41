#include "distributed/rendezvous_client.h"

#include <algorithm>

#include "core/error.h"
#include "core/logging.h"
#include "distributed/wire.h"

namespace tessera::dist {

RendezvousClient::RendezvousClient(RendezvousClientOptions options) : options_(std::move(options)) {
  Deadline deadline = deadline_after(options_.join_timeout);
  socket_ = connect_to_head(options_.head, deadline, options_.handshake_timeout);
  JoinRequest join{options_.node_rank, options_.nnodes, options_.fingerprint};
  send_frame(socket_, MessageType::kJoin, encode(join), deadline_after(options_.handshake_timeout));
  // The head answers once every node has joined; until then wait, bounded by the join deadline.
  std::optional<Frame> f;
  try {
    f = recv_frame(socket_, kMaxFrame, deadline);
  } catch (const Error& e) {
    fail(ErrorKind::kNetwork,
         "node {}: the cluster did not form within {:.0f} s ({}); other nodes may not have joined: check every node's "
         "--nnodes/--node-rank/--master-addr, or run `tessera cluster status` against the head",
         options_.node_rank, options_.join_timeout.count() / 1000.0, e.what());
  }
  if (!f)
    fail(ErrorKind::kNetwork, "the head at {}:{} closed the connection during the join", options_.head.host,
         options_.head.port);
  if (f->type == MessageType::kReject)
    fail(ErrorKind::kInvalidArgument, "the head refused this node: {}", decode_text(f->payload));
  if (f->type != MessageType::kWelcome)
    fail(ErrorKind::kNetwork, "the head sent a {} frame instead of the cluster table", message_type_name(f->type));
  cluster_ = decode_cluster_table(f->payload);
  node_rank_ = options_.node_rank;
  if (options_.nnodes == 0) {  // a persistent cluster: find the rank the head gave this node
    for (const ClusterNode& n : cluster_.nodes)
      if (n.node_rank > 0 && n.fingerprint.hostname == options_.fingerprint.hostname &&
          n.fingerprint.ip == options_.fingerprint.ip)
        node_rank_ = n.node_rank;
    if (node_rank_ < 0) fail(ErrorKind::kNetwork, "the head's cluster table does not list this node");
    TLOG_INFO("joined the cluster at {}:{} as node {} ({} node(s) in it)", options_.head.host, options_.head.port,
              node_rank_, cluster_.nodes.size());
    thread_ = std::thread([this] { run(); });
    return;
  }
  TLOG_INFO("node {} joined the cluster at {}:{}: {} node(s), {} rank(s)", options_.node_rank, options_.head.host,
            options_.head.port, cluster_.nodes.size(), cluster_.world_size);
  thread_ = std::thread([this] { run(); });
}

RendezvousClient::~RendezvousClient() {
  stopping_ = true;
  if (thread_.joinable()) thread_.join();  // exits within one poll interval
  if (socket_.valid() && !failure()) {
    try {  // an orderly exit is not a failure: say goodbye so the head does not report us
      send_frame(socket_, MessageType::kLeave, {}, deadline_after(std::chrono::seconds(1)));
    } catch (const Error&) {
    }
  }
  socket_.shutdown();
}

void RendezvousClient::simulate_crash() {
  stopping_ = true;
  socket_.shutdown();
  if (thread_.joinable()) thread_.join();
  socket_.close();
}

void RendezvousClient::record_failure(RankFailure f) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failure_) return;  // the first failure is the one worth reporting
    failure_ = f;
  }
  changed_.notify_all();
  TLOG_ERROR("cluster failure: {}", f.reason);
}

void RendezvousClient::run() {
  run_loop();
  {
    std::lock_guard<std::mutex> lock(mu_);
    ended_ = true;
  }
  changed_.notify_all();
}

void RendezvousClient::run_loop() {
  uint64_t seq = 0;
  Clock::time_point next_heartbeat = Clock::now();
  Clock::time_point last_echo = Clock::now();
  std::string head = fmt::format("the head at {}:{}", options_.head.host, options_.head.port);
  try {
    while (!stopping_) {
      Clock::time_point now = Clock::now();
      if (now >= next_heartbeat || heartbeat_asked_.exchange(false)) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          sent_seq_ = ++seq;
        }
        send_frame(socket_, MessageType::kHeartbeat, encode_u64(seq), deadline_after(options_.handshake_timeout));
        next_heartbeat = now + options_.heartbeat_interval;
      }
      auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next_heartbeat - now);
      if (!wait_readable(socket_, std::clamp(wait, std::chrono::milliseconds(1), std::chrono::milliseconds(200)))) {
        // Nothing to read: only now does the head's silence count. After a stall of this process
        // (SIGSTOP, swapping) what the head sent meanwhile is read first, and the heartbeat sent on
        // waking has had one wait to be answered.
        if (Clock::now() - last_echo > options_.heartbeat_timeout) {
          record_failure({0, 0, 0,
                          fmt::format("{} stopped answering heartbeats for {:.0f} s (its process is stuck or the "
                                      "link to it is cut)",
                                      head, options_.heartbeat_timeout.count() / 1000.0)});
          return;
        }
        continue;
      }
      std::optional<Frame> f = recv_frame(socket_, kMaxFrame, deadline_after(options_.handshake_timeout));
      if (!f) {
        if (!stopping_)
          record_failure({0, 0, 0,
                          fmt::format("{} is gone: it closed the control connection (its process ended, or it "
                                      "dropped this node)",
                                      head)});
        return;
      }
      switch (f->type) {
        case MessageType::kHeartbeat: {
          uint64_t echoed = decode_u64(f->payload);
          last_echo = Clock::now();
          {
            std::lock_guard<std::mutex> lock(mu_);
            echoed_seq_ = std::max(echoed_seq_, echoed);
          }
          changed_.notify_all();
          break;
        }
        case MessageType::kRankFailed: {
          RankFailure rf = decode_rank_failure(f->payload);
          if (rf.node_rank == node_rank_ && node_rank_ > 0)  // sent to the node it names: it was dropped
            rf.reason = fmt::format("{} declared this node dead: {}", head, rf.reason);
          record_failure(std::move(rf));
          break;
        }
        case MessageType::kWelcome:
          decode_cluster_table(f->payload);  // a repeat changes nothing: the table is fixed once formed
          break;
        case MessageType::kJobStart: {
          JobStart job = decode_job_start(f->payload);
          {
            std::lock_guard<std::mutex> lock(mu_);
            jobs_.push_back(std::move(job));
          }
          changed_.notify_all();
          break;
        }
        default:
          fail(ErrorKind::kCorrupt, "unexpected {} frame from the head", message_type_name(f->type));
      }
    }
  } catch (const Error& e) {
    if (!stopping_) record_failure({0, 0, 0, fmt::format("lost {}: {}", head, e.what())});
  }
}

bool RendezvousClient::confirm_membership(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t after = sent_seq_;  // a heartbeat numbered above this one is sent after this call
  heartbeat_asked_ = true;
  changed_.wait_for(lock, timeout, [&] { return echoed_seq_ > after || ended_; });
  return echoed_seq_ > after;
}

std::optional<JobStart> RendezvousClient::wait_job(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait_for(lock, timeout, [&] { return !jobs_.empty() || failure_.has_value(); });
  if (jobs_.empty()) return std::nullopt;
  JobStart j = std::move(jobs_.front());
  jobs_.pop_front();
  return j;
}

std::optional<RankFailure> RendezvousClient::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

ClusterStatus query_cluster_status(const HeadAddress& head, std::chrono::milliseconds timeout) {
  Deadline deadline = deadline_after(timeout);
  Socket s = connect_to_head(head, deadline, timeout);
  send_frame(s, MessageType::kStatusQuery, {}, deadline);
  std::optional<Frame> f = recv_frame(s, kMaxFrame, deadline);
  if (!f) fail(ErrorKind::kNetwork, "the head at {}:{} closed the connection before answering", head.host, head.port);
  if (f->type != MessageType::kStatusReply)
    fail(ErrorKind::kNetwork, "the head answered with a {} frame", message_type_name(f->type));
  return decode_cluster_status(f->payload);
}

void submit_job(const HeadAddress& head, const JobSubmit& job, std::chrono::milliseconds timeout) {
  Deadline deadline = deadline_after(timeout);
  Socket s = connect_to_head(head, deadline, timeout);
  send_frame(s, MessageType::kJobSubmit, encode(job), deadline);
  std::optional<Frame> f = recv_frame(s, kMaxFrame, deadline);
  if (!f) fail(ErrorKind::kNetwork, "the head at {}:{} closed the connection before answering", head.host, head.port);
  if (f->type == MessageType::kReject)
    fail(ErrorKind::kInvalidArgument, "the cluster head at {}:{} refused the job: {}", head.host, head.port,
         decode_text(f->payload));
  if (f->type != MessageType::kJobAccepted)
    fail(ErrorKind::kNetwork, "the head answered with a {} frame", message_type_name(f->type));
}

}  // namespace tessera::dist
