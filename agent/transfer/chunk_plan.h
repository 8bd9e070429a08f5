// BuildChunkPlan: turns a WriteRequest's layout into a validated list of copies.
//
//   absl::StatusOr<ChunkPlan> plan = BuildChunkPlan(request, src_size, dst_size, limits);
//   if (!plan.ok()) return plan.status();   // names the field and the allowed range
//   for (const CopyChunk& c : plan->chunks) ...
//
// Contract: on success every chunk has length >= 1, lies within both regions, no two
// destination ranges overlap, and total_bytes is their sum (no overflow). Both layouts
// (chunk list, paged) produce the same representation. Pure logic: no agent state.
#ifndef FERRY_AGENT_TRANSFER_CHUNK_PLAN_H_
#define FERRY_AGENT_TRANSFER_CHUNK_PLAN_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/ferry/v1/ferry.pb.h"

namespace ferry {

struct CopyChunk {
  uint64_t src_offset;
  uint64_t dst_offset;
  uint64_t length;
};

struct ChunkPlan {
  std::vector<CopyChunk> chunks;
  uint64_t total_bytes = 0;
};

struct ChunkLimits {
  uint64_t max_chunks = 1 << 20;
};

absl::StatusOr<ChunkPlan> BuildChunkPlan(const v1::WriteRequest& request, uint64_t src_size, uint64_t dst_size,
                                         const ChunkLimits& limits);

// The plan of one chunk (a queue entry), checked as BuildChunkPlan checks chunk 0.
absl::StatusOr<ChunkPlan> SingleChunkPlan(const CopyChunk& chunk, uint64_t src_size, uint64_t dst_size);

}  // namespace ferry

#endif  // FERRY_AGENT_TRANSFER_CHUNK_PLAN_H_
