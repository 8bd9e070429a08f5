// QueueEntries as one component: a write queue's entries handed to it as the poller
// would, over a ring this test maps as a client does (its block table written, its
// completions read), with this agent's regions in a RegionTable and the host copier
// moving the bytes. What it shows: each kind of entry (contiguous, paged, batch,
// through a window, window open and close) lands the right bytes or does the right
// thing, every refusal is a completion that names the field, and what would need an RPC
// on a NIC worker is left for the poller's own thread with nothing written.
#include "agent/router/queue_entries.h"

#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "agent/local/host_copier.h"
#include "tests/testing/host_region.h"
#include "tests/testing/mapped_ring.h"

namespace ferry {
namespace {

constexpr uint64_t kIncarnation = 0x1111;
constexpr uint32_t kEntries = 16;
constexpr uint32_t kTableIds = 1024;
constexpr uint64_t kRegionBytes = 1 << 16;

// The client's side of one queue: the ring mapped here too.
class ClientRing {
 public:
  ClientRing(uint64_t id, const Session& session,
             std::vector<std::shared_ptr<const v1::RegionDescriptor>> destinations) {
    int doorbell[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, doorbell) == 0);
    client_doorbell_ = UniqueFd(doorbell[1]);
    absl::StatusOr<std::shared_ptr<TransferQueue>> q =
        TransferQueue::Open(id, session.id(), ring_.TakeFd(), UniqueFd(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
                            UniqueFd(doorbell[0]), kEntries, kTableIds, std::move(destinations));
    REQUIRE(q.ok());
    queue_ = *q;
    queue_->set_timeout_ms(5000);
  }

  const std::shared_ptr<TransferQueue>& queue() const { return queue_; }
  uint32_t* table() { return reinterpret_cast<uint32_t*>(ring_.base() + queue::TableOffset(kEntries)); }
  void WriteTable(uint32_t index, const void* words, size_t bytes) { memcpy(table() + index, words, bytes); }
  uint32_t completions_written() const { return header()->cq_tail.value.load(); }

  // The next completion, once the agent wrote it (bounded wait: copies run on a thread).
  queue::CompletionEntry Next() {
    const absl::Time until = absl::Now() + absl::Seconds(10);
    while (header()->cq_tail.value.load(std::memory_order_acquire) == seen_ && absl::Now() < until) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    REQUIRE(header()->cq_tail.value.load(std::memory_order_acquire) != seen_);
    queue::CompletionEntry c;
    memcpy(&c, ring_.base() + queue::CompletionOffset(kEntries) + (seen_ % kEntries) * sizeof(c), sizeof(c));
    header()->cq_head.value.store(++seen_);
    return c;
  }

 private:
  queue::RingHeader* header() const { return ring_.header(); }

  testing::MappedRing ring_{kEntries, kTableIds};
  UniqueFd client_doorbell_;
  std::shared_ptr<TransferQueue> queue_;
  uint32_t seen_ = 0;
};

struct Fixture {
  Fixture() : windows(&regions, nullptr), transfers(kIncarnation, &metrics, &sessions, &regions) {
    writer = *sessions.Create({1, 1000, 1000});
    receiver = *sessions.Create({2, 1001, 1001});
    src = Add(writer->id());
    dst = Add(receiver->id());
    windowed = Add(receiver->id());
    windowed->set_write_windows(true);
    for (uint64_t i = 0; i < kRegionBytes; ++i) src->data()[i] = static_cast<uint8_t>(i * 7 + 1);
    TransferRouterDeps deps;
    deps.incarnation = kIncarnation;
    deps.regions = &regions;
    deps.windows = &windows;
    deps.transfers = &transfers;
    deps.local = &host;
    router = std::make_unique<TransferRouter>(std::move(deps));
    entries = std::make_unique<QueueEntries>(router.get(), &sessions, &transfers, &metrics, ChunkLimits{64});
    entries->set_windows(&windows, {/*max_timeout_ms=*/60'000, /*max_wait_ms=*/1'000});
  }
  std::shared_ptr<Region> Add(uint64_t owner) {
    std::shared_ptr<Region> r = testing::MemfdRegion(regions.NextId(), kRegionBytes, owner);
    REQUIRE(regions.Insert(r).ok());
    return r;
  }
  static std::shared_ptr<const v1::RegionDescriptor> Descriptor(const Region& r, uint64_t incarnation = kIncarnation) {
    auto d = std::make_shared<v1::RegionDescriptor>();
    d->set_version(1);
    d->set_agent_address("10.0.0.1:7000");
    d->set_agent_incarnation(incarnation);
    d->set_region_id(r.id());
    d->set_token(r.token().bytes());
    d->set_size(r.size());
    return d;
  }
  // Handles `e` as a NIC worker would (may_block false), else as the poller's thread.
  bool Handle(ClientRing& ring, const queue::SubmitEntry& e, bool may_block = true) {
    return entries->Handle(ring.queue(), e, may_block);
  }
  bool Same(uint64_t dst_offset, uint64_t src_offset, uint64_t length) const {
    return memcmp(dst->data() + dst_offset, src->data() + src_offset, length) == 0;
  }

