// StagingMemory: host memory registered with the NICs, for the staged path's stages.
//
//   absl::StatusOr<std::shared_ptr<StagingMemory>> m = StagingMemory::Allocate(32 << 20, cu, registrar);
//   (*m)->data();   (*m)->nics()  // keys and descriptors per NIC
//
// Pinned (cuMemHostAlloc, portable to every context) when a CUDA driver is present, so
// GPU copies into and out of it are single DMAs; page-aligned anonymous memory
// otherwise. It is a Region of the agent's own (id 0, no session), so the fabric
// engine can post writes from it like from any registered region.
#ifndef FERRY_AGENT_STAGED_STAGING_MEMORY_H_
#define FERRY_AGENT_STAGED_STAGING_MEMORY_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "agent/memory/region.h"
#include "proto/ferry/cuda/cuda_driver.h"

namespace ferry {

// `cu` may be null (no GPU on this node).
absl::StatusOr<std::shared_ptr<Region>> AllocateStagingRegion(uint64_t size, const CudaDriver* cu,
                                                              RegionRegistrar* registrar);

}  // namespace ferry

#endif  // FERRY_AGENT_STAGED_STAGING_MEMORY_H_
