#include "agent/topology/memory_node.h"

#include <linux/mempolicy.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace ferry {

int NumaNodeOfMemory(const void* addr) {
  if (addr == nullptr) return -1;
  int node = -1;
  // get_mempolicy(MPOL_F_NODE | MPOL_F_ADDR) answers with the node of the page at addr
  // (faulting it in if need be). Called directly: libnuma is not a dependency.
  if (syscall(SYS_get_mempolicy, &node, nullptr, 0, const_cast<void*>(addr), MPOL_F_NODE | MPOL_F_ADDR) != 0) {
    return -1;
  }
  return node;
}

}  // namespace ferry
