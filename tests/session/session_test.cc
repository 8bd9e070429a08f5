#include "agent/session/session.h"

#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <thread>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "agent/session/session_registry.h"
#include "proto/ferry/wire/session_wire.h"

namespace ferry {
namespace {

TEST_CASE("pending fds are bounded and used once") {
  SessionLimits limits;
  limits.max_pending_fds = 2;
  Session s(1, {}, limits);
  auto h1 = s.AddFd(UniqueFd(open("/dev/null", O_RDONLY)));
  auto h2 = s.AddFd(UniqueFd(open("/dev/null", O_RDONLY)));
  REQUIRE(h1.ok());
  REQUIRE(h2.ok());
  CHECK(s.AddFd(UniqueFd(open("/dev/null", O_RDONLY))).status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(s.TakeFd(*h1).ok());
  CHECK(s.TakeFd(*h1).status().code() == absl::StatusCode::kNotFound);
  CHECK(s.AddFd(UniqueFd(open("/dev/null", O_RDONLY))).ok());
}

TEST_CASE("Wait returns a result once, times out while running, and forgets old ones") {
  SessionLimits limits;
  limits.max_kept_results = 2;
  limits.max_inflight_transfers = 3;
  Session s(1, {}, limits);
  REQUIRE(s.BeginTransfer(10).ok());
  auto running = s.Wait(10, absl::Milliseconds(10));
  REQUIRE(running.ok());
  CHECK(!running->done());

  std::thread finisher([&] {
    absl::SleepFor(absl::Milliseconds(20));
    v1::TransferResult r;
    r.set_transfer_id(10);
    r.set_bytes(5);
    s.FinishTransfer(r);
  });
  auto done = s.Wait(10, absl::Seconds(5));
  finisher.join();
  REQUIRE(done.ok());
  CHECK(done->done());
  CHECK(done->result().bytes() == 5);
  CHECK(s.completions().Pop(absl::ZeroDuration()).has_value());

  CHECK(s.Wait(99, absl::ZeroDuration()).status().code() == absl::StatusCode::kNotFound);
  REQUIRE(s.BeginTransfer(11).ok());
  REQUIRE(s.BeginTransfer(12).ok());
  REQUIRE(s.BeginTransfer(13).ok());
  CHECK(s.BeginTransfer(14).code() == absl::StatusCode::kResourceExhausted);
  for (uint64_t id : {11, 12}) {
    v1::TransferResult r;
    r.set_transfer_id(id);
    s.FinishTransfer(r);
  }
  // Only the last two results are kept.
  CHECK(s.Wait(10, absl::ZeroDuration()).status().code() == absl::StatusCode::kNotFound);
  CHECK(s.Wait(12, absl::ZeroDuration()).ok());
}

TEST_CASE("closing a session wakes waiters and ends its streams") {
  int closed = 0;
  SessionRegistry registry({}, [&](Session&) { ++closed; });
  auto s = registry.Create({1, 2, 3}).value();
  REQUIRE(s->BeginTransfer(1).ok());
  auto found = registry.FindByToken(s->token().Hex());
  REQUIRE(found.ok());
  CHECK((*found)->id() == s->id());
  CHECK(registry.FindByToken(std::string(32, 'f')).status().code() == absl::StatusCode::kUnauthenticated);
  CHECK(registry.FindByToken("short").status().code() == absl::StatusCode::kUnauthenticated);

  std::thread closer([&] {
    absl::SleepFor(absl::Milliseconds(20));
    registry.Close(s->id());
  });
  auto r = s->Wait(1, absl::Seconds(10));  // must return well before 10 s
  closer.join();
  REQUIRE(r.ok());
  CHECK(!r->done());
  CHECK(closed == 1);
  CHECK(s->closed());
  CHECK(!s->notifications().Pop(absl::Seconds(5)).has_value());
  CHECK(registry.size() == 0);
  CHECK(!s->BeginTransfer(2).ok());
}

TEST_CASE("the registry holds each uid to its sessions and the node to its own, and frees them on close") {
  SessionLimits limits;
  limits.max_sessions = 3;
  limits.max_sessions_per_uid = 2;
  SessionRegistry registry(limits, nullptr);
  auto a1 = registry.Create({10, 1000, 1000}).value();
  auto a2 = registry.Create({11, 1000, 1000}).value();
  absl::StatusOr<std::shared_ptr<Session>> a3 = registry.Create({12, 1000, 1000});
  CHECK(a3.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(absl::StrContains(a3.status().message(), "uid 1000 already has 2 sessions (--max_sessions_per_uid)"));
  auto b1 = registry.Create({20, 2000, 2000}).value();  // another pod still gets in
  absl::StatusOr<std::shared_ptr<Session>> b2 = registry.Create({21, 2000, 2000});
  CHECK(absl::StrContains(b2.status().message(), "(--max_sessions)"));
  registry.Close(a1->id());
  CHECK(registry.Create({12, 1000, 1000}).ok());  // a closed session's room is given back
  CHECK(registry.size() == 3);
}

TEST_CASE("a session's queues are bounded in bytes as well as in events") {
  SessionLimits limits;
  limits.event_queue_bytes = 64 << 10;
  Session s(1, {}, limits);
  v1::Notification big;
  big.set_payload(std::string(4096, 'x'));
  int queued = 0;
  while (queued < 1000 && s.notifications().Push(big)) ++queued;
  CHECK(queued >= 14);  // 64 KiB of 4 KiB payloads, less each message's overhead
  CHECK(queued <= 16);
  CHECK(s.notifications().dropped() == 1);
  CHECK_FALSE(s.notifications().Push(big));  // full stays full until a reader takes one
  CHECK(s.notifications().Pop(absl::ZeroDuration()).has_value());
  CHECK(s.notifications().Push(big));
}

TEST_CASE("the session socket sits beside the gRPC socket") {
  CHECK(SessionSocketPath("/run/ferry/ferry.sock") == "/run/ferry/ferry.session.sock");
  CHECK(SessionSocketPath("/tmp/x") == "/tmp/x.session.sock");
}

}  // namespace
}  // namespace ferry
