// The few primitives the control channel needs, from OpenSSL's libcrypto.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

namespace tessera::dist {

using Digest = std::array<uint8_t, 32>;

Digest hmac_sha256(const std::string& key, std::span<const uint8_t> message);
bool digests_equal(const Digest& a, const Digest& b);  // constant time
std::array<uint8_t, 32> random_nonce();                // from the OS CSPRNG via RAND_bytes
std::string to_hex(std::span<const uint8_t> bytes);

// Incremental SHA-256 (for file headers that are read in pieces).
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(const void* data, size_t n);
  Digest finish();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace tessera::dist
