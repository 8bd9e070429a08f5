// Write windows through the C++ client, against real agents: a region in window mode
// takes a write only through an open window of it; once its owner closed the window and
// reused the bytes, a late write is refused by the owner's agent and the new bytes stay,
// on one agent (local copy) and across two in network namespaces (fabric, with the
// window's keys revoked, and staged); windows opened and closed by queue entries; and one
// queue entry through several windows.
#include <catch2/catch.hpp>
#include <cstring>

#include "client/cpp/ferry_client.h"
#include "client/cpp/write_queue.h"
#include "tests/testing/agent_process.h"
#include "tests/testing/fabric_agent.h"
#include "tests/testing/netns.h"
#include "tests/testing/test_pod.h"

namespace ferry {
namespace {

using testing::ChunkWrite;
using testing::MakePod;
using testing::StartFabricAgent;
using testing::TestNetwork;

constexpr uint64_t kBlock = 4096;

bool All(const HostBuffer& b, uint64_t from, uint64_t to, uint8_t value) {
  for (uint64_t i = from; i < to; ++i) {
    if (b.data()[i] != value) return false;
  }
  return true;
}

// The owner opens blocks 2..3 for the writer, the writer fills block 2, the owner closes
// the window and reuses blocks 2..3; the writer's late write is refused.
void LateWriteIsRefused(const std::string& writer_socket, const std::string& owner_socket, v1::TransferPath path) {
  testing::TestPod writer = MakePod(writer_socket, 8 * kBlock, 0xAB);
  auto owner = Client::Connect(owner_socket);
  REQUIRE(owner.ok());
  auto kv = (*owner)->AllocateHost(8 * kBlock, /*write_windows=*/true);
  INFO(kv.status().ToString());
  REQUIRE(kv.ok());
  memset(kv->buffer.data(), 0, 8 * kBlock);

  // Its own descriptor no longer writes into it.
  absl::StatusOr<v1::TransferResult> plain =
      writer.client->WriteAndWait(ChunkWrite(writer, kv->descriptor(), 0, 2 * kBlock, kBlock), absl::Seconds(30));
  CHECK(plain.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(plain.status().message()), Catch::Contains("only through write windows"));

  absl::StatusOr<v1::OpenWriteWindowResponse> window =
      (*owner)->OpenWriteWindow({kv->id()}, {{2 * kBlock, 2 * kBlock}}, &writer.reg.region(), absl::Seconds(30));
  INFO(window.status().ToString());
  REQUIRE(window.ok());
  const v1::RegionDescriptor& through = window->regions(0);
  absl::StatusOr<v1::TransferResult> in =
      writer.client->WriteAndWait(ChunkWrite(writer, through, 0, 2 * kBlock, kBlock), absl::Seconds(30));
  INFO(in.status().ToString());
  REQUIRE(in.ok());
  CHECK(in->path() == path);
  CHECK(All(kv->buffer, 2 * kBlock, 3 * kBlock, 0xAB));
  absl::StatusOr<v1::TransferResult> outside =
      writer.client->WriteAndWait(ChunkWrite(writer, through, 0, 4 * kBlock, kBlock), absl::Seconds(30));
  CHECK(outside.status().code() == absl::StatusCode::kOutOfRange);
  CHECK(All(kv->buffer, 4 * kBlock, 8 * kBlock, 0));

  REQUIRE((*owner)->CloseWriteWindow(window->window_id()).ok());
  memset(kv->buffer.data() + 2 * kBlock, 0x11, 2 * kBlock);  // the blocks' next owner
  absl::StatusOr<v1::TransferResult> late =
      writer.client->WriteAndWait(ChunkWrite(writer, through, 0, 2 * kBlock, 2 * kBlock), absl::Seconds(30));
  CHECK(late.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(late.status().message()), Catch::Contains("was closed by its owner"));
  absl::SleepFor(absl::Milliseconds(100));
  CHECK(All(kv->buffer, 2 * kBlock, 4 * kBlock, 0x11));
}

// The same through entries of the owner's write queue to the writer (no RPC).
TEST_CASE("write windows: opened and closed by write-queue entries, a late write is refused") {
  auto agent = testing::StartAgent();
  testing::TestPod writer = MakePod(agent->socket(), 8 * kBlock, 0xAB);
  auto owner = Client::Connect(agent->socket());
  REQUIRE(owner.ok());
  auto kv = (*owner)->AllocateHost(8 * kBlock, /*write_windows=*/true);
  REQUIRE(kv.ok());
  memset(kv->buffer.data(), 0, 8 * kBlock);
  auto q = WriteQueue::Create(**owner, {writer.reg.region()}, 8, 0, v1::TRAFFIC_CLASS_UNSPECIFIED, /*table_ids=*/64);
  REQUIRE(q.ok());
  auto one = [&](uint64_t user_data) {
    std::vector<WriteQueue::Completion> out;
    REQUIRE((*q)->Reap(&out, 1, absl::Seconds(10)) == 1);
    CHECK(out[0].user_data == user_data);
    return out[0];
  };
  const uint64_t ids[] = {kv->id()};
  const std::pair<uint64_t, uint64_t> ranges[] = {{2 * kBlock, 2 * kBlock}};
  REQUIRE((*q)->PostOpenWindow(0, 0, ids, ranges, 30000, /*user_data=*/7).ok());
  WriteQueue::Completion opened = one(7);
  INFO(opened.status.ToString());
  REQUIRE(opened.status.ok());
  REQUIRE(opened.transfer_id != 0);
  v1::RegionDescriptor through = kv->descriptor();
  through.set_window_id(opened.transfer_id);
  through.set_token(reinterpret_cast<const char*>(opened.window_token.data()), opened.window_token.size());

  absl::StatusOr<v1::TransferResult> in =
      writer.client->WriteAndWait(ChunkWrite(writer, through, 0, 2 * kBlock, 2 * kBlock), absl::Seconds(30));
  INFO(in.status().ToString());
  REQUIRE(in.ok());
  CHECK(All(kv->buffer, 2 * kBlock, 4 * kBlock, 0xAB));
  CHECK(All(kv->buffer, 4 * kBlock, 8 * kBlock, 0));

  REQUIRE((*q)->PostCloseWindow(opened.transfer_id, 1000, /*user_data=*/8).ok());
  WriteQueue::Completion closed = one(8);
  INFO(closed.status.ToString());
  REQUIRE(closed.status.ok());
  memset(kv->buffer.data() + 2 * kBlock, 0x11, 2 * kBlock);  // the blocks' next owner
  absl::StatusOr<v1::TransferResult> late =
      writer.client->WriteAndWait(ChunkWrite(writer, through, 0, 2 * kBlock, kBlock), absl::Seconds(30));
  CHECK(late.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(All(kv->buffer, 2 * kBlock, 4 * kBlock, 0x11));

  REQUIRE((*q)->PostCloseWindow(12345, 0, /*user_data=*/9).ok());  // not a window of this session
  CHECK(one(9).status.code() == absl::StatusCode::kNotFound);
}

TEST_CASE("write windows: a late write is refused on one agent") {
  auto agent = testing::StartAgent();
  LateWriteIsRefused(agent->socket(), agent->socket(), v1::TRANSFER_PATH_LOCAL);
}

// On one agent: a writer pod with a write queue to an owner's region in window mode
// (eight blocks, zeroed).
struct QueueToWindowedRegion {
  QueueToWindowedRegion() {
    auto connected = Client::Connect(agent->socket());
    REQUIRE(connected.ok());
    owner = *std::move(connected);
    auto allocated = owner->AllocateHost(8 * kBlock, /*write_windows=*/true);
    REQUIRE(allocated.ok());
    kv = std::make_unique<HostRegion>(*std::move(allocated));
    memset(kv->buffer.data(), 0, 8 * kBlock);
    auto created = WriteQueue::Create(*writer.client, {kv->descriptor()}, 8, 0, v1::TRAFFIC_CLASS_UNSPECIFIED,
                                      /*table_ids=*/256);
    INFO(created.status().ToString());
    REQUIRE(created.ok());
    queue = *std::move(created);
  }

  std::unique_ptr<testing::AgentProcess> agent = testing::StartAgent();
  testing::TestPod writer = MakePod(agent->socket(), 8 * kBlock, 0xCD);
  std::unique_ptr<Client> owner;
  std::unique_ptr<HostRegion> kv;
  std::unique_ptr<WriteQueue> queue;
};

TEST_CASE("write windows: a queue's batch entry writes through a window, and not after it closed") {
  QueueToWindowedRegion f;
  testing::TestPod& writer = f.writer;
  std::unique_ptr<HostRegion>& kv = f.kv;
  absl::StatusOr<v1::OpenWriteWindowResponse> window =
      f.owner->OpenWriteWindow({kv->id()}, {{kBlock, kBlock}}, &writer.reg.region(), absl::Seconds(30));
  REQUIRE(window.ok());
  const std::vector<queue::TablePart> parts = {{writer.reg.region_id(), 0, 0, 0, 0}};
  const std::vector<uint32_t> src = {0}, dst = {1};
  auto post = [&](const v1::RegionDescriptor* through, uint64_t user_data) {
    WriteQueue::BatchOptions options;
    options.block_size = kBlock;
    options.user_data = user_data;
    options.window = through;
    REQUIRE(f.queue->PostBatch(0, parts, src, dst, options).ok());
    std::vector<WriteQueue::Completion> done;
    REQUIRE(f.queue->Reap(&done, 1, absl::Seconds(30)) == 1);
    return done[0].status;
  };
  CHECK(post(nullptr, 1).code() == absl::StatusCode::kFailedPrecondition);  // the region's own token
  CHECK(post(&window->regions(0), 2).ok());
  CHECK(All(kv->buffer, kBlock, 2 * kBlock, 0xCD));
  REQUIRE(f.owner->CloseWriteWindow(window->window_id()).ok());
  memset(kv->buffer.data() + kBlock, 0x11, kBlock);
  absl::Status late = post(&window->regions(0), 3);
  CHECK(late.code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(late.message()), Catch::Contains("was closed by its owner"));
  CHECK(All(kv->buffer, kBlock, 2 * kBlock, 0x11));
}

TEST_CASE("write windows: one batch entry writes several requests, each through its own window") {
  QueueToWindowedRegion f;
  testing::TestPod& writer = f.writer;
  std::unique_ptr<HostRegion>& kv = f.kv;
  auto open = [&](uint64_t first_block, uint64_t blocks) {
    absl::StatusOr<v1::OpenWriteWindowResponse> w = f.owner->OpenWriteWindow(
        {kv->id()}, {{first_block * kBlock, blocks * kBlock}}, &writer.reg.region(), absl::Seconds(30));
    REQUIRE(w.ok());
    return *w;
  };
  const v1::OpenWriteWindowResponse first = open(1, 1), second = open(4, 2);  // block 1; blocks 4-5
  const std::vector<queue::TablePart> parts = {{writer.reg.region_id(), 0, 0, 0, 0}};
  const std::vector<uint32_t> src = {0, 1, 2}, dst = {1, 4, 5};
  auto post = [&](uint32_t first_blocks, uint32_t second_blocks, uint64_t user_data) {
    WriteQueue::BatchOptions options;
    options.block_size = kBlock;
    options.user_data = user_data;
    options.windows = {{&first.regions(0), first_blocks}, {&second.regions(0), second_blocks}};
    absl::Status posted = f.queue->PostBatch(0, parts, src, dst, options);
    if (!posted.ok()) return posted;
    std::vector<WriteQueue::Completion> done;
    REQUIRE(f.queue->Reap(&done, 1, absl::Seconds(30)) == 1);
    return done[0].status;
  };
  REQUIRE(post(1, 2, 1).ok());
  CHECK(All(kv->buffer, kBlock, 2 * kBlock, 0xCD));
  CHECK(All(kv->buffer, 4 * kBlock, 6 * kBlock, 0xCD));
  CHECK((All(kv->buffer, 0, kBlock, 0) && All(kv->buffer, 2 * kBlock, 4 * kBlock, 0)));

  memset(kv->buffer.data(), 0x11, 8 * kBlock);  // the blocks' next owners
  absl::Status outside = post(2, 1, 2);         // block 4 through the first window
  CHECK(outside.code() == absl::StatusCode::kOutOfRange);
  CHECK_THAT(std::string(outside.message()), Catch::Contains("window spans[0]: parts[0]"));
  CHECK(post(1, 1, 3).code() == absl::StatusCode::kInvalidArgument);  // 2 of 3 blocks: refused before posting
  REQUIRE(f.owner->CloseWriteWindow(second.window_id()).ok());
  absl::Status late = post(1, 2, 4);
  CHECK(late.code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(late.message()), Catch::Contains("was closed by its owner"));
  CHECK(All(kv->buffer, 0, 8 * kBlock, 0x11));  // refused before a byte of either span moved
}

TEST_CASE("write windows: a late write is refused across agents, fabric and staged") {
  TestNetwork net = TestNetwork::Create(2, 1);
  SECTION("fabric: the window's keys are revoked") {
    auto a = StartFabricAgent(net.host(0));
    auto b = StartFabricAgent(net.host(1));
    LateWriteIsRefused(a->socket(), b->socket(), v1::TRANSFER_PATH_FABRIC);
  }
  SECTION("staged: the owner's agent checks each commit") {
    auto a = StartFabricAgent(net.host(0), {"--stage_host_regions"});
    auto b = StartFabricAgent(net.host(1), {"--stage_host_regions"});
    LateWriteIsRefused(a->socket(), b->socket(), v1::TRANSFER_PATH_STAGED);
  }
}

}  // namespace
}  // namespace ferry
