// The shared-memory write queue against a real ferryd: data lands byte for byte, every
// entry is validated like a Write, and a client that corrupts its own queue or hands
// over the wrong fds hurts nobody else.
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <new>

#include "absl/time/clock.h"
#include "client/cpp/ferry_client.h"
#include "client/cpp/write_queue.h"
#include "proto/ferry/wire/ring_layout.h"
#include "tests/testing/agent_process.h"
#include "tests/testing/test_pod.h"

namespace ferry {
namespace {

using testing::AgentProcess;
using testing::FillRandom;
using testing::MakePod;
using testing::ShuffledIds;
using testing::StartAgent;
using testing::TestPod;

// Reaps until `n` completions arrived (bounded).
std::vector<WriteQueue::Completion> ReapAll(WriteQueue& q, size_t n) {
  std::vector<WriteQueue::Completion> done;
  const absl::Time end = absl::Now() + absl::Seconds(30);
  while (done.size() < n && absl::Now() < end) q.Reap(&done, n - done.size(), absl::Milliseconds(200));
  REQUIRE(done.size() == n);
  return done;
}

TEST_CASE("a write queue moves many small writes byte for byte and returns each completion once") {
  auto agent = StartAgent();
  const uint64_t kSize = 4 << 20, kBlock = 4096, kBlocks = kSize / kBlock;
  TestPod sender = MakePod(agent->socket(), kSize);
  TestPod receiver = MakePod(agent->socket(), kSize, 0xEE);
  FillRandom(sender.buf->data(), kSize, 3);
  auto q = WriteQueue::Create(*sender.client, {receiver.reg.region()}, 64);
  INFO(q.status().ToString());
  REQUIRE(q.ok());

  const std::vector<uint64_t> dst = ShuffledIds<uint64_t>(kBlocks, 4);
  std::vector<int> seen(kBlocks, 0);
  uint64_t posted = 0, reaped = 0;
  std::vector<WriteQueue::Completion> done;
  const absl::Time end = absl::Now() + absl::Seconds(60);
  while (reaped < kBlocks && absl::Now() < end) {
    while (posted < kBlocks) {
      WriteQueue::Entry e;
      e.src_region = sender.reg.region_id();
      e.src_offset = posted * kBlock;
      e.dst_offset = dst[posted] * kBlock;
      e.length = kBlock;
      e.user_data = posted;
      absl::Status s = (*q)->Post(e);
      if (s.code() == absl::StatusCode::kResourceExhausted) break;  // 64 in flight: reap first
      REQUIRE(s.ok());
      ++posted;
    }
    CHECK((*q)->inflight() <= 64);
    done.clear();
    (*q)->Reap(&done, 64, absl::Milliseconds(200));
    for (const auto& c : done) {
      INFO(c.status.ToString());
      REQUIRE(c.status.ok());
      REQUIRE(c.user_data < kBlocks);
      CHECK(c.bytes == kBlock);
      CHECK(c.transfer_id != 0);
      ++seen[c.user_data];
    }
    reaped += done.size();
  }
  REQUIRE(reaped == kBlocks);
  CHECK(std::count(seen.begin(), seen.end(), 1) == static_cast<long>(kBlocks));
  for (uint64_t i = 0; i < kBlocks; ++i) {
    REQUIRE(memcmp(receiver.buf->data() + dst[i] * kBlock, sender.buf->data() + i * kBlock, kBlock) == 0);
  }
}

TEST_CASE("Reap waits for `min` completions, never for more than are in flight") {
  auto agent = StartAgent();
  const uint64_t kWrite = 4 << 20, kWrites = 8;
  TestPod sender = MakePod(agent->socket(), kWrite * kWrites, 0x21);
  TestPod receiver = MakePod(agent->socket(), kWrite * kWrites, 0);
  auto q = WriteQueue::Create(*sender.client, {receiver.reg.region()}, 16);
  REQUIRE(q.ok());
  auto post = [&](uint64_t i) {
    REQUIRE((*q)->Post({sender.reg.region_id(), 0, i * kWrite, i * kWrite, kWrite, i}).ok());
  };

  // 8 copies of 4 MiB finish one after another (the agent copies on 2 threads), so a
  // Reap that returned at the first completion would come back with fewer.
  for (uint64_t i = 0; i < kWrites; ++i) post(i);
  std::vector<WriteQueue::Completion> done;
  CHECK((*q)->Reap(&done, 64, absl::Seconds(30), /*min=*/kWrites) == kWrites);
  for (const auto& c : done) CHECK(c.status.ok());
  CHECK(memcmp(receiver.buf->data(), sender.buf->data(), kWrite * kWrites) == 0);

  // Two in flight: a min of 8 means both, not a wait for the timeout.
  post(0);
  post(1);
  done.clear();
  const absl::Time start = absl::Now();
  CHECK((*q)->Reap(&done, 64, absl::Seconds(20), /*min=*/8) == 2);
  CHECK(absl::Now() - start < absl::Seconds(10));

  // Nothing in flight: the timeout ends the wait with nothing.
  done.clear();
  CHECK((*q)->Reap(&done, 64, absl::Milliseconds(50), /*min=*/4) == 0);

  // Polling first (`spin`) finds the same completions, and a spin longer than the
  // timeout still ends at the timeout.
  for (uint64_t i = 0; i < kWrites; ++i) post(i);
  done.clear();
  CHECK((*q)->Reap(&done, 64, absl::Seconds(30), /*min=*/kWrites, /*spin=*/absl::Milliseconds(5)) == kWrites);
  for (const auto& c : done) CHECK(c.status.ok());
  done.clear();
  const absl::Time spun = absl::Now();
  CHECK((*q)->Reap(&done, 64, absl::Milliseconds(50), /*min=*/1, /*spin=*/absl::Seconds(30)) == 0);
  CHECK(absl::Now() - spun < absl::Seconds(10));
}

TEST_CASE("queue entries are validated like Writes: refusals come back as completions, nothing moves") {
  auto agent = StartAgent();
  TestPod sender = MakePod(agent->socket(), 1 << 20, 0x11);
  TestPod receiver = MakePod(agent->socket(), 1 << 16, 0x22);
  TestPod other = MakePod(agent->socket(), 1 << 16, 0x33);
  auto q = WriteQueue::Create(*sender.client, {receiver.reg.region()}, 8);
  REQUIRE(q.ok());

  struct Case {
    const char* name;
    WriteQueue::Entry entry;
    absl::StatusCode code;
    const char* message_part;
  };
  const uint64_t src = sender.reg.region_id();
  std::vector<Case> cases = {
      {"unknown destination index", {src, 1, 0, 0, 8}, absl::StatusCode::kInvalidArgument, "dst_index 1"},
      {"another session's source region",
       {other.reg.region_id(), 0, 0, 0, 8},
       absl::StatusCode::kPermissionDenied,
       "another session"},
      {"unregistered source region", {987654, 0, 0, 0, 8}, absl::StatusCode::kNotFound, "987654"},
      {"destination out of bounds", {src, 0, 0, (1 << 16) - 4, 8}, absl::StatusCode::kOutOfRange, "destination range"},
      {"source out of bounds", {src, 0, (1 << 20) - 4, 0, 8}, absl::StatusCode::kOutOfRange, "source range"},
      {"zero length", {src, 0, 0, 0, 0}, absl::StatusCode::kInvalidArgument, "length"},
      {"offset + length overflows", {src, 0, ~0ull - 2, 0, 8}, absl::StatusCode::kOutOfRange, ""},
  };
  for (uint64_t i = 0; i < cases.size(); ++i) {
    cases[i].entry.user_data = 100 + i;
    REQUIRE((*q)->Post(cases[i].entry).ok());
    auto done = ReapAll(**q, 1);
    INFO(cases[i].name << ": " << done[0].status.ToString());
    CHECK(done[0].user_data == 100 + i);
    CHECK(done[0].status.code() == cases[i].code);
    CHECK(std::string(done[0].status.message()).find(cases[i].message_part) != std::string::npos);
    CHECK(done[0].transfer_id == 0);
  }
  for (uint64_t i = 0; i < (1 << 16); ++i) REQUIRE(receiver.buf->data()[i] == 0x22);

  // The queue still works, and the refusals were counted.
  REQUIRE((*q)->Post({src, 0, 0, 0, 4096, 7}).ok());
  auto done = ReapAll(**q, 1);
  CHECK(done[0].status.ok());
  CHECK(memcmp(receiver.buf->data(), sender.buf->data(), 4096) == 0);
  auto metrics = testing::HttpGet(agent->metrics_port(), "/metrics");
  REQUIRE(metrics.ok());
  CHECK(testing::MetricValue(*metrics, "ferry_errors_total", R"(api="Queue",code="OUT_OF_RANGE")") == 3);
}

// A queue assembled by hand, for what the client library would never send.
struct RawQueue {
  int ring = -1, submit = -1, complete = -1, complete_ours = -1;
  void* map = nullptr;
  size_t bytes = 0;
  queue::RingHeader* header = nullptr;

