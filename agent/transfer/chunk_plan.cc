#include "agent/transfer/chunk_plan.h"

#include <algorithm>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"

namespace ferry {
namespace {

// Checks that [offset, offset + length) lies in a region of `size` bytes.
absl::Status CheckRange(const char* what, size_t index, uint64_t offset, uint64_t length, uint64_t size) {
  if (offset > size || length > size - offset) {
    return absl::OutOfRangeError(absl::StrCat(what, " range of chunk ", index, " [", offset, ", ", offset, "+", length,
                                              ") is outside the region; allowed: offset + length <= ", size));
  }
  return absl::OkStatus();
}

absl::Status AddChunk(ChunkPlan& plan, size_t index, uint64_t src, uint64_t dst, uint64_t len, uint64_t src_size,
                      uint64_t dst_size) {
  if (len == 0) {
    return absl::InvalidArgumentError(absl::StrCat("chunks[", index, "].length must be >= 1"));
  }
  absl::Status s = CheckRange("source", index, src, len, src_size);
  if (!s.ok()) return s;
  s = CheckRange("destination", index, dst, len, dst_size);
  if (!s.ok()) return s;
  plan.chunks.push_back({src, dst, len});
  // May wrap only if destinations overlap, which CheckDisjointChunks rejects.
  plan.total_bytes += len;
  return absl::OkStatus();
}

// Multiplies and adds without wrapping; false on overflow.
bool BlockOffset(uint64_t base, uint64_t block, uint64_t block_size, uint64_t* out) {
  uint64_t product;
  if (__builtin_mul_overflow(block, block_size, &product)) return false;
  return !__builtin_add_overflow(base, product, out);
}

absl::Status CheckDisjointChunks(std::vector<CopyChunk> chunks) {
  std::sort(chunks.begin(), chunks.end(),
            [](const CopyChunk& a, const CopyChunk& b) { return a.dst_offset < b.dst_offset; });
  for (size_t i = 1; i < chunks.size(); ++i) {
    const CopyChunk& prev = chunks[i - 1];
    if (chunks[i].dst_offset < prev.dst_offset + prev.length) {
      return absl::InvalidArgumentError(absl::StrCat(
          "destination ranges overlap: [", prev.dst_offset, ", +", prev.length, ") and [", chunks[i].dst_offset, ", +",
          chunks[i].length, "); every destination byte may be written by one chunk only"));
    }
  }
  return absl::OkStatus();
}

// Whether block `id` of `block_size` bytes at `base` ends within `size` bytes, without
// wrapping: base + (id + 1) * block_size <= size.
bool BlockWithin(uint64_t base, uint64_t id, uint64_t block_size, uint64_t size) {
  uint64_t blocks, bytes, end;
  return !__builtin_add_overflow(id, 1, &blocks) && !__builtin_mul_overflow(blocks, block_size, &bytes) &&
         !__builtin_add_overflow(base, bytes, &end) && end <= size;
}

// Paged destinations are equal blocks on one grid: they overlap exactly when an id
// repeats. A bitmap over the ids finds that in O(n) (a KV-cache write of 16,384 blocks
// is validated in microseconds rather than a sort's milliseconds); ids spread too
// sparsely for a small bitmap fall back to sorting them.
absl::Status CheckDistinctIds(const std::vector<uint64_t>& dst, uint64_t max_id) {
  const uint64_t n = dst.size();
  auto duplicate = [&](uint64_t id) {
    return absl::InvalidArgumentError(
        absl::StrCat("paged.dst_blocks: block ", id, " appears twice; every destination block may be written once"));
  };
  if (max_id < 64 * n + 4096) {  // so max_id / 64 + 1 does not wrap either
    std::vector<uint64_t> seen(max_id / 64 + 1, 0);
    for (uint64_t id : dst) {
      uint64_t& word = seen[id / 64];
      const uint64_t bit = 1ull << (id % 64);
      if (word & bit) return duplicate(id);
      word |= bit;
    }
    return absl::OkStatus();
  }
  std::vector<uint64_t> ids(dst);
  std::sort(ids.begin(), ids.end());
  auto dup = std::adjacent_find(ids.begin(), ids.end());
  if (dup != ids.end()) return duplicate(*dup);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ChunkPlan> SingleChunkPlan(const CopyChunk& chunk, uint64_t src_size, uint64_t dst_size) {
  ChunkPlan plan;
  FERRY_RETURN_IF_ERROR(AddChunk(plan, 0, chunk.src_offset, chunk.dst_offset, chunk.length, src_size, dst_size));
  return plan;
}

absl::StatusOr<ChunkPlan> BuildChunkPlan(const v1::WriteRequest& request, uint64_t src_size, uint64_t dst_size,
                                         const ChunkLimits& limits) {
  switch (request.layout_case()) {
    case v1::WriteRequest::kChunks:
      return ChunkListPlan(request.chunks(), src_size, dst_size, limits);
    case v1::WriteRequest::kPaged:
      return PagedPlan(request.paged(), request.paged().src_base(), request.paged().dst_base(), src_size, dst_size,
                       limits);
    default:
      return absl::InvalidArgumentError("layout: set either chunks or paged");
  }
}

absl::StatusOr<ChunkPlan> ChunkListPlan(const v1::ChunkList& chunks, uint64_t src_size, uint64_t dst_size,
                                        const ChunkLimits& limits) {
  const auto& list = chunks.chunks();
  if (list.empty()) return absl::InvalidArgumentError("chunks: the chunk list is empty");
  if (static_cast<uint64_t>(list.size()) > limits.max_chunks) {
    return absl::ResourceExhaustedError(absl::StrCat("chunks: ", list.size(), " chunks exceed the limit of ",
                                                     limits.max_chunks,
                                                     " per write (--max_chunks_per_write); split the write"));
  }
  ChunkPlan plan;
  plan.chunks.reserve(list.size());
  for (int i = 0; i < list.size(); ++i) {
    const v1::Chunk& c = list[i];
    FERRY_RETURN_IF_ERROR(AddChunk(plan, i, c.src_offset(), c.dst_offset(), c.length(), src_size, dst_size));
  }
  FERRY_RETURN_IF_ERROR(CheckDisjointChunks(plan.chunks));
  return plan;
}

BlockIds BlockIds::Le32(absl::string_view packed) {
  BlockIds ids;
  ids.le32_ = packed.data();
  ids.size_ = packed.size() / 4;
  return ids;
}

void BlockIds::CopyTo(std::vector<uint64_t>* out) const {
  if (le32_ == nullptr) {
    out->assign(wide_.begin(), wide_.end());
    return;
  }
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the packed ids are read as host uint32s");
  out->resize(size_);
  for (size_t i = 0; i < size_; ++i) {
    uint32_t id;
    memcpy(&id, le32_ + 4 * i, sizeof(id));  // bytes of a protobuf string: no alignment promised
    (*out)[i] = id;
  }
}

absl::StatusOr<BlockMapping> MappingOf(const v1::PagedChunks& p) {
  auto side = [](const char* name, const google::protobuf::RepeatedField<uint64_t>& wide,
                 const std::string& le32) -> absl::StatusOr<BlockIds> {
    if (le32.empty()) return BlockIds(absl::MakeConstSpan(wide.data(), wide.size()));
    if (!wide.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("paged: set ", name, "_blocks or ", name,
                                                     "_blocks_le32, not both (", wide.size(), " ids and ", le32.size(),
                                                     " bytes given)"));
    }
    if (le32.size() % 4 != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("paged.", name, "_blocks_le32 holds ", le32.size(), " bytes; 4 a block id, so a multiple of 4"));
    }
    return BlockIds::Le32(le32);
  };
  FERRY_ASSIGN_OR_RETURN(BlockIds src, side("src", p.src_blocks(), p.src_blocks_le32()));
  FERRY_ASSIGN_OR_RETURN(BlockIds dst, side("dst", p.dst_blocks(), p.dst_blocks_le32()));
  return BlockMapping{p.block_size(), src, dst};
}

absl::StatusOr<ChunkPlan> PagedPlan(const v1::PagedChunks& p, uint64_t src_base, uint64_t dst_base, uint64_t src_size,
                                    uint64_t dst_size, const ChunkLimits& limits) {
  FERRY_ASSIGN_OR_RETURN(BlockMapping mapping, MappingOf(p));
  return PagedPlan(mapping, src_base, dst_base, src_size, dst_size, limits);
}

absl::StatusOr<ChunkPlan> PagedPlan(const BlockMapping& p, uint64_t src_base, uint64_t dst_base, uint64_t src_size,
                                    uint64_t dst_size, const ChunkLimits& limits) {
  FERRY_ASSIGN_OR_RETURN(std::shared_ptr<const PagedIds> ids, CheckPagedIds(p, limits));
  return PagedPlan(std::move(ids), src_base, dst_base, src_size, dst_size);
}

absl::StatusOr<std::shared_ptr<const PagedIds>> CheckPagedIds(const BlockMapping& p, const ChunkLimits& limits) {
  if (p.block_size == 0) return absl::InvalidArgumentError("paged.block_size must be >= 1");
  if (p.src.size() != p.dst.size()) {
    return absl::InvalidArgumentError(absl::StrCat("paged: src_blocks has ", p.src.size(), " ids but dst_blocks has ",
                                                   p.dst.size(), "; they must pair up"));
  }
  if (p.src.size() == 0) return absl::InvalidArgumentError("paged: no blocks given");
  if (static_cast<uint64_t>(p.src.size()) > limits.max_chunks) {
    return absl::ResourceExhaustedError(absl::StrCat("paged: ", p.src.size(), " blocks exceed the limit of ",
                                                     limits.max_chunks,
                                                     " per write (--max_chunks_per_write); split the write"));
  }
  auto ids = std::make_shared<PagedIds>();
  ids->block_size = p.block_size;
  p.src.CopyTo(&ids->src);
  p.dst.CopyTo(&ids->dst);
  ids->min_dst = ids->dst[0];
  for (size_t i = 0; i < ids->src.size(); ++i) {
    ids->max_src = std::max(ids->max_src, ids->src[i]);
    ids->max_dst = std::max(ids->max_dst, ids->dst[i]);
    ids->min_dst = std::min(ids->min_dst, ids->dst[i]);
  }
  FERRY_RETURN_IF_ERROR(CheckDistinctIds(ids->dst, ids->max_dst));
  return std::shared_ptr<const PagedIds>(std::move(ids));
}

absl::StatusOr<ChunkPlan> PagedPlan(std::shared_ptr<const PagedIds> ids, uint64_t src_base, uint64_t dst_base,
                                    uint64_t src_size, uint64_t dst_size) {
  const uint64_t bs = ids->block_size;
  // A block's offset grows with its id, so the largest id on each side bounds them all.
  if (BlockWithin(src_base, ids->max_src, bs, src_size) && BlockWithin(dst_base, ids->max_dst, bs, dst_size)) {
    ChunkPlan plan;
    plan.total_bytes = ids->src.size() * bs;  // <= dst_size: the blocks are distinct and in range
    plan.paged = std::move(ids);
    plan.src_base = src_base;
    plan.dst_base = dst_base;
    return plan;
  }
  // Some block is out of range: walk them to name the first one that is.
  ChunkPlan scratch;
  for (size_t i = 0; i < ids->src.size(); ++i) {
    uint64_t src, dst;
    if (!BlockOffset(src_base, ids->src[i], bs, &src) || !BlockOffset(dst_base, ids->dst[i], bs, &dst)) {
      return absl::OutOfRangeError(absl::StrCat("paged block ", i, ": base + id * block_size overflows 64 bits"));
    }
    FERRY_RETURN_IF_ERROR(AddChunk(scratch, i, src, dst, bs, src_size, dst_size));
  }
  return absl::InternalError("a paged block is out of range but none was found");  // BlockWithin and AddChunk disagree
}

std::shared_ptr<const PagedIds> SlicePagedIds(std::shared_ptr<const PagedIds> whole, size_t first, size_t count) {
  auto slice = std::make_shared<PagedIds>();
  slice->block_size = whole->block_size;
  slice->src.assign(whole->src.begin() + first, whole->src.begin() + first + count);
  slice->dst.assign(whole->dst.begin() + first, whole->dst.begin() + first + count);
  slice->min_dst = slice->dst[0];
  for (size_t i = 0; i < count; ++i) {
    slice->max_src = std::max(slice->max_src, slice->src[i]);
    slice->max_dst = std::max(slice->max_dst, slice->dst[i]);
    slice->min_dst = std::min(slice->min_dst, slice->dst[i]);
  }
  slice->whole = std::move(whole);
  slice->first = first;
  return slice;
}

DestinationExtent ExtentOf(const ChunkPlan& plan) {
  if (plan.paged != nullptr) {
    // No wrap: the plan checked that its largest block ends inside the region.
    const uint64_t bs = plan.paged->block_size;
    return {plan.dst_base + plan.paged->min_dst * bs, plan.dst_base + (plan.paged->max_dst + 1) * bs};
  }
  if (plan.chunks.empty()) return {};
  DestinationExtent e{UINT64_MAX, 0};
  for (const CopyChunk& c : plan.chunks) {
    e.begin = std::min(e.begin, c.dst_offset);
    e.end = std::max(e.end, c.dst_offset + c.length);
  }
  return e;
}

namespace {

// Slices of one checked mapping (its destination ids distinct) at one destination base,
// no block in two of them: their destination bytes are disjoint.
bool DistinctSlicesOfOneMapping(absl::Span<const ChunkPlan* const> plans) {
  std::vector<std::pair<size_t, size_t>> blocks;  // each slice's [first, end) in the whole
  for (const ChunkPlan* plan : plans) {
    const PagedIds* ids = plan->paged.get();
    if (ids == nullptr || ids->whole == nullptr || ids->whole != plans[0]->paged->whole ||
        plan->dst_base != plans[0]->dst_base) {
      return false;
    }
    blocks.emplace_back(ids->first, ids->first + ids->src.size());
  }
  std::sort(blocks.begin(), blocks.end());
  for (size_t i = 1; i < blocks.size(); ++i) {
    if (blocks[i].first < blocks[i - 1].second) return false;
  }
  return true;
}

}  // namespace

absl::Status CheckDisjointDestinations(absl::Span<const ChunkPlan* const> plans) {
  if (DistinctSlicesOfOneMapping(plans)) return absl::OkStatus();
  std::vector<CopyChunk> chunks;
  for (const ChunkPlan* plan : plans) {
    for (size_t i = 0; i < plan->size(); ++i) chunks.push_back(plan->chunk(i));
  }
  return CheckDisjointChunks(std::move(chunks));
}

}  // namespace ferry