  Metrics metrics;
  SessionRegistry sessions{{}, nullptr};
  RegionTable regions;
  WriteWindows windows;
  TransferManager transfers;
  HostCopier host{1};
  std::shared_ptr<Session> writer, receiver;
  std::shared_ptr<Region> src, dst, windowed;
  std::unique_ptr<TransferRouter> router;
  std::unique_ptr<QueueEntries> entries;
};

queue::SubmitEntry Contiguous(uint64_t src_region, uint64_t src_offset, uint64_t dst_offset, uint64_t length) {
  queue::SubmitEntry e{};
  e.user_data = 42;
  e.src_region = src_region;
  e.src_offset = src_offset;
  e.dst_offset = dst_offset;
  e.length = length;
  return e;
}

void CheckRefused(const queue::CompletionEntry& c, absl::StatusCode code, const char* says) {
  CHECK(c.code == static_cast<int>(code));
  CHECK(c.transfer_id == 0);
  CHECK_THAT(std::string(c.message), Catch::Contains(says));
}

TEST_CASE("A contiguous entry lands its bytes and completes with its id, bytes and path") {
  Fixture f;
  ClientRing ring(1, *f.writer, {Fixture::Descriptor(*f.dst)});
  REQUIRE(f.Handle(ring, Contiguous(f.src->id(), 100, 8192, 4000)));
  queue::CompletionEntry c = ring.Next();
  CHECK(c.user_data == 42);
  CHECK(c.code == 0);
  CHECK(c.transfer_id != 0);
  CHECK(c.bytes == 4000);
  CHECK(c.path == v1::TRANSFER_PATH_LOCAL);
  CHECK(f.Same(8192, 100, 4000));
  CHECK(f.dst->data()[8191] == 0);
  CHECK(f.dst->data()[8192 + 4000] == 0);
}

TEST_CASE("A paged entry moves the blocks its table names") {
  Fixture f;
  ClientRing ring(1, *f.writer, {Fixture::Descriptor(*f.dst)});
  const uint32_t ids[] = {3, 0, 5, /*to*/ 1, 7, 2};  // src ids, then dst ids
  ring.WriteTable(10, ids, sizeof(ids));
  queue::SubmitEntry e = Contiguous(f.src->id(), /*src base=*/512, /*dst base=*/0, /*block=*/1024);
  e.flags = queue::kFlagPaged;
  e.table_index = 10;
  e.blocks = 3;
  REQUIRE(f.Handle(ring, e));
  queue::CompletionEntry c = ring.Next();
  REQUIRE(c.code == 0);
  CHECK(c.bytes == 3 * 1024);
  CHECK(f.Same(1 * 1024, 512 + 3 * 1024, 1024));
  CHECK(f.Same(7 * 1024, 512 + 0 * 1024, 1024));
  CHECK(f.Same(2 * 1024, 512 + 5 * 1024, 1024));
  CHECK(f.dst->data()[0] == 0);  // block 0 was not written
}

TEST_CASE("A batch entry's parts each write their own destination, as one transfer") {
  Fixture f;
  std::shared_ptr<Region> second = f.Add(f.receiver->id());
  ClientRing ring(1, *f.writer, {Fixture::Descriptor(*f.dst), Fixture::Descriptor(*second)});
  const queue::TablePart parts[] = {{f.src->id(), 0, 0, 0, 0}, {f.src->id(), 4096, 256, 1, 0}};
  const uint32_t ids[] = {1, 2, /*to*/ 4, 5};
  ring.WriteTable(0, parts, sizeof(parts));
  ring.WriteTable(2 * queue::kPartIds, ids, sizeof(ids));
  queue::SubmitEntry e{};
  e.flags = queue::kFlagBatch;
  e.dst_index = 2;  // parts
  e.length = 512;   // block size
  e.blocks = 2;
  REQUIRE(f.Handle(ring, e));
  queue::CompletionEntry c = ring.Next();
  REQUIRE(c.code == 0);
  CHECK(c.bytes == 2 * 2 * 512);
  CHECK(f.Same(4 * 512, 1 * 512, 512));
  CHECK(f.Same(5 * 512, 2 * 512, 512));
  CHECK(memcmp(second->data() + 256 + 4 * 512, f.src->data() + 4096 + 512, 512) == 0);
  CHECK(memcmp(second->data() + 256 + 5 * 512, f.src->data() + 4096 + 1024, 512) == 0);
}

TEST_CASE("Each refusal is a completion that names what to fix, and nothing lands") {
  Fixture f;
  ClientRing ring(1, *f.writer, {Fixture::Descriptor(*f.dst)});
  auto refused = [&](const queue::SubmitEntry& e, absl::StatusCode code, const char* says) {
    REQUIRE(f.Handle(ring, e));
    CheckRefused(ring.Next(), code, says);
  };
  queue::SubmitEntry e = Contiguous(f.src->id(), 0, 0, 4096);
  e.flags = 0x100;
  refused(e, absl::StatusCode::kInvalidArgument, "flags 0x100 has unknown bits");
  e = Contiguous(f.src->id(), 0, 0, 4096);
  e.dst_index = 1;
  refused(e, absl::StatusCode::kInvalidArgument, "dst_index 1 is not one of the queue's 1 destinations");
  e = Contiguous(f.src->id(), 0, 0, 4096);
  e.table_index = 4;
  refused(e, absl::StatusCode::kInvalidArgument, "table_index and blocks are for paged and batch entries");
  e = Contiguous(f.src->id(), 0, kRegionBytes - 100, 4096);
  refused(e, absl::StatusCode::kOutOfRange, "destination range of chunk 0");
  e = Contiguous(f.dst->id(), 0, 0, 4096);  // another session's region as the source
  refused(e, absl::StatusCode::kPermissionDenied, "src_region_id");
  e = Contiguous(f.src->id(), 0, 0, 1024);
  e.flags = queue::kFlagPaged;
  e.table_index = kTableIds - 2;
  e.blocks = 2;
  refused(e, absl::StatusCode::kOutOfRange, "outside the queue's block table");
  e.table_index = 0;
  e.blocks = 65;
  refused(e, absl::StatusCode::kResourceExhausted, "--max_chunks_per_write");
  e = Contiguous(f.src->id(), 0, 0, 0);
  e.flags = queue::kFlagMessage;
  refused(e, absl::StatusCode::kInvalidArgument, "of a message entry must be 0");
  e = Contiguous(0, 0, 0, 0);
  e.flags = queue::kFlagWindow;
  refused(e, absl::StatusCode::kInvalidArgument, "a window (16) or window spans (128) are for batch entries (4) only");
  e = Contiguous(0, 0, 0, 0);
  e.flags = queue::kFlagBatch;
  refused(e, absl::StatusCode::kInvalidArgument, "a batch entry has 1..1024 parts");
  const queue::TablePart reserved[] = {{f.src->id(), 0, 0, 0, 9}};
  const uint32_t ids[] = {0, 0};
  ring.WriteTable(0, reserved, sizeof(reserved));
  ring.WriteTable(queue::kPartIds, ids, sizeof(ids));
  e.dst_index = 1;
  e.length = 512;
  e.blocks = 1;
  refused(e, absl::StatusCode::kInvalidArgument, "parts[0]: reserved is 9; it must be 0");
  CHECK(std::vector<uint8_t>(f.dst->data(), f.dst->data() + kRegionBytes) == std::vector<uint8_t>(kRegionBytes, 0));
}

TEST_CASE("An ended session's queue, and every queue once the agent shuts down, refuse with UNAVAILABLE") {
  Fixture f;
  ClientRing ring(1, *f.writer, {Fixture::Descriptor(*f.dst)});
  f.entries->BeginShutdown();
  REQUIRE(f.Handle(ring, Contiguous(f.src->id(), 0, 0, 4096)));
  CheckRefused(ring.Next(), absl::StatusCode::kUnavailable, "the agent is shutting down");

  Fixture g;
  ClientRing gone(2, *g.writer, {Fixture::Descriptor(*g.dst)});
  g.sessions.Close(g.writer->id());
  REQUIRE(g.Handle(gone, Contiguous(g.src->id(), 0, 0, 4096)));
  CheckRefused(gone.Next(), absl::StatusCode::kUnavailable, "the session ended");
}

TEST_CASE("On a NIC worker, a message to another agent is left for the poller's thread, nothing written") {
  Fixture f;
  ClientRing ring(1, *f.writer, {Fixture::Descriptor(*f.dst, /*incarnation=*/0x2222)});
  queue::SubmitEntry e{};
  e.flags = queue::kFlagMessage;
  CHECK_FALSE(f.Handle(ring, e, /*may_block=*/false));
  CHECK(ring.completions_written() == 0);
}

TEST_CASE("A window opened and closed by entries: writes through it land, and none after its close") {
  Fixture f;
  // The receiver's queue opens a window over its region for the writer (its destination).
  ClientRing receiving(1, *f.receiver, {Fixture::Descriptor(*f.src)});
  struct {
    queue::WindowOpen head;
    uint64_t region;
    uint64_t range[2];
  } open = {{/*timeout_ms=*/10'000, /*regions=*/1, /*ranges=*/1}, f.windowed->id(), {4096, 8192}};
  receiving.WriteTable(0, &open, sizeof(open));
  queue::SubmitEntry e{};
  e.user_data = 7;
  e.flags = queue::kFlagOpenWindow;
  REQUIRE(f.Handle(receiving, e));
  const queue::CompletionEntry opened = receiving.Next();
  REQUIRE(opened.code == 0);
  const uint64_t window_id = opened.transfer_id;
  CHECK(window_id != 0);

  // The writer's queue writes a batch entry through it.
  ClientRing writing(2, *f.writer, {Fixture::Descriptor(*f.windowed)});
  queue::WindowRef ref{window_id, {}};
  memcpy(ref.token, opened.message, sizeof(ref.token));
  auto write = [&](uint64_t dst_base) {
    const queue::TablePart part = {f.src->id(), 0, dst_base, 0, 0};
    const uint32_t ids[] = {0, /*to*/ 0};
    writing.WriteTable(0, &ref, sizeof(ref));
    writing.WriteTable(queue::kWindowIds, &part, sizeof(part));
    writing.WriteTable(queue::kWindowIds + queue::kPartIds, ids, sizeof(ids));
    queue::SubmitEntry w{};
    w.flags = queue::kFlagBatch | queue::kFlagWindow;
    w.dst_index = 1;
    w.length = 1024;
    w.blocks = 1;
    REQUIRE(f.Handle(writing, w));
    return writing.Next();
  };
  queue::CompletionEntry c = write(4096);
  REQUIRE(c.code == 0);
  CHECK(memcmp(f.windowed->data() + 4096, f.src->data(), 1024) == 0);
  CheckRefused(write(0), absl::StatusCode::kOutOfRange, "window");  // outside its ranges

  queue::SubmitEntry close{};
  close.flags = queue::kFlagCloseWindow;
  close.src_offset = window_id;
  close.length = 100;  // ms to wait
  REQUIRE(f.Handle(receiving, close, /*may_block=*/false));
  CHECK(receiving.Next().code == 0);
  std::vector<uint8_t> before(f.windowed->data(), f.windowed->data() + kRegionBytes);
  c = write(8192);
  CHECK(c.code != 0);
  CHECK_THAT(std::string(c.message), Catch::Contains("closed"));
  CHECK(memcmp(before.data(), f.windowed->data(), kRegionBytes) == 0);
}

TEST_CASE("A batch entry's window spans: each run of blocks through its own window, refusals precise") {
  Fixture f;
  auto open = [&](uint64_t offset, uint64_t length) {
    WindowSpec spec;
    spec.region_ids = {f.windowed->id()};
    spec.ranges = {{offset, length}};
    spec.timeout = absl::Seconds(10);
    absl::StatusOr<std::shared_ptr<const WriteWindow>> w = f.windows.Open(f.receiver->id(), spec);
    REQUIRE(w.ok());
    queue::WindowSpan span{{(*w)->id(), {}}, 0, 0};
    memcpy(span.window.token, (*w)->token().bytes().data(), sizeof(span.window.token));
    return span;
  };
  queue::WindowSpan spans[2] = {open(0, 2048), open(4096, 1024)};  // blocks 0-1, and block 4
  ClientRing ring(1, *f.writer, {Fixture::Descriptor(*f.windowed)});
  // The table: the head, both spans, one part, the ids (blocks 0, 1 to the first window's
  // blocks 1, 0; block 2 to the second's block 4).
  auto write = [&](uint32_t first_blocks, uint32_t second_blocks, uint32_t count = 2, uint32_t flags = 0) {
    const queue::WindowSpans head = {count, 0};
    spans[0].blocks = first_blocks;
    spans[1].blocks = second_blocks;
    const queue::TablePart part = {f.src->id(), 0, 0, 0, 0};
    const uint32_t ids[] = {0, 1, 2, /*to*/ 1, 0, 4};
    uint32_t at = 0;
    ring.WriteTable(at, &head, sizeof(head));
    ring.WriteTable(at += queue::kWindowSpansIds, spans, sizeof(spans));
    ring.WriteTable(at += 2 * queue::kWindowSpanIds, &part, sizeof(part));
    ring.WriteTable(at + queue::kPartIds, ids, sizeof(ids));
    queue::SubmitEntry e{};
    e.flags = queue::kFlagBatch | queue::kFlagWindowSpans | flags;
    e.dst_index = 1;
    e.length = 1024;
    e.blocks = 3;
    REQUIRE(f.Handle(ring, e));
    return ring.Next();
  };
  REQUIRE(write(2, 1).code == 0);
  CHECK(memcmp(f.windowed->data() + 1024, f.src->data(), 1024) == 0);
  CHECK(memcmp(f.windowed->data(), f.src->data() + 1024, 1024) == 0);
  CHECK(memcmp(f.windowed->data() + 4096, f.src->data() + 2048, 1024) == 0);

  memset(f.windowed->data(), 0, kRegionBytes);
  CheckRefused(write(1, 2), absl::StatusCode::kOutOfRange, "window spans[1]: parts[0]: ");  // block 1 in the second
  CheckRefused(write(2, 2), absl::StatusCode::kInvalidArgument, "window spans cover 4 blocks; the entry has 3");
  CheckRefused(write(3, 0), absl::StatusCode::kInvalidArgument, "window spans[1]: window_id and blocks must be >= 1");
  CheckRefused(write(2, 1, 0), absl::StatusCode::kInvalidArgument, "spans must be 1..256");
  CheckRefused(write(2, 1, 257), absl::StatusCode::kInvalidArgument, "spans must be 1..256");
  CheckRefused(write(2, 1, 2, queue::kFlagWindow), absl::StatusCode::kInvalidArgument, "exclude each other");
  REQUIRE(f.windows.Close(spans[1].window.window_id, f.receiver->id(), absl::Seconds(1)).ok());
  CheckRefused(write(2, 1), absl::StatusCode::kFailedPrecondition, "was closed");
  CHECK(std::vector<uint8_t>(f.windowed->data(), f.windowed->data() + kRegionBytes) ==
        std::vector<uint8_t>(kRegionBytes, 0));
}

TEST_CASE("Window entries are checked as the RPCs are") {
  Fixture f;
  ClientRing ring(1, *f.receiver, {Fixture::Descriptor(*f.src)});
  queue::SubmitEntry e{};
  e.flags = queue::kFlagOpenWindow | queue::kFlagNotify;
  REQUIRE(f.Handle(ring, e));
  CheckRefused(ring.Next(), absl::StatusCode::kInvalidArgument, "takes no other flag");

  const queue::WindowOpen too_long = {/*timeout_ms=*/60'001, 1, 1};
  ring.WriteTable(0, &too_long, sizeof(too_long));
  e.flags = queue::kFlagOpenWindow;
  REQUIRE(f.Handle(ring, e));
  CheckRefused(ring.Next(), absl::StatusCode::kInvalidArgument, "timeout_ms must be 1..60000");

  const queue::WindowOpen no_ranges = {1000, 1, 0};
  ring.WriteTable(0, &no_ranges, sizeof(no_ranges));
  REQUIRE(f.Handle(ring, e));
  CheckRefused(ring.Next(), absl::StatusCode::kInvalidArgument, "ranges must be 1..");

  e.tag = 1;
  REQUIRE(f.Handle(ring, e));
  CheckRefused(ring.Next(), absl::StatusCode::kInvalidArgument, "of a window's open entry must be 0");

  queue::SubmitEntry close{};
  close.flags = queue::kFlagCloseWindow;
  close.src_offset = 12345;
  close.length = 1001;
  REQUIRE(f.Handle(ring, close));
  CheckRefused(ring.Next(), absl::StatusCode::kInvalidArgument, "(--max_wait_ms)");
  close.length = 0;
  REQUIRE(f.Handle(ring, close));
  CheckRefused(ring.Next(), absl::StatusCode::kNotFound, "");
}

}  // namespace
}  // namespace ferry