  explicit RawQueue(uint32_t entries, size_t ring_bytes = 0, bool sealable = true) {
    bytes = ring_bytes != 0 ? ring_bytes : queue::RingBytes(entries);
    ring = memfd_create("raw-queue", MFD_CLOEXEC | (sealable ? MFD_ALLOW_SEALING : 0));
    REQUIRE(ftruncate(ring, bytes) == 0);
    map = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, ring, 0);
    REQUIRE(map != MAP_FAILED);
    header = new (map) queue::RingHeader{};
    header->magic = queue::kRingMagic;
    header->entries = entries;
    submit = eventfd(0, EFD_CLOEXEC);
    int pair[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) == 0);
    complete = pair[0];
    complete_ours = pair[1];
  }
  ~RawQueue() {
    munmap(map, bytes);
    for (int fd : {ring, submit, complete, complete_ours}) close(fd);
  }
  queue::SubmitEntry* sq() {
    return reinterpret_cast<queue::SubmitEntry*>(static_cast<char*>(map) + queue::kSubmitOffset);
  }
};

absl::Status Create(Client& c, int ring, int submit, int complete, uint32_t entries,
                    std::vector<v1::RegionDescriptor> dsts, uint32_t table_ids = 0) {
  v1::CreateQueueRequest req;
  auto send = [&](int fd) -> uint64_t {
    auto h = c.SendFd(fd);
    REQUIRE(h.ok());
    return *h;
  };
  req.set_ring_fd(send(ring));
  req.set_submit_doorbell_fd(send(submit));
  req.set_complete_doorbell_fd(send(complete));
  req.set_entries(entries);
  req.set_table_ids(table_ids);
  for (auto& d : dsts) *req.add_destinations() = d;
  v1::CreateQueueResponse resp;
  auto ctx = c.NewContext();
  return FromGrpcStatus(c.stub()->CreateQueue(ctx.get(), req, &resp));
}

