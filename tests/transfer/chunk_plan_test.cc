#include "agent/transfer/chunk_plan.h"

#include <catch2/catch.hpp>

namespace ferry {
namespace {

v1::WriteRequest Chunks(std::vector<std::array<uint64_t, 3>> chunks) {
  v1::WriteRequest r;
  auto* list = r.mutable_chunks();
  for (auto& c : chunks) {
    auto* pc = list->add_chunks();
    pc->set_src_offset(c[0]);
    pc->set_dst_offset(c[1]);
    pc->set_length(c[2]);
  }
  return r;
}

v1::WriteRequest Paged(uint64_t block, std::vector<uint64_t> src, std::vector<uint64_t> dst, uint64_t src_base = 0,
                       uint64_t dst_base = 0) {
  v1::WriteRequest r;
  auto* p = r.mutable_paged();
  p->set_block_size(block);
  p->mutable_src_blocks()->Add(src.begin(), src.end());
  p->mutable_dst_blocks()->Add(dst.begin(), dst.end());
  p->set_src_base(src_base);
  p->set_dst_base(dst_base);
  return r;
}

TEST_CASE("chunk lists become copies with their total") {
  auto plan = BuildChunkPlan(Chunks({{0, 100, 10}, {50, 0, 20}}), 100, 200, {});
  REQUIRE(plan.ok());
  REQUIRE(plan->size() == 2);
  CHECK(plan->chunk(1).src_offset == 50);
  CHECK(plan->total_bytes == 30);
}

TEST_CASE("paged form expands base + id * block_size") {
  auto plan = BuildChunkPlan(Paged(64, {3, 0}, {1, 2}, 8, 16), 1024, 1024, {});
  REQUIRE(plan.ok());
  REQUIRE(plan->size() == 2);
  CHECK(plan->chunk(0).src_offset == 8 + 3 * 64);
  CHECK(plan->chunk(0).dst_offset == 16 + 64);
  CHECK(plan->total_bytes == 128);
}

// `ids` packed as PagedChunks' *_le32 fields carry them: 4 bytes each, little-endian.
std::string Le32(std::vector<uint32_t> ids) {
  std::string out;
  for (uint32_t id : ids) {
    for (int b = 0; b < 4; ++b) out.push_back(static_cast<char>(id >> (8 * b)));
  }
  return out;
}

TEST_CASE("packed ids plan as their varints do, and each side may use either form") {
  // Ids past 2^16 and 2^24, so every byte of the packing is read.
  const uint64_t big = (1u << 24) + (3u << 16) + 5;
  auto plan = BuildChunkPlan(Paged(64, {3, 0}, {1, big}, 8, 16), 1024, 16 + (big + 1) * 64, {});
  REQUIRE(plan.ok());
  v1::WriteRequest packed = Paged(64, {}, {}, 8, 16);
  packed.mutable_paged()->set_src_blocks_le32(Le32({3, 0}));
  packed.mutable_paged()->set_dst_blocks_le32(Le32({1, static_cast<uint32_t>(big)}));
  auto from_packed = BuildChunkPlan(packed, 1024, 16 + (big + 1) * 64, {});
  REQUIRE(from_packed.ok());
  REQUIRE(from_packed->size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    CHECK(from_packed->chunk(i).src_offset == plan->chunk(i).src_offset);
    CHECK(from_packed->chunk(i).dst_offset == plan->chunk(i).dst_offset);
  }
  CHECK(from_packed->chunk(1).dst_offset == 16 + big * 64);
  CHECK(from_packed->total_bytes == 128);
  v1::WriteRequest mixed = Paged(64, {3, 0}, {}, 8, 16);
  mixed.mutable_paged()->set_dst_blocks_le32(Le32({1, 2}));
  CHECK(BuildChunkPlan(mixed, 1024, 1024, {}).ok());
  // The same checks as varints: pairs, duplicates, ranges.
  packed.mutable_paged()->set_dst_blocks_le32(Le32({1}));
  CHECK(std::string(BuildChunkPlan(packed, 1024, 1024, {}).status().message()).find("must pair up") !=
        std::string::npos);
  packed.mutable_paged()->set_dst_blocks_le32(Le32({1, 1}));
  CHECK(std::string(BuildChunkPlan(packed, 1024, 1024, {}).status().message()).find("appears twice") !=
        std::string::npos);
  packed.mutable_paged()->set_dst_blocks_le32(Le32({1, 16}));
  CHECK(BuildChunkPlan(packed, 1024, 1024, {}).status().code() == absl::StatusCode::kOutOfRange);
}

TEST_CASE("packed ids that are not whole, or given twice, are refused by name") {
  v1::WriteRequest torn = Paged(64, {}, {0, 1});
  torn.mutable_paged()->set_src_blocks_le32(Le32({3, 0}).substr(0, 7));
  auto s = BuildChunkPlan(torn, 1024, 1024, {}).status();
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(s.message()).find("src_blocks_le32 holds 7 bytes") != std::string::npos);
  v1::WriteRequest both = Paged(64, {0, 1}, {0, 1});
  both.mutable_paged()->set_dst_blocks_le32(Le32({0, 1}));
  s = BuildChunkPlan(both, 1024, 1024, {}).status();
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(s.message()).find("set dst_blocks or dst_blocks_le32, not both") != std::string::npos);
  // A batch's shared mapping goes through the same door.
  v1::PagedChunks blocks;
  blocks.set_block_size(64);
  blocks.set_src_blocks_le32("abc");
  blocks.set_dst_blocks_le32(Le32({0}));
  CHECK(MappingOf(blocks).status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("paged blocks are checked by the largest id, and a bad one is named") {
  // The last block ends exactly at each region's end: accepted, every block expanded.
  auto plan = BuildChunkPlan(Paged(64, {0, 5, 2}, {7, 1, 3}, 16, 32), 16 + 6 * 64, 32 + 8 * 64, {});
  REQUIRE(plan.ok());
  REQUIRE(plan->size() == 3);
  CHECK(plan->chunk(1).src_offset == 16 + 5 * 64);
  CHECK(plan->chunk(0).dst_offset == 32 + 7 * 64);
  CHECK(plan->total_bytes == 3 * 64);
  // One byte less on either side: the block with the largest id is named, by its index.
  auto src = BuildChunkPlan(Paged(64, {0, 5, 2}, {7, 1, 3}, 16, 32), 16 + 6 * 64 - 1, 32 + 8 * 64, {}).status();
  CHECK(src.code() == absl::StatusCode::kOutOfRange);
  CHECK(std::string(src.message()).find("source range of chunk 1") != std::string::npos);
  auto dst = BuildChunkPlan(Paged(64, {0, 5, 2}, {7, 1, 3}, 16, 32), 16 + 6 * 64, 32 + 8 * 64 - 1, {}).status();
  CHECK(dst.code() == absl::StatusCode::kOutOfRange);
  CHECK(std::string(dst.message()).find("destination range of chunk 0") != std::string::npos);
  // The first bad block in request order, not the largest.
  auto first = BuildChunkPlan(Paged(64, {9, 0, 12}, {0, 1, 2}), 10 * 64, 10 * 64, {}).status();
  CHECK(std::string(first.message()).find("source range of chunk 2") != std::string::npos);
  auto wraps = BuildChunkPlan(Paged(1ull << 62, {0, 4}, {0, 1}), ~0ull, ~0ull, {}).status();  // 4 << 62 wraps
  CHECK(wraps.code() == absl::StatusCode::kOutOfRange);
  CHECK(std::string(wraps.message()).find("paged block 1") != std::string::npos);
}

TEST_CASE("a batch's ids are checked once and planned per region at its own bases") {
  const std::vector<uint64_t> src = {4, 0, 2}, dst = {1, 3, 0};
  auto ids = CheckPagedIds(BlockMapping{64, src, dst}, {});
  REQUIRE(ids.ok());
  CHECK((*ids)->max_src == 4);
  CHECK((*ids)->max_dst == 3);
  // Two regions, each at its own bases, sharing the ids (no copy per part).
  auto a = PagedPlan(*ids, 0, 0, 5 * 64, 4 * 64);
  auto b = PagedPlan(*ids, 1000, 64, 1000 + 5 * 64, 5 * 64);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(a->paged == b->paged);
  CHECK(b->size() == 3);
  CHECK(b->chunk(0).src_offset == 1000 + 4 * 64);
  CHECK(b->chunk(0).dst_offset == 64 + 64);
  CHECK(b->chunk(2).length == 64);
  CHECK(b->total_bytes == 3 * 64);
  // A region one byte short names the block that does not fit; other parts are unaffected.
  auto short_dst = PagedPlan(*ids, 0, 64, 5 * 64, 5 * 64 - 1).status();
  CHECK(short_dst.code() == absl::StatusCode::kOutOfRange);
  CHECK(std::string(short_dst.message()).find("destination range of chunk 1") != std::string::npos);
  auto wraps = PagedPlan(*ids, ~0ull - 100, 0, ~0ull, ~0ull).status();
  CHECK(std::string(wraps.message()).find("overflows 64 bits") != std::string::npos);
  // The ids' own faults are found once, before any region.
  const std::vector<uint64_t> twice = {1, 1, 0};
  CHECK(CheckPagedIds(BlockMapping{64, src, twice}, {}).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(CheckPagedIds(BlockMapping{64, src, dst}, {2}).status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(CheckPagedIds(BlockMapping{0, src, dst}, {}).status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("ranges touching the end are accepted; one byte more is not") {
  CHECK(BuildChunkPlan(Chunks({{90, 0, 10}}), 100, 100, {}).ok());
  auto s = BuildChunkPlan(Chunks({{91, 0, 10}}), 100, 100, {}).status();
  CHECK(s.code() == absl::StatusCode::kOutOfRange);
  CHECK(BuildChunkPlan(Chunks({{0, 91, 10}}), 100, 100, {}).status().code() == absl::StatusCode::kOutOfRange);
}

TEST_CASE("overflowing offsets are out of range, not wrapped") {
  CHECK(BuildChunkPlan(Chunks({{~0ull, 0, 2}}), 100, 100, {}).status().code() == absl::StatusCode::kOutOfRange);
  CHECK(BuildChunkPlan(Paged(1ull << 32, {1ull << 32}, {0}), ~0ull, ~0ull, {}).status().code() ==
        absl::StatusCode::kOutOfRange);
  CHECK(BuildChunkPlan(Paged(8, {1}, {0}, ~0ull - 4), ~0ull, ~0ull, {}).status().code() ==
        absl::StatusCode::kOutOfRange);
}

TEST_CASE("destination overlaps are refused, adjacency is fine") {
  CHECK(BuildChunkPlan(Chunks({{0, 0, 10}, {0, 10, 10}}), 100, 100, {}).ok());
  CHECK(BuildChunkPlan(Chunks({{0, 0, 10}, {0, 9, 10}}), 100, 100, {}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(BuildChunkPlan(Paged(10, {0, 1}, {2, 2}), 100, 100, {}).status().code() == absl::StatusCode::kInvalidArgument);
  // Ids spread over a huge region (the sort fallback rather than the bitmap).
  CHECK(BuildChunkPlan(Paged(8, {0, 1}, {1ull << 40, 1ull << 40}), 100, ~0ull, {}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(BuildChunkPlan(Paged(8, {0, 1}, {1ull << 40, 3}), 100, ~0ull, {}).ok());
  // 1-byte blocks over a region claiming 2^64 - 1 bytes: the id range must not wrap
  // (it did, to an empty bitmap written out of bounds; found by the fuzzer).
  CHECK(BuildChunkPlan(Paged(1, {0, 1}, {5, 5}), 100, ~0ull, {}).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(BuildChunkPlan(Paged(1, {0, 1}, {~0ull - 1, 5}), 100, ~0ull, {}).ok());
  // The bitmap's last word: the highest id that fits.
  CHECK(BuildChunkPlan(Paged(1, {0, 1}, {63, 0}), 100, 64, {}).ok());
  CHECK(BuildChunkPlan(Paged(1, {0, 1}, {64, 0}), 100, 65, {}).ok());
  // Overlapping *sources* are fine (broadcast a block to two places).
  CHECK(BuildChunkPlan(Chunks({{0, 0, 10}, {0, 50, 10}}), 100, 100, {}).ok());
}

TEST_CASE("plans into one region: extents, and overlaps across plans") {
  const std::vector<uint64_t> src = {0, 1, 2}, even = {4, 0, 2};
  auto ids = CheckPagedIds(BlockMapping{64, src, even}, {});
  REQUIRE(ids.ok());
  CHECK((*ids)->min_dst == 0);
  auto k = PagedPlan(*ids, 0, 0, 3 * 64, 1 << 20);
  auto interleaved = PagedPlan(*ids, 0, 64, 3 * 64, 1 << 20);  // the odd blocks
  auto far = PagedPlan(*ids, 0, 1 << 19, 3 * 64, 1 << 20);
  REQUIRE((k.ok() && interleaved.ok() && far.ok()));
  CHECK(ExtentOf(*k).begin == 0);
  CHECK(ExtentOf(*k).end == 5 * 64);
  CHECK(ExtentOf(*far).begin == (1 << 19));
  CHECK(CheckDisjointDestinations({&*k, &*interleaved, &*far}).ok());
  const absl::Status twice = CheckDisjointDestinations({&*k, &*far, &*k});
  CHECK(twice.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(twice.message()).find("destination ranges overlap") != std::string::npos);
  auto list = BuildChunkPlan(Chunks({{0, 100, 10}, {0, 30, 10}}), 100, 1000, {});
  REQUIRE(list.ok());
  CHECK(ExtentOf(*list).begin == 30);
  CHECK(ExtentOf(*list).end == 110);
  CHECK(CheckDisjointDestinations({&*list, &*k}).code() == absl::StatusCode::kInvalidArgument);  // [64, 128)
}

TEST_CASE("slices of one mapping plan their own blocks and are disjoint by the mapping's check") {
  const std::vector<uint64_t> src = {0, 1, 2, 3, 4}, dst = {7, 2, 5, 0, 3};
  auto ids = CheckPagedIds(BlockMapping{64, src, dst}, {});
  REQUIRE(ids.ok());
  // Blocks 0-1 through one window, 2-4 through another (interleaved in the region).
  const std::shared_ptr<const PagedIds> first = SlicePagedIds(*ids, 0, 2), rest = SlicePagedIds(*ids, 2, 3);
  CHECK(first->dst == std::vector<uint64_t>{7, 2});
  CHECK((first->min_dst == 2 && first->max_dst == 7 && first->max_src == 1));
  CHECK((rest->min_dst == 0 && rest->max_dst == 5 && rest->max_src == 4 && rest->first == 2));
  auto a = PagedPlan(first, 0, 0, 5 * 64, 8 * 64);
  auto b = PagedPlan(rest, 0, 0, 5 * 64, 8 * 64);
  REQUIRE((a.ok() && b.ok()));
  CHECK(b->chunk(0).dst_offset == 5 * 64);
  CHECK(a->total_bytes + b->total_bytes == 5 * 64);
  CHECK(CheckDisjointDestinations({&*a, &*b}).ok());
  // The same slice twice, or slices at other bases that meet, are compared chunk by chunk.
  CHECK(CheckDisjointDestinations({&*a, &*b, &*a}).code() == absl::StatusCode::kInvalidArgument);
  auto shifted = PagedPlan(rest, 0, 64, 5 * 64, 9 * 64);  // blocks 6, 1, 4: none of a's
  REQUIRE(shifted.ok());
  CHECK(CheckDisjointDestinations({&*a, &*shifted}).ok());
  auto onto_a = PagedPlan(rest, 0, 2 * 64, 5 * 64, 10 * 64);  // blocks 7, 2, 5: a's 7 and 2
  REQUIRE(onto_a.ok());
  CHECK(CheckDisjointDestinations({&*a, &*onto_a}).code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("limits, empties and missing layouts") {
  CHECK(BuildChunkPlan(Chunks({{0, 0, 1}, {0, 1, 1}, {0, 2, 1}}), 10, 10, {2}).status().code() ==
        absl::StatusCode::kResourceExhausted);
  CHECK(BuildChunkPlan(Paged(1, {0, 1, 2}, {0, 1, 2}), 10, 10, {2}).status().code() ==
        absl::StatusCode::kResourceExhausted);
  CHECK(BuildChunkPlan(Chunks({}), 10, 10, {}).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(BuildChunkPlan(Paged(0, {0}, {0}), 10, 10, {}).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(BuildChunkPlan(Paged(1, {0}, {}), 10, 10, {}).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(BuildChunkPlan(v1::WriteRequest(), 10, 10, {}).status().code() == absl::StatusCode::kInvalidArgument);
  auto zero = BuildChunkPlan(Chunks({{0, 0, 0}}), 10, 10, {}).status();
  CHECK(zero.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(zero.message()).find("chunks[0].length") != std::string::npos);
}

}  // namespace
}  // namespace ferry
