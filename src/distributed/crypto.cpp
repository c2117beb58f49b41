#include "distributed/crypto.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "core/error.h"

namespace tessera::dist {

Digest hmac_sha256(const std::string& key, std::span<const uint8_t> message) {
  Digest out{};
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), message.data(), message.size(), out.data(), &len) ||
      len != out.size())
    fail(ErrorKind::kInternal, "HMAC-SHA256 failed in libcrypto");
  return out;
}

bool digests_equal(const Digest& a, const Digest& b) { return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0; }

std::array<uint8_t, 32> random_nonce() {
  std::array<uint8_t, 32> n{};
  if (RAND_bytes(n.data(), static_cast<int>(n.size())) != 1) fail(ErrorKind::kInternal, "RAND_bytes failed");
  return n;
}

std::string to_hex(std::span<const uint8_t> bytes) {
  static const char* kDigits = "0123456789abcdef";
  std::string s;
  s.reserve(bytes.size() * 2);
  for (uint8_t b : bytes) {
    s.push_back(kDigits[b >> 4]);
    s.push_back(kDigits[b & 15]);
  }
  return s;
}

struct Sha256::State {
  EVP_MD_CTX* ctx = nullptr;
};

Sha256::Sha256() : state_(std::make_unique<State>()) {
  state_->ctx = EVP_MD_CTX_new();
  if (!state_->ctx || EVP_DigestInit_ex(state_->ctx, EVP_sha256(), nullptr) != 1)
    fail(ErrorKind::kInternal, "SHA-256 init failed in libcrypto");
}

Sha256::~Sha256() { EVP_MD_CTX_free(state_->ctx); }

void Sha256::update(const void* data, size_t n) { EVP_DigestUpdate(state_->ctx, data, n); }

Digest Sha256::finish() {
  Digest d{};
  unsigned int len = 0;
  EVP_DigestFinal_ex(state_->ctx, d.data(), &len);
  return d;
}

}  // namespace tessera::dist