// Posts `e` as entry `index` of `rq` (made with `entries` slots) and returns its completion.
queue::CompletionEntry PostRaw(RawQueue& rq, uint32_t entries, const queue::SubmitEntry& e, uint32_t index = 0) {
  rq.sq()[index % entries] = e;
  rq.header->sq_tail.value.store(index + 1);
  uint64_t one = 1;
  REQUIRE(write(rq.submit, &one, sizeof(one)) == sizeof(one));
  const absl::Time end = absl::Now() + absl::Seconds(30);
  while (rq.header->cq_tail.value.load() == index && absl::Now() < end) absl::SleepFor(absl::Milliseconds(1));
  REQUIRE(rq.header->cq_tail.value.load() == index + 1);
  const queue::CompletionEntry c = reinterpret_cast<const queue::CompletionEntry*>(
      static_cast<char*>(rq.map) + queue::CompletionOffset(entries))[index % entries];
  rq.header->cq_head.value.store(index + 1);  // reaped: the slot is free again
  return c;
}

TEST_CASE("paged entries apply one block mapping from the queue's block table to each layer") {
  auto agent = StartAgent();
  // Two "layers" in each region: layer l at base l * kLayer. 48 of each layer's 128
  // blocks move, scattered on both sides; the rest of the receiver stays as it was.
  const uint64_t kBlock = 4096, kLayerBlocks = 128, kLayer = kBlock * kLayerBlocks, kMoved = 48;
  TestPod sender = MakePod(agent->socket(), 2 * kLayer);
  TestPod receiver = MakePod(agent->socket(), 2 * kLayer, 0xEE);
  FillRandom(sender.buf->data(), 2 * kLayer, 9);
  auto q = WriteQueue::Create(*sender.client, {receiver.reg.region()}, 16, 0, v1::TRAFFIC_CLASS_UNSPECIFIED,
                              /*table_ids=*/1024);
  INFO(q.status().ToString());
  REQUIRE(q.ok());
  REQUIRE((*q)->table_ids() == 1024);

  const std::vector<uint32_t> src = ShuffledIds(kLayerBlocks, 1), dst = ShuffledIds(kLayerBlocks, 2);
  const uint32_t at = 100;  // anywhere in the table
  std::copy(src.begin(), src.begin() + kMoved, (*q)->table() + at);
  std::copy(dst.begin(), dst.begin() + kMoved, (*q)->table() + at + kMoved);
  for (uint64_t layer = 0; layer < 2; ++layer) {
    WriteQueue::PagedEntry e;
    e.src_region = sender.reg.region_id();
    e.src_base = e.dst_base = layer * kLayer;
    e.block_size = kBlock;
    e.table_index = at;
    e.blocks = kMoved;
    e.user_data = layer;
    REQUIRE((*q)->PostPaged(e).ok());
  }
  auto done = ReapAll(**q, 2);
  for (const auto& c : done) {
    INFO(c.status.ToString());
    CHECK(c.status.ok());
    CHECK(c.bytes == kMoved * kBlock);
  }
  std::vector<uint8_t> expected(2 * kLayer, 0xEE);
  for (uint64_t layer = 0; layer < 2; ++layer) {
    for (uint64_t i = 0; i < kMoved; ++i) {
      memcpy(expected.data() + layer * kLayer + dst[i] * kBlock, sender.buf->data() + layer * kLayer + src[i] * kBlock,
             kBlock);
    }
  }
  CHECK(memcmp(receiver.buf->data(), expected.data(), expected.size()) == 0);
}

