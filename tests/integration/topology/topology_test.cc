// Topology discovery and rails on fake sysfs trees of real machine shapes.
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include "absl/strings/str_cat.h"
#include "agent/topology/cpu_list.h"
#include "agent/topology/memory_node.h"
#include "agent/topology/rails.h"
#include "agent/topology/topology.h"
#include "tests/testing/agent_process.h"
#include "tests/testing/fake_sysfs.h"

namespace ferry {
namespace {

Topology Load(const std::string& fixture) {
  const char* srcdir = getenv("TEST_SRCDIR");
  const std::string spec =
      absl::StrCat(srcdir != nullptr ? absl::StrCat(srcdir, "/ferry/") : "", "tests/topology/fixtures/", fixture);
  const std::string root = testing::MakeTempDir("sysfs");
  REQUIRE(!root.empty());
  absl::Status s = testing::WriteFakeSysfsFromFile(spec, root);
  INFO(s.ToString());
  REQUIRE(s.ok());
  absl::StatusOr<Topology> t = DiscoverTopology(root);
  REQUIRE(t.ok());
  std::filesystem::remove_all(root);
  return *t;
}

// The fabric NICs as the agent would have them: every RDMA device of the box.
std::vector<const NicDevice*> RdmaNics(const Topology& t) {
  std::vector<const NicDevice*> out;
  for (const NicDevice& n : t.nics) {
    if (!n.rdma_device.empty()) out.push_back(&n);
  }
  return out;
}

std::vector<int> Cpus(const char* list) { return *ParseCpuList(list); }

TEST_CASE("cpu lists parse and print") {
  CHECK(*ParseCpuList("0-3,8,10-11") == std::vector<int>{0, 1, 2, 3, 8, 10, 11});
  CHECK(*ParseCpuList(" 5\n") == std::vector<int>{5});
  CHECK(ParseCpuList("")->empty());
  CHECK(FormatCpuList({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11");
  CHECK(FormatCpuList({}) == "");
  for (const char* bad : {"3-1", "a", "1-", "-1", "0-70000", "1,,x"}) {
    INFO(bad);
    CHECK(!ParseCpuList(bad).ok());
  }
}

TEST_CASE("a3-ultragpu-8g: each GPU has its own NIC on its switch") {
  Topology t = Load("a3-ultragpu-8g.sysfs");
  REQUIRE(t.numa_nodes.size() == 2);
  CHECK(t.numa_nodes[0].cpus == Cpus("0-55,112-167"));
  CHECK(t.numa_nodes[1].cpus.size() == 112);
  REQUIRE(t.gpus.size() == 8);
  REQUIRE(t.nics.size() == 9);  // 8 RDMA NICs and the gVNIC
  // The values the DRA ResourceSlices and NCCL's device list in the context documents show.
  const char* gpu_bus[] = {"8f", "90", "96", "97", "c4", "c5", "cb", "cc"};
  for (int g = 0; g < 8; ++g) CHECK(t.gpus[g].pci.address == absl::StrCat("0000:", gpu_bus[g], ":00.0"));
  CHECK(t.gpus[0].pci.pcie_root == "pci0000:8c");
  CHECK(t.gpus[0].name == "10de:2335");
  const NicDevice* nic0 = t.FindNic("gpu0rdma0");
  REQUIRE(nic0 != nullptr);
  CHECK(nic0->rdma_device == "mlx5_0");
  CHECK(nic0->pci.address == "0000:91:00.0");
  CHECK(nic0->pci.pcie_root == "pci0000:8c");
  CHECK(t.FindNic("gpu6rdma0")->pci.address == "0000:cd:00.0");
  CHECK(t.FindNic("gpu6rdma0")->pci.pcie_root == "pci0000:c8");
  CHECK(t.FindNic("gpu6rdma0")->pci.numa_node == 1);
  CHECK(t.FindNic("eth0")->rdma_device.empty());

  std::vector<const NicDevice*> nics = RdmaNics(t);
  REQUIRE(nics.size() == 8);
  RailPlan plan = PlanRails(t, nics);
  for (int g = 0; g < 8; ++g) {
    INFO("gpu " << g);
    const GpuRail& rail = plan.gpu_rails[g];
    CHECK(rail.nics == std::vector<int>{g});
    CHECK(nics[g]->netdev == absl::StrCat("gpu", g, "rdma0"));
    CHECK(rail.link == Link::kPix);
    CHECK(rail.cpus == (g < 4 ? Cpus("0-55,112-167") : Cpus("56-111,168-223")));
    CHECK(plan.nic_cpus[g] == rail.cpus);
    // Its switch's other NIC is as near (PIX), but belongs to the other GPU of the pair;
    // the rest are on the same NUMA node (NODE) or across (SYS).
    for (int n = 0; n < 8; ++n) {
      const Link want = n / 2 == g / 2 ? Link::kPix : ((n < 4) == (g < 4) ? Link::kNode : Link::kSys);
      CHECK(Classify(t.gpus[g].pci, nics[n]->pci) == want);
    }
  }
  CHECK(plan.numa_nics.at(0) == std::vector<int>{0, 1, 2, 3});
  CHECK(plan.numa_nics.at(1) == std::vector<int>{4, 5, 6, 7});
  CHECK(plan.NicsFor({"0000:CB:00.0", -1}) == std::vector<int>{6});  // CUDA's upper case
  CHECK(plan.NicsFor({"", 1}) == std::vector<int>{4, 5, 6, 7});
  CHECK(plan.NicsFor({}) == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7});
  CHECK(plan.NicsFor({"0000:ff:00.0", 0}) == std::vector<int>{0, 1, 2, 3});  // not a GPU here

  // With only the first NIC of each pair in use, both GPUs of a pair share it; with a
  // single NIC on the node, every GPU's rail is that NIC.
  RailPlan half = PlanRails(t, {nics[0], nics[2], nics[4], nics[6]});
  for (int g = 0; g < 8; ++g) CHECK(half.gpu_rails[g].nics == std::vector<int>{g / 2});
  RailPlan one = PlanRails(t, {nics[5]});
  for (int g = 0; g < 8; ++g) CHECK(one.gpu_rails[g].nics == std::vector<int>{0});
}

TEST_CASE("p5.48xlarge: four EFA devices per GPU, behind its switch") {
  Topology t = Load("p5.48xlarge.sysfs");
  REQUIRE(t.gpus.size() == 8);
  std::vector<const NicDevice*> nics = RdmaNics(t);
  REQUIRE(nics.size() == 32);
  for (const NicDevice* n : nics) CHECK(n->netdev.empty());  // EFA has no netdev
  CHECK(t.FindNic("rdmap20s0-rdm") == nics[0]);              // libfabric's efa domain name
  RailPlan plan = PlanRails(t, nics);
  for (int g = 0; g < 8; ++g) {
    INFO("gpu " << g);
    const GpuRail& rail = plan.gpu_rails[g];
    CHECK(rail.nics == std::vector<int>{4 * g, 4 * g + 1, 4 * g + 2, 4 * g + 3});
    CHECK(rail.link == Link::kPix);
    CHECK(rail.cpus == (g < 4 ? Cpus("0-47,96-143") : Cpus("48-95,144-191")));
    for (int n : rail.nics) CHECK(nics[n]->pci.pcie_root == t.gpus[g].pci.pcie_root);
  }
  CHECK(plan.numa_nics.at(1).size() == 16);
  CHECK(t.NumaNodeOfCpus({50, 150}) == 1);
  CHECK(t.NumaNodeOfCpus({0, 50}) == -1);  // spread over both
  CHECK(t.NumaNodeOfCpus({500}) == -1);
}

TEST_CASE("a CPU-only box: no GPUs, host memory over every NIC") {
  Topology t = Load("cpu-only.sysfs");
  CHECK(t.gpus.empty());
  REQUIRE(t.nics.size() == 1);
  // One NUMA node: a device without NUMA information is on it.
  CHECK(t.nics[0].pci.numa_node == 0);
  RailPlan plan = PlanRails(t, {&t.nics[0], nullptr});  // eth0 and a loopback NIC
  CHECK(plan.gpu_rails.empty());
  CHECK(plan.nic_cpus[0] == Cpus("0-7"));
  CHECK(plan.nic_cpus[1].empty());  // no place: unpinned
  CHECK(plan.NicsFor({"", 0}) == std::vector<int>{0});
  CHECK(plan.NicsFor({}) == std::vector<int>{0, 1});
}

TEST_CASE("an asymmetric box: nearest NICs at every distance") {
  Topology t = Load("asymmetric.sysfs");
  REQUIRE(t.gpus.size() == 5);
  std::vector<const NicDevice*> nics = RdmaNics(t);  // mlx5_0, mlx5_1, mlx5_2
  REQUIRE(nics.size() == 3);
  CHECK(nics[1]->rdma_device == "mlx5_1");
  CHECK(nics[1]->pci.numa_node == -1);
  RailPlan plan = PlanRails(t, nics);
  struct Want {
    std::vector<int> nics;
    Link link;
    const char* cpus;
  };
  const Want want[] = {{{0}, Link::kPix, "0-3"},
                       {{0}, Link::kPhb, "0-3"},
                       {{0}, Link::kNode, "0-3"},
                       {{2}, Link::kNode, "4-7"},
                       {{2}, Link::kPxb, "4-7"}};
  for (int g = 0; g < 5; ++g) {
    INFO("gpu " << g << " " << t.gpus[g].pci.address);
    CHECK(plan.gpu_rails[g].nics == want[g].nics);
    CHECK(LinkName(plan.gpu_rails[g].link) == std::string(LinkName(want[g].link)));
    CHECK(plan.gpu_rails[g].cpus == Cpus(want[g].cpus));
    CHECK(Classify(t.gpus[g].pci, nics[1]->pci) == Link::kSys);
  }
  CHECK(plan.nic_cpus[1].empty());
  CHECK(plan.numa_nics.count(0) == 1);
  CHECK(plan.numa_nics.at(0) == std::vector<int>{0});
  CHECK(plan.numa_nics.at(1) == std::vector<int>{2});
  CHECK(Classify(t.gpus[0].pci, t.gpus[0].pci) == Link::kSelf);
}

TEST_CASE("a missing or odd tree yields fewer devices, not a crash") {
  CHECK(!DiscoverTopology("/nonexistent/sysfs").ok());
  const std::string root = testing::MakeTempDir("sysfs");
  // A NIC whose device is not on PCI is left out; the GPU is found.
  REQUIRE(testing::WriteFakeSysfs("node 0 0-1\n"
                                  "gpu pci0000:00/0000:00:01.0/0000:01:00.0\n"
                                  "net eth9 platform/not-pci/0000:02:00.0\n",
                                  root)
              .ok());
  absl::StatusOr<Topology> t = DiscoverTopology(root);
  REQUIRE(t.ok());
  CHECK(t->gpus.size() == 1);
  CHECK(t->nics.empty());
  CHECK(!testing::WriteFakeSysfs("gpu\n", root).ok());
  CHECK(!testing::WriteFakeSysfs("disk sda pci0000:00/0000:00:02.0\n", root).ok());
  std::filesystem::remove_all(root);
}

TEST_CASE("NumaNodeOfMemory names the node the kernel placed a page on") {
  std::vector<char> page(1 << 16, 1);  // touched: its pages are present
  const int node = NumaNodeOfMemory(page.data() + 4096);
  REQUIRE(node >= 0);
  if (std::filesystem::exists("/sys/devices/system/node")) {
    CHECK(std::filesystem::exists(absl::StrCat("/sys/devices/system/node/node", node)));
  }
  CHECK(NumaNodeOfMemory(nullptr) == -1);
}

}  // namespace
}  // namespace ferry
