#include "tests/testing/netns.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace ferry::testing {

int RunCommand(const std::string& command, int timeout_seconds) {
  std::string cmd = absl::StrCat("timeout ", timeout_seconds, " sh -c '", command, "' >/dev/null 2>&1");
  int rc = system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

TestNetwork TestNetwork::Create(int hosts, int nics_per_host) {
  TestNetwork net;
  const std::string tag = absl::StrCat("fy", getpid() % 100000);
  bool ok = geteuid() == 0 && RunCommand("command -v ip") == 0;
  if (ok) {
    net.hub_ = tag + "hub";
    std::string script = absl::StrCat("set -e; ip netns add ", net.hub_, "; ip -n ", net.hub_, " link set lo up;");
    for (int n = 0; n < nics_per_host; ++n) {
      absl::StrAppend(&script, "ip -n ", net.hub_, " link add br", n, " type bridge; ip -n ", net.hub_, " link set br",
                      n, " up;");
    }
    for (int h = 0; h < hosts; ++h) {
      const std::string ns = absl::StrCat(tag, "h", h);
      absl::StrAppend(&script, "ip netns add ", ns, "; ip -n ", ns, " link set lo up;");
      for (int n = 0; n < nics_per_host; ++n) {
        const std::string inner = absl::StrCat("eth", n), outer = absl::StrCat(tag, "h", h, "n", n);
        const std::string addr = absl::StrCat("169.254.", 77 + n, ".", h + 1);
        absl::StrAppend(&script, "ip link add ", outer, " netns ", net.hub_, " type veth peer name ", inner, " netns ",
                        ns, ";", "ip -n ", net.hub_, " link set ", outer, " master br", n, " up;", "ip -n ", ns,
                        " addr add ", addr, "/24 dev ", inner, "; ip -n ", ns, " link set ", inner, " up;");
      }
    }
    ok = RunCommand(script, 30) == 0;
    if (!ok) net.Teardown(hosts);
  }
  for (int h = 0; h < hosts; ++h) {
    TestHost host;
    for (int n = 0; n < nics_per_host; ++n) {
      host.nics.push_back(ok ? absl::StrCat("169.254.", 77 + n, ".", h + 1) : absl::StrCat("127.0.", n, ".", h + 1));
    }
    if (ok) {
      host.ns = absl::StrCat(tag, "h", h);
      host.wrapper = {"/usr/bin/env", "ip", "netns", "exec", host.ns};
    }
    net.hosts_.push_back(host);
  }
  net.description_ = ok ? absl::StrCat(hosts, " hosts in network namespaces, ", nics_per_host,
                                       " veth NIC(s) each, bridged in namespace ", net.hub_)
                        : absl::StrCat(hosts,
                                       " hosts on loopback with distinct 127.0.<nic>.<host> addresses "
                                       "(no root or no iproute2: network namespaces unavailable)");
  fprintf(stderr, "test network: %s\n", net.description_.c_str());
  return net;
}

bool TestNetwork::SetLink(int i, int nic, bool up) {
  if (hub_.empty()) return false;
  return RunCommand(absl::StrCat("ip -n ", hosts_[i].ns, " link set eth", nic, up ? " up" : " down")) == 0;
}

void TestNetwork::Teardown(int hosts) {
  if (hub_.empty()) return;
  const std::string tag = hub_.substr(0, hub_.size() - 3);
  for (int h = 0; h < hosts; ++h) RunCommand(absl::StrCat("ip netns del ", tag, "h", h));
  RunCommand("ip netns del " + hub_);
  hub_.clear();
}

TestNetwork::~TestNetwork() { Teardown(static_cast<int>(hosts_.size())); }

}  // namespace ferry::testing
