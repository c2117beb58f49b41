// Which network interface a node uses for the control channel, Gloo and NCCL.
//
// The seeds' most common multi-node failure is traffic on the wrong NIC (docker0, a
// management port, 127.0.0.1). The rule here: the interface that routes to the master
// address, never a virtual one when the master is remote; `--nic` overrides it with
// NCCL_SOCKET_IFNAME syntax, `--node-ip-address` pins the address.
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tessera::dist {

// NCCL_SOCKET_IFNAME syntax: "eth,ib" (prefixes), "=eth0" (exact names), "^docker,lo"
// (exclude prefixes), "^=docker0" (exclude exact names).
struct NicSpec {
  bool exclude = false;
  bool exact = false;
  std::vector<std::string> names;
  bool matches(const std::string& interface_name) const;
  std::string str() const;  // the spec as the user would write it
};
NicSpec parse_nic_spec(const std::string& text);  // throws Error(kInvalidArgument) on empty names

struct NetworkInterface {
  std::string name;
  std::string ip;  // numeric, IPv4 or IPv6
  bool is_ipv6 = false;
  bool is_loopback = false;
  bool is_up = false;
};
// Every address of every interface (getifaddrs), in kernel order.
std::vector<NetworkInterface> list_interfaces();
// lo, docker*, veth*, virbr*, br-*, cni*, flannel*, cali*: never chosen automatically for a remote master.
bool is_virtual_interface_name(const std::string& name);
bool is_loopback_address(const std::string& ip);

struct NicRequest {
  std::string master_addr;      // numeric IP or host name of the head
  std::string nic;              // --nic (NCCL_SOCKET_IFNAME syntax); empty = automatic
  std::string node_ip_address;  // --node-ip-address; empty = the chosen interface's address
  // The user's GLOO_SOCKET_IFNAME (exact names, comma list, as torch reads it) and
  // NCCL_SOCKET_IFNAME (NCCL syntax). Without --nic they choose the interface (GLOO's
  // first); either one that leaves out the interface --nic or the route to the master
  // picks is an error naming both. choose_nic(request) fills them from the environment.
  std::string gloo_socket_ifname{};
  std::string nccl_socket_ifname{};
};

struct NicChoice {
  std::string interface_name;
  std::string ip;
  std::string reason;                   // why this one, for the startup log line
  std::vector<std::string> notes{};     // what the user's *_SOCKET_IFNAME matched here (logged)
  std::vector<std::string> warnings{};  // entries of it that match no interface (logged)
};

// Local source address the kernel would use to reach `master_addr` (UDP connect, no packet sent).
// nullopt when no route exists. Host names are resolved first.
std::optional<std::string> route_source_address(const std::string& master_addr);

// Picks the interface. `interfaces` and `route_source` are parameters so tests can supply a
// made-up machine; the defaults use this host's.
NicChoice choose_nic(const NicRequest& request, const std::vector<NetworkInterface>& interfaces,
                     const std::function<std::optional<std::string>(const std::string&)>& route_source);
NicChoice choose_nic(const NicRequest& request);

// NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME (exact-match form) for the ranks, skipping any the user set.
std::vector<std::pair<std::string, std::string>> nic_env_for_ranks(
    const NicChoice& choice, const std::function<const char*(const char*)>& getenv_fn);
// Applies nic_env_for_ranks to this process (setenv without overwrite) and logs the choice,
// its notes and warnings.
void apply_nic_env(const NicChoice& choice);

}  // namespace tessera::dist
