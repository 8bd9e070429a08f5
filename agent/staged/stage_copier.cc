#include "agent/staged/stage_copier.h"

#include "agent/common/status_macros.h"
#include "agent/memory/region_copy.h"

namespace ferry {

absl::Status HostStageCopier::ToRegion(const Region& region, const uint8_t* staging,
                                       const std::vector<CopyChunk>& chunks) {
  for (const CopyChunk& c : chunks) CopyRegionBytes(region.data() + c.dst_offset, staging + c.src_offset, c.length);
  return absl::OkStatus();
}

absl::Status HostStageCopier::FromRegion(const Region& region, uint8_t* staging, const std::vector<CopyChunk>& chunks) {
  for (const CopyChunk& c : chunks) CopyRegionBytes(staging + c.dst_offset, region.data() + c.src_offset, c.length);
  return absl::OkStatus();
}

// Queued on the legacy default stream and waited for once: the staging memory is
// pinned, so each chunk is one DMA.
absl::Status CudaStageCopier::ToRegion(const Region& region, const uint8_t* staging,
                                       const std::vector<CopyChunk>& chunks) {
  if (region.kind() != MemoryKind::kCuda) return host_.ToRegion(region, staging, chunks);
  FERRY_RETURN_IF_ERROR(UseDevice(*cu_, region.device()));
  const CUdeviceptr base = reinterpret_cast<CUdeviceptr>(region.data());
  for (const CopyChunk& c : chunks) {
    FERRY_RETURN_IF_CU_ERROR(cu_,
                             cu_->cuMemcpyHtoDAsync(base + c.dst_offset, staging + c.src_offset, c.length, nullptr),
                             "staging to GPU (cuMemcpyHtoDAsync)");
  }
  return cu_->Check(cu_->cuStreamSynchronize(nullptr), "staging to GPU");
}

absl::Status CudaStageCopier::FromRegion(const Region& region, uint8_t* staging, const std::vector<CopyChunk>& chunks) {
  if (region.kind() != MemoryKind::kCuda) return host_.FromRegion(region, staging, chunks);
  FERRY_RETURN_IF_ERROR(UseDevice(*cu_, region.device()));
  const CUdeviceptr base = reinterpret_cast<CUdeviceptr>(region.data());
  for (const CopyChunk& c : chunks) {
    FERRY_RETURN_IF_CU_ERROR(cu_,
                             cu_->cuMemcpyDtoHAsync(staging + c.dst_offset, base + c.src_offset, c.length, nullptr),
                             "GPU to staging (cuMemcpyDtoHAsync)");
  }
  return cu_->Check(cu_->cuStreamSynchronize(nullptr), "GPU to staging");
}

}  // namespace ferry