TEST_CASE("paged entries are checked like a Write's paged layout: refusals name what to fix, nothing moves") {
  auto agent = StartAgent();
  const uint64_t kBlock = 4096, kBlocks = 16;
  TestPod sender = MakePod(agent->socket(), kBlock * kBlocks, 0x11);
  TestPod receiver = MakePod(agent->socket(), kBlock * kBlocks, 0x22);
  auto q = WriteQueue::Create(*sender.client, {receiver.reg.region()}, 8, 0, v1::TRAFFIC_CLASS_UNSPECIFIED,
                              /*table_ids=*/64);
  REQUIRE(q.ok());
  uint32_t* table = (*q)->table();
  // ids 0..3 -> 0..3 at [0, 8); 0..3 -> 5, 5, 6, 7 at [8, 16); 0 -> 99 at [16, 18).
  const uint32_t ids[] = {0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 5, 5, 6, 7, 0, 99};
  std::copy(std::begin(ids), std::end(ids), table);
  WriteQueue::PagedEntry good;
  good.src_region = sender.reg.region_id();
  good.block_size = kBlock;
  good.blocks = 4;

  struct Case {
    const char* name;
    WriteQueue::PagedEntry entry;
    absl::StatusCode code;
    const char* message_part;
  };
  auto with = [&](auto change) {
    WriteQueue::PagedEntry e = good;
    change(e);
    return e;
  };
  std::vector<Case> cases = {
      {"ids beyond the table", with([](auto& e) { e.table_index = 60; }), absl::StatusCode::kOutOfRange,
       "outside the queue's block table of 64 ids"},
      {"no blocks", with([](auto& e) { e.blocks = 0; }), absl::StatusCode::kInvalidArgument, "at least one block"},
      {"block size 0", with([](auto& e) { e.block_size = 0; }), absl::StatusCode::kInvalidArgument,
       "block_size must be >= 1"},
      {"a destination block twice", with([](auto& e) { e.table_index = 8; }), absl::StatusCode::kInvalidArgument,
       "block 5 appears twice"},
      {"a destination block out of range", with([](auto& e) { e.table_index = 16, e.blocks = 1; }),
       absl::StatusCode::kOutOfRange, "destination range"},
      {"a base past the region", with([](auto& e) { e.src_base = kBlock * kBlocks; }), absl::StatusCode::kOutOfRange,
       "source range"},
      {"a base + id * block_size that wraps",
       with([](auto& e) { e.dst_base = ~0ull - kBlock, e.table_index = 16, e.blocks = 1; }),
       absl::StatusCode::kOutOfRange, "overflows 64 bits"},
      {"another session's source region", with([&](auto& e) { e.src_region = receiver.reg.region_id(); }),
       absl::StatusCode::kPermissionDenied, "another session"},
  };
  for (uint64_t i = 0; i < cases.size(); ++i) {
    cases[i].entry.user_data = 200 + i;
    REQUIRE((*q)->PostPaged(cases[i].entry).ok());
    auto done = ReapAll(**q, 1);
    INFO(cases[i].name << ": " << done[0].status.ToString());
    CHECK(done[0].user_data == 200 + i);
    CHECK(done[0].status.code() == cases[i].code);
    CHECK(std::string(done[0].status.message()).find(cases[i].message_part) != std::string::npos);
    CHECK(done[0].transfer_id == 0);
  }
  // A contiguous entry may not carry table fields, and a queue without a table takes no
  // paged entry.
  {
    RawQueue rq(16);
    REQUIRE(Create(*sender.client, rq.ring, rq.submit, rq.complete, 16, {receiver.reg.region()}).ok());
    const queue::CompletionEntry c =
        PostRaw(rq, 16, {7, sender.reg.region_id(), 0, 0, kBlock, 0, 0, 0, /*table_index=*/0, /*blocks=*/4});
    CHECK(c.user_data == 7);
    CHECK(c.code == static_cast<int>(absl::StatusCode::kInvalidArgument));
    CHECK(std::string(c.message).find("table_index and blocks are for paged and batch entries") != std::string::npos);
  }
  auto plain = WriteQueue::Create(*sender.client, {receiver.reg.region()}, 8);
  REQUIRE(plain.ok());
  REQUIRE((*plain)->PostPaged(good).ok());
  auto done = ReapAll(**plain, 1);
  CHECK(done[0].status.code() == absl::StatusCode::kOutOfRange);
  CHECK(std::string(done[0].status.message()).find("block table of 0 ids") != std::string::npos);
  for (uint64_t i = 0; i < kBlock * kBlocks; ++i) REQUIRE(receiver.buf->data()[i] == 0x22);

  // The good entry moves blocks 0..3, and the queue still works after its refusals.
  REQUIRE((*q)->PostPaged(good).ok());
  done = ReapAll(**q, 1);
  CHECK(done[0].status.ok());
  CHECK(memcmp(receiver.buf->data(), sender.buf->data(), 4 * kBlock) == 0);
}

