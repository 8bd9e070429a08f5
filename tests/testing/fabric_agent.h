// StartFabricAgent: a real ferryd with the fabric on a test host's NICs (tcp;ofi_rxm),
// run through the host's wrapper (its network namespace, if any); REQUIREs that it
// becomes ready.
//
//   TestNetwork net = TestNetwork::Create(2, 1);
//   auto a = StartFabricAgent(net.host(0), {"--fabric_tx_size=4"});
#ifndef FERRY_TESTS_TESTING_FABRIC_AGENT_H_
#define FERRY_TESTS_TESTING_FABRIC_AGENT_H_

#include <catch2/catch.hpp>
#include <csignal>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "tests/testing/agent_process.h"
#include "tests/testing/netns.h"

namespace ferry::testing {

// `dir`: reuse a directory (to restart on the same socket); empty = a new one.
inline std::unique_ptr<AgentProcess> StartFabricAgent(const TestHost& host, std::vector<std::string> flags = {},
                                                      const std::string& dir = "") {
  flags.push_back("--peer_address=" + host.nics[0] + ":0");
  flags.push_back("--fabric_iface=" + absl::StrJoin(host.nics, ","));
  flags.push_back("--fabric_provider=tcp;ofi_rxm");
  auto a = AgentProcess::Start(flags, dir, host.wrapper);
  INFO(a.status().ToString());
  REQUIRE(a.ok());
  return std::move(*a);
}

// Kills `agent` outright and starts it again on the same host, socket and peer port (as
// a DaemonSet pod restarts), with `flags` as StartFabricAgent's.
inline void KillAndRestart(std::unique_ptr<AgentProcess>& agent, const TestHost& host,
                           std::vector<std::string> flags = {}) {
  const std::string dir = agent->dir();
  const std::string peer_address = agent->ready("peer_address");
  const std::string peer_port = peer_address.substr(peer_address.rfind(':') + 1);
  agent->KeepDir();
  CHECK(agent->Stop(SIGKILL) == 128 + SIGKILL);
  agent.reset();
  flags.push_back("--peer_address=" + host.nics[0] + ":" + peer_port);
  flags.push_back("--fabric_iface=" + absl::StrJoin(host.nics, ","));
  flags.push_back("--fabric_provider=tcp;ofi_rxm");
  auto restarted = AgentProcess::Start(flags, dir, host.wrapper);
  INFO(restarted.status().ToString());
  REQUIRE(restarted.ok());
  agent = std::move(*restarted);
}

}  // namespace ferry::testing

#endif  // FERRY_TESTS_TESTING_FABRIC_AGENT_H_
