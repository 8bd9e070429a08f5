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
#include "absl/types/span.h"
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

// The plans of each layout, as BuildChunkPlan makes them.
absl::StatusOr<ChunkPlan> ChunkListPlan(const v1::ChunkList& chunks, uint64_t src_size, uint64_t dst_size,
                                        const ChunkLimits& limits);
// A paged layout's block ids, wherever they are kept (a PagedChunks message, a write
// queue's block table): block i copies block_size bytes from src_base + src[i] *
// block_size to dst_base + dst[i] * block_size. A view: the ids outlive it.
struct BlockMapping {
  uint64_t block_size = 0;
  absl::Span<const uint64_t> src, dst;
};
BlockMapping MappingOf(const v1::PagedChunks& p);

// The plan of a paged layout with the bases given apart from the mapping (which
// BuildChunkPlan passes as p.src_base() / p.dst_base()): how a batch applies one block
// mapping to many regions, each at its own bases.
absl::StatusOr<ChunkPlan> PagedPlan(const BlockMapping& p, uint64_t src_base, uint64_t dst_base, uint64_t src_size,
                                    uint64_t dst_size, const ChunkLimits& limits);
absl::StatusOr<ChunkPlan> PagedPlan(const v1::PagedChunks& p, uint64_t src_base, uint64_t dst_base, uint64_t src_size,
                                    uint64_t dst_size, const ChunkLimits& limits);

// The plan of one chunk (a queue entry), checked as BuildChunkPlan checks chunk 0.
absl::StatusOr<ChunkPlan> SingleChunkPlan(const CopyChunk& chunk, uint64_t src_size, uint64_t dst_size);

}  // namespace ferry

#endif  // FERRY_AGENT_TRANSFER_CHUNK_PLAN_H_
