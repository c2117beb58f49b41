#include "distributed/nic.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

#include "core/error.h"

namespace tessera::dist {
namespace {

using ::testing::HasSubstr;

TEST(NicSpec, ParsesNcclSyntax) {
  NicSpec prefix = parse_nic_spec("eth,ib");
  EXPECT_FALSE(prefix.exclude);
  EXPECT_FALSE(prefix.exact);
  EXPECT_EQ(prefix.names, (std::vector<std::string>{"eth", "ib"}));
  EXPECT_TRUE(prefix.matches("eth0"));
  EXPECT_TRUE(prefix.matches("ib1"));
  EXPECT_FALSE(prefix.matches("docker0"));

  NicSpec exact = parse_nic_spec("=eth0");
  EXPECT_TRUE(exact.exact);
  EXPECT_TRUE(exact.matches("eth0"));
  EXPECT_FALSE(exact.matches("eth01"));

  NicSpec exclude = parse_nic_spec("^docker,lo");
  EXPECT_TRUE(exclude.exclude);
  EXPECT_FALSE(exclude.matches("docker0"));
  EXPECT_FALSE(exclude.matches("lo"));
  EXPECT_TRUE(exclude.matches("eth0"));

  NicSpec exclude_exact = parse_nic_spec("^=docker0");
  EXPECT_TRUE(exclude_exact.exclude && exclude_exact.exact);
  EXPECT_FALSE(exclude_exact.matches("docker0"));
  EXPECT_TRUE(exclude_exact.matches("docker1"));
  EXPECT_EQ(exclude_exact.str(), "^=docker0");
}

TEST(NicSpec, RejectsEmptyNames) {
  EXPECT_THROW(parse_nic_spec(""), Error);
  EXPECT_THROW(parse_nic_spec("eth,"), Error);
  EXPECT_THROW(parse_nic_spec("^"), Error);
}

// A made-up two-NIC server with docker: management on eno1, fast network on ens5.
std::vector<NetworkInterface> machine() {
  return {{"lo", "127.0.0.1", false, true, true},
          {"eno1", "192.168.1.10", false, false, true},
          {"ens5", "10.0.0.1", false, false, true},
          {"docker0", "172.17.0.1", false, false, true},
          {"veth12ab", "169.254.3.3", false, false, true}};
}

auto routes(std::map<std::string, std::string> table) {
  return [table](const std::string& dest) -> std::optional<std::string> {
    auto it = table.find(dest);
    if (it == table.end()) return std::nullopt;
    return it->second;
  };
}

TEST(ChooseNic, PicksTheInterfaceThatRoutesToTheMaster) {
  NicChoice c = choose_nic({"10.0.0.5", "", ""}, machine(), routes({{"10.0.0.5", "10.0.0.1"}}));
  EXPECT_EQ(c.interface_name, "ens5");
  EXPECT_EQ(c.ip, "10.0.0.1");
  EXPECT_THAT(c.reason, HasSubstr("routes to the master 10.0.0.5"));
}

TEST(ChooseNic, NoRouteIsAClearError) {
  try {
    choose_nic({"10.9.9.9", "", ""}, machine(), routes({}));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("no interface routes to 10.9.9.9; check --master-addr or pass --nic"));
  }
}

TEST(ChooseNic, NeverAVirtualInterfaceForARemoteMaster) {
  try {
    choose_nic({"172.17.0.9", "", ""}, machine(), routes({{"172.17.0.9", "172.17.0.1"}}));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("goes through docker0"));
    EXPECT_THAT(e.what(), HasSubstr("pass --nic"));
  }
}

TEST(ChooseNic, LoopbackMasterUsesLo) {
  NicChoice c = choose_nic({"127.0.0.1", "", ""}, machine(), routes({{"127.0.0.1", "127.0.0.1"}}));
  EXPECT_EQ(c.interface_name, "lo");
}

TEST(ChooseNic, NicFlagOverridesTheRoute) {
  NicChoice c = choose_nic({"10.0.0.5", "eno", ""}, machine(), routes({{"10.0.0.5", "10.0.0.1"}}));
  EXPECT_EQ(c.interface_name, "eno1");
  NicChoice excluded = choose_nic({"10.0.0.5", "^lo,docker,veth,eno", ""}, machine(), routes({}));
  EXPECT_EQ(excluded.interface_name, "ens5");
}

TEST(ChooseNic, MissingInterfaceListsWhatExists) {
  try {
    choose_nic({"10.0.0.5", "eth9", ""}, machine(), routes({}));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("interface eth9 does not exist; interfaces here: lo (127.0.0.1), eno1"));
  }
}

TEST(ChooseNic, NodeIpAddressOverride) {
  NicChoice c = choose_nic({"10.0.0.5", "", "192.168.1.10"}, machine(), routes({{"10.0.0.5", "10.0.0.1"}}));
  EXPECT_EQ(c.interface_name, "eno1");
  EXPECT_EQ(c.ip, "192.168.1.10");
  EXPECT_THROW(choose_nic({"10.0.0.5", "", "10.1.1.1"}, machine(), routes({})), Error);
}

// The seeds' environment: the same machine with four fast ports enp1s0f0..3 (10.0.1.x).
std::vector<NetworkInterface> four_port_machine() {
  std::vector<NetworkInterface> m = machine();
  for (int i = 0; i < 4; ++i)
    m.push_back({"enp1s0f" + std::to_string(i), "10.0.1." + std::to_string(i + 1), false, false, true});
  return m;
}

