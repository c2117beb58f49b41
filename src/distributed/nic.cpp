#include "distributed/nic.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "core/logging.h"

namespace tessera::dist {

namespace {

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

std::string describe_interfaces(const std::vector<NetworkInterface>& interfaces) {
  std::string out;
  for (const NetworkInterface& i : interfaces) {
    if (!out.empty()) out += ", ";
    out += fmt::format("{} ({}{})", i.name, i.ip, i.is_up ? "" : ", down");
  }
  return out.empty() ? "none" : out;
}

std::string address_to_string(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (sa->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf, sizeof buf);
  } else if (sa->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, buf, sizeof buf);
  }
  return buf;
}

const NetworkInterface* find_by_ip(const std::vector<NetworkInterface>& interfaces, const std::string& ip) {
  for (const NetworkInterface& i : interfaces)
    if (i.ip == ip) return &i;
  return nullptr;
}

}  // namespace

bool NicSpec::matches(const std::string& interface_name) const {
  bool hit = std::any_of(names.begin(), names.end(), [&](const std::string& n) {
    return exact ? interface_name == n : starts_with(interface_name, n);
  });
  return exclude ? !hit : hit;
}

std::string NicSpec::str() const {
  std::string out = std::string(exclude ? "^" : "") + (exact ? "=" : "");
  for (size_t i = 0; i < names.size(); ++i) out += (i ? "," : "") + names[i];
  return out;
}

NicSpec parse_nic_spec(const std::string& text) {
  NicSpec spec;
  std::string rest = text;
  if (starts_with(rest, "^")) {
    spec.exclude = true;
    rest.erase(0, 1);
  }
  if (starts_with(rest, "=")) {
    spec.exact = true;
    rest.erase(0, 1);
  }
  size_t start = 0;
  while (start <= rest.size()) {
    size_t comma = rest.find(',', start);
    if (comma == std::string::npos) comma = rest.size();
    std::string name = rest.substr(start, comma - start);
    if (name.empty())
      fail(ErrorKind::kInvalidArgument,
           "--nic '{}' has an empty interface name; write names like 'eth0', '=eth0', 'eth,ib' or '^docker,lo'", text);
    spec.names.push_back(name);
    start = comma + 1;
  }
  return spec;
}

std::vector<NetworkInterface> list_interfaces() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) fail(ErrorKind::kNetwork, "getifaddrs failed: {}", std::strerror(errno));
  std::vector<NetworkInterface> out;
  for (ifaddrs* a = list; a; a = a->ifa_next) {
    if (!a->ifa_addr || (a->ifa_addr->sa_family != AF_INET && a->ifa_addr->sa_family != AF_INET6)) continue;
    NetworkInterface nic;
    nic.name = a->ifa_name;
    nic.ip = address_to_string(a->ifa_addr);
    nic.is_ipv6 = a->ifa_addr->sa_family == AF_INET6;
    nic.is_loopback = (a->ifa_flags & IFF_LOOPBACK) != 0;
    nic.is_up = (a->ifa_flags & IFF_UP) != 0;
    // IPv6 link-local addresses need a scope id to be usable; no collective library takes them.
    if (nic.is_ipv6 && starts_with(nic.ip, "fe80")) continue;
    out.push_back(nic);
  }
  freeifaddrs(list);
  return out;
}

bool is_virtual_interface_name(const std::string& name) {
  static const char* kPrefixes[] = {"lo", "docker", "veth", "virbr", "br-", "cni", "flannel", "cali", "vxlan", "tun"};
  return std::any_of(std::begin(kPrefixes), std::end(kPrefixes), [&](const char* p) { return starts_with(name, p); });
}

bool is_loopback_address(const std::string& ip) { return starts_with(ip, "127.") || ip == "::1"; }

std::optional<std::string> route_source_address(const std::string& master_addr) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(master_addr.c_str(), "9", &hints, &res) != 0 || !res) return std::nullopt;
  std::optional<std::string> source;
  for (addrinfo* r = res; r && !source; r = r->ai_next) {
    int fd = socket(r->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    // connect() on a UDP socket only asks the kernel for a route; nothing is sent.
    if (connect(fd, r->ai_addr, r->ai_addrlen) == 0) {
      sockaddr_storage local{};
      socklen_t len = sizeof local;
      if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0)
        source = address_to_string(reinterpret_cast<sockaddr*>(&local));
    }
    close(fd);
  }
  freeaddrinfo(res);
  return source;
}

