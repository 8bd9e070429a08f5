// Cross-node transfers between real ferryd processes over libfabric tcp;ofi_rxm, each
// agent on its own test host (network namespace, or loopback address as a fallback).
#include <signal.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/ferry_client.h"
#include "client/cpp/write_queue.h"
#include "tests/testing/agent_process.h"
#include "tests/testing/fabric_agent.h"
#include "tests/testing/netns.h"
#include "tests/testing/test_pod.h"

namespace ferry {
namespace {

using testing::AgentProcess;
using testing::TestNetwork;

using Pod = testing::TestPod;
using testing::ChunkWrite;
using testing::FillRandom;
using testing::KillAndRestart;
using testing::MakePod;
using testing::StartFabricAgent;

TEST_CASE("two agents: chunk list and paged writes land byte for byte, notified once, after the data") {
  TestNetwork net = TestNetwork::Create(2, 1);
  auto a = StartFabricAgent(net.host(0));
  auto b = StartFabricAgent(net.host(1));
  const uint64_t kSize = 8 << 20;
  Pod sender = MakePod(a->socket(), kSize, 0);
  Pod receiver = MakePod(b->socket(), kSize, 0xEE);
  FillRandom(sender.buf->data(), kSize, 11);

  auto ctx = receiver.client->NewContext(absl::Seconds(60));
  auto stream = receiver.client->stub()->WatchNotifications(ctx.get(), v1::WatchNotificationsRequest());

  // Chunk list: three pieces, one larger than the 4 MiB op size (split), one tiny.
  v1::WriteRequest req = ChunkWrite(sender, receiver.reg.region(), 0, 1 << 20, 5 << 20);
  auto* c2 = req.mutable_chunks()->add_chunks();
  c2->set_src_offset(7 << 20);
  c2->set_dst_offset(0);
  c2->set_length(3);
  req.set_notify(true);
  req.set_tag(1);
  auto r = sender.client->WriteAndWait(req, absl::Seconds(30));
  INFO(r.status().ToString() << "\n" << a->Log());
  REQUIRE(r.ok());
  CHECK(r->path() == v1::TRANSFER_PATH_FABRIC);
  v1::Notification n;
  REQUIRE(stream->Read(&n));
  // The notification comes after every byte is in place.
  CHECK(memcmp(receiver.buf->data() + (1 << 20), sender.buf->data(), 5 << 20) == 0);
  CHECK(memcmp(receiver.buf->data(), sender.buf->data() + (7 << 20), 3) == 0);
  CHECK(receiver.buf->data()[3] == 0xEE);
  CHECK(receiver.buf->data()[(6 << 20)] == 0xEE);
  CHECK(n.tag() == 1);
  CHECK(n.bytes() == (5 << 20) + 3);
  CHECK(n.transfer_id() == r->transfer_id());

  // Paged: 10,000 blocks of 512 B, randomly scattered on both sides, in one request.
  const uint64_t kBlock = 512, kBlocks = 10000;
  std::vector<uint64_t> src(kBlocks), dst(kBlocks);
  for (uint64_t i = 0; i < kBlocks; ++i) src[i] = dst[i] = i;
  std::shuffle(src.begin(), src.end(), std::mt19937(5));
  std::shuffle(dst.begin(), dst.end(), std::mt19937(6));
  memset(receiver.buf->data(), 0xEE, kSize);
  auto id = sender.client->WriteBlocks(sender.reg.region_id(), receiver.reg.region(), kBlock, src, dst, true, 2);
  REQUIRE(id.ok());
  auto pr = sender.client->Wait(*id, absl::Seconds(30));
  REQUIRE(pr.ok());
  REQUIRE(pr->code() == 0);
  REQUIRE(stream->Read(&n));
  CHECK(n.tag() == 2);
  for (uint64_t i = 0; i < kBlocks; ++i) {
    REQUIRE(memcmp(receiver.buf->data() + dst[i] * kBlock, sender.buf->data() + src[i] * kBlock, kBlock) == 0);
  }
  CHECK(receiver.buf->data()[kBlocks * kBlock] == 0xEE);

  // Exactly once: a write without notify produces no notification.
  REQUIRE(sender.client->WriteAndWait(ChunkWrite(sender, receiver.reg.region(), 0, 0, 4096), absl::Seconds(30)).ok());
  ctx->TryCancel();
  int extra = 0;
  while (stream->Read(&n)) ++extra;
  CHECK(extra == 0);
}

TEST_CASE("a Write with wait_ms answers with the result of a cross-agent transfer: one round trip, no Wait") {
  TestNetwork net = TestNetwork::Create(2, 1);
  auto a = StartFabricAgent(net.host(0));
  auto b = StartFabricAgent(net.host(1));
  Pod sender = MakePod(a->socket(), 1 << 20, 0);
  Pod receiver = MakePod(b->socket(), 1 << 20, 0xEE);
  FillRandom(sender.buf->data(), 1 << 20, 12);
  v1::WriteRequest req = ChunkWrite(sender, receiver.reg.region(), 0, 4096, 512 << 10);
  req.set_wait_ms(30000);
  v1::WriteResponse resp;
  auto ctx = sender.client->NewContext(absl::Seconds(60));
  REQUIRE(sender.client->stub()->Write(ctx.get(), req, &resp).ok());
  INFO(a->Log());
  REQUIRE(resp.has_result());  // the call waited for the fabric write
  CHECK(resp.result().transfer_id() == resp.transfer_id());
  CHECK(resp.result().code() == 0);
  CHECK(resp.result().bytes() == 512 << 10);
  CHECK(resp.result().path() == v1::TRANSFER_PATH_FABRIC);
  CHECK(memcmp(receiver.buf->data() + 4096, sender.buf->data(), 512 << 10) == 0);
  auto waited = sender.client->Wait(resp.transfer_id(), absl::Seconds(1));  // Wait still finds it
  REQUIRE(waited.ok());
  CHECK(waited->bytes() == resp.result().bytes());

  // A failure comes back the same way: the destination region deregistered.
  const v1::RegionDescriptor gone = receiver.reg.region();
  REQUIRE(receiver.client->Deregister(receiver.reg.region_id()).ok());
  v1::WriteRequest late = ChunkWrite(sender, gone, 0, 0, 4096);
  late.set_wait_ms(30000);
  auto ctx2 = sender.client->NewContext(absl::Seconds(60));
  grpc::Status call = sender.client->stub()->Write(ctx2.get(), late, &resp);
  INFO(call.error_message());
  if (call.ok()) {  // refused by the target agent, not by the call: the result says so
    REQUIRE(resp.has_result());
    CHECK(resp.result().code() != 0);
    CHECK(!resp.result().message().empty());
  }
}

TEST_CASE("a write queue to another agent: bytes land, the receiver is notified, completions come back") {
  // Submissions taken on the NIC worker's thread (the default) and on a thread of their own.
  const std::string mode = GENERATE(as<std::string>(), "--queues_on_nic_worker=true", "--queues_on_nic_worker=false");
  INFO(mode);
  TestNetwork net = TestNetwork::Create(2, 1);
  auto a = StartFabricAgent(net.host(0), {mode});
  auto b = StartFabricAgent(net.host(1));
  const uint64_t kSize = 1 << 20, kBlock = 16 << 10;
  Pod sender = MakePod(a->socket(), kSize, 0);
  Pod receiver = MakePod(b->socket(), kSize, 0xEE);
  FillRandom(sender.buf->data(), kSize, 31);
  auto ctx = receiver.client->NewContext(absl::Seconds(60));
  auto stream = receiver.client->stub()->WatchNotifications(ctx.get(), v1::WatchNotificationsRequest());

  INFO(a->Log());
  testing::QueueReversedBlocks(sender, receiver, kBlock, 64, /*notify_last=*/true, /*tag=*/77);
  v1::Notification note;
  REQUIRE(stream->Read(&note));
  CHECK(note.tag() == 77);
  CHECK(note.bytes() == kBlock);
  ctx->TryCancel();
}

TEST_CASE("a wrong token or out-of-bounds destination is refused before any byte moves") {
  TestNetwork net = TestNetwork::Create(2, 1);
  auto a = StartFabricAgent(net.host(0));
  auto b = StartFabricAgent(net.host(1));
  Pod sender = MakePod(a->socket(), 1 << 20, 0x11);
  Pod receiver = MakePod(b->socket(), 1 << 16, 0x22);

  v1::RegionDescriptor wrong = receiver.reg.region();
  wrong.set_token(std::string(16, '\x01'));
  auto s = sender.client->Write(ChunkWrite(sender, wrong, 0, 0, 4096)).status();
  CHECK(s.code() == absl::StatusCode::kPermissionDenied);

  // A descriptor that lies about its size is checked against the region's real size.
  v1::RegionDescriptor lying = receiver.reg.region();
  lying.set_size(1 << 20);
  s = sender.client->Write(ChunkWrite(sender, lying, 0, 0, 1 << 20)).status();
  CHECK(s.code() == absl::StatusCode::kOutOfRange);
  s = sender.client->Write(ChunkWrite(sender, receiver.reg.region(), 0, (1 << 16) - 10, 11)).status();
  CHECK(s.code() == absl::StatusCode::kOutOfRange);

  // The right token after a wrong one still works (no poisoned cache), and the wrong one
  // stays wrong once the region is cached.
  REQUIRE(sender.client->WriteAndWait(ChunkWrite(sender, receiver.reg.region(), 0, 0, 8), absl::Seconds(30)).ok());
  CHECK(sender.client->Write(ChunkWrite(sender, wrong, 0, 0, 8)).status().code() ==
        absl::StatusCode::kPermissionDenied);
  for (uint64_t i = 8; i < (1 << 16); ++i) REQUIRE(receiver.buf->data()[i] == 0x22);
}

TEST_CASE("messages and notify payloads reach a region's owner, across agents and on one, token-checked") {
  TestNetwork net = TestNetwork::Create(2, 1);
  auto a = StartFabricAgent(net.host(0));
  auto b = StartFabricAgent(net.host(1));
  Pod sender = MakePod(a->socket(), 1 << 16, 0x11);
  Pod neighbour = MakePod(b->socket(), 1 << 16, 0x33);  // on the receiver's own agent
  Pod receiver = MakePod(b->socket(), 1 << 16, 0x22);
  auto ctx = receiver.client->NewContext(absl::Seconds(60));
  auto stream = receiver.client->stub()->WatchNotifications(ctx.get(), v1::WatchNotificationsRequest());
  v1::Notification n;

  // Across agents: a message, then a notified write carrying a payload.
  REQUIRE(sender.client->SendMessage(receiver.reg.region(), 42, "fill blocks 3,4,5").ok());
  REQUIRE(stream->Read(&n));
  CHECK(n.kind() == v1::NOTIFICATION_KIND_MESSAGE);
  CHECK(n.region_id() == receiver.reg.region_id());
  CHECK(n.tag() == 42);
  CHECK(n.payload() == "fill blocks 3,4,5");
  CHECK(n.bytes() == 0);
  CHECK(n.transfer_id() == 0);
  CHECK(n.source_incarnation() == std::stoull(a->ready("incarnation")));
  for (uint64_t i = 0; i < (1 << 16); ++i) REQUIRE(receiver.buf->data()[i] == 0x22);  // nothing written

  v1::WriteRequest w = ChunkWrite(sender, receiver.reg.region(), 0, 0, 4096);
  w.set_notify(true);
  w.set_tag(7);
  w.set_notify_payload(std::string("request-17\0with a zero", 23));
  REQUIRE(sender.client->WriteAndWait(w, absl::Seconds(30)).ok());
  REQUIRE(stream->Read(&n));
  CHECK(n.kind() == v1::NOTIFICATION_KIND_WRITE);
  CHECK(n.payload() == std::string("request-17\0with a zero", 23));
  CHECK(n.bytes() == 4096);

  // On one agent: the same, without a peer in between.
  REQUIRE(neighbour.client->SendMessage(receiver.reg.region(), 43, std::string(4096, 'x')).ok());
  REQUIRE(stream->Read(&n));
  CHECK(n.kind() == v1::NOTIFICATION_KIND_MESSAGE);
  CHECK(n.tag() == 43);
  CHECK(n.payload() == std::string(4096, 'x'));

  // Refused, and nothing delivered: a wrong token (from either agent), a payload over
  // 4 KiB, a payload without notify, no destination.
  v1::RegionDescriptor wrong = receiver.reg.region();
  wrong.set_token(std::string(16, '\x01'));
  CHECK(sender.client->SendMessage(wrong, 1, "x").code() == absl::StatusCode::kPermissionDenied);
  CHECK(neighbour.client->SendMessage(wrong, 1, "x").code() == absl::StatusCode::kPermissionDenied);
  absl::Status big = sender.client->SendMessage(receiver.reg.region(), 1, std::string(4097, 'x'));
  CHECK(big.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(big.message()).find("4096") != std::string::npos);
  w.set_notify_payload(std::string(4097, 'x'));
  CHECK(sender.client->Write(w).status().code() == absl::StatusCode::kInvalidArgument);
  w.set_notify(false);
  w.set_notify_payload("orphan");
  absl::Status orphan = sender.client->Write(w).status();
  CHECK(orphan.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(orphan.message()).find("notify_payload needs notify") != std::string::npos);
  v1::SendMessageRequest no_dst;
  v1::SendMessageResponse resp;
  auto call = sender.client->NewContext();
  CHECK(sender.client->stub()->SendMessage(call.get(), no_dst, &resp).error_code() ==
        grpc::StatusCode::INVALID_ARGUMENT);
  REQUIRE(sender.client->SendMessage(receiver.reg.region(), 44, "last").ok());
  REQUIRE(stream->Read(&n));
  CHECK(n.tag() == 44);  // none of the refused ones came through
}

TEST_CASE("a notified write that fails after it started still notifies its receiver, with the status") {
  TestNetwork net = TestNetwork::Create(2, 1);
  auto a = StartFabricAgent(net.host(0));
  auto b = StartFabricAgent(net.host(1));
  const uint64_t kSize = 256 << 20;  // far more than moves in the 1 ms deadline below
  Pod far = MakePod(a->socket(), kSize, 0x31);
  Pod near = MakePod(b->socket(), kSize, 0x32);
  Pod receiver = MakePod(b->socket(), kSize, 0);
  auto ctx = receiver.client->NewContext(absl::Seconds(60));
  auto stream = receiver.client->stub()->WatchNotifications(ctx.get(), v1::WatchNotificationsRequest());

  // The peer and region cached first: the 1 ms deadline below is for moving bytes.
  REQUIRE(far.client->WriteAndWait(ChunkWrite(far, receiver.reg.region(), 0, 0, 8), absl::Seconds(30)).ok());
  for (Pod* writer : {&far, &near}) {  // across agents, then on the receiver's own
    v1::WriteRequest req;
    req.set_src_region_id(writer->reg.region_id());
    *req.mutable_dst() = receiver.reg.region();
    v1::PagedChunks* p = req.mutable_paged();  // 64 Ki blocks: the local copy checks its deadline per block
    p->set_block_size(4096);
    for (uint64_t i = 0; i < kSize / 4096; ++i) {
      p->add_src_blocks(i);
      p->add_dst_blocks(i);
    }
    req.set_notify(true);
    req.set_tag(9);
    req.set_notify_payload("req-3");
    req.set_timeout_ms(1);
    auto id = writer->client->Write(req);
    INFO(id.status().ToString());
    REQUIRE(id.ok());
    auto r = writer->client->Wait(*id, absl::Seconds(30));
    REQUIRE(r.ok());
    INFO(r->ShortDebugString());
    REQUIRE(r->code() == static_cast<int>(absl::StatusCode::kDeadlineExceeded));
    const absl::Time failed = absl::Now();
    v1::Notification n;
    REQUIRE(stream->Read(&n));
    CHECK(absl::Now() - failed < absl::Seconds(1));
    CHECK(n.kind() == v1::NOTIFICATION_KIND_WRITE);
    CHECK(n.code() == static_cast<int>(absl::StatusCode::kDeadlineExceeded));
    CHECK(n.message().find("deadline") != std::string::npos);
    CHECK(n.transfer_id() == *id);
    CHECK(n.tag() == 9);
    CHECK(n.payload() == "req-3");
    CHECK(n.bytes() == 0);
  }
}

// One session's per-layer regions (a serving pod's KV cache: one tensor per layer).
struct LayerPod {
  std::unique_ptr<Client> client;
  std::vector<std::unique_ptr<HostBuffer>> bufs;
  std::vector<v1::RegisterMemoryResponse> regs;
};

LayerPod MakeLayerPod(const std::string& socket, int layers, uint64_t bytes, int seed) {
  LayerPod p;
  auto c = Client::Connect(socket);
  REQUIRE(c.ok());
  p.client = std::move(*c);
  for (int l = 0; l < layers; ++l) {
    auto b = HostBuffer::Create(bytes);
    REQUIRE(b.ok());
    p.bufs.push_back(std::make_unique<HostBuffer>(std::move(*b)));
    if (seed < 0) {
      memset(p.bufs.back()->data(), 0xEE, bytes);
    } else {
      FillRandom(p.bufs.back()->data(), bytes, seed + l);
    }
    auto r = p.client->RegisterHost(*p.bufs.back());
    REQUIRE(r.ok());
    p.regs.push_back(*r);
  }
  return p;
}

// A KV handoff's shape: one block mapping over every layer's region, K and V halves as
// two parts each, in one WriteBatch with one notification.
TEST_CASE("a batch writes one block mapping into many regions as one transfer, across agents and on one") {
  TestNetwork net = TestNetwork::Create(2, 1);
  auto a = StartFabricAgent(net.host(0));
  auto b = StartFabricAgent(net.host(1));
  constexpr int kLayers = 6;
  constexpr uint64_t kBlock = 2048, kBlocks = 64, kHalf = kBlock * kBlocks, kLayerBytes = 2 * kHalf;
  LayerPod producer = MakeLayerPod(a->socket(), kLayers, kLayerBytes, 100);   // on another node
  LayerPod neighbour = MakeLayerPod(b->socket(), kLayers, kLayerBytes, 200);  // on the consumer's
  LayerPod consumer = MakeLayerPod(b->socket(), kLayers, kLayerBytes, -1);
  std::vector<uint64_t> src_ids(kBlocks / 2), dst_ids(kBlocks / 2);  // half the blocks, scattered
  for (uint64_t i = 0; i < src_ids.size(); ++i) src_ids[i] = dst_ids[i] = 2 * i + 1;
  std::shuffle(dst_ids.begin(), dst_ids.end(), std::mt19937(9));
  auto ctx = consumer.client->NewContext(absl::Seconds(60));
  auto stream = consumer.client->stub()->WatchNotifications(ctx.get(), v1::WatchNotificationsRequest());

  auto batch_from = [&](const LayerPod& from) {
    v1::WriteBatchRequest req;
    req.mutable_blocks()->set_block_size(kBlock);
    req.mutable_blocks()->mutable_src_blocks()->Add(src_ids.begin(), src_ids.end());
    req.mutable_blocks()->mutable_dst_blocks()->Add(dst_ids.begin(), dst_ids.end());
    for (int l = 0; l < kLayers; ++l) {
      for (uint64_t half : {uint64_t{0}, kHalf}) {  // K, then V
        v1::WritePart* p = req.add_parts();
        p->set_src_region_id(from.regs[l].region_id());
        *p->mutable_dst() = consumer.regs[l].region();
        p->set_src_base(half);
        p->set_dst_base(half);
      }
    }
    req.set_notify(true);
    req.set_tag(77);
    req.set_notify_payload("request-5");
    return req;
  };
  auto check_layers = [&](const LayerPod& from) {
    for (int l = 0; l < kLayers; ++l) {
      for (uint64_t half : {uint64_t{0}, kHalf}) {
        for (size_t i = 0; i < src_ids.size(); ++i) {
          REQUIRE(memcmp(consumer.bufs[l]->data() + half + dst_ids[i] * kBlock,
                         from.bufs[l]->data() + half + src_ids[i] * kBlock, kBlock) == 0);
        }
        REQUIRE(consumer.bufs[l]->data()[half] == 0xEE);  // block 0 is not in the mapping
      }
    }
  };
  const uint64_t kBytes = kLayers * 2 * src_ids.size() * kBlock;

  // Across agents and on one: one id, one result for every byte, one notification after them all.
  for (const LayerPod* from : {&producer, &neighbour}) {
    absl::StatusOr<uint64_t> id = from->client->WriteBatch(batch_from(*from));
    INFO(id.status().ToString() << "\n" << a->Log());
    REQUIRE(id.ok());
    auto r = from->client->Wait(*id, absl::Seconds(30));
    REQUIRE(r.ok());
    REQUIRE(r->code() == 0);
    CHECK(r->bytes() == kBytes);
    CHECK(r->path() == (from == &producer ? v1::TRANSFER_PATH_FABRIC : v1::TRANSFER_PATH_LOCAL));
    v1::Notification n;
    REQUIRE(stream->Read(&n));
    CHECK(n.kind() == v1::NOTIFICATION_KIND_WRITE);
    CHECK(n.tag() == 77);
    CHECK(n.payload() == "request-5");
    CHECK(n.bytes() == kBytes);
    CHECK(n.transfer_id() == *id);
    check_layers(*from);
    for (int l = 0; l < kLayers; ++l) memset(consumer.bufs[l]->data(), 0xEE, kLayerBytes);
  }

  // A bad part refuses the whole batch, names the part, and moves nothing.
  v1::WriteBatchRequest bad = batch_from(producer);
  bad.mutable_parts(5)->set_dst_base(kLayerBytes);  // V half of layer 2 past the region's end
  absl::Status s = producer.client->WriteBatch(bad).status();
  CHECK(s.code() == absl::StatusCode::kOutOfRange);
  CHECK(std::string(s.message()).find("parts[5]") != std::string::npos);
  Pod stranger = MakePod(a->socket(), 4096);
  bad = batch_from(producer);
  bad.mutable_parts(3)->set_src_region_id(stranger.reg.region_id());  // another session's region
  s = producer.client->WriteBatch(bad).status();
  CHECK(s.code() == absl::StatusCode::kPermissionDenied);
  CHECK(std::string(s.message()).find("parts[3]") != std::string::npos);
  // On one agent a batch looks each region up once; a part that names a region an
  // earlier part named still passes every check of its own (parts 2 and 3: layer 1's
  // K and V halves).
  bad = batch_from(neighbour);
  std::string forged = bad.parts(3).dst().token();
  forged[0] ^= 1;
  bad.mutable_parts(3)->mutable_dst()->set_token(forged);
  s = neighbour.client->WriteBatch(bad).status();
  CHECK(s.code() == absl::StatusCode::kPermissionDenied);
  CHECK(std::string(s.message()).find("parts[3]: dst.token") != std::string::npos);
  Pod stranger_b = MakePod(b->socket(), 4096);
  bad = batch_from(neighbour);
  bad.mutable_parts(3)->set_src_region_id(stranger_b.reg.region_id());
  s = neighbour.client->WriteBatch(bad).status();
  CHECK(s.code() == absl::StatusCode::kPermissionDenied);
  CHECK(std::string(s.message()).find("parts[3]: src_region_id") != std::string::npos);
  bad = batch_from(neighbour);
  bad.mutable_parts(3)->set_dst_base(kLayerBytes);
  s = neighbour.client->WriteBatch(bad).status();
  CHECK(s.code() == absl::StatusCode::kOutOfRange);
  CHECK(std::string(s.message()).find("parts[3]") != std::string::npos);
  bad = batch_from(producer);
  bad.set_notify(false);  // a payload without notify
  CHECK(producer.client->WriteBatch(bad).status().code() == absl::StatusCode::kInvalidArgument);
  bad.clear_parts();
  CHECK(producer.client->WriteBatch(bad).status().code() == absl::StatusCode::kInvalidArgument);
  absl::SleepFor(absl::Milliseconds(200));
  for (int l = 0; l < kLayers; ++l) {
    for (uint64_t i = 0; i < kLayerBytes; ++i) REQUIRE(consumer.bufs[l]->data()[i] == 0xEE);
  }
}

TEST_CASE("two NICs per agent: transfers stripe over both (per-NIC byte counters)") {
  TestNetwork net = TestNetwork::Create(2, 2);
  auto a = StartFabricAgent(net.host(0), {"--fabric_max_op_bytes=1048576"});
  auto b = StartFabricAgent(net.host(1));
  const uint64_t kSize = 32 << 20;
  Pod sender = MakePod(a->socket(), kSize, 0);
  Pod receiver = MakePod(b->socket(), kSize, 0);
  FillRandom(sender.buf->data(), kSize, 21);
  REQUIRE(sender.client->WriteAndWait(ChunkWrite(sender, receiver.reg.region(), 0, 0, kSize), absl::Seconds(60)).ok());
  CHECK(memcmp(receiver.buf->data(), sender.buf->data(), kSize) == 0);

  auto status = sender.client->GetStatus();
  REQUIRE(status.ok());
  REQUIRE(status->nics_size() == 2);
  CHECK(status->nics(0).tx_bytes() == kSize / 2);
  CHECK(status->nics(1).tx_bytes() == kSize / 2);

  // The target cannot see one-sided writes; the initiator reports them within a second
  // or so (no notification was asked for), split by the target's NIC.
  uint64_t rx0 = 0, rx1 = 0;
  for (absl::Time end = absl::Now() + absl::Seconds(10); absl::Now() < end && rx0 + rx1 < kSize;
       absl::SleepFor(absl::Milliseconds(100))) {
    auto bs = receiver.client->GetStatus();
    REQUIRE(bs.ok());
    REQUIRE(bs->nics_size() == 2);
    rx0 = bs->nics(0).rx_bytes();
    rx1 = bs->nics(1).rx_bytes();
  }
  CHECK(rx0 == kSize / 2);
  CHECK(rx1 == kSize / 2);
}

TEST_CASE(
    "--fabric_latency_lane: latency-class writes cross on the lanes, others on the NICs; lane-less agents "
    "interoperate") {
  TestNetwork net = TestNetwork::Create(3, 1);
  auto a = StartFabricAgent(net.host(0), {"--fabric_latency_lane"});
  auto b = StartFabricAgent(net.host(1), {"--fabric_latency_lane"});
  auto c = StartFabricAgent(net.host(2));  // no lanes
  const uint64_t kSize = 4 << 20;
  Pod sender = MakePod(a->socket(), kSize, 0);
  Pod plain = MakePod(c->socket(), kSize, 0);
  Pod receiver = MakePod(b->socket(), kSize, 0);
  Pod plain_receiver = MakePod(c->socket(), kSize, 0);
  FillRandom(sender.buf->data(), kSize, 31);
  FillRandom(plain.buf->data(), kSize, 32);

  auto status = sender.client->GetStatus();
  REQUIRE(status.ok());
  REQUIRE(status->nics_size() == 2);
  CHECK(status->nics(0).name() == "nic0");
  CHECK(status->nics(1).name() == "nic0-latency");
  auto write = [](Pod& from, const Pod& to, uint64_t off, uint64_t len, v1::TrafficClass cls, bool notify) {
    v1::WriteRequest req = ChunkWrite(from, to.reg.region(), off, off, len);
    req.set_traffic_class(cls);
    req.set_notify(notify);
    auto r = from.client->WriteAndWait(req, absl::Seconds(30));
    INFO(r.status().ToString());
    REQUIRE(r.ok());
    CHECK(r->path() == v1::TRANSFER_PATH_FABRIC);
  };
  // Between two agents with lanes: the latency class (notified, so its announcement and
  // notification travel the lane too) on the lane, bulk on the NIC.
  auto ctx = receiver.client->NewContext(absl::Seconds(60));
  auto stream = receiver.client->stub()->WatchNotifications(ctx.get(), v1::WatchNotificationsRequest());
  write(sender, receiver, 0, kSize / 2, v1::TRAFFIC_CLASS_LATENCY, /*notify=*/true);
  write(sender, receiver, kSize / 2, kSize / 2, v1::TRAFFIC_CLASS_BULK, /*notify=*/false);
  CHECK(memcmp(receiver.buf->data(), sender.buf->data(), kSize) == 0);
  v1::Notification note;
  REQUIRE(stream->Read(&note));
  CHECK(note.bytes() == kSize / 2);
  ctx->TryCancel();
  status = sender.client->GetStatus();
  REQUIRE(status.ok());
  CHECK(status->nics(0).tx_bytes() == kSize / 2);
  CHECK(status->nics(1).tx_bytes() >= kSize / 2);  // and the notification's messages

  // With an agent without lanes, either way: the latency class goes through the NICs.
  write(sender, plain_receiver, 0, kSize, v1::TRAFFIC_CLASS_LATENCY, /*notify=*/false);
  CHECK(memcmp(plain_receiver.buf->data(), sender.buf->data(), kSize) == 0);
  write(plain, receiver, 0, kSize, v1::TRAFFIC_CLASS_LATENCY, /*notify=*/false);
  CHECK(memcmp(receiver.buf->data(), plain.buf->data(), kSize) == 0);
  auto after = sender.client->GetStatus();
  REQUIRE(after.ok());
  CHECK(after->nics(0).tx_bytes() == kSize / 2 + kSize);
  CHECK(after->nics(1).tx_bytes() == status->nics(1).tx_bytes());
}

TEST_CASE("--fabric_latency_lane without --qos is refused at start, naming both flags") {
  auto agent = AgentProcess::Start({"--fabric_latency_lane", "--qos=false"});
  REQUIRE_FALSE(agent.ok());
  CHECK(absl::StrContains(agent.status().message(), "--fabric_latency_lane needs --qos"));
}

TEST_CASE("three agents, many sessions, concurrent transfers: no corruption") {
  TestNetwork net = TestNetwork::Create(3, 1);
  std::vector<std::unique_ptr<AgentProcess>> agents;
  for (int i = 0; i < 3; ++i) agents.push_back(StartFabricAgent(net.host(i)));
  const uint64_t kSlice = 1 << 20;
  const int kWriters = 6;  // two sessions on each agent
  // Every agent hosts one receiver region with a slice per writer.
  std::vector<Pod> receivers;
  for (int i = 0; i < 3; ++i) receivers.push_back(MakePod(agents[i]->socket(), kSlice * kWriters, 0));

  // Sessions are made here: Catch's assertions (inside MakePod) are not thread-safe.
  std::vector<Pod> writers;
  for (int w = 0; w < kWriters; ++w) writers.push_back(MakePod(agents[w % 3]->socket(), kSlice, 0));

  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int w = 0; w < kWriters; ++w) {
    threads.emplace_back([&, w] {
      Pod& me = writers[w];
      for (int round = 0; round < 5; ++round) {
        FillRandom(me.buf->data(), kSlice, w * 100 + round);
        // Write the slice to the next agent's receiver, in 64 scattered chunks.
        const Pod& dst = receivers[(w + 1) % 3];
        v1::WriteRequest req;
        req.set_src_region_id(me.reg.region_id());
        *req.mutable_dst() = dst.reg.region();
        for (int k = 0; k < 64; ++k) {
          auto* c = req.mutable_chunks()->add_chunks();
          c->set_src_offset(k * (kSlice / 64));
          c->set_dst_offset(w * kSlice + (63 - k) * (kSlice / 64));
          c->set_length(kSlice / 64);
        }
        auto r = me.client->WriteAndWait(req, absl::Seconds(60));
        if (!r.ok()) {
          ++failures;
          continue;
        }
        for (int k = 0; k < 64; ++k) {
          if (memcmp(dst.buf->data() + w * kSlice + (63 - k) * (kSlice / 64), me.buf->data() + k * (kSlice / 64),
                     kSlice / 64) != 0) {
            ++failures;
          }
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(failures.load() == 0);
}

// With its tx queue full (4 deep here), a NIC worker hands the slots completions free to
// every peer in turn: a 4 KiB write to C does not wait behind 32,768 ops queued for B.
TEST_CASE("a deep backlog to one peer does not hold up a write to another") {
  TestNetwork net = TestNetwork::Create(3, 1);
  auto a = StartFabricAgent(net.host(0), {"--fabric_tx_size=4"});
  auto b = StartFabricAgent(net.host(1));
  auto c = StartFabricAgent(net.host(2));
  const uint64_t kBlock = 4096, kBlocks = 32768, kSize = kBlock * kBlocks;
  Pod sender = MakePod(a->socket(), kSize, 0);
  Pod to_b = MakePod(b->socket(), kSize, 0);
  Pod to_c = MakePod(c->socket(), kBlock, 0);
  FillRandom(sender.buf->data(), kSize, 5);
  // A first write to each connects and caches the destination (B's queue is made first).
  for (const Pod* dst : {&to_b, &to_c}) {
    auto r = sender.client->WriteAndWait(ChunkWrite(sender, dst->reg.region(), 0, 0, kBlock), absl::Seconds(20));
    REQUIRE(r.ok());
    REQUIRE(r->code() == 0);
  }
  // Blocks in reverse order on B: one op each, nothing coalesces.
  std::vector<uint64_t> src(kBlocks), dst(kBlocks);
  for (uint64_t i = 0; i < kBlocks; ++i) src[i] = i, dst[i] = kBlocks - 1 - i;
  const absl::Time t0 = absl::Now();
  auto backlog = sender.client->WriteBlocks(sender.reg.region_id(), to_b.reg.region(), kBlock, src, dst);
  REQUIRE(backlog.ok());
  auto small = sender.client->WriteAndWait(ChunkWrite(sender, to_c.reg.region(), kBlock, 0, kBlock), absl::Seconds(60));
  const absl::Duration small_took = absl::Now() - t0;
  REQUIRE(small.ok());
  REQUIRE(small->code() == 0);
  auto big = sender.client->Wait(*backlog, absl::Seconds(120));
  const absl::Duration big_took = absl::Now() - t0;
  REQUIRE(big.ok());
  REQUIRE(big->code() == 0);
  INFO("the write to C took " << small_took << ", the backlog to B " << big_took);
  CHECK(small_took < big_took / 3);  // without the turns: within a millisecond of it
  CHECK(memcmp(to_c.buf->data(), sender.buf->data() + kBlock, kBlock) == 0);
  for (uint64_t i = 0; i < kBlocks; i += 1023) {
    REQUIRE(memcmp(to_b.buf->data() + dst[i] * kBlock, sender.buf->data() + i * kBlock, kBlock) == 0);
  }
}

TEST_CASE("--max_peers: a transfer to one agent more is refused RESOURCE_EXHAUSTED, naming the flag") {
  TestNetwork net = TestNetwork::Create(3, 1);
  auto a = StartFabricAgent(net.host(0), {"--max_peers=1"});
  auto b = StartFabricAgent(net.host(1));
  auto c = StartFabricAgent(net.host(2));
  Pod writer = MakePod(a->socket(), 4096, 0x41);
  Pod on_b = MakePod(b->socket(), 4096, 0);
  Pod on_c = MakePod(c->socket(), 4096, 0);
  REQUIRE(writer.client->WriteAndWait(ChunkWrite(writer, on_b.reg.region(), 0, 0, 4096), absl::Seconds(30)).ok());
  auto refused = writer.client->WriteAndWait(ChunkWrite(writer, on_c.reg.region(), 0, 0, 4096), absl::Seconds(30));
  REQUIRE(!refused.ok());
  CHECK(refused.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(absl::StrContains(refused.status().message(), "--max_peers"));
  // The agent it is connected to is still served.
  CHECK(writer.client->WriteAndWait(ChunkWrite(writer, on_b.reg.region(), 0, 0, 4096), absl::Seconds(30)).ok());
}

TEST_CASE("--peer_idle_s: a connection no transfer uses is closed, and the next transfer opens it again") {
  TestNetwork net = TestNetwork::Create(2, 1);
  auto a = StartFabricAgent(net.host(0), {"--peer_idle_s=1"});
  auto b = StartFabricAgent(net.host(1));
  Pod writer = MakePod(a->socket(), 4096, 0x51);
  Pod receiver = MakePod(b->socket(), 4096, 0);
  auto peers = [&] {
    auto st = writer.client->GetStatus();
    REQUIRE(st.ok());
    return st->peers_size();
  };
  REQUIRE(writer.client->WriteAndWait(ChunkWrite(writer, receiver.reg.region(), 0, 0, 4096), absl::Seconds(30)).ok());
  CHECK(peers() == 1);
  int left = 1;
  for (absl::Time end = absl::Now() + absl::Seconds(10); left > 0 && absl::Now() < end;
       absl::SleepFor(absl::Milliseconds(100))) {
    left = peers();
  }
  CHECK(left == 0);
  memset(receiver.buf->data(), 0, 4096);
  REQUIRE(writer.client->WriteAndWait(ChunkWrite(writer, receiver.reg.region(), 0, 0, 4096), absl::Seconds(30)).ok());
  CHECK(memcmp(receiver.buf->data(), writer.buf->data(), 4096) == 0);
  CHECK(peers() == 1);
}

TEST_CASE("a restarted peer: old descriptors are stale, new ones work without restarting anything else") {
  TestNetwork net = TestNetwork::Create(2, 1);
  auto a = StartFabricAgent(net.host(0));
  auto b = StartFabricAgent(net.host(1));
  Pod sender = MakePod(a->socket(), 1 << 20, 0x33);
  v1::RegionDescriptor old_descriptor;
  {
    Pod receiver = MakePod(b->socket(), 1 << 20, 0);
    REQUIRE(
        sender.client->WriteAndWait(ChunkWrite(sender, receiver.reg.region(), 0, 0, 1 << 20), absl::Seconds(30)).ok());
    old_descriptor = receiver.reg.region();
  }
  KillAndRestart(b, net.host(1));

  auto stale = sender.client->Write(ChunkWrite(sender, old_descriptor, 0, 0, 4096)).status();
  INFO(stale.ToString());
  CHECK(stale.code() == absl::StatusCode::kNotFound);
  CHECK(std::string(stale.message()).find("stale") != std::string::npos);

  Pod receiver = MakePod(b->socket(), 1 << 20, 0);
  auto r = sender.client->WriteAndWait(ChunkWrite(sender, receiver.reg.region(), 0, 0, 1 << 20), absl::Seconds(30));
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  CHECK(receiver.buf->data()[12345] == 0x33);
}

TEST_CASE("a queue whose destination agent restarted: its entries end NOT_FOUND, the queue keeps serving") {
  // The NIC worker takes queue entries only with cached peers and regions; an entry that
  // needs a handshake first (the peer's connection broke) goes to a thread that may
  // block. Either way it gets the same answer a Write would.
  TestNetwork net = TestNetwork::Create(2, 1);
  auto a = StartFabricAgent(net.host(0));
  auto b = StartFabricAgent(net.host(1));
  Pod sender = MakePod(a->socket(), 1 << 20, 0x47);
  Pod local = MakePod(a->socket(), 1 << 20, 0);
  Pod remote = MakePod(b->socket(), 1 << 20, 0);
  auto q = WriteQueue::Create(*sender.client, {remote.reg.region(), local.reg.region()}, 64, /*timeout_ms=*/10000);
  INFO(q.status().ToString());
  REQUIRE(q.ok());
  auto run = [&](uint32_t dst, uint64_t user_data) {
    REQUIRE((*q)->Post({sender.reg.region_id(), dst, 0, 0, 64 << 10, user_data}).ok());
    std::vector<WriteQueue::Completion> done;
    for (absl::Time end = absl::Now() + absl::Seconds(30); done.empty() && absl::Now() < end;) {
      (*q)->Reap(&done, 1, absl::Milliseconds(200));
    }
    REQUIRE(done.size() == 1);
    CHECK(done[0].user_data == user_data);
    return done[0].status;
  };
  REQUIRE(run(0, 1).ok());
  CHECK(remote.buf->data()[4096] == 0x47);

  KillAndRestart(b, net.host(1));

  absl::Status stale = run(0, 2);
  INFO(stale.ToString());
  CHECK(stale.code() == absl::StatusCode::kNotFound);
  CHECK(std::string(stale.message()).find("stale") != std::string::npos);
  REQUIRE(run(1, 3).ok());
  CHECK(local.buf->data()[4096] == 0x47);
  CHECK(run(0, 4).code() == absl::StatusCode::kNotFound);
  INFO(a->Log());
  CHECK(a->running());
}

}  // namespace
}  // namespace ferry
