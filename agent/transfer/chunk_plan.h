// BuildChunkPlan: turns a WriteRequest's layout into a validated list of copies.
//
//   absl::StatusOr<ChunkPlan> plan = BuildChunkPlan(request, src_size, dst_size, limits);
//   if (!plan.ok()) return plan.status();   // names the field and the allowed range
//   for (size_t i = 0; i < plan->size(); ++i) Copy(plan->chunk(i));
//
// Contract: on success every chunk has length >= 1, lies within both regions, no two
// destination ranges overlap, and total_bytes is their sum (no overflow). A chunk list
// is kept as its chunks; a paged layout as its block ids (checked once, shared by the
// parts of a batch that apply one mapping to many regions) and two bases: read either
// through size() and chunk(i). Pure logic: no agent state.
#ifndef FERRY_AGENT_TRANSFER_CHUNK_PLAN_H_
#define FERRY_AGENT_TRANSFER_CHUNK_PLAN_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "proto/ferry/v1/ferry.pb.h"

namespace ferry {

struct CopyChunk {
  uint64_t src_offset;
  uint64_t dst_offset;
  uint64_t length;
};

// A paged layout's block ids, owned and checked (CheckPagedIds): as many of each, at
// most the chunk limit, no destination id twice. Block i copies block_size bytes from
// src_base + src[i] * block_size to dst_base + dst[i] * block_size.
struct PagedIds {
  uint64_t block_size = 0;
  std::vector<uint64_t> src, dst;
  uint64_t max_src = 0, max_dst = 0;  // bound every block's offset on each side
  uint64_t min_dst = 0;               // with max_dst, where a plan's destination bytes lie
  // Set on a slice (SlicePagedIds): the checked mapping these are blocks [first, first +
  // src.size()) of. Distinct slices of one mapping at one destination base never overlap.
  std::shared_ptr<const PagedIds> whole;
  size_t first = 0;
};

struct ChunkPlan {
  std::vector<CopyChunk> chunks;          // a chunk list; empty when `paged` is set
  std::shared_ptr<const PagedIds> paged;  // or a paged layout, at these bases
  uint64_t src_base = 0, dst_base = 0;
  uint64_t total_bytes = 0;

  size_t size() const { return paged != nullptr ? paged->src.size() : chunks.size(); }
  CopyChunk chunk(size_t i) const {
    if (paged == nullptr) return chunks[i];
    const uint64_t bs = paged->block_size;
    return {src_base + paged->src[i] * bs, dst_base + paged->dst[i] * bs, bs};
  }
};

struct ChunkLimits {
  uint64_t max_chunks = 1 << 20;
};

absl::StatusOr<ChunkPlan> BuildChunkPlan(const v1::WriteRequest& request, uint64_t src_size, uint64_t dst_size,
                                         const ChunkLimits& limits);

// The plans of each layout, as BuildChunkPlan makes them.
absl::StatusOr<ChunkPlan> ChunkListPlan(const v1::ChunkList& chunks, uint64_t src_size, uint64_t dst_size,
                                        const ChunkLimits& limits);
// One side's block ids, wherever they are kept: 64-bit ids (a PagedChunks message's
// varints once parsed, a write queue's block table) or 32-bit little-endian ids packed
// in bytes (PagedChunks' *_le32 fields). A view: the ids outlive it.
class BlockIds {
 public:
  BlockIds() = default;
  BlockIds(absl::Span<const uint64_t> ids) : wide_(ids), size_(ids.size()) {}         // NOLINT: implicit, as a Span
  BlockIds(const std::vector<uint64_t>& ids) : BlockIds(absl::MakeConstSpan(ids)) {}  // NOLINT
  // `packed`: size() / 4 ids; its length must be a multiple of 4 (MappingOf checks).
  static BlockIds Le32(absl::string_view packed);

  size_t size() const { return size_; }
  // Replaces `out` with the ids, widened to 64 bits.
  void CopyTo(std::vector<uint64_t>* out) const;

 private:
  absl::Span<const uint64_t> wide_;
  const char* le32_ = nullptr;  // when set, size_ ids of 4 bytes each
  size_t size_ = 0;
};

// A paged layout's block ids: block i copies block_size bytes from src_base + src[i] *
// block_size to dst_base + dst[i] * block_size. A view: the ids outlive it.
struct BlockMapping {
  uint64_t block_size = 0;
  BlockIds src, dst;
};
// The mapping of a PagedChunks message, each side from its varints or its packed
// *_le32 bytes; INVALID_ARGUMENT if a side sets both, or packed bytes are not whole ids.
absl::StatusOr<BlockMapping> MappingOf(const v1::PagedChunks& p);

// The plan of a paged layout with the bases given apart from the mapping (which
// BuildChunkPlan passes as p.src_base() / p.dst_base()).
absl::StatusOr<ChunkPlan> PagedPlan(const BlockMapping& p, uint64_t src_base, uint64_t dst_base, uint64_t src_size,
                                    uint64_t dst_size, const ChunkLimits& limits);
// How a batch applies one block mapping to many regions: the ids copied and checked
// once (CheckPagedIds), then a plan per region at its own bases, which checks only that
// the largest ids fit (or, when one does not, walks the blocks to name the first).
absl::StatusOr<std::shared_ptr<const PagedIds>> CheckPagedIds(const BlockMapping& p, const ChunkLimits& limits);
absl::StatusOr<ChunkPlan> PagedPlan(std::shared_ptr<const PagedIds> ids, uint64_t src_base, uint64_t dst_base,
                                    uint64_t src_size, uint64_t dst_size);
absl::StatusOr<ChunkPlan> PagedPlan(const v1::PagedChunks& p, uint64_t src_base, uint64_t dst_base, uint64_t src_size,
                                    uint64_t dst_size, const ChunkLimits& limits);
// Blocks [first, first + count) of a checked mapping, as a mapping of their own (a batch
// whose runs of blocks go through different write windows: a plan per run and region).
// Requires count >= 1 and first + count <= whole->src.size().
std::shared_ptr<const PagedIds> SlicePagedIds(std::shared_ptr<const PagedIds> whole, size_t first, size_t count);

// The plan of one chunk (a queue entry), checked as BuildChunkPlan checks chunk 0.
absl::StatusOr<ChunkPlan> SingleChunkPlan(const CopyChunk& chunk, uint64_t src_size, uint64_t dst_size);

// The destination bytes [begin, end) a checked plan's chunks lie within; O(1) for a
// paged plan, one pass over a chunk list.
struct DestinationExtent {
  uint64_t begin = 0, end = 0;
};
DestinationExtent ExtentOf(const ChunkPlan& plan);
// Whether the destination bytes of plans into one region are disjoint, each plan's own
// being so (as every checked plan's are): INVALID_ARGUMENT naming two overlapping
// ranges otherwise. Sorts all their chunks (callers compare extents first), unless the
// plans are distinct slices of one mapping at one destination base, disjoint by its check.
absl::Status CheckDisjointDestinations(absl::Span<const ChunkPlan* const> plans);

}  // namespace ferry

#endif  // FERRY_AGENT_TRANSFER_CHUNK_PLAN_H_
