// CopyRegionBytes: memcpy to or from the bytes of a host region.
//
//   for (size_t i = 0; i < plan.size(); ++i) {
//     const CopyChunk c = plan.chunk(i);
//     CopyRegionBytes(dst.data() + c.dst_offset, src.data() + c.src_offset, c.length);
//   }
//
// A region's bytes belong to its pod (shared memory the pod maps too) and are ordered by
// the pods, not by the agent: two writes in flight to the same bytes race as two RDMA
// writes would, by the pods' choice, and the agent's job is only to finish both. Under
// ThreadSanitizer the copy's own memory accesses (both sides) are therefore not checked,
// as the fabric's are not (they land inside libfabric); everything around the copy is.
// Without TSan this is exactly memcpy.
#ifndef FERRY_AGENT_MEMORY_REGION_COPY_H_
#define FERRY_AGENT_MEMORY_REGION_COPY_H_

#include <cstddef>
#include <cstring>

#include "absl/base/dynamic_annotations.h"

namespace ferry {

inline void CopyRegionBytes(void* dst, const void* src, size_t length) {
  ABSL_ANNOTATE_IGNORE_READS_AND_WRITES_BEGIN();
  memcpy(dst, src, length);
  ABSL_ANNOTATE_IGNORE_READS_AND_WRITES_END();
}

}  // namespace ferry

#endif  // FERRY_AGENT_MEMORY_REGION_COPY_H_
