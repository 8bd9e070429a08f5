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
// `peer_port`: the peer API's port ("0": any free one).
inline std::unique_ptr<AgentProcess> StartFabricAgent(const TestHost& host, std::vector<std::string> flags = {},
                                                      const std::string& dir = "", const std::string& peer_port = "0") {
  flags.push_back("--peer_address=" + host.nics[0] + ":" + peer_port);
  flags.push_back("--fabric_iface=" + absl::StrJoin(host.nics, ","));
  flags.push_back("--fabric_provider=tcp;ofi_rxm");
  auto a = AgentProcess::Start(flags, dir, host.wrapper);
  INFO(a.status().ToString());
  REQUIRE(a.ok());
  return std::move(*a);
}

// The port of a running agent's peer API.
inline std::string PeerPort(const AgentProcess& agent) {
  const std::string address = agent.ready("peer_address");
  return address.substr(address.rfind(':') + 1);
}

// Kills `agent` outright and starts it again on the same host, socket and peer port (as
// a DaemonSet pod restarts), with `flags` as StartFabricAgent's.
inline void KillAndRestart(std::unique_ptr<AgentProcess>& agent, const TestHost& host,
                           std::vector<std::string> flags = {}) {
  const std::string dir = agent->dir();
  const std::string peer_port = PeerPort(*agent);
  agent->KeepDir();
  CHECK(agent->Stop(SIGKILL) == 128 + SIGKILL);
  agent.reset();
  agent = StartFabricAgent(host, std::move(flags), dir, peer_port);
}

}  // namespace ferry::testing

#endif  // FERRY_TESTS_TESTING_FABRIC_AGENT_H_
