#include "agent/topology/rails.h"

#include <algorithm>
#include <numeric>

namespace ferry {
namespace {

PciLocation NicLocation(const NicDevice* nic) { return nic == nullptr ? PciLocation() : nic->pci; }

std::vector<int> NumaCpus(const Topology& t, int node) {
  const NumaNode* n = t.FindNuma(node);
  return n == nullptr ? std::vector<int>() : n->cpus;
}

}  // namespace

RailPlan PlanRails(const Topology& topology, const std::vector<const NicDevice*>& nics) {
  RailPlan plan;
  plan.topology = &topology;
  plan.all_nics.resize(nics.size());
  std::iota(plan.all_nics.begin(), plan.all_nics.end(), 0);
  for (size_t i = 0; i < nics.size(); ++i) {
    const int node = NicLocation(nics[i]).numa_node;
    plan.nic_cpus.push_back(node >= 0 ? NumaCpus(topology, node) : std::vector<int>());
    if (node >= 0) plan.numa_nics[node].push_back(static_cast<int>(i));
  }
  for (const GpuDevice& gpu : topology.gpus) {
    GpuRail rail;
    rail.gpu_index = gpu.index;
    for (size_t i = 0; i < nics.size(); ++i) {
      const Link l = Classify(gpu.pci, NicLocation(nics[i]));
      if (rail.nics.empty() || l < rail.link) {
        rail.nics.assign(1, static_cast<int>(i));
        rail.link = l;
      } else if (l == rail.link) {
        rail.nics.push_back(static_cast<int>(i));
      }
    }
    plan.gpu_rails.push_back(std::move(rail));
  }
  // GPUs with the same nearest NICs (two GPUs and two NICs behind one switch) share them
  // out in order, so GPU i keeps to NIC i as NCCL pairs them and rail-aligned networks
  // expect; with fewer NICs than GPUs, the NICs are dealt round-robin.
  std::map<std::pair<std::vector<int>, Link>, std::vector<GpuRail*>> groups;
  for (GpuRail& r : plan.gpu_rails) groups[{r.nics, r.link}].push_back(&r);
  for (auto& [key, members] : groups) {
    const std::vector<int>& shared = key.first;
    const size_t g = members.size(), n = shared.size();
    if (g < 2 || n == 0) continue;
    for (size_t j = 0; j < g; ++j) {
      if (n >= g) {
        members[j]->nics.assign(shared.begin() + j * n / g, shared.begin() + (j + 1) * n / g);
      } else {
        members[j]->nics.assign(1, shared[j % n]);
      }
    }
  }
  for (GpuRail& rail : plan.gpu_rails) {
    for (int i : rail.nics) {
      const std::vector<int>& c = plan.nic_cpus[i];
      rail.cpus.insert(rail.cpus.end(), c.begin(), c.end());
    }
    std::sort(rail.cpus.begin(), rail.cpus.end());
    rail.cpus.erase(std::unique(rail.cpus.begin(), rail.cpus.end()), rail.cpus.end());
  }
  return plan;
}

const std::vector<int>& RailPlan::NicsFor(const Placement& where) const {
  if (topology != nullptr && !where.gpu_pci_address.empty()) {
    const GpuDevice* gpu = topology->FindGpu(where.gpu_pci_address);
    if (gpu != nullptr && !gpu_rails[gpu->index].nics.empty()) return gpu_rails[gpu->index].nics;
  }
  if (where.numa_node >= 0) {
    auto it = numa_nics.find(where.numa_node);
    if (it != numa_nics.end()) return it->second;
  }
  return all_nics;
}

}  // namespace ferry
