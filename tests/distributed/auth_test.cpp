#include "distributed/auth.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>

#include "core/error.h"
#include "distributed/wire.h"

namespace tessera::dist {
namespace {

using ::testing::HasSubstr;

// Runs the server side on a thread and the client side here; returns both outcomes.
struct Outcome {
  std::string server_error, client_error;
};

Outcome handshake(const std::string& server_token, const std::string& client_token) {
  Socket listener = listen_tcp("127.0.0.1", 0);
  uint16_t port = local_port(listener);
  Outcome out;
  std::thread server([&] {
    Socket s = accept_tcp(listener, deadline_after(std::chrono::seconds(5)));
    try {
      authenticate_client(s, server_token, deadline_after(std::chrono::seconds(5)));
    } catch (const Error& e) {
      out.server_error = e.what();
    }
  });
  try {
    Socket c = connect_tcp("127.0.0.1", port, deadline_after(std::chrono::seconds(5)));
    authenticate_to_server(c, client_token, deadline_after(std::chrono::seconds(5)));
  } catch (const Error& e) {
    out.client_error = e.what();
  }
  server.join();
  return out;
}

TEST(Auth, ProofsDependOnTokenAndBothNonces) {
  std::array<uint8_t, 32> a{}, b{};
  b[0] = 1;
  EXPECT_TRUE(digests_equal(client_proof("t", a, b), client_proof("t", a, b)));
  EXPECT_FALSE(digests_equal(client_proof("t", a, b), client_proof("u", a, b)));
  EXPECT_FALSE(digests_equal(client_proof("t", a, b), client_proof("t", b, a)));
  EXPECT_FALSE(digests_equal(client_proof("t", a, b), server_proof("t", a, b)));  // no reflection
}

TEST(Auth, HmacMatchesRfc4231) {
  // RFC 4231 test case 2.
  std::string data = "what do ya want for nothing?";
  Digest d = hmac_sha256("Jefe", std::span(reinterpret_cast<const uint8_t*>(data.data()), data.size()));
  EXPECT_EQ(to_hex(d), "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST(Auth, SameTokenAccepted) {
  Outcome o = handshake("s3cret", "s3cret");
  EXPECT_EQ(o.server_error, "");
  EXPECT_EQ(o.client_error, "");
}

TEST(Auth, WrongTokenRejectedOnBothSides) {
  Outcome o = handshake("s3cret", "guess");
  EXPECT_THAT(o.server_error, HasSubstr("failed authentication"));
  EXPECT_THAT(o.client_error, HasSubstr("cluster-token"));
}

TEST(Auth, SilentPeerTimesOut) {
  Socket listener = listen_tcp("127.0.0.1", 0);
  Socket c = connect_tcp("127.0.0.1", local_port(listener), deadline_after(std::chrono::seconds(5)));
  Socket s = accept_tcp(listener, deadline_after(std::chrono::seconds(5)));
  auto start = Clock::now();
  // The server challenges, the client never answers.
  EXPECT_THROW(authenticate_client(s, "t", deadline_after(std::chrono::milliseconds(300))), Error);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(2));
}

}  // namespace
}  // namespace tessera::dist
