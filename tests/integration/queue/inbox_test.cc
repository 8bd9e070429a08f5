// Notification inboxes (OpenInbox) against a real ferryd: notifications of writes and
// messages through shared memory, in order, none lost while the ring is full; one
// reader per session; and what is not an inbox refused, naming the field.
#include "client/cpp/inbox.h"

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
#include "proto/ferry/wire/inbox_layout.h"
#include "tests/testing/agent_process.h"
#include "tests/testing/test_pod.h"

namespace ferry {
namespace {

using testing::AgentProcess;
using testing::MakePod;
using testing::StartAgent;
using testing::TestPod;

// Polls until `n` notifications arrived (bounded).
std::vector<v1::Notification> PollAll(Inbox& in, size_t n) {
  std::vector<v1::Notification> got;
  const absl::Time end = absl::Now() + absl::Seconds(30);
  while (got.size() < n && absl::Now() < end) {
    absl::StatusOr<size_t> polled = in.Poll(&got, n - got.size(), absl::Milliseconds(200));
    REQUIRE(polled.ok());
  }
  REQUIRE(got.size() == n);
  return got;
}

TEST_CASE("an inbox gets the session's notifications, writes and messages, in order and whole") {
  auto agent = StartAgent();
  TestPod sender = MakePod(agent->socket(), 1 << 16, 0x5A);
  TestPod receiver = MakePod(agent->socket(), 1 << 16);
  auto in = Inbox::Open(*receiver.client, 8);
  INFO(in.status().ToString());
  REQUIRE(in.ok());
  std::vector<v1::Notification> none;
  REQUIRE((*in)->Poll(&none, 8, absl::ZeroDuration()).ok());
  CHECK(none.empty());

  v1::WriteRequest w;
  w.set_src_region_id(sender.reg.region_id());
  *w.mutable_dst() = receiver.reg.region();
  auto* chunk = w.mutable_chunks()->add_chunks();
  chunk->set_length(4096);
  w.set_notify(true);
  w.set_tag(7);
  w.set_notify_payload("block 3 of request 9");
  REQUIRE(sender.client->WriteAndWait(w, absl::Seconds(10)).ok());
  const std::string big(4096, 'p');
  REQUIRE(sender.client->SendMessage(receiver.reg.region(), 8, big).ok());
  REQUIRE(sender.client->SendMessage(receiver.reg.region(), 9, "").ok());

  std::vector<v1::Notification> got = PollAll(**in, 3);
  CHECK(got[0].kind() == v1::NOTIFICATION_KIND_WRITE);
  CHECK(got[0].tag() == 7);
  CHECK(got[0].bytes() == 4096);
  CHECK(got[0].payload() == "block 3 of request 9");
  CHECK(got[0].region_id() == receiver.reg.region_id());
  CHECK(got[1].kind() == v1::NOTIFICATION_KIND_MESSAGE);
  CHECK(got[1].payload() == big);
  CHECK(got[2].tag() == 9);
  CHECK(memcmp(receiver.buf->data(), sender.buf->data(), 4096) == 0);

  // Eight slots, 100 messages nobody reads yet: they wait in the agent, none is lost.
  for (uint64_t i = 0; i < 100; ++i) REQUIRE(sender.client->SendMessage(receiver.reg.region(), 100 + i, "m").ok());
  absl::SleepFor(absl::Milliseconds(50));
  got = PollAll(**in, 100);
  for (uint64_t i = 0; i < 100; ++i) CHECK(got[i].tag() == 100 + i);
}

TEST_CASE("a session reads notifications through streams or one inbox, never both") {
  auto agent = StartAgent();
  TestPod a = MakePod(agent->socket(), 4096);
  {  // a stream is open: no inbox
    auto ctx = a.client->NewContext(absl::Seconds(10));
    auto stream = a.client->stub()->WatchNotifications(ctx.get(), v1::WatchNotificationsRequest());
    // The stream is up once it carries a message (an inbox opened before that would stay).
    REQUIRE(a.client->SendMessage(a.reg.region(), 1, "up").ok());
    v1::Notification up;
    REQUIRE(stream->Read(&up));
    const absl::Status refused = Inbox::Open(*a.client, 8).status();
    CHECK(refused.code() == absl::StatusCode::kFailedPrecondition);
    CHECK(std::string(refused.message()).find("close it before opening an inbox") != std::string::npos);
    ctx->TryCancel();
  }
  TestPod b = MakePod(agent->socket(), 4096);
  auto in = Inbox::Open(*b.client, 8);
  REQUIRE(in.ok());
  absl::Status second = Inbox::Open(*b.client, 8).status();
  CHECK(second.code() == absl::StatusCode::kAlreadyExists);
  auto ctx = b.client->NewContext(absl::Seconds(10));
  auto stream = b.client->stub()->WatchNotifications(ctx.get(), v1::WatchNotificationsRequest());
  v1::Notification n;
  CHECK_FALSE(stream->Read(&n));
  grpc::Status s = stream->Finish();
  CHECK(s.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  CHECK(s.error_message().find("through its inbox") != std::string::npos);
  // The inbox still gets everything.
  REQUIRE(a.client->SendMessage(b.reg.region(), 5, "still here").ok());
  CHECK(PollAll(**in, 1)[0].payload() == "still here");
}

// An inbox assembled by hand, for what the client library would never send.
struct RawInbox {
  int ring = -1, doorbell = -1, ours = -1;
  explicit RawInbox(uint32_t slots, size_t bytes = 0, bool sealable = true, uint32_t magic = inbox::kInboxMagic) {
    bytes = bytes != 0 ? bytes : inbox::InboxBytes(slots);
    ring = memfd_create("raw-inbox", MFD_CLOEXEC | (sealable ? MFD_ALLOW_SEALING : 0));
    REQUIRE(ftruncate(ring, bytes) == 0);
    void* map = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, ring, 0);
    REQUIRE(map != MAP_FAILED);
    auto* header = new (map) inbox::InboxHeader{};
    header->magic = magic;
    header->slots = slots;
    munmap(map, bytes);
    int pair[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) == 0);
    doorbell = pair[0];
    ours = pair[1];
  }
  ~RawInbox() {
    for (int fd : {ring, doorbell, ours}) close(fd);
  }
};

TEST_CASE("OpenInbox refuses what is not an inbox, naming the field, and the session keeps working") {
  auto agent = StartAgent();
  TestPod pod = MakePod(agent->socket(), 4096);
  auto open = [&](int ring, int doorbell, uint32_t slots, bool send = true) {
    v1::OpenInboxRequest req;
    if (send) {
      req.set_ring_fd(*pod.client->SendFd(ring));
      req.set_doorbell_fd(*pod.client->SendFd(doorbell));
    } else {
      req.set_ring_fd(999);
      req.set_doorbell_fd(998);
    }
    req.set_slots(slots);
    v1::OpenInboxResponse resp;
    auto ctx = pod.client->NewContext();
    return FromGrpcStatus(pod.client->stub()->OpenInbox(ctx.get(), req, &resp));
  };
  int pipe_fds[2];
  REQUIRE(pipe(pipe_fds) == 0);
  struct Case {
    const char* name;
    absl::Status status;
    absl::StatusCode code;
    const char* message_part;
  };
  std::vector<Case> cases;
  {
    RawInbox r(8);
    cases.push_back({"slots not a power of two", open(r.ring, r.doorbell, 12), absl::StatusCode::kInvalidArgument,
                     "slots must be a power of two in [8, 4096], got 12"});
  }
  {
    RawInbox r(8);
    cases.push_back({"too many slots", open(r.ring, r.doorbell, 8192), absl::StatusCode::kInvalidArgument, "got 8192"});
  }
  {
    RawInbox r(8);
    cases.push_back(
        {"unknown fd handles", open(r.ring, r.doorbell, 8, /*send=*/false), absl::StatusCode::kNotFound, "ring_fd"});
  }
  {
    RawInbox r(8);
    cases.push_back({"a pipe for a doorbell", open(r.ring, pipe_fds[0], 8), absl::StatusCode::kInvalidArgument,
                     "doorbell_fd must be one end of a unix stream socketpair"});
  }
  {  // an eventfd's write blocks once the pod fills its count and clears O_NONBLOCK
    RawInbox r(8);
    const int efd = eventfd(0, EFD_CLOEXEC);
    cases.push_back({"an eventfd for a doorbell", open(r.ring, efd, 8), absl::StatusCode::kInvalidArgument,
                     "doorbell_fd must be one end of a unix stream socketpair"});
    close(efd);
  }
  {
    RawInbox r(8);
    const int udp = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    cases.push_back({"a datagram socket for a doorbell", open(r.ring, udp, 8), absl::StatusCode::kInvalidArgument,
                     "got another kind of socket"});
    close(udp);
  }
  {
    RawInbox r(8, /*bytes=*/4096);
    cases.push_back({"a ring too small", open(r.ring, r.doorbell, 8), absl::StatusCode::kInvalidArgument,
                     "an inbox of 8 slots needs"});
  }
  {
    RawInbox r(8, 0, /*sealable=*/false);
    cases.push_back({"a memfd that cannot be sealed", open(r.ring, r.doorbell, 8), absl::StatusCode::kInvalidArgument,
                     "ring_fd: the fd cannot be sealed against shrinking"});
  }
  {
    RawInbox r(8, 0, true, /*magic=*/0x12345678);
    cases.push_back({"no inbox header", open(r.ring, r.doorbell, 8), absl::StatusCode::kInvalidArgument,
                     "initialised inbox header"});
  }
  {
    RawInbox r(16);
    cases.push_back({"slots other than the header's", open(r.ring, r.doorbell, 8), absl::StatusCode::kInvalidArgument,
                     "initialised inbox header"});
  }
  {
    RawInbox r(8);
    cases.push_back({"a pipe for a ring", open(pipe_fds[0], r.doorbell, 8), absl::StatusCode::kInvalidArgument,
                     "ring_fd must be a memfd"});
  }
  for (const Case& c : cases) {
    INFO(c.name << ": " << c.status.ToString());
    CHECK(c.status.code() == c.code);
    CHECK(std::string(c.status.message()).find(c.message_part) != std::string::npos);
  }
  close(pipe_fds[0]);
  close(pipe_fds[1]);
  // None of the refusals took the session's notifications: an inbox opens and works.
  auto in = Inbox::Open(*pod.client, 8);
  INFO(in.status().ToString());
  REQUIRE(in.ok());
  REQUIRE(pod.client->SendMessage(pod.reg.region(), 1, "ok").ok());
  CHECK(PollAll(**in, 1)[0].payload() == "ok");
}

TEST_CASE("a pod that exits with an inbox leaves the agent serving the others") {
  auto agent = StartAgent();
  TestPod stays = MakePod(agent->socket(), 4096);
  auto kept = Inbox::Open(*stays.client, 8);
  REQUIRE(kept.ok());
  for (int i = 0; i < 5; ++i) {
    TestPod gone = MakePod(agent->socket(), 4096);
    auto in = Inbox::Open(*gone.client, 8);
    REQUIRE(in.ok());
    REQUIRE(stays.client->SendMessage(gone.reg.region(), 1, "unread").ok());
  }  // each session ends with a notification unread in its ring
  REQUIRE(stays.client->SendMessage(stays.reg.region(), 2, "mine").ok());
  CHECK(PollAll(**kept, 1)[0].payload() == "mine");
  REQUIRE(agent->Stop() == 0);
}

}  // namespace
}  // namespace ferry
