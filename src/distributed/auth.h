// Mutual challenge-response authentication with the cluster token, run first on every
// control-channel connection. The token never crosses the wire:
//
//   server -> client  kChallenge     u16 protocol, 32-byte server nonce
//   client -> server  kAuthResponse  32-byte client nonce, HMAC(token, "tessera-client" | sn | cn)
//   server -> client  kAuthOk        HMAC(token, "tessera-server" | cn | sn)      (or kReject)
//
// The client checks the server's proof too, so a stranger posing as the head cannot
// collect fingerprints or hand out jobs. Fresh nonces on both sides defeat replay.
#pragma once
#include <array>
#include <cstdint>
#include <span>
#include <string>

#include "distributed/crypto.h"
#include "distributed/socket.h"

namespace tessera::dist {

inline constexpr uint16_t kAuthProtocol = 1;

Digest client_proof(const std::string& token, std::span<const uint8_t, 32> server_nonce,
                    std::span<const uint8_t, 32> client_nonce);
Digest server_proof(const std::string& token, std::span<const uint8_t, 32> server_nonce,
                    std::span<const uint8_t, 32> client_nonce);

// Both throw Error(kNetwork) naming the peer when authentication fails or times out.
void authenticate_client(const Socket& s, const std::string& token, Deadline deadline);     // server side
void authenticate_to_server(const Socket& s, const std::string& token, Deadline deadline);  // client side

}  // namespace tessera::dist