namespace {

NicChoice choose_nic_flags(const NicRequest& request, const std::vector<NetworkInterface>& interfaces,
                           const std::function<std::optional<std::string>(const std::string&)>& route_source) {
  std::optional<std::string> source = request.master_addr.empty() ? std::nullopt : route_source(request.master_addr);
  bool master_is_local_loopback = is_loopback_address(request.master_addr) || request.master_addr == "localhost";

  if (!request.nic.empty()) {
    NicSpec spec = parse_nic_spec(request.nic);
    std::vector<const NetworkInterface*> candidates;
    for (const NetworkInterface& i : interfaces) {
      if (!spec.matches(i.name) || !i.is_up) continue;
      if (!request.node_ip_address.empty() && i.ip != request.node_ip_address) continue;
      candidates.push_back(&i);
    }
    if (candidates.empty()) {
      if (!spec.exclude && spec.names.size() == 1)
        fail(ErrorKind::kInvalidArgument, "interface {} does not exist{}; interfaces here: {}", spec.names[0],
             request.node_ip_address.empty() ? "" : " with address " + request.node_ip_address,
             describe_interfaces(interfaces));
      fail(ErrorKind::kInvalidArgument, "no interface matches --nic '{}'; interfaces here: {}", request.nic,
           describe_interfaces(interfaces));
    }
    // Among the matching ones: the one that routes to the master, then IPv4 over IPv6.
    const NetworkInterface* pick = nullptr;
    for (const NetworkInterface* c : candidates)
      if (source && c->ip == *source) pick = c;
    if (!pick)
      for (const NetworkInterface* c : candidates)
        if (!pick && !c->is_ipv6) pick = c;
    if (!pick) pick = candidates.front();
    return {pick->name, pick->ip, fmt::format("matches --nic '{}'", request.nic)};
  }

  if (!request.node_ip_address.empty()) {
    const NetworkInterface* owner = find_by_ip(interfaces, request.node_ip_address);
    if (!owner)
      fail(ErrorKind::kInvalidArgument, "--node-ip-address {} is not an address of this machine; addresses here: {}",
           request.node_ip_address, describe_interfaces(interfaces));
    return {owner->name, owner->ip, "owns --node-ip-address"};
  }

  if (request.master_addr.empty())
    fail(ErrorKind::kInvalidArgument, "no master address to route to; pass --master-addr");
  if (!source)
    fail(ErrorKind::kNetwork, "no interface routes to {}; check --master-addr or pass --nic (interfaces here: {})",
         request.master_addr, describe_interfaces(interfaces));
  const NetworkInterface* owner = find_by_ip(interfaces, *source);
  if (!owner)
    fail(ErrorKind::kNetwork,
         "the route to {} leaves from {}, which no interface here owns; pass --nic (interfaces: {})",
         request.master_addr, *source, describe_interfaces(interfaces));
  bool master_is_this_host = master_is_local_loopback || find_by_ip(interfaces, request.master_addr) != nullptr;
  if (!master_is_this_host && (owner->is_loopback || is_virtual_interface_name(owner->name)))
    fail(ErrorKind::kNetwork,
         "the route to {} goes through {} ({}), a virtual or loopback interface; pass --nic with the physical one "
         "(interfaces here: {})",
         request.master_addr, owner->name, owner->ip, describe_interfaces(interfaces));
  return {owner->name, owner->ip, fmt::format("routes to the master {}", request.master_addr)};
}

// A user's *_SOCKET_IFNAME as a spec: GLOO's is a list of exact names (torch), NCCL's has NCCL's syntax.
struct EnvSpec {
  const char* name;
  std::string value;
  NicSpec spec;
};

std::vector<EnvSpec> env_specs(const NicRequest& r) {
  std::vector<EnvSpec> out;
  if (!r.gloo_socket_ifname.empty()) {
    NicSpec s = parse_nic_spec(r.gloo_socket_ifname);
    if (!s.exclude) s.exact = true;  // torch compares GLOO_SOCKET_IFNAME entries as whole names
    out.push_back({"GLOO_SOCKET_IFNAME", r.gloo_socket_ifname, s});
  }
  if (!r.nccl_socket_ifname.empty())
    out.push_back({"NCCL_SOCKET_IFNAME", r.nccl_socket_ifname, parse_nic_spec(r.nccl_socket_ifname)});
  return out;
}

std::vector<std::string> matching_names(const NicSpec& spec, const std::vector<NetworkInterface>& interfaces) {
  std::vector<std::string> out;
  for (const NetworkInterface& i : interfaces)
    if (spec.matches(i.name) && std::find(out.begin(), out.end(), i.name) == out.end()) out.push_back(i.name);
  std::sort(out.begin(), out.end());
  return out;
}

std::string join_names(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& n : v) s += (s.empty() ? "" : ", ") + n;
  return s.empty() ? "none" : s;
}

}  // namespace

