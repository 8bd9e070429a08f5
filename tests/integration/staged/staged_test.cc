// The staged path between real agents, with host memory standing in for GPU memory
// (--stage_host_regions): every stage goes source -> local staging -> fi_write ->
// target staging -> CommitStaged -> destination, exactly as for GPU regions, with the
// memcpy copier in place of cuMemcpy. tests/gpu runs it with GPU memory.
#include <catch2/catch.hpp>
#include <cstring>
#include <random>

#include "absl/time/clock.h"
#include "client/cpp/ferry_client.h"
#include "tests/testing/agent_process.h"
#include "tests/testing/fabric_agent.h"
#include "tests/testing/netns.h"
#include "tests/testing/test_pod.h"

namespace ferry {
namespace {

using Pod = testing::TestPod;
using testing::ChunkWrite;
using testing::FillRandom;
using testing::MakePod;
using testing::StartFabricAgent;
using testing::TestNetwork;

// 256 KiB staging buffers in 64 KiB stages: the writes below take many stages, up to
// four in flight at once (copied, written and committed out of order).
const std::vector<std::string> kStaged = {"--stage_host_regions", "--staging_buffer_bytes=262144",
                                          "--stage_bytes=65536"};

TEST_CASE("staged writes across agents land byte for byte, in many stages, notified once after the data") {
  TestNetwork net = TestNetwork::Create(2, 2);  // two NICs per agent
  auto a = StartFabricAgent(net.host(0), kStaged);
  auto b = StartFabricAgent(net.host(1), kStaged);
  const uint64_t kSize = 4 << 20;
  Pod sender = MakePod(a->socket(), kSize, 0);
  Pod receiver = MakePod(b->socket(), kSize, 0xEE);
  FillRandom(sender.buf->data(), kSize, 21);
  auto ctx = receiver.client->NewContext(absl::Seconds(60));
  auto stream = receiver.client->stub()->WatchNotifications(ctx.get(), v1::WatchNotificationsRequest());

  // A chunk of 3 MiB + 5 bytes (split over 49 stages) and a 7-byte one at odd offsets.
  v1::WriteRequest req = ChunkWrite(sender, receiver.reg.region(), 1, 100, (3 << 20) + 5);
  v1::Chunk* c = req.mutable_chunks()->add_chunks();
  c->set_src_offset(kSize - 7);
  c->set_dst_offset(kSize - 9);
  c->set_length(7);
  req.set_notify(true);
  req.set_tag(9);
  auto r = sender.client->WriteAndWait(req, absl::Seconds(30));
  INFO(r.status().ToString() << "\n" << a->Log() << "\n" << b->Log());
  REQUIRE(r.ok());
  CHECK(r->path() == v1::TRANSFER_PATH_STAGED);
  v1::Notification n;
  REQUIRE(stream->Read(&n));
  CHECK(memcmp(receiver.buf->data() + 100, sender.buf->data() + 1, (3 << 20) + 5) == 0);
  CHECK(memcmp(receiver.buf->data() + kSize - 9, sender.buf->data() + kSize - 7, 7) == 0);
  CHECK(receiver.buf->data()[99] == 0xEE);
  CHECK(receiver.buf->data()[100 + (3 << 20) + 5] == 0xEE);
  CHECK(n.tag() == 9);
  CHECK(n.bytes() == (3 << 20) + 12);

  // Paged: 8,000 blocks of 512 B scattered on both sides, one request.
  const uint64_t kBlock = 512, kBlocks = 8000;
  std::vector<uint64_t> src(kBlocks), dst(kBlocks);
  for (uint64_t i = 0; i < kBlocks; ++i) src[i] = dst[i] = i;
  std::shuffle(src.begin(), src.end(), std::mt19937(1));
  std::shuffle(dst.begin(), dst.end(), std::mt19937(2));
  memset(receiver.buf->data(), 0xEE, kSize);
  auto id = sender.client->WriteBlocks(sender.reg.region_id(), receiver.reg.region(), kBlock, src, dst);
  REQUIRE(id.ok());
  auto pr = sender.client->Wait(*id, absl::Seconds(30));
  REQUIRE(pr.ok());
  REQUIRE(pr->code() == 0);
  for (uint64_t i = 0; i < kBlocks; ++i) {
    REQUIRE(memcmp(receiver.buf->data() + dst[i] * kBlock, sender.buf->data() + src[i] * kBlock, kBlock) == 0);
  }
  // Exactly once: that write did not ask for a notification.
  ctx->TryCancel();
  int extra = 0;
  while (stream->Read(&n)) ++extra;
  CHECK(extra == 0);
}

TEST_CASE("staged writes from several sessions into one region share its staging slots and all land") {
  TestNetwork net = TestNetwork::Create(2, 1);
  auto a = StartFabricAgent(net.host(0), kStaged);
  auto b = StartFabricAgent(net.host(1), kStaged);
  const uint64_t kSlice = 512 << 10;
  Pod receiver = MakePod(b->socket(), 4 * kSlice, 0xEE);
  std::vector<Pod> senders;
  for (int i = 0; i < 4; ++i) {
    senders.push_back(MakePod(a->socket(), kSlice, 0));
    FillRandom(senders.back().buf->data(), kSlice, 100 + i);
  }
  std::vector<uint64_t> ids;
  for (int i = 0; i < 4; ++i) {
    auto id = senders[i].client->Write(ChunkWrite(senders[i], receiver.reg.region(), 0, i * kSlice, kSlice));
    REQUIRE(id.ok());
    ids.push_back(*id);
  }
  for (int i = 0; i < 4; ++i) {
    auto r = senders[i].client->Wait(ids[i], absl::Seconds(30));
    REQUIRE(r.ok());
    INFO(r->message());
    CHECK(r->code() == 0);
    CHECK(memcmp(receiver.buf->data() + i * kSlice, senders[i].buf->data(), kSlice) == 0);
  }
}

TEST_CASE("a shared-memory write queue into a staged destination") {
  TestNetwork net = TestNetwork::Create(2, 1);
  auto a = StartFabricAgent(net.host(0), kStaged);
  auto b = StartFabricAgent(net.host(1), kStaged);
  const uint64_t kSize = 1 << 20, kBlock = 64 << 10;
  Pod sender = MakePod(a->socket(), kSize, 0);
  Pod receiver = MakePod(b->socket(), kSize, 0xEE);
  FillRandom(sender.buf->data(), kSize, 41);
  INFO(a->Log());
  testing::QueueReversedBlocks(sender, receiver, kBlock, 32);
}

TEST_CASE("staged writes: a wrong token or bounds are refused before any byte moves; a restarted target heals") {
  TestNetwork net = TestNetwork::Create(2, 1);
  auto a = StartFabricAgent(net.host(0), kStaged);
  auto b = StartFabricAgent(net.host(1), kStaged);
  Pod sender = MakePod(a->socket(), 1 << 20, 0x11);
  Pod receiver = MakePod(b->socket(), 1 << 20, 0xEE);
  v1::RegionDescriptor wrong = receiver.reg.region();
  wrong.set_token(std::string(16, 'x'));
  auto s = sender.client->Write(ChunkWrite(sender, wrong, 0, 0, 4096)).status();
  CHECK(s.code() == absl::StatusCode::kPermissionDenied);
  s = sender.client->Write(ChunkWrite(sender, receiver.reg.region(), 0, (1 << 20) - 10, 4096)).status();
  CHECK(s.code() == absl::StatusCode::kOutOfRange);
  CHECK(receiver.buf->data()[0] == 0xEE);
  CHECK(receiver.buf->data()[(1 << 20) - 1] == 0xEE);

  // The target is replaced (new incarnation, new staging buffers): the old descriptor
  // fails, a new one works without restarting the initiator.
  REQUIRE(sender.client->WriteAndWait(ChunkWrite(sender, receiver.reg.region(), 0, 0, 4096), absl::Seconds(30)).ok());
  REQUIRE(b->Stop() == 0);
  b.reset();
  b = StartFabricAgent(net.host(1), kStaged);
  Pod receiver2 = MakePod(b->socket(), 1 << 20, 0xEE);
  s = sender.client->Write(ChunkWrite(sender, receiver.reg.region(), 0, 0, 4096)).status();
  CHECK(!s.ok());
  auto r = sender.client->WriteAndWait(ChunkWrite(sender, receiver2.reg.region(), 0, 0, 300000), absl::Seconds(30));
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  CHECK(receiver2.buf->data()[299999] == 0x11);
  CHECK(receiver2.buf->data()[300000] == (uint8_t)0xEE);
}

TEST_CASE("a restarted initiator's staging buffer on the target replaces its old one") {
  TestNetwork net = TestNetwork::Create(2, 1);
  auto a = StartFabricAgent(net.host(0), kStaged);
  auto b = StartFabricAgent(net.host(1), kStaged);
  Pod receiver = MakePod(b->socket(), 1 << 20, 0);
  auto staging_buffers = [&receiver] {
    auto status = receiver.client->GetStatus();
    REQUIRE(status.ok());
    return status->staging_buffers();
  };
  for (int round = 0; round < 3; ++round) {
    {
      Pod sender = MakePod(a->socket(), 1 << 20, static_cast<uint8_t>(0x40 + round));
      for (int i = 0; i < 2; ++i) {
        auto r =
            sender.client->WriteAndWait(ChunkWrite(sender, receiver.reg.region(), 0, 0, 1 << 20), absl::Seconds(30));
        INFO(r.status().ToString());
        REQUIRE(r.ok());
        REQUIRE(r->code() == 0);
      }
      CHECK(receiver.buf->data()[(1 << 20) - 1] == 0x40 + round);
    }
    INFO("round " << round);
    CHECK(staging_buffers() == 1);  // not one per incarnation of the initiator
    if (round < 2) testing::KillAndRestart(a, net.host(0), kStaged);
  }
}

}  // namespace
}  // namespace ferry
