#include "agent/main/topology_report.h"

#include <unistd.h>

#include <algorithm>

namespace ferry {
namespace {

void FillDevice(const NicDevice& dev, v1::NicInfo* n) {
  n->set_pci_address(dev.pci.address);
  n->set_numa_node(dev.pci.numa_node);
  n->set_pcie_root(dev.pci.pcie_root);
  n->set_rdma_device(dev.rdma_device);
  n->set_netdev(dev.netdev);
  n->set_claimed_device(dev.claimed_device);
}

}  // namespace

void FillTopology(const Topology& topology, const FabricEngine* engine, v1::GetTopologyResponse* resp) {
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) == 0) resp->set_hostname(host);

  // The NICs: the fabric's first, then the node's others. `places` keeps each one's
  // location for the GPU x NIC links.
  std::vector<PciLocation> places;
  std::vector<const NicDevice*> used;
  std::vector<std::string> fabric_names;
  if (engine != nullptr) {
    const std::vector<FabricNic*> nics = engine->nics();
    for (size_t i = 0; i < nics.size(); ++i) {
      const NicDevice* dev = engine->nic_devices()[i];
      v1::NicInfo* n = resp->add_nics();
      n->set_name(nics[i]->name());
      n->set_fabric_address(nics[i]->address_string());
      n->set_numa_node(-1);
      if (dev != nullptr) {
        FillDevice(*dev, n);
      } else {
        n->set_netdev(nics[i]->netdev());
      }
      for (int c : engine->worker_cpus(i)) n->add_cpus(c);
      places.push_back(dev != nullptr ? dev->pci : PciLocation());
      used.push_back(dev);
      fabric_names.push_back(nics[i]->name());
    }
  }
  for (const NicDevice& dev : topology.nics) {
    if (std::find(used.begin(), used.end(), &dev) != used.end()) continue;
    v1::NicInfo* n = resp->add_nics();
    n->set_name(dev.name);
    FillDevice(dev, n);
    places.push_back(dev.pci);
  }

  for (const NumaNode& node : topology.numa_nodes) {
    v1::CpuSet* set = resp->add_numa_nodes();
    set->set_numa_node(node.id);
    for (int c : node.cpus) set->add_cpus(c);
    if (engine == nullptr) continue;
    auto it = engine->rails().numa_nics.find(node.id);
    if (it == engine->rails().numa_nics.end()) continue;
    for (int i : it->second) set->add_nics(fabric_names[i]);
  }

  for (const GpuDevice& gpu : topology.gpus) {
    v1::GpuInfo* g = resp->add_gpus();
    g->set_index(gpu.index);
    g->set_pci_address(gpu.pci.address);
    g->set_numa_node(gpu.pci.numa_node);
    g->set_pcie_root(gpu.pci.pcie_root);
    g->set_name(gpu.name);
    for (const PciLocation& p : places) g->add_nic_links(LinkName(Classify(gpu.pci, p)));
  }
  if (engine == nullptr) return;
  for (const GpuRail& rail : engine->rails().gpu_rails) {
    v1::Rail* r = resp->add_rails();
    r->set_gpu_index(rail.gpu_index);
    for (int i : rail.nics) r->add_nics(fabric_names[i]);
    for (int c : rail.cpus) r->add_cpus(c);
    r->set_link(LinkName(rail.link));
  }
}

}  // namespace ferry