NicChoice choose_nic(const NicRequest& request, const std::vector<NetworkInterface>& interfaces,
                     const std::function<std::optional<std::string>(const std::string&)>& route_source) {
  std::vector<EnvSpec> envs = env_specs(request);
  std::vector<std::string> notes, warnings;
  for (const EnvSpec& e : envs) {
    std::vector<std::string> hits = matching_names(e.spec, interfaces);
    if (hits.empty())
      fail(ErrorKind::kInvalidArgument, "{}={} (from the environment) matches no interface here ({}); fix or unset it",
           e.name, e.value, describe_interfaces(interfaces));
    if (!e.spec.exclude)
      for (const std::string& entry : e.spec.names) {
        NicSpec one{false, e.spec.exact, {entry}};
        if (matching_names(one, interfaces).empty())
          warnings.push_back(fmt::format(
              "{} entry '{}' matches no interface on this node (interfaces: {}); {} ignores it", e.name, entry,
              describe_interfaces(interfaces), std::string(e.name) == "NCCL_SOCKET_IFNAME" ? "NCCL" : "Gloo"));
      }
    notes.push_back(fmt::format(
        "{}={} (set by the user) matches {}{}", e.name, e.value, join_names(hits),
        std::string(e.name) == "NCCL_SOCKET_IFNAME" && hits.size() > 1 ? "; NCCL gets the whole list" : ""));
  }
  NicChoice choice;
  if (request.nic.empty() && !envs.empty()) {
    // The user's environment chooses, as it would for NCCL and Gloo; it must agree with the route.
    NicRequest r = request;
    r.nic = envs.front().spec.str();
    choice = choose_nic_flags(r, interfaces, route_source);
    choice.reason = fmt::format("matches {}={} (from the environment)", envs.front().name, envs.front().value);
    std::optional<std::string> source = request.master_addr.empty() || !request.node_ip_address.empty()
                                            ? std::nullopt
                                            : route_source(request.master_addr);
    const NetworkInterface* via = source ? find_by_ip(interfaces, *source) : nullptr;
    bool master_here = is_loopback_address(request.master_addr) || request.master_addr == "localhost" ||
                       find_by_ip(interfaces, request.master_addr) != nullptr;
    if (via && !master_here && via->ip != choice.ip)
      fail(ErrorKind::kInvalidArgument,
           "{}={} (from the environment) contradicts the route to the head {}, which leaves from {} ({}); set {} to "
           "{}, or pass --nic to choose the interface",
           envs.front().name, envs.front().value, request.master_addr, via->name, via->ip, envs.front().name,
           via->name);
  } else {
    choice = choose_nic_flags(request, interfaces, route_source);
  }
  for (const EnvSpec& e : envs)
    if (!e.spec.matches(choice.interface_name))
      fail(ErrorKind::kInvalidArgument,
           "{}={} (from the environment) contradicts {}: it leaves out {} ({}), which {}; make them agree or unset {}",
           e.name, e.value,
           request.nic.empty() ? "the interface chosen for the control channel" : "--nic " + request.nic,
           choice.interface_name, choice.ip, choice.reason, e.name);
  choice.notes = std::move(notes);
  choice.warnings = std::move(warnings);
  return choice;
}

NicChoice choose_nic(const NicRequest& request) {
  NicRequest r = request;
  auto env = [](const char* n) -> std::string {
    const char* v = std::getenv(n);
    return v ? v : "";
  };
  if (r.gloo_socket_ifname.empty()) r.gloo_socket_ifname = env("GLOO_SOCKET_IFNAME");
  if (r.nccl_socket_ifname.empty()) r.nccl_socket_ifname = env("NCCL_SOCKET_IFNAME");
  return choose_nic(r, list_interfaces(), route_source_address);
}

std::vector<std::pair<std::string, std::string>> nic_env_for_ranks(
    const NicChoice& choice, const std::function<const char*(const char*)>& getenv_fn) {
  std::vector<std::pair<std::string, std::string>> out;
  const std::pair<const char*, std::string> wanted[] = {
      {"NCCL_SOCKET_IFNAME", "=" + choice.interface_name},  // exact: "eth0" alone would also match eth01
      {"GLOO_SOCKET_IFNAME", choice.interface_name},
  };
  for (const auto& [name, value] : wanted) {
    const char* existing = getenv_fn(name);
    if (existing && *existing) continue;  // the user's setting wins
    out.emplace_back(name, value);
  }
  return out;
}

void apply_nic_env(const NicChoice& choice) {
  for (const auto& [name, value] : nic_env_for_ranks(choice, [](const char* n) { return std::getenv(n); })) {
    setenv(name.c_str(), value.c_str(), 0);
  }
  for (const std::string& n : choice.notes) TLOG_INFO("{}", n);
  for (const std::string& w : choice.warnings) TLOG_WARN("{}", w);
  TLOG_INFO("network interface {} ({}): {}; NCCL_SOCKET_IFNAME={} GLOO_SOCKET_IFNAME={}", choice.interface_name,
            choice.ip, choice.reason, std::getenv("NCCL_SOCKET_IFNAME") ? std::getenv("NCCL_SOCKET_IFNAME") : "",
            std::getenv("GLOO_SOCKET_IFNAME") ? std::getenv("GLOO_SOCKET_IFNAME") : "");
}

}  // namespace tessera::dist