TEST_CASE("a batch entry moves one block mapping over several regions as one transfer with one notification") {
  auto agent = StartAgent();
  constexpr uint64_t kBlock = 4096, kBlocks = 64, kLayer = kBlock * kBlocks;
  constexpr uint32_t kLayers = 3, kMoved = 20;
  TestPod sender = MakePod(agent->socket(), kLayers * kLayer);
  TestPod receiver = MakePod(agent->socket(), kLayers * kLayer, 0xEE);
  FillRandom(sender.buf->data(), kLayers * kLayer, 11);
  // One destination per layer (as a consumer's layer regions), all the receiver's.
  std::vector<v1::RegionDescriptor> dsts(kLayers, receiver.reg.region());
  auto q = WriteQueue::Create(*sender.client, dsts, 8, 0, v1::TRAFFIC_CLASS_UNSPECIFIED, /*table_ids=*/512);
  REQUIRE(q.ok());
  std::vector<uint32_t> src = ShuffledIds(kBlocks, 3), dst = ShuffledIds(kBlocks, 4);
  src.resize(kMoved);
  dst.resize(kMoved);
  std::vector<queue::TablePart> parts;
  for (uint32_t l = 0; l < kLayers; ++l) parts.push_back({sender.reg.region_id(), l * kLayer, l * kLayer, l, 0});
  auto ctx = receiver.client->NewContext(absl::Seconds(30));
  auto stream = receiver.client->stub()->WatchNotifications(ctx.get(), v1::WatchNotificationsRequest());
  REQUIRE(
      (*q)->PostBatch(5, parts, src, dst, {kBlock, /*user_data=*/77, /*notify=*/true, /*tag=*/123, "request-1"}).ok());
  auto done = ReapAll(**q, 1);
  INFO(done[0].status.ToString());
  REQUIRE(done[0].status.ok());
  CHECK(done[0].user_data == 77);
  CHECK(done[0].bytes == kLayers * kMoved * kBlock);
  CHECK(done[0].transfer_id != 0);
  std::vector<uint8_t> expected(kLayers * kLayer, 0xEE);
  for (uint32_t l = 0; l < kLayers; ++l) {
    for (uint32_t i = 0; i < kMoved; ++i) {
      memcpy(expected.data() + l * kLayer + dst[i] * kBlock, sender.buf->data() + l * kLayer + src[i] * kBlock, kBlock);
    }
  }
  CHECK(memcmp(receiver.buf->data(), expected.data(), expected.size()) == 0);
  // One notification for the whole batch, with every part's bytes.
  v1::Notification n;
  REQUIRE(stream->Read(&n));
  CHECK(n.tag() == 123);
  CHECK(n.payload() == "request-1");
  CHECK(n.bytes() == kLayers * kMoved * kBlock);
  CHECK(n.transfer_id() == done[0].transfer_id);

  // Refusals name the part or field; nothing moves.
  memset(receiver.buf->data(), 0xEE, kLayers * kLayer);
  struct Case {
    const char* name;
    std::vector<queue::TablePart> parts;
    uint32_t table_index;
    absl::StatusCode code;
    const char* message_part;
  };
  auto with = [&](uint32_t p, auto change) {
    std::vector<queue::TablePart> ps = parts;
    change(ps[p]);
    return ps;
  };
  std::vector<Case> cases = {
      {"a part's unknown destination", with(1, [](auto& p) { p.dst_index = 9; }), 0, absl::StatusCode::kInvalidArgument,
       "parts[1]: dst_index 9"},
      {"a part's block out of range", with(2, [&](auto& p) { p.dst_base = kLayers * kLayer - kBlock; }), 0,
       absl::StatusCode::kOutOfRange, "parts[2]: destination range"},
      {"another session's source region", with(0, [&](auto& p) { p.src_region = receiver.reg.region_id(); }), 0,
       absl::StatusCode::kPermissionDenied, "parts[0]"},
      {"ids past the table", parts, 480, absl::StatusCode::kInvalidArgument, "table ids"},
  };
  {  // a payload longer than a notification may carry (the client library would refuse less)
    auto big = WriteQueue::Create(*sender.client, dsts, 8, 0, v1::TRAFFIC_CLASS_UNSPECIFIED, 4096);
    REQUIRE(big.ok());
    REQUIRE((*big)->PostBatch(0, parts, src, dst, {kBlock, 9, true, 1, std::string(5000, 'x')}).ok());
    auto got = ReapAll(**big, 1);
    CHECK(got[0].status.code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(got[0].status.message()).find("at most 4096") != std::string::npos);
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    absl::Status posted = (*q)->PostBatch(cases[i].table_index, cases[i].parts, src, dst, {kBlock, 300 + i, true, 1});
    INFO(cases[i].name << ": " << posted.ToString());
    if (!posted.ok()) {  // refused by the client before anything was posted
      CHECK(posted.code() == cases[i].code);
      CHECK(std::string(posted.message()).find(cases[i].message_part) != std::string::npos);
      continue;
    }
    auto got = ReapAll(**q, 1);
    INFO(got[0].status.ToString());
    CHECK(got[0].status.code() == cases[i].code);
    CHECK(std::string(got[0].status.message()).find(cases[i].message_part) != std::string::npos);
    CHECK(got[0].transfer_id == 0);
  }
  for (uint64_t i = 0; i < kLayers * kLayer; ++i) REQUIRE(receiver.buf->data()[i] == 0xEE);
  // The refused batches notified nobody: the next notification is the next good batch's.
  REQUIRE((*q)->PostBatch(0, parts, src, dst, {kBlock, 8, true, 456}).ok());
  CHECK(ReapAll(**q, 1)[0].status.ok());
  REQUIRE(stream->Read(&n));
  CHECK(n.tag() == 456);
  ctx->TryCancel();
}

