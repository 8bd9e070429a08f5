// Placement: where a region's memory is, so the engine can pick the NICs nearest to it.
#ifndef FERRY_AGENT_TOPOLOGY_PLACEMENT_H_
#define FERRY_AGENT_TOPOLOGY_PLACEMENT_H_

#include <string>

namespace ferry {

// A GPU (by PCI address, as cuDeviceGetPCIBusId prints it), else a NUMA node, else
// unknown (both empty / -1).
struct Placement {
  std::string gpu_pci_address;
  int numa_node = -1;
};

}  // namespace ferry

#endif  // FERRY_AGENT_TOPOLOGY_PLACEMENT_H_
