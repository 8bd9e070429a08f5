// Rails end to end: two real agents in network namespaces, each with two stand-in tcp
// NICs (veth eth0, eth1) that a fake sysfs tree places on NUMA nodes 0 and 1. A host
// region is written over the NICs of its client's NUMA node only (per-NIC byte
// counters), each NIC's worker is pinned to its node's cores, and GetTopology reports
// the GPU x NIC links and rails.
#include <sched.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "agent/topology/cpu_list.h"
#include "tests/testing/agent_process.h"
#include "tests/testing/fabric_agent.h"
#include "tests/testing/fake_sysfs.h"
#include "tests/testing/netns.h"
#include "tests/testing/test_pod.h"

namespace ferry {
namespace {

using testing::ChunkWrite;
using testing::FillRandom;
using testing::MakePod;
using testing::StartFabricAgent;
using testing::TestNetwork;
using testing::TestPod;

void PinSelf(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  REQUIRE(sched_setaffinity(0, sizeof(set), &set) == 0);
}

// Bytes each NIC of `pod`'s agent sent so far.
std::vector<uint64_t> TxBytes(TestPod& pod) {
  auto s = pod.client->GetStatus();
  REQUIRE(s.ok());
  std::vector<uint64_t> out;
  for (const auto& n : s->nics()) out.push_back(n.tx_bytes());
  return out;
}

TEST_CASE("host regions go over their client's NUMA node's NICs; workers pinned; GetTopology shows the rails") {
  const std::vector<int> cpus = ProcessCpus(0);
  if (cpus.size() < 2) {
    WARN("SKIPPED: needs 2 CPUs to stand in for 2 NUMA nodes, this process may use " << cpus.size());
    return;
  }
  TestNetwork net = TestNetwork::Create(2, 2);
  if (!net.namespaces()) {
    WARN("SKIPPED: needs network namespaces (root and iproute2) so each stand-in NIC has its own netdev");
    return;
  }
  // NUMA node 0 is the first CPU, node 1 the rest. eth1 shares a PCIe switch with a GPU.
  const std::vector<int> node0 = {cpus[0]}, node1(cpus.begin() + 1, cpus.end());
  const std::string root = testing::MakeTempDir("sysfs");
  const std::string spec =
      absl::StrCat("node 0 ", FormatCpuList(node0), "\nnode 1 ", FormatCpuList(node1),
                   "\nnet eth0 pci0000:10/0000:10:01.0/0000:11:00.0 numa 0"
                   "\nnet eth1 pci0000:20/0000:20:01.0/0000:21:00.0/0000:22:01.0/0000:23:00.0 numa 1"
                   "\ngpu pci0000:20/0000:20:01.0/0000:21:00.0/0000:22:00.0/0000:24:00.0 numa 1\n");
  REQUIRE(testing::WriteFakeSysfs(spec, root).ok());
  auto a = StartFabricAgent(net.host(0), {"--sysfs_root=" + root, "--fabric_max_op_bytes=1048576"});
  auto b = StartFabricAgent(net.host(1));

  const uint64_t kSize = 8 << 20;
  TestPod receiver = MakePod(b->socket(), kSize, 0);
  struct Case {
    const char* what;
    std::vector<int> pin;
    std::vector<uint64_t> want;  // bytes per NIC
  } cases[] = {
      {"client on NUMA node 1", node1, {0, kSize}},
      {"client on NUMA node 0", node0, {kSize, 0}},
      {"client spread over both nodes", cpus, {kSize / 2, kSize / 2}},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    PinSelf(c.pin);  // the agent reads it from /proc/<pid>/status at RegisterMemory
    TestPod sender = MakePod(a->socket(), kSize, 0);
    FillRandom(sender.buf->data(), kSize, 7);
    const std::vector<uint64_t> before = TxBytes(sender);
    REQUIRE(
        sender.client->WriteAndWait(ChunkWrite(sender, receiver.reg.region(), 0, 0, kSize), absl::Seconds(60)).ok());
    CHECK(memcmp(receiver.buf->data(), sender.buf->data(), kSize) == 0);
    const std::vector<uint64_t> after = TxBytes(sender);
    REQUIRE(after.size() == 2);
    CHECK(after[0] - before[0] == c.want[0]);
    CHECK(after[1] - before[1] == c.want[1]);
  }
  PinSelf(cpus);

  TestPod probe = MakePod(a->socket(), 4096, 0);
  auto status = probe.client->GetStatus();
  REQUIRE(status.ok());
  REQUIRE(status->nics_size() == 2);
  CHECK(std::vector<int>(status->nics(0).cpus().begin(), status->nics(0).cpus().end()) == node0);
  CHECK(std::vector<int>(status->nics(1).cpus().begin(), status->nics(1).cpus().end()) == node1);
  CHECK(status->nics(0).device() == "eth0");
  CHECK(status->nics(1).numa_node() == 1);

  auto topo = probe.client->GetTopology();
  REQUIRE(topo.ok());
  REQUIRE(topo->gpus_size() == 1);
  REQUIRE(topo->nics_size() == 2);  // both are the fabric's
  CHECK(topo->nics(1).name() == "nic1");
  CHECK(topo->nics(1).pcie_root() == "pci0000:20");
  CHECK(topo->gpus(0).pcie_root() == "pci0000:20");
  CHECK(std::vector<std::string>(topo->gpus(0).nic_links().begin(), topo->gpus(0).nic_links().end()) ==
        std::vector<std::string>{"SYS", "PIX"});
  REQUIRE(topo->rails_size() == 1);
  CHECK(std::vector<std::string>(topo->rails(0).nics().begin(), topo->rails(0).nics().end()) ==
        std::vector<std::string>{"nic1"});
  CHECK(topo->rails(0).link() == "PIX");
  REQUIRE(topo->numa_nodes_size() == 2);
  CHECK(std::vector<std::string>(topo->numa_nodes(0).nics().begin(), topo->numa_nodes(0).nics().end()) ==
        std::vector<std::string>{"nic0"});
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace ferry