TEST_CASE("message entries reach the destination's owner in order; bad ones are refused and deliver nothing") {
  auto agent = StartAgent();
  TestPod sender = MakePod(agent->socket(), 1 << 16);
  TestPod receiver = MakePod(agent->socket(), 1 << 16);
  auto q = WriteQueue::Create(*sender.client, {receiver.reg.region()}, 8, 0, v1::TRAFFIC_CLASS_UNSPECIFIED,
                              /*table_ids=*/3 * 1024);
  REQUIRE(q.ok());
  auto ctx = receiver.client->NewContext(absl::Seconds(30));
  auto stream = receiver.client->stub()->WatchNotifications(ctx.get(), v1::WatchNotificationsRequest());
  const std::string payloads[] = {"pull 1", "", std::string(4096, 'x')};
  for (uint32_t i = 0; i < 3; ++i) REQUIRE((*q)->PostMessage(i * 1024, 0, /*tag=*/10 + i, payloads[i], i).ok());
  for (const WriteQueue::Completion& c : ReapAll(**q, 3)) {
    INFO(c.status.ToString());
    CHECK(c.status.ok());
    CHECK(c.bytes == 0);
  }
  for (uint32_t i = 0; i < 3; ++i) {
    v1::Notification n;
    REQUIRE(stream->Read(&n));
    CHECK(n.kind() == v1::NOTIFICATION_KIND_MESSAGE);
    CHECK(n.tag() == 10 + i);
    CHECK(n.payload() == payloads[i]);
    CHECK(n.region_id() == receiver.reg.region_id());
  }

  // Refused by the client: the payload does not fit in the table.
  absl::Status posted = (*q)->PostMessage(3 * 1024 - 1, 0, 1, "12345");
  CHECK(posted.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(posted.message()).find("table ids") != std::string::npos);
  // Refused by the agent, naming the field.
  RawQueue rq(8, queue::RingBytes(8, 1024));
  REQUIRE(Create(*sender.client, rq.ring, rq.submit, rq.complete, 8, {receiver.reg.region()}, 1024).ok());
  const uint32_t kMessage = queue::kFlagMessage;
  struct Case {
    const char* name;
    queue::SubmitEntry entry;  // user_data, src_region, src_offset (payload bytes), dst_offset, length, tag,
                               // dst_index, flags, table_index, blocks
    absl::StatusCode code;
    const char* message_part;
  };
  const std::vector<Case> cases = {
      {"another destination index",
       {0, 0, 4, 0, 0, 1, 1, kMessage, 0, 0},
       absl::StatusCode::kInvalidArgument,
       "dst_index 1"},
      {"with the notify flag",
       {0, 0, 4, 0, 0, 1, 0, kMessage | queue::kFlagNotify, 0, 0},
       absl::StatusCode::kInvalidArgument,
       "takes no other flag"},
      {"with the batch flag",
       {0, 0, 4, 0, 0, 1, 0, kMessage | queue::kFlagBatch, 0, 0},
       absl::StatusCode::kInvalidArgument,
       "takes no other flag"},
      {"a source region",
       {0, sender.reg.region_id(), 4, 0, 0, 1, 0, kMessage, 0, 0},
       absl::StatusCode::kInvalidArgument,
       "must be 0"},
      {"a length", {0, 0, 4, 0, 8, 1, 0, kMessage, 0, 0}, absl::StatusCode::kInvalidArgument, "must be 0"},
      {"blocks", {0, 0, 4, 0, 0, 1, 0, kMessage, 0, 3}, absl::StatusCode::kInvalidArgument, "must be 0"},
      {"a destination offset", {0, 0, 4, 64, 0, 1, 0, kMessage, 0, 0}, absl::StatusCode::kInvalidArgument, "must be 0"},
      {"a payload over 4 KiB",
       {0, 0, 4097, 0, 0, 1, 0, kMessage, 0, 0},
       absl::StatusCode::kInvalidArgument,
       "at most 4096"},
      {"a payload past the table",
       {0, 0, 8, 0, 0, 1, 0, kMessage, 1023, 0},
       absl::StatusCode::kOutOfRange,
       "outside the queue's block table of 1024 ids"},
      {"a table index past the table",
       {0, 0, 0, 0, 0, 1, 0, kMessage, 5000, 0},
       absl::StatusCode::kOutOfRange,
       "outside the queue's block table"},
  };
  uint32_t index = 0;
  for (const Case& c : cases) {
    queue::SubmitEntry e = c.entry;
    e.user_data = 500 + index;
    const queue::CompletionEntry done = PostRaw(rq, 8, e, index++);
    INFO(c.name << ": " << done.message);
    CHECK(done.user_data == e.user_data);
    CHECK(done.code == static_cast<int>(c.code));
    CHECK(std::string(done.message).find(c.message_part) != std::string::npos);
  }
  // A destination that went away.
  TestPod gone = MakePod(agent->socket(), 4096);
  auto to_gone = WriteQueue::Create(*sender.client, {gone.reg.region()}, 8, 0, v1::TRAFFIC_CLASS_UNSPECIFIED, 1024);
  REQUIRE(to_gone.ok());
  REQUIRE(gone.client->Deregister(gone.reg.region_id()).ok());
  REQUIRE((*to_gone)->PostMessage(0, 0, 1, "anyone?").ok());
  auto refused = ReapAll(**to_gone, 1);
  CHECK(refused[0].status.code() == absl::StatusCode::kNotFound);
  CHECK(std::string(refused[0].status.message()).find("is not registered") != std::string::npos);
  // Nothing refused reached the receiver: its next notification is the next good message.
  REQUIRE((*q)->PostMessage(0, 0, 99, "after").ok());
  CHECK(ReapAll(**q, 1)[0].status.ok());
  v1::Notification n;
  REQUIRE(stream->Read(&n));
  CHECK(n.tag() == 99);
  CHECK(n.payload() == "after");
  ctx->TryCancel();
}

