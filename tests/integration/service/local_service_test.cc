// Integration tests of the local API against a real ferryd process over its unix socket.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/ferry_client.h"
#include "proto/ferry/cuda/cuda_driver.h"
#include "tests/testing/agent_process.h"
#include "tests/testing/test_pod.h"

namespace ferry {
namespace {

using testing::AgentProcess;

using Pod = testing::TestPod;
using testing::ChunkWrite;
using testing::FillRandom;
using testing::MakePod;

std::unique_ptr<AgentProcess> StartAgent(const std::vector<std::string>& flags = {}) {
  auto a = AgentProcess::Start(flags);
  INFO(a.status().ToString());
  REQUIRE(a.ok());
  return std::move(*a);
}

v1::WriteRequest ChunkRequest(uint64_t src, const v1::RegionDescriptor& dst,
                              std::vector<std::array<uint64_t, 3>> chunks) {
  v1::WriteRequest req;
  req.set_src_region_id(src);
  *req.mutable_dst() = dst;
  for (auto& c : chunks) {
    auto* pc = req.mutable_chunks()->add_chunks();
    pc->set_src_offset(c[0]);
    pc->set_dst_offset(c[1]);
    pc->set_length(c[2]);
  }
  return req;
}

TEST_CASE("a write between two sessions lands byte for byte and notifies the receiver") {
  auto agent = StartAgent();
  const uint64_t kSize = 4 << 20;
  Pod sender = MakePod(agent->socket(), kSize);
  Pod receiver = MakePod(agent->socket(), kSize);
  FillRandom(sender.buf->data(), kSize, 1);
  memset(receiver.buf->data(), 0xAB, kSize);

  // The receiver watches notifications before the write starts.
  auto ctx = receiver.client->NewContext(absl::Seconds(20));
  auto stream = receiver.client->stub()->WatchNotifications(ctx.get(), v1::WatchNotificationsRequest());

  v1::WriteRequest req = ChunkRequest(sender.reg.region_id(), receiver.reg.region(),
                                      {{0, 1 << 20, 1 << 20}, {3 << 20, 0, 4096}, {100, 2 << 20, 12345}});
  req.set_notify(true);
  req.set_tag(42);
  auto result = sender.client->WriteAndWait(req, absl::Seconds(10));
  INFO(result.status().ToString());
  REQUIRE(result.ok());
  CHECK(result->bytes() == (1 << 20) + 4096 + 12345);
  CHECK(result->path() == v1::TRANSFER_PATH_LOCAL);

  CHECK(memcmp(receiver.buf->data() + (1 << 20), sender.buf->data(), 1 << 20) == 0);
  CHECK(memcmp(receiver.buf->data(), sender.buf->data() + (3 << 20), 4096) == 0);
  CHECK(memcmp(receiver.buf->data() + (2 << 20), sender.buf->data() + 100, 12345) == 0);
  // Bytes outside the chunks are untouched.
  CHECK(receiver.buf->data()[4096] == 0xAB);
  CHECK(receiver.buf->data()[(2 << 20) + 12345] == 0xAB);

  v1::Notification n;
  REQUIRE(stream->Read(&n));
  CHECK(n.tag() == 42);
  CHECK(n.region_id() == receiver.reg.region_id());
  CHECK(n.transfer_id() == result->transfer_id());
  CHECK(n.bytes() == result->bytes());
  ctx->TryCancel();
}

TEST_CASE("a small node-local write answers with its result; Wait still finds it") {
  auto agent = StartAgent();
  Pod sender = MakePod(agent->socket(), 1 << 16);
  Pod receiver = MakePod(agent->socket(), 1 << 16);
  FillRandom(sender.buf->data(), 1 << 16, 3);
  v1::WriteRequest req = ChunkRequest(sender.reg.region_id(), receiver.reg.region(), {{8, 0, 4096}, {0, 8192, 8}});
  v1::WriteResponse resp;
  auto ctx = sender.client->NewContext(absl::Seconds(10));
  REQUIRE(sender.client->stub()->Write(ctx.get(), req, &resp).ok());
  REQUIRE(resp.has_result());  // copied inside the call
  CHECK(resp.result().transfer_id() == resp.transfer_id());
  CHECK(resp.result().code() == 0);
  CHECK(resp.result().bytes() == 4096 + 8);
  CHECK(memcmp(receiver.buf->data(), sender.buf->data() + 8, 4096) == 0);
  CHECK(memcmp(receiver.buf->data() + 8192, sender.buf->data(), 8) == 0);
  auto waited = sender.client->Wait(resp.transfer_id(), absl::Seconds(1));
  REQUIRE(waited.ok());
  CHECK(waited->bytes() == resp.result().bytes());
}

TEST_CASE("a paged write of 10,000 blocks moves every block to its slot") {
  auto agent = StartAgent();
  const uint64_t kBlock = 256, kBlocks = 10000;
  Pod sender = MakePod(agent->socket(), kBlock * kBlocks);
  Pod receiver = MakePod(agent->socket(), kBlock * kBlocks);
  FillRandom(sender.buf->data(), kBlock * kBlocks, 2);
  std::vector<uint64_t> src(kBlocks), dst(kBlocks);
  for (uint64_t i = 0; i < kBlocks; ++i) src[i] = dst[i] = i;
  std::shuffle(src.begin(), src.end(), std::mt19937(3));
  std::shuffle(dst.begin(), dst.end(), std::mt19937(4));
  auto id = sender.client->WriteBlocks(sender.reg.region_id(), receiver.reg.region(), kBlock, src, dst);
  REQUIRE(id.ok());
  auto r = sender.client->Wait(*id, absl::Seconds(10));
  REQUIRE(r.ok());
  REQUIRE(r->code() == 0);
  for (uint64_t i = 0; i < kBlocks; ++i) {
    REQUIRE(memcmp(receiver.buf->data() + dst[i] * kBlock, sender.buf->data() + src[i] * kBlock, kBlock) == 0);
  }
}

struct BadCase {
  const char* name;
  absl::StatusCode code;
  const char* message_part;
};

TEST_CASE("bad input gets a precise status and writes nothing") {
  auto agent = StartAgent({"--max_chunks_per_write=64", "--max_region_bytes=67108864"});
  const uint64_t kSize = 1 << 16;
  Pod a = MakePod(agent->socket(), kSize);
  Pod b = MakePod(agent->socket(), kSize);
  memset(b.buf->data(), 0x5A, kSize);
  const v1::RegionDescriptor& dst = b.reg.region();

  auto write_status = [&](v1::WriteRequest req) { return a.client->Write(req).status(); };
  auto check = [&](const BadCase& c, absl::Status s) {
    INFO(c.name << ": got " << s.ToString());
    CHECK(s.code() == c.code);
    CHECK(std::string(s.message()).find(c.message_part) != std::string::npos);
  };

  SECTION("write requests") {
    v1::RegionDescriptor wrong_token = dst;
    wrong_token.set_token(std::string(16, 'x'));
    v1::RegionDescriptor short_token = dst;
    short_token.set_token("abc");
    v1::RegionDescriptor stale = dst;
    stale.set_agent_incarnation(dst.agent_incarnation() + 1);
    v1::RegionDescriptor unknown_dst = dst;
    unknown_dst.set_region_id(999999);
    v1::RegionDescriptor bad_version = dst;
    bad_version.set_version(7);
    std::vector<std::array<uint64_t, 3>> too_many(65, {0, 0, 1});
    for (size_t i = 0; i < too_many.size(); ++i) too_many[i] = {0, i, 1};
    v1::WriteRequest no_layout;
    no_layout.set_src_region_id(a.reg.region_id());
    *no_layout.mutable_dst() = dst;
    v1::WriteRequest no_dst;
    no_dst.set_src_region_id(a.reg.region_id());
    no_dst.mutable_chunks()->add_chunks()->set_length(1);
    v1::WriteRequest empty_list = ChunkRequest(a.reg.region_id(), dst, {});
    empty_list.mutable_chunks();
    v1::WriteRequest paged_mismatch = ChunkRequest(a.reg.region_id(), dst, {});
    paged_mismatch.mutable_paged()->set_block_size(64);
    paged_mismatch.mutable_paged()->add_src_blocks(0);
    v1::WriteRequest paged_overflow = ChunkRequest(a.reg.region_id(), dst, {});
    paged_overflow.mutable_paged()->set_block_size(1ull << 40);
    paged_overflow.mutable_paged()->add_src_blocks(1ull << 30);
    paged_overflow.mutable_paged()->add_dst_blocks(0);

    const std::vector<std::pair<BadCase, v1::WriteRequest>> cases = {
        {{"unknown source region", absl::StatusCode::kNotFound, "src_region_id"},
         ChunkRequest(424242, dst, {{0, 0, 8}})},
        {{"source region 0", absl::StatusCode::kInvalidArgument, "src_region_id"}, ChunkRequest(0, dst, {{0, 0, 8}})},
        {{"someone else's region as source", absl::StatusCode::kPermissionDenied, "another session"},
         ChunkRequest(b.reg.region_id(), dst, {{0, 0, 8}})},
        {{"wrong token", absl::StatusCode::kPermissionDenied, "dst.token"},
         ChunkRequest(a.reg.region_id(), wrong_token, {{0, 0, 8}})},
        {{"truncated token", absl::StatusCode::kInvalidArgument, "dst.token"},
         ChunkRequest(a.reg.region_id(), short_token, {{0, 0, 8}})},
        {{"stale descriptor", absl::StatusCode::kNotFound, "stale"},
         ChunkRequest(a.reg.region_id(), stale, {{0, 0, 8}})},
        {{"unknown destination", absl::StatusCode::kNotFound, "dst.region_id"},
         ChunkRequest(a.reg.region_id(), unknown_dst, {{0, 0, 8}})},
        {{"descriptor version", absl::StatusCode::kInvalidArgument, "dst.version"},
         ChunkRequest(a.reg.region_id(), bad_version, {{0, 0, 8}})},
        {{"destination out of bounds", absl::StatusCode::kOutOfRange, "destination"},
         ChunkRequest(a.reg.region_id(), dst, {{0, kSize - 4, 8}})},
        {{"source out of bounds", absl::StatusCode::kOutOfRange, "source"},
         ChunkRequest(a.reg.region_id(), dst, {{kSize, 0, 1}})},
        {{"offset + length overflows", absl::StatusCode::kOutOfRange, "outside the region"},
         ChunkRequest(a.reg.region_id(), dst, {{~0ull - 2, 0, 8}})},
        {{"zero length", absl::StatusCode::kInvalidArgument, "length must be >= 1"},
         ChunkRequest(a.reg.region_id(), dst, {{0, 0, 8}, {0, 16, 0}})},
        {{"overlapping destinations", absl::StatusCode::kInvalidArgument, "overlap"},
         ChunkRequest(a.reg.region_id(), dst, {{0, 0, 100}, {200, 50, 100}})},
        {{"more chunks than the limit", absl::StatusCode::kResourceExhausted, "limit of 64"},
         ChunkRequest(a.reg.region_id(), dst, too_many)},
        {{"empty chunk list", absl::StatusCode::kInvalidArgument, "empty"}, empty_list},
        {{"no layout", absl::StatusCode::kInvalidArgument, "layout"}, no_layout},
        {{"no destination", absl::StatusCode::kInvalidArgument, "dst"}, no_dst},
        {{"paged ids do not pair", absl::StatusCode::kInvalidArgument, "pair up"}, paged_mismatch},
        {{"paged offset overflows", absl::StatusCode::kOutOfRange, "overflows"}, paged_overflow},
    };
    for (const auto& [c, req] : cases) check(c, write_status(req));
    // Nothing was written by any of them.
    for (uint64_t i = 0; i < kSize; ++i) REQUIRE(b.buf->data()[i] == 0x5A);
  }

  SECTION("registration requests") {
    auto reg = [&](v1::RegisterMemoryRequest req) {
      v1::RegisterMemoryResponse resp;
      auto ctx = a.client->NewContext();
      return FromGrpcStatus(a.client->stub()->RegisterMemory(ctx.get(), req, &resp));
    };
    auto host_req = [&](int fd, uint64_t size, uint64_t offset = 0) {
      v1::RegisterMemoryRequest req;
      req.set_size(size);
      auto handle = a.client->SendFd(fd);
      REQUIRE(handle.ok());
      req.mutable_host()->set_fd_handle(*handle);
      req.mutable_host()->set_offset(offset);
      return req;
    };
    int pipefd[2];
    REQUIRE(pipe(pipefd) == 0);
    int dirfd = open("/tmp", O_RDONLY | O_DIRECTORY);
    auto small = HostBuffer::Create(4096);
    REQUIRE(small.ok());

    check({"a pipe as memory", absl::StatusCode::kInvalidArgument, "not a shared-memory file"},
          reg(host_req(pipefd[0], 4096)));
    check({"a directory as memory", absl::StatusCode::kInvalidArgument, "not a shared-memory file"},
          reg(host_req(dirfd, 4096)));
    check({"size beyond the fd", absl::StatusCode::kOutOfRange, "exceeds the fd's size"},
          reg(host_req(small->fd(), 8192)));
    check({"unaligned offset", absl::StatusCode::kInvalidArgument, "page size"}, reg(host_req(small->fd(), 100, 1)));
    // A memfd the agent cannot seal against shrinking: the pod could fault the agent.
    const int unsealable = memfd_create("unsealable", MFD_CLOEXEC);
    REQUIRE(ftruncate(unsealable, 4096) == 0);
    check({"a memfd that cannot be sealed", absl::StatusCode::kInvalidArgument,
           "host.fd_handle: the fd cannot be sealed against shrinking"},
          reg(host_req(unsealable, 4096)));
    close(unsealable);
    // A registered one is sealed: its pod can no longer shrink it under the agent.
    CHECK(ftruncate(a.buf->fd(), 0) != 0);
    CHECK(errno == EPERM);
    check({"zero size", absl::StatusCode::kInvalidArgument, "size must be"}, reg(host_req(small->fd(), 0)));
    check({"size above the limit", absl::StatusCode::kInvalidArgument, "--max_region_bytes"},
          reg(host_req(small->fd(), 1ull << 30)));
    v1::RegisterMemoryRequest unknown_handle;
    unknown_handle.set_size(4096);
    unknown_handle.mutable_host()->set_fd_handle(777);
    check({"unknown fd handle", absl::StatusCode::kNotFound, "fd_handle"}, reg(unknown_handle));
    v1::RegisterMemoryRequest no_memory;
    no_memory.set_size(4096);
    check({"no memory kind", absl::StatusCode::kInvalidArgument, "memory"}, reg(no_memory));
    v1::RegisterMemoryRequest cuda;
    cuda.set_size(4096);
    cuda.mutable_cuda_ipc()->set_ipc_handle(std::string(64, '\0'));
    // CI machines have no NVIDIA driver: GPU requests say so (tests/gpu covers GPU hosts).
    if (!CudaDriver::Load().ok()) {
      check({"cuda_ipc without a driver", absl::StatusCode::kFailedPrecondition, "no CUDA driver"}, reg(cuda));
      check({"... and what a deployment sets", absl::StatusCode::kFailedPrecondition, "gpu.driverHostPath"}, reg(cuda));
      v1::RegisterMemoryRequest cuda_fd;
      cuda_fd.set_size(4096);
      absl::StatusOr<uint64_t> h = a.client->SendFd(pipefd[0]);
      REQUIRE(h.ok());
      cuda_fd.mutable_cuda_fd()->set_fd_handle(*h);
      check({"cuda_fd without a driver", absl::StatusCode::kFailedPrecondition, "no CUDA driver"}, reg(cuda_fd));
      check({"the fd was consumed", absl::StatusCode::kNotFound, "fd_handle"}, reg(cuda_fd));
    }
    close(pipefd[0]);
    close(pipefd[1]);
    close(dirfd);

    check({"deregister someone else's region", absl::StatusCode::kPermissionDenied, "another session"},
          a.client->Deregister(b.reg.region_id()));
    check({"deregister unknown region", absl::StatusCode::kNotFound, "region_id"}, a.client->Deregister(31337));
  }

  SECTION("calls without a session") {
    grpc::ClientContext ctx;
    v1::DeregisterMemoryRequest req;
    req.set_region_id(1);
    v1::DeregisterMemoryResponse resp;
    auto channel = grpc::CreateChannel("unix:" + agent->socket(), grpc::InsecureChannelCredentials());
    auto stub = v1::Agent::NewStub(channel);
    check({"no session metadata", absl::StatusCode::kUnauthenticated, "session"},
          FromGrpcStatus(stub->DeregisterMemory(&ctx, req, &resp)));
    grpc::ClientContext ctx2;
    ctx2.AddMetadata("ferry-session", std::string(32, '0'));
    check({"unknown session token", absl::StatusCode::kUnauthenticated, "no live session"},
          FromGrpcStatus(stub->DeregisterMemory(&ctx2, req, &resp)));
    // Status needs no session.
    grpc::ClientContext ctx3;
    v1::GetStatusResponse status;
    REQUIRE(stub->GetStatus(&ctx3, v1::GetStatusRequest(), &status).ok());
    CHECK(status.regions() == 2);
  }
}

TEST_CASE("a session cannot register more than --max_regions_per_session regions") {
  auto agent = StartAgent({"--max_regions_per_session=2"});
  Pod p = MakePod(agent->socket(), 4096);
  auto second = HostBuffer::Create(4096);
  auto third = HostBuffer::Create(4096);
  REQUIRE(second.ok());
  REQUIRE(third.ok());
  auto r2 = p.client->RegisterHost(*second);
  REQUIRE(r2.ok());
  auto r3 = p.client->RegisterHost(*third);
  CHECK(r3.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(std::string(r3.status().message()).find("--max_regions_per_session") != std::string::npos);
  Pod other = MakePod(agent->socket(), 4096);  // the limit is per session
  REQUIRE(p.client->Deregister(r2->region_id()).ok());
  CHECK(p.client->RegisterHost(*third).ok());
}

TEST_CASE("a killed client's regions are reclaimed (status and metrics agree)") {
  auto agent = StartAgent();
  std::string ready = agent->dir() + "/holder.ready";
  auto holder = testing::ChildProcess::Spawn(
      {testing::RunfilePath("tests/testing/region_holder"), agent->socket(), "3", "65536", ready},
      agent->dir() + "/holder.log");
  REQUIRE(holder.ok());
  REQUIRE(testing::WaitForFile(ready, absl::Seconds(20)).ok());

  auto observer = Client::Connect(agent->socket());
  REQUIRE(observer.ok());
  auto status = (*observer)->GetStatus();
  REQUIRE(status.ok());
  CHECK(status->regions() == 3);
  CHECK(status->registered_bytes() == 3 * 65536);
  CHECK(status->sessions() == 2);
  auto metrics = testing::HttpGet(agent->metrics_port(), "/metrics");
  REQUIRE(metrics.ok());
  CHECK(testing::MetricValue(*metrics, "ferry_regions", R"(kind="host")") == 3);

  (*holder)->Kill(SIGKILL);
  REQUIRE((*holder)->Wait(absl::Seconds(10)) == 128 + SIGKILL);

  absl::Time deadline = absl::Now() + absl::Seconds(10);
  uint32_t regions = 3;
  while (regions != 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
    status = (*observer)->GetStatus();
    REQUIRE(status.ok());
    regions = status->regions();
  }
  CHECK(regions == 0);
  CHECK(status->registered_bytes() == 0);
  CHECK(status->sessions() == 1);
  metrics = testing::HttpGet(agent->metrics_port(), "/metrics");
  REQUIRE(metrics.ok());
  CHECK(testing::MetricValue(*metrics, "ferry_regions", R"(kind="host")") == 0);
  CHECK(testing::MetricValue(*metrics, "ferry_registered_bytes", R"(kind="host")") == 0);
  CHECK(testing::MetricValue(*metrics, "ferry_sessions") == 1);
}

TEST_CASE("metrics scraped over HTTP follow the traffic") {
  auto agent = StartAgent();
  auto health = testing::HttpGet(agent->metrics_port(), "/healthz");
  CHECK(health.ok());
  auto before = testing::HttpGet(agent->metrics_port(), "/metrics");
  REQUIRE(before.ok());
  CHECK(testing::MetricValue(*before, "ferry_build_info", R"(libfabric_version="1.17",provider="",version="0.1.0")") ==
        1);
  CHECK(testing::MetricValue(*before, "ferry_sessions") == 0);

  Pod a = MakePod(agent->socket(), 1 << 20);
  Pod b = MakePod(agent->socket(), 1 << 20);
  for (int i = 0; i < 3; ++i) {
    auto r =
        a.client->WriteAndWait(ChunkRequest(a.reg.region_id(), b.reg.region(), {{0, 0, 1 << 20}}), absl::Seconds(10));
    REQUIRE(r.ok());
  }
  auto failed = a.client->Write(ChunkRequest(a.reg.region_id(), b.reg.region(), {{0, 0, 2 << 20}}));
  CHECK(failed.status().code() == absl::StatusCode::kOutOfRange);

  auto after = testing::HttpGet(agent->metrics_port(), "/metrics");
  REQUIRE(after.ok());
  CHECK(testing::MetricValue(*after, "ferry_sessions") == 2);
  CHECK(testing::MetricValue(*after, "ferry_regions", R"(kind="host")") == 2);
  CHECK(testing::MetricValue(*after, "ferry_registered_bytes", R"(kind="host")") == 2 << 20);
  CHECK(testing::MetricValue(*after, "ferry_transfers_total", R"(path="local",status="OK")") == 3);
  CHECK(testing::MetricValue(*after, "ferry_transfer_bytes_total", R"(direction="tx",nic="none",path="local")") ==
        3 << 20);
  CHECK(testing::MetricValue(*after, "ferry_transfer_bytes_total", R"(direction="rx",nic="none",path="local")") ==
        3 << 20);
  CHECK(testing::MetricValue(*after, "ferry_transfer_duration_seconds_count", R"(path="local")") == 3);
  CHECK(testing::MetricValue(*after, "ferry_errors_total", R"(api="Write",code="OUT_OF_RANGE")") == 1);
}

TEST_CASE("/readyz answers 200 while the agent takes work and 503 with the reason when it cannot") {
  auto agent = StartAgent();
  auto ready = testing::HttpGet(agent->metrics_port(), "/readyz");
  CHECK(ready.ok());
  // Someone removed the API socket: pods can no longer reach this agent.
  REQUIRE(unlink(agent->socket().c_str()) == 0);
  auto gone = testing::HttpGet(agent->metrics_port(), "/readyz");
  REQUIRE_FALSE(gone.ok());
  CHECK_THAT(std::string(gone.status().message()), Catch::Matchers::Contains("503"));
  CHECK(testing::HttpGet(agent->metrics_port(), "/healthz").ok());  // alive all the same
}

TEST_CASE("ferryctl status prints the agent's state as a table and as JSON") {
  auto agent = StartAgent();
  Pod p = MakePod(agent->socket(), 1 << 20);
  const std::string out = agent->dir() + "/ferryctl.out";
  for (const std::string& format : {std::string("--json=false"), std::string("--json")}) {
    auto ctl = testing::ChildProcess::Spawn(
        {testing::RunfilePath("tools/ferryctl/ferryctl"), "--socket=" + agent->socket(), format, "status"}, out);
    REQUIRE(ctl.ok());
    REQUIRE((*ctl)->Wait(absl::Seconds(10)) == 0);
  }
  auto text = testing::WaitForFile(out + ".out", absl::Seconds(1));
  REQUIRE(text.ok());
  CHECK(text->find("sessions               1") != std::string::npos);
  CHECK(text->find("regions                1 (1.0 MiB)") != std::string::npos);
  CHECK(text->find("\"registeredBytes\": \"1048576\"") != std::string::npos);
  // The pod's row under traffic classes: its rule (none matched) and what that grants.
  CHECK(text->find("traffic classes (scheduled per class and pod)") != std::string::npos);
  CHECK(text->find(absl::StrCat(getpid())) != std::string::npos);
  CHECK(text->find("default      latency     bulk             1") != std::string::npos);
  CHECK(text->find("\"rule\": \"default\"") != std::string::npos);
}

TEST_CASE("after the agent restarts, calls are UNAVAILABLE until Reconnect(); the same memory registers again") {
  auto agent = StartAgent();
  agent->KeepDir();
  const std::string dir = agent->dir();
  Pod a = MakePod(agent->socket(), 1 << 16, 0x3C);
  Pod b = MakePod(agent->socket(), 1 << 16, 0);
  REQUIRE(agent->Stop(SIGKILL) == 128 + SIGKILL);  // dies without cleaning up
  auto restarted = AgentProcess::Start({}, dir);
  INFO(restarted.status().ToString());
  REQUIRE(restarted.ok());
  absl::StatusOr<uint64_t> w = a.client->Write(ChunkWrite(a, b.reg.region(), 0, 0, 16));
  CHECK(w.status().code() == absl::StatusCode::kUnavailable);
  CHECK(std::string(w.status().message()).find("Reconnect") != std::string::npos);
  for (Pod* p : {&a, &b}) {
    REQUIRE(p->client->Reconnect(absl::Seconds(10)).ok());
    absl::StatusOr<v1::RegisterMemoryResponse> r = p->client->RegisterHost(*p->buf);  // the same memory
    REQUIRE(r.ok());
    p->reg = *r;
  }
  auto done = a.client->WriteAndWait(ChunkWrite(a, b.reg.region(), 0, 0, 16), absl::Seconds(10));
  INFO(done.status().ToString());
  REQUIRE(done.ok());
  CHECK(b.buf->data()[15] == 0x3C);
}

TEST_CASE("a call racing the agent's shutdown fails with UNAVAILABLE, never gRPC's CANCELLED") {
  // The agent's server cancels calls that arrive while it shuts down; the client must
  // say what a caller can act on (reconnect), as a helm upgrade rolling the agent needs.
  for (int attempt = 0; attempt < 4; ++attempt) {
    auto agent = StartAgent();
    Pod a = MakePod(agent->socket(), 1 << 16, 0x3C);
    Pod b = MakePod(agent->socket(), 1 << 16, 0);
    std::atomic<bool> started{false};
    absl::Status failure;
    std::thread writer([&] {
      const absl::Time deadline = absl::Now() + absl::Seconds(10);
      while (absl::Now() < deadline) {
        absl::StatusOr<v1::TransferResult> r =
            a.client->WriteAndWait(ChunkWrite(a, b.reg.region(), 0, 0, 1 << 16), absl::Seconds(5));
        started = true;
        if (!r.ok()) {
          failure = r.status();
          return;
        }
      }
    });
    while (!started) absl::SleepFor(absl::Milliseconds(1));
    absl::SleepFor(absl::Milliseconds(50));
    CHECK(agent->Stop(SIGTERM) == 0);
    writer.join();
    INFO(failure.ToString());
    CHECK(failure.code() == absl::StatusCode::kUnavailable);
  }
}

TEST_CASE("a sizing flag out of its range is refused at start, naming the flag") {
  for (const std::string flag :
       {"--staging_buffer_bytes=1024", "--staging_buffer_bytes=4294967297", "--stage_bytes=0"}) {
    INFO(flag);
    auto agent = AgentProcess::Start({flag});
    REQUIRE_FALSE(agent.ok());
    CHECK(std::string(agent.status().message()).find(flag.substr(0, flag.find('='))) != std::string::npos);
  }
}

TEST_CASE("SIGTERM stops cleanly; a stale socket does not block a restart; a live one does") {
  auto agent = StartAgent();
  const std::string dir = agent->dir();
  const std::string socket = agent->socket();
  {
    Pod p = MakePod(socket, 4096);  // a live session does not hold up shutdown
    CHECK(agent->Stop(SIGTERM, absl::Seconds(10)) == 0);
  }
  struct stat st;
  CHECK(stat(socket.c_str(), &st) != 0);

  // Leave a stale socket file behind, as a crashed agent would.
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  strcpy(addr.sun_path, socket.c_str());
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  close(fd);
  REQUIRE(stat(socket.c_str(), &st) == 0);
  agent->KeepDir();
  agent.reset();

  auto restarted = AgentProcess::Start({}, dir);
  INFO(restarted.status().ToString());
  REQUIRE(restarted.ok());
  auto c = Client::Connect(socket);
  REQUIRE(c.ok());

  // A second agent on the same socket refuses to start instead of stealing it.
  auto second = AgentProcess::Start({}, testing::MakeTempDir("fy"));
  REQUIRE(second.ok());
  auto clash = AgentProcess::Start({"--socket=" + socket}, (*second)->dir());
  CHECK(!clash.ok());
  CHECK(std::string(clash.status().message()).find("another agent is listening") != std::string::npos);
}

}  // namespace
}  // namespace ferry
