// Rails: which NICs carry which memory, and which cores drive each NIC.
//
//   Topology topo = *DiscoverTopology("/sys");
//   std::vector<const NicDevice*> nics = {topo.FindNic("mlx5_0"), nullptr};  // fabric NICs
//   RailPlan plan = PlanRails(topo, nics);
//   plan.NicsFor({.gpu_pci_address = "0000:8f:00.0"});   // {0}: GPU 0's rail
//   plan.nic_cpus[0];                                    // NUMA-local cores of NIC 0
//
// A GPU's rail is its nearest NICs: those at the best link class to it (same switch,
// else same root complex, else same NUMA node, else all). GPUs that have the same nearest
// NICs share them out in order (GPU i keeps to NIC i, as NCCL pairs them). Host memory goes over the NICs
// of its NUMA node (all NICs when it has none or the node is unknown). A NIC's worker runs
// on the cores of the NIC's NUMA node. A NIC without a place in sysfs (loopback, a veth)
// is SYS to everything and runs unpinned.
#ifndef FERRY_AGENT_TOPOLOGY_RAILS_H_
#define FERRY_AGENT_TOPOLOGY_RAILS_H_

#include <map>
#include <string>
#include <vector>

#include "agent/topology/placement.h"
#include "agent/topology/topology.h"

namespace ferry {

struct GpuRail {
  int gpu_index = 0;
  std::vector<int> nics;   // indices into the NICs given to PlanRails
  Link link = Link::kSys;  // how far those NICs are from the GPU
  std::vector<int> cpus;   // the NUMA-local cores of those NICs
};

struct RailPlan {
  std::vector<GpuRail> gpu_rails;             // one per topology GPU
  std::map<int, std::vector<int>> numa_nics;  // NUMA node -> its NICs (nodes that have some)
  std::vector<std::vector<int>> nic_cpus;     // per NIC; empty: unpinned
  std::vector<int> all_nics;                  // every fabric NIC: 0 .. n - 1
  const Topology* topology = nullptr;

  // The NICs a region at `where` is sent over; never empty when all_nics is not. A
  // reference into the plan: it is asked once per transfer.
  const std::vector<int>& NicsFor(const Placement& where) const;
};

// `nics[i]` is fabric NIC i's device in `topology`, or nullptr when it has none.
// `topology` must outlive the plan.
RailPlan PlanRails(const Topology& topology, const std::vector<const NicDevice*>& nics);

}  // namespace ferry

#endif  // FERRY_AGENT_TOPOLOGY_RAILS_H_
