// StageCopier: moves bytes between a region and host staging memory.
//
// The staged path's only memory-kind-specific step. CudaStageCopier serves GPU regions
// (cuMemcpy to and from pinned staging memory); HostStageCopier serves host regions,
// which the staged path carries only when asked to (--stage_host_regions: exercising
// the pipeline where there is no GPU, as CI does).
#ifndef FERRY_AGENT_STAGED_STAGE_COPIER_H_
#define FERRY_AGENT_STAGED_STAGE_COPIER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "agent/memory/region.h"
#include "agent/transfer/chunk_plan.h"
#include "proto/ferry/cuda/cuda_driver.h"

namespace ferry {

class StageCopier {
 public:
  virtual ~StageCopier() = default;
  // For each chunk: region[dst_offset, +length) = staging[src_offset, +length).
  // Returns once the bytes are in the region. Offsets are already bounds-checked.
  virtual absl::Status ToRegion(const Region& region, const uint8_t* staging, const std::vector<CopyChunk>& chunks) = 0;
  // For each chunk: staging[dst_offset, +length) = region[src_offset, +length).
  virtual absl::Status FromRegion(const Region& region, uint8_t* staging, const std::vector<CopyChunk>& chunks) = 0;
};

// memcpy, for host regions.
class HostStageCopier : public StageCopier {
 public:
  absl::Status ToRegion(const Region& region, const uint8_t* staging, const std::vector<CopyChunk>& chunks) override;
  absl::Status FromRegion(const Region& region, uint8_t* staging, const std::vector<CopyChunk>& chunks) override;
};

// Copy engines, for GPU regions; host regions go to HostStageCopier.
class CudaStageCopier : public StageCopier {
 public:
  explicit CudaStageCopier(const CudaDriver* cu) : cu_(cu) {}
  absl::Status ToRegion(const Region& region, const uint8_t* staging, const std::vector<CopyChunk>& chunks) override;
  absl::Status FromRegion(const Region& region, uint8_t* staging, const std::vector<CopyChunk>& chunks) override;

 private:
  const CudaDriver* cu_;
  HostStageCopier host_;
};

}  // namespace ferry

#endif  // FERRY_AGENT_STAGED_STAGE_COPIER_H_