TEST_CASE("CreateQueue refuses what is not a queue, naming the field") {
  auto agent = StartAgent();
  TestPod pod = MakePod(agent->socket(), 1 << 16);
  const auto dst = pod.reg.region();
  int pipe_fds[2];
  REQUIRE(pipe(pipe_fds) == 0);
  {
    RawQueue rq(16);
    auto s = Create(*pod.client, rq.ring, pipe_fds[0], rq.complete, 16, {dst});
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(s.message()).find("submit_doorbell_fd must be an eventfd") != std::string::npos);
  }
  {  // the agent rings the completion doorbell: an eventfd's write could be made to block
    RawQueue rq(16);
    auto s = Create(*pod.client, rq.ring, rq.submit, rq.submit, 16, {dst});
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(s.message()).find("complete_doorbell_fd must be one end of a unix stream socketpair") !=
          std::string::npos);
  }
  {
    RawQueue rq(16, /*ring_bytes=*/1024);
    auto s = Create(*pod.client, rq.ring, rq.submit, rq.complete, 16, {dst});
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(s.message()).find("needs") != std::string::npos);
  }
  {  // a block table the memfd does not hold
    RawQueue rq(16);
    auto s = Create(*pod.client, rq.ring, rq.submit, rq.complete, 16, {dst}, /*table_ids=*/1024);
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(s.message()).find("1024 table ids needs") != std::string::npos);
  }
  {
    RawQueue rq(16, queue::RingBytes(16, 64));
    auto s = Create(*pod.client, rq.ring, rq.submit, rq.complete, 16, {dst}, queue::kMaxTableIds + 1);
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(s.message()).find("table_ids must be at most") != std::string::npos);
  }
  {  // a memfd the agent cannot seal: the client could shrink it under the agent
    RawQueue rq(16, 0, /*sealable=*/false);
    auto s = Create(*pod.client, rq.ring, rq.submit, rq.complete, 16, {dst});
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(s.message()).find("ring_fd: the fd cannot be sealed against shrinking") != std::string::npos);
  }
  {  // a ring the agent took is sealed: the client can no longer shrink it
    RawQueue rq(16);
    REQUIRE(Create(*pod.client, rq.ring, rq.submit, rq.complete, 16, {dst}).ok());
    CHECK(ftruncate(rq.ring, 0) != 0);
    CHECK(errno == EPERM);
  }
  {
    RawQueue rq(16);
    auto s = Create(*pod.client, rq.ring, rq.submit, rq.complete, 12, {dst});
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(s.message()).find("power of two") != std::string::npos);
  }
  {
    RawQueue rq(16);
    rq.header->magic = 0;
    auto s = Create(*pod.client, rq.ring, rq.submit, rq.complete, 16, {dst});
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  }
  {
    RawQueue rq(16);
    auto s = Create(*pod.client, rq.ring, rq.submit, rq.complete, 16, {});
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(s.message()).find("destinations") != std::string::npos);
  }
  {
    RawQueue rq(16);
    v1::RegionDescriptor forged = dst;
    forged.set_token(std::string(16, '\x01'));
    auto s = Create(*pod.client, rq.ring, rq.submit, rq.complete, 16, {dst, forged});
    CHECK(s.code() == absl::StatusCode::kPermissionDenied);
    CHECK(std::string(s.message()).find("destinations[1]") != std::string::npos);
  }
  close(pipe_fds[0]);
  close(pipe_fds[1]);
}

