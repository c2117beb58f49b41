#include "distributed/auth.h"

#include <vector>

#include "core/error.h"
#include "distributed/wire.h"

namespace tessera::dist {

namespace {

Digest proof(const std::string& token, const char* label, std::span<const uint8_t, 32> first,
             std::span<const uint8_t, 32> second) {
  std::vector<uint8_t> msg(label, label + std::char_traits<char>::length(label));
  msg.insert(msg.end(), first.begin(), first.end());
  msg.insert(msg.end(), second.begin(), second.end());
  return hmac_sha256(token, msg);
}

Frame expect_frame(const Socket& s, MessageType want, Deadline deadline) {
  std::optional<Frame> f = recv_frame(s, kMaxUnauthenticatedFrame, deadline);
  if (!f) fail(ErrorKind::kNetwork, "{} closed the connection during authentication", peer_address(s));
  if (f->type == MessageType::kReject) {
    WireReader r(f->payload, "reject");
    fail(ErrorKind::kNetwork, "{} refused us: {}", peer_address(s), r.str(4096));
  }
  if (f->type != want)
    fail(ErrorKind::kNetwork, "{} sent a {} frame during authentication, expected {}", peer_address(s),
         message_type_name(f->type), message_type_name(want));
  return std::move(*f);
}

}  // namespace

Digest client_proof(const std::string& token, std::span<const uint8_t, 32> sn, std::span<const uint8_t, 32> cn) {
  return proof(token, "tessera-client", sn, cn);
}

Digest server_proof(const std::string& token, std::span<const uint8_t, 32> sn, std::span<const uint8_t, 32> cn) {
  return proof(token, "tessera-server", cn, sn);
}

void authenticate_client(const Socket& s, const std::string& token, Deadline deadline) {
  std::array<uint8_t, 32> server_nonce = random_nonce();
  WireWriter w;
  w.u16(kAuthProtocol);
  w.raw(server_nonce.data(), server_nonce.size());
  send_frame(s, MessageType::kChallenge, w.data(), deadline);

  Frame f = expect_frame(s, MessageType::kAuthResponse, deadline);
  WireReader r(f.payload, "auth response");
  std::array<uint8_t, 32> client_nonce{};
  Digest mac{};
  r.raw(client_nonce.data(), client_nonce.size());
  r.raw(mac.data(), mac.size());
  r.expect_end();
  if (!digests_equal(mac, client_proof(token, server_nonce, client_nonce))) {
    WireWriter reject;
    reject.str("authentication failed: wrong cluster token");
    try {
      send_frame(s, MessageType::kReject, reject.data(), deadline);
    } catch (const Error&) {
    }
    fail(ErrorKind::kNetwork, "{} failed authentication (wrong --cluster-token?)", peer_address(s));
  }
  Digest answer = server_proof(token, server_nonce, client_nonce);
  send_frame(s, MessageType::kAuthOk, answer, deadline);
}

void authenticate_to_server(const Socket& s, const std::string& token, Deadline deadline) {
  Frame challenge = expect_frame(s, MessageType::kChallenge, deadline);
  WireReader r(challenge.payload, "challenge");
  uint16_t protocol = r.u16();
  std::array<uint8_t, 32> server_nonce{};
  r.raw(server_nonce.data(), server_nonce.size());
  r.expect_end();
  if (protocol != kAuthProtocol)
    fail(ErrorKind::kNetwork, "{} speaks auth protocol {} but we speak {}; run the same tessera version everywhere",
         peer_address(s), protocol, kAuthProtocol);
  std::array<uint8_t, 32> client_nonce = random_nonce();
  WireWriter w;
  w.raw(client_nonce.data(), client_nonce.size());
  Digest mac = client_proof(token, server_nonce, client_nonce);
  w.raw(mac.data(), mac.size());
  send_frame(s, MessageType::kAuthResponse, w.data(), deadline);

  std::optional<Frame> ok;
  try {
    ok = expect_frame(s, MessageType::kAuthOk, deadline);
  } catch (const Error& e) {
    fail(ErrorKind::kNetwork, "{} (check that --cluster-token matches the head's)", e.what());
  }
  WireReader ok_reader(ok->payload, "auth ok");
  Digest their{};
  ok_reader.raw(their.data(), their.size());
  ok_reader.expect_end();
  if (!digests_equal(their, server_proof(token, server_nonce, client_nonce)))
    fail(ErrorKind::kNetwork, "{} could not prove it knows the cluster token; refusing to talk to it", peer_address(s));
}

}  // namespace tessera::dist
