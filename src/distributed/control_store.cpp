#include "distributed/control_store.h"

#include <exception>

#include "core/error.h"
#include "distributed/messages.h"
#include "distributed/wire.h"

namespace tessera::dist {

ControlStoreClient::ControlStoreClient(const HeadAddress& head, int world_rank,
                                       std::chrono::milliseconds connect_timeout,
                                       std::chrono::milliseconds request_timeout)
    : head_(head), world_rank_(world_rank), request_timeout_(request_timeout) {
  socket_ = connect_to_head(head_, deadline_after(connect_timeout), request_timeout_);
  send_frame(socket_, MessageType::kRankHello, encode_ranks({world_rank}), deadline_after(request_timeout_));
}

ControlStoreClient::~ControlStoreClient() {
  if (std::uncaught_exceptions() > 0) return;
  try {
    std::lock_guard<std::mutex> lock(mu_);
    send_frame(socket_, MessageType::kLeave, {}, deadline_after(std::chrono::seconds(1)));
  } catch (const std::exception&) {  // the head is gone already: nothing to tell
  }
}

Frame ControlStoreClient::request(MessageType type, std::span<const uint8_t> payload, MessageType reply) {
  std::lock_guard<std::mutex> lock(mu_);
  Deadline deadline = deadline_after(request_timeout_);
  send_frame(socket_, type, payload, deadline);
  std::optional<Frame> f = recv_frame(socket_, kMaxFrame, deadline);
  if (!f) fail(ErrorKind::kNetwork, "the head at {}:{} closed the bootstrap-store connection", head_.host, head_.port);
  if (f->type != reply)
    fail(ErrorKind::kNetwork, "the head answered a {} with a {} frame", message_type_name(type),
         message_type_name(f->type));
  return std::move(*f);
}

void ControlStoreClient::set(const std::string& key, std::span<const uint8_t> value) {
  StoreEntry e{key, std::vector<uint8_t>(value.begin(), value.end())};
  Frame f = request(MessageType::kStoreSet, encode(e), MessageType::kStoreOk);
  WireReader(f.payload, "store ok").expect_end();
}

std::optional<std::vector<uint8_t>> ControlStoreClient::try_get(const std::string& key) {
  Frame f = request(MessageType::kStoreGet, encode_text(key), MessageType::kStoreValue);
  std::vector<uint8_t> value;
  if (!decode_store_value(f.payload, &value)) return std::nullopt;
  return value;
}

std::vector<int> ControlStoreClient::gone_ranks(const std::vector<int>& ranks) {
  std::vector<int32_t> asked(ranks.begin(), ranks.end());
  Frame f = request(MessageType::kLivenessQuery, encode_ranks(asked), MessageType::kLivenessReply);
  std::vector<int32_t> gone = decode_ranks(f.payload);
  return {gone.begin(), gone.end()};
}

}  // namespace tessera::dist
