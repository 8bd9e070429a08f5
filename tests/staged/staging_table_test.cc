// StagingTable's bookkeeping: which OpenRegion gets which staging buffer, and when
// buffers are freed. Real host memory; the buffers are registered with no transport.
#include "agent/staged/staging_table.h"

#include <catch2/catch.hpp>
#include <memory>

#include "tests/testing/host_region.h"

namespace ferry {
namespace {

class NoTransports : public RegionRegistrar {
 public:
  absl::StatusOr<RegionRegistration> Register(const MemoryBacking&) override { return RegionRegistration{}; }
};

using testing::MemfdRegion;

struct Table {
  explicit Table(size_t max_buffers = 8) {
    StagingOptions options;
    options.buffer_bytes = 1 << 16;
    options.max_buffers = max_buffers;
    options.on_count = [this](size_t n) { counted = n; };
    table = std::make_unique<StagingTable>(options, nullptr, &registrar, &copier);
  }
  NoTransports registrar;
  HostStageCopier copier;
  size_t counted = 0;
  std::unique_ptr<StagingTable> table;
};

TEST_CASE("an initiator opening a region again gets the buffer it has") {
  Table t;
  auto region = MemfdRegion(7, 1 << 20);
  const StagingInitiator a{0x1111, "10.0.0.1:7000"};
  auto first = t.table->Open(region, a);
  REQUIRE(first.ok());
  auto again = t.table->Open(region, a);
  REQUIRE(again.ok());
  CHECK(again->id() == first->id());
  CHECK(again->size() == first->size());
  CHECK(t.table->buffers() == 1);
  CHECK(t.counted == 1);
}

TEST_CASE("each initiator agent gets its own buffer; a restarted one's replaces its old one") {
  Table t;
  auto region = MemfdRegion(7, 1 << 20);
  auto other_region = MemfdRegion(8, 1 << 20);
  auto a = t.table->Open(region, {0x1111, "10.0.0.1:7000"});
  auto b = t.table->Open(region, {0x2222, "10.0.0.2:7000"});
  auto a_other = t.table->Open(other_region, {0x1111, "10.0.0.1:7000"});
  REQUIRE((a.ok() && b.ok() && a_other.ok()));
  CHECK(a->id() != b->id());
  CHECK(t.table->buffers() == 3);
  // 10.0.0.1:7000 restarted (new incarnation) and opens `region` again: its old buffer
  // for that region goes, the one for the other region stays until it opens that too.
  auto a2 = t.table->Open(region, {0x3333, "10.0.0.1:7000"});
  REQUIRE(a2.ok());
  CHECK(a2->id() != a->id());
  CHECK(t.table->buffers() == 3);
  CHECK(t.counted == 3);
  // The old incarnation's buffer is gone: its commits are refused.
  google::protobuf::RepeatedPtrField<v1::Chunk> chunks;
  v1::Chunk* c = chunks.Add();
  c->set_length(16);
  CHECK(t.table->Commit(region, a->id(), chunks).code() == absl::StatusCode::kNotFound);
  CHECK(t.table->Commit(region, a2->id(), chunks).ok());
  CHECK(t.table->Commit(region, b->id(), chunks).ok());
}

TEST_CASE("older initiators (no incarnation) get a new buffer at every open; the limit holds") {
  Table t(/*max_buffers=*/2);
  auto region = MemfdRegion(7, 1 << 20);
  auto first = t.table->Open(region, {});
  auto second = t.table->Open(region, {});
  REQUIRE((first.ok() && second.ok()));
  CHECK(first->id() != second->id());
  auto third = t.table->Open(region, {});
  CHECK(third.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(t.counted == 2);
}

TEST_CASE("a buffer whose region went is freed at the next open") {
  Table t;
  auto region = MemfdRegion(7, 1 << 20);
  REQUIRE(t.table->Open(region, {0x1111, "10.0.0.1:7000"}).ok());
  region.reset();
  auto next = MemfdRegion(9, 1 << 20);
  REQUIRE(t.table->Open(next, {0x1111, "10.0.0.1:7000"}).ok());
  CHECK(t.table->buffers() == 1);
  CHECK(t.counted == 1);
}

}  // namespace
}  // namespace ferry
