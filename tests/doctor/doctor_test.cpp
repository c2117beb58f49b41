// The doctor's own logic without a network: facts survive the wire, each single-node rule
// (/dev/shm, memlock, a NIC that does not route to the head) and each cross-node comparison
// (version, MTU, model files, content hashes) is a ✗ naming the nodes and carrying a fix.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/dtype.h"
#include "core/error.h"
#include "doctor/doctor.h"
#include "nan_fixture.h"

namespace tessera::doctor {
namespace {

NodeFacts node(int rank, const std::string& ip) {
  NodeFacts f;
  f.node_rank = rank;
  f.hostname = "host" + std::to_string(rank);
  f.version = "0.1.0 (abc)";
  f.nic = "ens1";
  f.ip = ip;
  f.route_interface = "ens1";
  f.interfaces = {{"lo", "127.0.0.1", 65536, -1}, {"ens1", ip, 1500, 25000}, {"docker0", "172.17.0.1", 1500, -1}};
  f.shm_bytes = 16ull << 30;
  f.memlock_bytes = -1;
  f.has_model = true;
  f.model.version = f.version;
  f.model.config_sha256 = "c0ffee";
  f.model.shards = {{"model-00001-of-00002.safetensors", 100, "aa"}, {"model-00002-of-00002.safetensors", 50, "bb"}};
  f.content_sha256 = {{"model-00001-of-00002.safetensors", "1111"}, {"model-00002-of-00002.safetensors", "2222"}};
  f.probe_ip = ip;
  f.probe_port = 40000 + rank;
  return f;
}

// By value: callers pass temporaries.
std::optional<Check> find(const std::vector<Check>& v, const std::string& name) {
  for (const auto& c : v)
    if (c.name == name) return c;
  return std::nullopt;
}

TEST(Doctor, FactsRoundTrip) {
  NodeFacts a = node(1, "10.0.0.2");
  a.gpus = {"NVIDIA H200, 143771 MiB", "NVIDIA H200, 143771 MiB"};
  a.driver = "570.86";
  NodeFacts b = decode_facts(encode_facts(a));
  EXPECT_EQ(b.node_rank, 1);
  EXPECT_EQ(b.ip, "10.0.0.2");
  EXPECT_EQ(b.gpus, a.gpus);
  EXPECT_EQ(b.interfaces.size(), 3u);
  EXPECT_EQ(b.interfaces[1].mtu, 1500);
  EXPECT_EQ(b.model.shards, a.model.shards);
  EXPECT_EQ(b.content_sha256, a.content_sha256);
  EXPECT_EQ(b.probe_port, 40001);
  a.nonfinite_tensors = {"model.safetensors: model.norm.weight"};
  a.nonfinite_count = 3;
  a.tensors_scanned = 40;
  b = decode_facts(encode_facts(a));
  EXPECT_EQ(b.nonfinite_tensors, a.nonfinite_tensors);
  EXPECT_EQ(b.nonfinite_count, 3u);
  EXPECT_EQ(b.tensors_scanned, 40u);
  std::vector<uint8_t> bytes = encode_facts(a);
  bytes.pop_back();
  EXPECT_THROW(decode_facts(bytes), tessera::Error);  // truncated: refused, never read past the end
}

TEST(Doctor, HealthyNodePasses) {
  DoctorOptions o;
  auto c = local_checks(node(0, "10.0.0.1"), o);
  for (const auto& x : c) EXPECT_NE(x.status, Status::kFail) << x.name << ": " << x.detail;
  ASSERT_TRUE(find(c, "NIC choice"));
  EXPECT_EQ(find(c, "NIC choice")->status, Status::kOk);
}

TEST(Doctor, SmallShmLowMemlockAndWrongNic) {
  DoctorOptions o;
  NodeFacts f = node(1, "192.168.5.2");
  f.shm_bytes = 64ull << 20;  // docker's default
  f.memlock_bytes = 64 << 10;
  f.nic = "eno9";
  auto c = local_checks(f, o);
  ASSERT_TRUE(find(c, "/dev/shm"));
  EXPECT_EQ(find(c, "/dev/shm")->status, Status::kFail);
  EXPECT_NE(find(c, "/dev/shm")->fix.find("--shm-size"), std::string::npos);
  EXPECT_EQ(find(c, "memlock limit")->status, Status::kWarn);
  auto nic = find(c, "NIC choice");
  ASSERT_TRUE(nic);
  EXPECT_EQ(nic->status, Status::kFail);
  EXPECT_NE(nic->detail.find("routes to the head through ens1"), std::string::npos) << nic->detail;
  EXPECT_NE(nic->fix.find("--nic =ens1"), std::string::npos) << nic->fix;
}

TEST(Doctor, SlowLinkIsAWarning) {
  DoctorOptions o;
  NodeFacts f = node(0, "10.0.0.1");
  f.interfaces[1].speed_mbps = 1000;
  EXPECT_EQ(find(local_checks(f, o), "NIC choice")->status, Status::kWarn);
}

TEST(Doctor, ComparisonNamesEveryDifference) {
  std::vector<NodeFacts> same = {node(0, "10.0.0.1"), node(1, "10.0.0.2")};
  for (const auto& c : compare_nodes(same)) EXPECT_EQ(c.status, Status::kOk) << c.name << ": " << c.detail;

  auto v = same;
  v[1].version = "0.0.9 (old)";
  auto ver = find(compare_nodes(v), "tessera version");
  EXPECT_EQ(ver->status, Status::kFail);
  EXPECT_NE(ver->detail.find("node 1 (10.0.0.2) has 0.0.9 (old)"), std::string::npos) << ver->detail;

  v = same;
  v[1].interfaces[1].mtu = 9000;
  auto mtu = find(compare_nodes(v), "MTU");
  EXPECT_EQ(mtu->status, Status::kFail);
  EXPECT_NE(mtu->detail.find("ens1 9000"), std::string::npos) << mtu->detail;

  v = same;
  v[1].model.shards[1].header_sha256 = "cc";
  auto files = find(compare_nodes(v), "model files");
  EXPECT_EQ(files->status, Status::kFail);
  EXPECT_NE(files->detail.find("model-00002-of-00002.safetensors"), std::string::npos) << files->detail;

  v = same;  // same headers, different tensor data: only the content hash tells
  v[1].content_sha256[0].second = "9999";
  files = find(compare_nodes(v), "model files");
  EXPECT_EQ(files->status, Status::kFail);
  EXPECT_NE(files->detail.find("model-00001-of-00002.safetensors has the same header but different tensor data"),
            std::string::npos)
      << files->detail;
}

TEST(Doctor, ReportFailsOnAnyFailedLine) {
  Report r;
  r.checks.push_back({"node 0", "a", Status::kOk, "", ""});
  r.checks.push_back({"node 0", "b", Status::kWarn, "", "x"});
  EXPECT_TRUE(r.ok());
  r.checks.push_back({"", "c", Status::kFail, "broken", "fix it"});
  EXPECT_FALSE(r.ok());
  const std::string text = render_report(r);
  EXPECT_NE(text.find("✗ c"), std::string::npos) << text;
  EXPECT_NE(text.find("fix: fix it"), std::string::npos) << text;
}

// --verify-weights reads every tensor: a copy of a fixture whose final norm is NaN in the file
// fails "weight values" naming the file and tensor; the fixture itself passes.
TEST(Doctor, VerifyWeightsNamesNanTensors) {
  namespace fs = std::filesystem;
  const fs::path src = fs::path(TESSERA_SOURCE_DIR) / "tests/fixtures/models/qwen2_gqa2_untied";
  const fs::path dir = testing::copy_with_nan_tensor(src, "tessera_doctor_nan", "model.norm.weight");
  DoctorOptions o;
  o.verify_weights = true;
  o.model_dir = dir.string();
  const NodeFacts broken = collect_local_facts(o);
  ASSERT_TRUE(broken.model_error.empty()) << broken.model_error;
  auto c = find(local_checks(broken, o), "weight values");
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, Status::kFail);
  EXPECT_NE(c->detail.find("NaN or Inf in 1 of"), std::string::npos) << c->detail;
  EXPECT_NE(c->detail.find("model.safetensors: model.norm.weight"), std::string::npos) << c->detail;
  EXPECT_FALSE(c->fix.empty());

  o.model_dir = src.string();
  c = find(local_checks(collect_local_facts(o), o), "weight values");
  ASSERT_TRUE(c);
  EXPECT_EQ(c->status, Status::kOk) << c->detail;
  o.verify_weights = false;  // without the flag, no tensor is read
  EXPECT_FALSE(find(local_checks(collect_local_facts(o), o), "weight values"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tessera::doctor
