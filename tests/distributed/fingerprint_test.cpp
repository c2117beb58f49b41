#include "distributed/fingerprint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "test_util.h"

namespace tessera::dist {
namespace {

using testing::FakeModelDir;
using ::testing::HasSubstr;

TEST(Fingerprint, HashesConfigAndShardHeaders) {
  FakeModelDir dir(3);
  NodeFingerprint f = compute_fingerprint(dir.path());
  EXPECT_EQ(f.config_sha256.size(), 64u);
  EXPECT_EQ(f.dtype, "bfloat16");
  ASSERT_EQ(f.shards.size(), 3u);
  EXPECT_EQ(f.shards[0].name, "model-00001-of-00003.safetensors");
  EXPECT_EQ(f.shards[2].header_sha256.size(), 64u);
  EXPECT_NE(f.shards[0].header_sha256, f.shards[1].header_sha256);
  EXPECT_FALSE(f.version.empty());
  EXPECT_EQ(fingerprint_mismatch(f, compute_fingerprint(dir.path()), 1), std::nullopt);
}

TEST(Fingerprint, SameModelInTwoDirectoriesMatches) {
  FakeModelDir a(2), b(2);
  EXPECT_EQ(fingerprint_mismatch(compute_fingerprint(a.path()), compute_fingerprint(b.path()), 1), std::nullopt);
}

TEST(Fingerprint, MismatchNamesNodeAndFile) {
  FakeModelDir head(4), node(4);
  node.write_shard(FakeModelDir::name(3, 4), 1000);
  NodeFingerprint h = compute_fingerprint(head.path());
  NodeFingerprint n = compute_fingerprint(node.path());
  n.ip = "10.0.0.2";
  std::optional<std::string> why = fingerprint_mismatch(h, n, 1);
  ASSERT_TRUE(why);
  EXPECT_THAT(*why, HasSubstr("node 1 (10.0.0.2): model-00003-of-00004.safetensors differs from the head's (size"));
}

TEST(Fingerprint, SameSizeDifferentHeader) {
  FakeModelDir head(2), node(2);
  node.write_shard(FakeModelDir::name(2, 2), 128, "x");  // same data size and header length, another tensor name
  std::optional<std::string> why =
      fingerprint_mismatch(compute_fingerprint(head.path()), compute_fingerprint(node.path()), 2);
  ASSERT_TRUE(why);
  EXPECT_THAT(*why, HasSubstr("node 2: model-00002-of-00002.safetensors differs from the head's (same size"));
}

TEST(Fingerprint, MissingExtraVersionConfig) {
  FakeModelDir head(2), node(1);
  NodeFingerprint h = compute_fingerprint(head.path());
  NodeFingerprint n = compute_fingerprint(node.path());
  EXPECT_THAT(*fingerprint_mismatch(h, n, 1), HasSubstr("is missing"));
  NodeFingerprint v = h;
  v.version = "0.0.1 (old)";
  EXPECT_THAT(*fingerprint_mismatch(h, v, 1), HasSubstr("runs tessera 0.0.1 (old) but the head runs"));
  NodeFingerprint c = h;
  c.config_sha256 = std::string(64, '0');
  EXPECT_THAT(*fingerprint_mismatch(h, c, 1), HasSubstr("config.json differs"));
}

TEST(Fingerprint, CorruptShardIsRefused) {
  FakeModelDir dir(1);
  std::ofstream(dir.path() + "/model-00001-of-00001.safetensors", std::ios::binary | std::ios::trunc)
      << std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8);
  EXPECT_THROW(compute_fingerprint(dir.path()), Error);
  EXPECT_THROW(compute_fingerprint("/nonexistent/model"), Error);
}

TEST(Fingerprint, HumanBytes) {
  EXPECT_EQ(human_bytes(4'900'000'000ull), "4.9 GB");
  EXPECT_EQ(human_bytes(512), "512 bytes");
}

}  // namespace
}  // namespace tessera::dist
