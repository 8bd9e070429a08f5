// ferryd started as the DRA profile starts it: --claimed_devices names the file the
// init container wrote and no --fabric_iface. The claimed NIC (here the loopback device,
// as a claim of the test's would name it) becomes the fabric NIC, with the claim's PCIe
// root and NUMA node in GetTopology, its worker on that node's cores within the process's
// own cpuset (`taskset`, as a dra.cpu claim narrows a container's); a claim with no NIC,
// or no file, stops the agent at start saying which setting to change.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "agent/topology/cpu_list.h"
#include "client/cpp/ferry_client.h"
#include "tests/testing/agent_process.h"

namespace ferry {
namespace {

using testing::AgentProcess;

std::string WriteClaim(const std::string& dir, const std::string& attributes) {
  const std::string path = dir + "/claimed-devices.json";
  std::ofstream(path) << R"({"pod": "ferry/ferry-x7k2p", "node": "node-a", "devices": [
    {"claim": "nics", "request": "nics", "driver": "dra.net", "pool": "node-a", "device": "pci-0000-91-00-0",
     "attributes": )" << attributes
                      << "}]}";
  return path;
}

TEST_CASE("the agent takes its fabric NIC and the NIC's place from its DRA claim", "[dra]") {
  const std::string dir = testing::MakeTempDir("fy.dra");
  const std::string claim = WriteClaim(dir, R"({
      "dra.net/ifName": {"string": "lo"}, "dra.net/rdma": {"bool": true},
      "dra.net/numaNode": {"int": 0}, "resource.kubernetes.io/pcieRoot": {"string": "pci0000:8c"}})");
  // The agent may use CPU 0 alone: its NIC worker stays there though NUMA node 0 has more.
  auto agent = AgentProcess::Start({"--claimed_devices=" + claim, "--peer_address=127.0.0.1:0"}, "",
                                   {"/usr/bin/taskset", "-c", "0"});
  INFO((agent.ok() ? std::string() : agent.status().ToString()));
  REQUIRE(agent.ok());
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect((*agent)->socket());
  REQUIRE(client.ok());
  absl::StatusOr<v1::GetTopologyResponse> topology = (*client)->GetTopology();
  REQUIRE(topology.ok());
  REQUIRE(topology->nics_size() == 1);
  const v1::NicInfo& nic = topology->nics(0);
  CHECK(nic.netdev() == "lo");
  CHECK(nic.claimed_device() == "dra.net/node-a/pci-0000-91-00-0");
  CHECK(nic.pcie_root() == "pci0000:8c");
  CHECK(nic.numa_node() == 0);
  CHECK(absl::StartsWith(nic.fabric_address(), "fi_sockaddr_in://127.0.0.1:"));
  // NUMA node 0 of this machine's sysfs holds CPU 0: pinned there, and nowhere else.
  if (!ProcessCpus(0).empty() && ProcessCpus(0)[0] == 0)
    CHECK(FormatCpuList({nic.cpus().begin(), nic.cpus().end()}) == "0");
  CHECK(absl::StrContains((*agent)->Log(), "claimed NIC lo (dra.net/node-a/pci-0000-91-00-0)"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("a claim the agent cannot use stops it at start, naming the setting", "[dra]") {
  const std::string dir = testing::MakeTempDir("fy.dra");
  SECTION("no device of the claim names a NIC") {
    const std::string claim = WriteClaim(dir, R"({"dra.net/numaNode": {"int": 0}})");
    auto agent = AgentProcess::Start({"--claimed_devices=" + claim, "--peer_address=127.0.0.1:0"});
    REQUIRE_FALSE(agent.ok());
    CHECK(absl::StrContains(agent.status().message(), "--claimed_devices"));
    CHECK(absl::StrContains(agent.status().message(), "dra.deviceClassName"));
  }
  SECTION("no file") {
    auto agent = AgentProcess::Start({"--claimed_devices=" + dir + "/none.json", "--peer_address=127.0.0.1:0"});
    REQUIRE_FALSE(agent.ok());
    CHECK(absl::StrContains(agent.status().message(), "--claimed_devices: cannot read"));
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ferry