TEST_CASE("a client that corrupts its queue stalls only that queue") {
  auto agent = StartAgent();
  TestPod evil = MakePod(agent->socket(), 1 << 16);
  TestPod good = MakePod(agent->socket(), 1 << 16, 0x44);
  TestPod receiver = MakePod(agent->socket(), 1 << 16, 0x55);
  RawQueue rq(16);
  REQUIRE(Create(*evil.client, rq.ring, rq.submit, rq.complete, 16, {receiver.reg.region()}).ok());
  // A tail far ahead of anything submitted, and garbage in every slot.
  memset(rq.sq(), 0xA5, 16 * sizeof(queue::SubmitEntry));
  rq.header->sq_tail.value.store(100000);
  uint64_t one = 1;
  REQUIRE(write(rq.submit, &one, sizeof(one)) == sizeof(one));

  auto q = WriteQueue::Create(*good.client, {receiver.reg.region()}, 16);
  REQUIRE(q.ok());
  REQUIRE((*q)->Post({good.reg.region_id(), 0, 0, 0, 4096, 1}).ok());
  auto done = ReapAll(**q, 1);
  CHECK(done[0].status.ok());
  CHECK(receiver.buf->data()[0] == 0x44);
  CHECK(receiver.buf->data()[4096] == 0x55);
  CHECK(rq.header->cq_tail.value.load() == 0);  // the corrupt queue got nothing
  auto status = good.client->GetStatus();
  REQUIRE(status.ok());  // the agent is alive and serving
}

TEST_CASE("a session's queues end with it, and the agent keeps serving") {
  auto agent = StartAgent();
  TestPod receiver = MakePod(agent->socket(), 1 << 16);
  TestPod keeper = MakePod(agent->socket(), 1 << 16);
  std::vector<std::unique_ptr<WriteQueue>> kept;  // queues created after each round's
  for (int round = 0; round < 3; ++round) {
    TestPod pod = MakePod(agent->socket(), 1 << 16, 0x40 + round);
    std::vector<std::unique_ptr<WriteQueue>> queues;
    for (int i = 0; i < 3; ++i) {
      auto q = WriteQueue::Create(*pod.client, {receiver.reg.region()}, 8);
      REQUIRE(q.ok());
      queues.push_back(std::move(*q));
    }
    auto k = WriteQueue::Create(*keeper.client, {receiver.reg.region()}, 8);
    REQUIRE(k.ok());
    kept.push_back(std::move(*k));
    REQUIRE(queues[1]->Post({pod.reg.region_id(), 0, 0, 0, 4096, 1}).ok());
    REQUIRE(ReapAll(*queues[1], 1)[0].status.ok());
  }  // the pods close their sessions here, queues and all
  absl::SleepFor(absl::Milliseconds(300));
  INFO(agent->Log());
  REQUIRE(agent->running());
  for (auto& k : kept) {  // the other session's queues still work
    REQUIRE(k->Post({keeper.reg.region_id(), 0, 0, 0, 64, 1}).ok());
    CHECK(ReapAll(*k, 1)[0].status.ok());
  }
  TestPod after = MakePod(agent->socket(), 1 << 16, 0x77);
  auto q = WriteQueue::Create(*after.client, {receiver.reg.region()}, 8);
  REQUIRE(q.ok());
  REQUIRE((*q)->Post({after.reg.region_id(), 0, 0, 0, 4096, 1}).ok());
  CHECK(ReapAll(**q, 1)[0].status.ok());
  CHECK(receiver.buf->data()[0] == 0x77);
}

TEST_CASE("a client that stops reaping cannot make the agent overwrite unread completions") {
  auto agent = StartAgent();
  TestPod pod = MakePod(agent->socket(), 1 << 16);
  TestPod receiver = MakePod(agent->socket(), 1 << 16);
  RawQueue rq(8);
  REQUIRE(Create(*pod.client, rq.ring, rq.submit, rq.complete, 8, {receiver.reg.region()}).ok());
  // Submit 8 writes, never advance cq_head, then submit 8 more by reusing the slots.
  for (uint32_t round = 0; round < 2; ++round) {
    for (uint32_t i = 0; i < 8; ++i) {
      queue::SubmitEntry& e = rq.sq()[i];
      e = queue::SubmitEntry{round * 8 + i, pod.reg.region_id(), 0, i * 64, 64, 0, 0, 0, 0};
    }
    // Round 1 lies: its slots were never freed from the agent's point of view.
    rq.header->sq_tail.value.store((round + 1) * 8);
    uint64_t one = 1;
    REQUIRE(write(rq.submit, &one, sizeof(one)) == sizeof(one));
    const absl::Time end = absl::Now() + absl::Seconds(10);
    while (rq.header->cq_tail.value.load() < 8 && absl::Now() < end) absl::SleepFor(absl::Milliseconds(5));
  }
  absl::SleepFor(absl::Milliseconds(300));
  CHECK(rq.header->cq_tail.value.load() == 8);  // never past the unread eight
  CHECK(rq.header->sq_head.value.load() == 8);  // the second eight wait for room
}

}  // namespace
}  // namespace ferry
