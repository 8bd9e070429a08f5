// NumaNodeOfMemory: the NUMA node the page at an address of this process is on.
//
//   int node = NumaNodeOfMemory(region.data());   // -1: unknown
//
// For a pod's host memory the agent maps (populated), this says where its pages are
// whatever pid namespace the pod runs in: SO_PEERCRED gives pid 0 for a client in a
// namespace the agent cannot see (every pod of a Kubernetes node), so the client's
// CPUs cannot be read.
#ifndef FERRY_AGENT_TOPOLOGY_MEMORY_NODE_H_
#define FERRY_AGENT_TOPOLOGY_MEMORY_NODE_H_

namespace ferry {

// -1 for a null address, a page not present, or a kernel without NUMA.
int NumaNodeOfMemory(const void* addr);

}  // namespace ferry

#endif  // FERRY_AGENT_TOPOLOGY_MEMORY_NODE_H_
