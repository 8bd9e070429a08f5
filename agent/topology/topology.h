// Topology: the node's GPUs, NICs, NUMA nodes and PCIe tree, read from sysfs.
//
//   absl::StatusOr<Topology> t = DiscoverTopology("/sys");   // --sysfs_root in tests
//   for (const GpuDevice& g : t->gpus) {
//     Link l = Classify(g.pci, t->nics[0].pci);   // PIX, PXB, PHB, NODE or SYS
//   }
//
// Vocabulary as in Kubernetes DRA and `nvidia-smi topo -m`: a PCIe root is the host
// bridge's sysfs name, "pci0000:8c" (resource.kubernetes.io/pcieRoot); links are
//   PIX   at most one PCIe switch between the two devices
//   PXB   several switches, not through the host bridge
//   PHB   through the PCIe host bridge (same root complex)
//   NODE  across root complexes within one NUMA node
//   SYS   across NUMA nodes, or where a side's place is unknown
// Sysfs describes the hardware of this node only; nothing here is a security boundary,
// but a malformed tree (a test fixture, an odd VM) yields fewer devices, never a crash.
#ifndef FERRY_AGENT_TOPOLOGY_TOPOLOGY_H_
#define FERRY_AGENT_TOPOLOGY_TOPOLOGY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ferry {

// Where a PCI device sits in the PCIe tree.
struct PciLocation {
  std::string address;               // "0000:8f:00.0"; empty for a device not on PCI
  std::string pcie_root;             // "pci0000:8c"
  std::vector<std::string> bridges;  // from the root port down; the device not included
  int numa_node = -1;                // -1: unknown
};

struct GpuDevice {
  int index = 0;     // in PCI address order, as CUDA_DEVICE_ORDER=PCI_BUS_ID numbers them
  std::string name;  // "10de:2335" (vendor:device; sysfs has no product names)
  PciLocation pci;
};

struct NicDevice {
  std::string name;         // the RDMA device ("mlx5_0", "rdmap16s27"), else the netdev
  std::string rdma_device;  // empty for a plain Ethernet NIC
  std::string netdev;       // "gpu0rdma0"; empty for EFA, which has none
  PciLocation pci;
  // "driver/pool/device" when the NIC was claimed through DRA (agent/dra); empty when
  // it was read from sysfs.
  std::string claimed_device;
};

struct NumaNode {
  int id = 0;
  std::vector<int> cpus;
};

struct Topology {
  std::vector<NumaNode> numa_nodes;  // by id
  std::vector<GpuDevice> gpus;       // by PCI address
  std::vector<NicDevice> nics;       // by PCI address

  const NumaNode* FindNuma(int id) const;
  // By PCI address, any case ("0000:8F:00.0" as CUDA prints it matches).
  const GpuDevice* FindGpu(absl::string_view pci_address) const;
  // By RDMA device or netdev name; a libfabric domain name such as "rdmap16s27-rdm"
  // (efa) matches its device "rdmap16s27".
  const NicDevice* FindNic(absl::string_view name) const;
  // The NUMA node holding every one of `cpus`, or -1 (none given, unknown CPUs, or
  // spread over nodes).
  int NumaNodeOfCpus(const std::vector<int>& cpus) const;
  std::vector<int> AllCpus() const;
};

// Reads `sysfs_root` (normally "/sys"): PCI devices under devices/, RDMA devices under
// class/infiniband, NICs under class/net (those backed by a PCI device), NUMA nodes
// under devices/system/node. A missing part is an empty list (a CPU-only node has no
// GPUs); only an unreadable root is an error.
absl::StatusOr<Topology> DiscoverTopology(const std::string& sysfs_root);

enum class Link { kSelf = 0, kPix, kPxb, kPhb, kNode, kSys };
Link Classify(const PciLocation& a, const PciLocation& b);
const char* LinkName(Link link);  // "X", "PIX", "PXB", "PHB", "NODE", "SYS"

}  // namespace ferry

#endif  // FERRY_AGENT_TOPOLOGY_TOPOLOGY_H_