NicRequest with_env(std::string master, std::string nic, std::string gloo, std::string nccl) {
  NicRequest r{std::move(master), std::move(nic), ""};
  r.gloo_socket_ifname = std::move(gloo);
  r.nccl_socket_ifname = std::move(nccl);
  return r;
}

TEST(NicUserEnv, GlooSocketIfnameChoosesTheControlInterface) {
  NicChoice c =
      choose_nic(with_env("10.0.1.9", "", "enp1s0f0", ""), four_port_machine(), routes({{"10.0.1.9", "10.0.1.1"}}));
  EXPECT_EQ(c.interface_name, "enp1s0f0");
  EXPECT_THAT(c.reason, HasSubstr("matches GLOO_SOCKET_IFNAME=enp1s0f0 (from the environment)"));
  ASSERT_EQ(c.notes.size(), 1u);
  EXPECT_EQ(c.notes[0], "GLOO_SOCKET_IFNAME=enp1s0f0 (set by the user) matches enp1s0f0");
}

TEST(NicUserEnv, AListWithAWrongEntryIsWarnedAbout) {
  NicChoice c = choose_nic(with_env("10.0.1.9", "", "", "enp1s0f0,enp1s0f1,ib7"), four_port_machine(),
                           routes({{"10.0.1.9", "10.0.1.1"}}));
  EXPECT_EQ(c.interface_name, "enp1s0f0");
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_THAT(c.warnings[0], HasSubstr("NCCL_SOCKET_IFNAME entry 'ib7' matches no interface on this node"));
  EXPECT_THAT(c.warnings[0], HasSubstr("NCCL ignores it"));
}

TEST(NicUserEnv, APrefixListStaysAListForNccl) {
  NicChoice c = choose_nic(with_env("10.0.1.9", "", "enp1s0f0", "enp1s0f"), four_port_machine(),
                           routes({{"10.0.1.9", "10.0.1.1"}}));
  EXPECT_EQ(c.interface_name, "enp1s0f0");
  ASSERT_EQ(c.notes.size(), 2u);
  EXPECT_EQ(c.notes[1],
            "NCCL_SOCKET_IFNAME=enp1s0f (set by the user) matches enp1s0f0, enp1s0f1, enp1s0f2, enp1s0f3; NCCL gets "
            "the whole list");
  // The user's value is left as it is for the ranks: never narrowed to the one control interface.
  auto user = [](const char* n) -> const char* { return std::string(n) == "NCCL_SOCKET_IFNAME" ? "enp1s0f" : nullptr; };
  auto env = nic_env_for_ranks(c, user);
  ASSERT_EQ(env.size(), 1u);
  EXPECT_EQ(env[0].first, "GLOO_SOCKET_IFNAME");
}

TEST(NicUserEnv, ContradictingNicFlagIsAnErrorNamingBoth) {
  try {
    choose_nic(with_env("10.0.1.9", "=ens5", "", "enp1s0f0"), four_port_machine(), routes({}));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("NCCL_SOCKET_IFNAME=enp1s0f0 (from the environment) contradicts --nic =ens5"));
    EXPECT_THAT(e.what(), HasSubstr("leaves out ens5 (10.0.0.1)"));
  }
}

TEST(NicUserEnv, ContradictingTheRouteToTheHeadIsAnErrorNamingBoth) {
  try {
    choose_nic(with_env("10.0.0.5", "", "eno1", ""), four_port_machine(), routes({{"10.0.0.5", "10.0.0.1"}}));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("GLOO_SOCKET_IFNAME=eno1 (from the environment) contradicts the route to the "
                                    "head 10.0.0.5, which leaves from ens5 (10.0.0.1)"));
  }
}

TEST(NicUserEnv, AValueMatchingNothingIsAnError) {
  EXPECT_THROW(choose_nic(with_env("10.0.0.5", "", "", "ib"), machine(), routes({})), Error);
}

TEST(NicEnv, SetsBothUnlessTheUserDid) {
  NicChoice c{"ens5", "10.0.0.1", ""};
  auto none = [](const char*) -> const char* { return nullptr; };
  auto env = nic_env_for_ranks(c, none);
  ASSERT_EQ(env.size(), 2u);
  EXPECT_EQ(env[0], (std::pair<std::string, std::string>{"NCCL_SOCKET_IFNAME", "=ens5"}));
  EXPECT_EQ(env[1], (std::pair<std::string, std::string>{"GLOO_SOCKET_IFNAME", "ens5"}));
  auto user_nccl = [](const char* n) -> const char* {
    return std::string(n) == "NCCL_SOCKET_IFNAME" ? "ib0" : nullptr;
  };
  env = nic_env_for_ranks(c, user_nccl);
  ASSERT_EQ(env.size(), 1u);
  EXPECT_EQ(env[0].first, "GLOO_SOCKET_IFNAME");
}

TEST(NicHost, RoutesToLoopbackAndListsInterfaces) {
  std::optional<std::string> src = route_source_address("127.0.0.1");
  ASSERT_TRUE(src.has_value());
  EXPECT_EQ(*src, "127.0.0.1");
  std::vector<NetworkInterface> here = list_interfaces();
  bool has_lo = false;
  for (const auto& i : here) has_lo |= i.is_loopback;
  EXPECT_TRUE(has_lo);
  EXPECT_EQ(choose_nic({"127.0.0.1", "", ""}).ip, "127.0.0.1");
}

}  // namespace
}  // namespace tessera::dist
