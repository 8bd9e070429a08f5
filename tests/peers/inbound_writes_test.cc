// InboundWrites against the real region table, sessions and transfer manager, with the
// writing agent's Ping replaced by a scripted answer (the fault to inject): a write
// announced by an agent that then dies, restarts or goes silent ends for its receiver
// with the reason; one whose end arrives (before or after its begin) ends silently.
#include "agent/peers/inbound_writes.h"

#include <catch2/catch.hpp>
#include <string>

#include "agent/common/clock.h"
#include "agent/peers/peer_service.h"
#include "agent/session/session_registry.h"
#include "tests/testing/host_region.h"

namespace ferry {
namespace {

constexpr uint64_t kIncarnation = 0x5eed;
constexpr uint64_t kWriter = 0xabc;

struct Receiver {
  ManualClock clock{absl::FromUnixSeconds(1'000'000)};
  Metrics metrics;
  SessionRegistry sessions{{}, nullptr};
  RegionTable regions;
  TransferManager transfers{kIncarnation, &metrics, &sessions, &regions};
  InboundWrites inbound{Options(&clock), &transfers};
  PeerService service{kIncarnation, {}, &regions, &transfers, &metrics};
  std::shared_ptr<Session> owner = sessions.Create({}).value();
  std::shared_ptr<Region> region = testing::MemfdRegion(7, 4096, owner->id());
  // What the writing agent's Ping answers, and how often it was asked.
  absl::StatusOr<uint64_t> answer = kWriter;
  int pings = 0;

  static InboundWritesOptions Options(const Clock* clock) {
    InboundWritesOptions o;
    o.run_thread = false;  // the test runs Check, at times of its clock
    o.clock = clock;
    o.max_writes = 4;
    return o;
  }

  Receiver() {
    REQUIRE(regions.Insert(region).ok());
    service.set_inbound(&inbound);
    inbound.StartProbing([this](const std::string& address, absl::Duration) {
      CHECK(address == "10.0.0.9:7000");
      ++pings;
      return answer;
    });
  }

  // The writer's begin of write `id`, as it sends it (Notify with begin).
  v1::NotifyRequest Begin(uint64_t id, uint32_t timeout_ms = 60000) const {
    v1::NotifyRequest r;
    r.set_target_incarnation(kIncarnation);
    r.set_region_id(region->id());
    r.set_token(region->token().bytes());
    r.set_transfer_id(id);
    r.set_source_incarnation(kWriter);
    r.set_tag(5);
    r.set_payload("request-9");
    r.set_kind(v1::NOTIFICATION_KIND_WRITE);
    r.set_begin(true);
    r.set_source_address("10.0.0.9:7000");
    r.set_timeout_ms(timeout_ms);
    return r;
  }
  // The write's own notification.
  v1::NotifyRequest End(uint64_t id) const {
    v1::NotifyRequest r = Begin(id);
    r.set_begin(false);
    r.set_deliver(true);
    r.set_bytes(4096);
    return r;
  }
  grpc::Status Send(const v1::NotifyRequest& r) {
    v1::NotifyResponse resp;
    return service.Notify(nullptr, &r, &resp);
  }
  std::optional<v1::Notification> Next() { return owner->notifications().Pop(absl::ZeroDuration()); }
};

TEST_CASE("a write that ends, before or after its begin arrives, is forgotten without a word") {
  Receiver r;
  REQUIRE(r.Send(r.Begin(1)).ok());
  CHECK(r.inbound.size() == 1);
  CHECK(!r.Next().has_value());  // a begin is not delivered
  REQUIRE(r.Send(r.End(1)).ok());
  CHECK(r.inbound.size() == 0);
  std::optional<v1::Notification> n = r.Next();  // the end is, as always
  REQUIRE(n.has_value());
  CHECK(n->code() == 0);
  // An end that overtook its begin: the late begin is dropped.
  REQUIRE(r.Send(r.End(2)).ok());
  REQUIRE(r.Next().has_value());
  REQUIRE(r.Send(r.Begin(2)).ok());
  CHECK(r.inbound.size() == 0);
  // Nothing is held, so nobody is pinged, however long it has been.
  r.answer = absl::UnavailableError("connection refused");
  r.inbound.Check(r.clock.Now() + absl::Hours(2));
  CHECK(r.pings == 0);
  CHECK(!r.Next().has_value());
}

TEST_CASE("writes through a window are counted until they end or are lost (a window's Close waits on them)") {
  Receiver r;
  v1::NotifyRequest through = r.Begin(1);
  through.set_window_id(77);
  REQUIRE(r.inbound.Begin(through, r.region).ok());
  through.set_transfer_id(2);
  REQUIRE(r.inbound.Begin(through, r.region).ok());
  REQUIRE(r.inbound.Begin(r.Begin(3), r.region).ok());  // no window
  CHECK(r.inbound.InWindow(77) == 2);
  CHECK(r.inbound.InWindow(78) == 0);
  r.inbound.End(kWriter, 1);
  CHECK(r.inbound.InWindow(77) == 1);
  r.answer = 999;  // the writer restarted: its writes are lost, and counted out
  r.inbound.Check(r.clock.Now() + absl::Seconds(5));
  CHECK(r.inbound.InWindow(77) == 0);
  CHECK(r.inbound.size() == 0);
}

TEST_CASE("a writer that stops answering: its writes in flight end UNAVAILABLE for their receivers") {
  Receiver r;
  REQUIRE(r.Send(r.Begin(3)).ok());
  const absl::Time t0 = r.clock.Now();
  r.inbound.Check(t0);  // too young to ask about
  CHECK(r.pings == 0);
  r.inbound.Check(t0 + absl::Seconds(1));
  CHECK(r.pings == 1);  // alive
  CHECK(!r.Next().has_value());
  r.answer = absl::UnavailableError("connection refused");
  r.inbound.Check(t0 + absl::Seconds(2));
  CHECK(!r.Next().has_value());  // one failed ping is not enough
  r.inbound.Check(t0 + absl::Milliseconds(2100));
  CHECK(r.pings == 2);  // not again within probe_every
  r.inbound.Check(t0 + absl::Seconds(3));
  std::optional<v1::Notification> n = r.Next();
  REQUIRE(n.has_value());
  CHECK(n->code() == static_cast<int>(absl::StatusCode::kUnavailable));
  CHECK(n->transfer_id() == 3);
  CHECK(n->tag() == 5);
  CHECK(n->payload() == "request-9");
  CHECK(n->source_incarnation() == kWriter);
  CHECK(n->kind() == v1::NOTIFICATION_KIND_WRITE);
  CHECK(n->message().find("10.0.0.9:7000") != std::string::npos);
  CHECK(n->message().find("stopped answering") != std::string::npos);
  CHECK(r.inbound.size() == 0);
  CHECK(r.inbound.sources() == 0);
  // Before the receiver was told, the writer was fenced: no keys, no staged commit, until
  // the write's deadline (60 s) and the grace have passed.
  CHECK(n->message().find("no further operation of it is accepted") != std::string::npos);
  absl::Status fenced = r.region->writers().Admit(kWriter);
  CHECK(fenced.code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(fenced.message()), Catch::Contains("its write 3 into region 7 was declared lost"));
  CHECK_THAT(std::string(fenced.message()), Catch::Contains("refused for 5"));  // 60 s + 2 s, less the 3 s passed
  CHECK(r.region->writers().Admit(kWriter + 1).ok());                           // other writers are not
}

TEST_CASE("a writer that restarted (another incarnation answers) loses its writes at once") {
  Receiver r;
  REQUIRE(r.Send(r.Begin(4)).ok());
  REQUIRE(r.Send(r.Begin(5)).ok());
  r.answer = kWriter + 1;
  r.inbound.Check(r.clock.Now() + absl::Seconds(1));
  for (uint64_t id : {4, 5}) {
    std::optional<v1::Notification> n = r.Next();
    REQUIRE(n.has_value());
    CHECK(n->transfer_id() == id);
    CHECK(n->code() == static_cast<int>(absl::StatusCode::kUnavailable));
    CHECK(n->message().find("restarted") != std::string::npos);
  }
  CHECK(r.inbound.size() == 0);
}

TEST_CASE("a writer that answers but never ends its write: DEADLINE_EXCEEDED after the grace") {
  Receiver r;
  REQUIRE(r.Send(r.Begin(6, /*timeout_ms=*/1000)).ok());
  const absl::Time t0 = r.clock.Now();
  r.inbound.Check(t0 + absl::Seconds(2));  // past the deadline, within the grace
  CHECK(!r.Next().has_value());
  r.inbound.Check(t0 + absl::Seconds(4));
  std::optional<v1::Notification> n = r.Next();
  REQUIRE(n.has_value());
  CHECK(n->code() == static_cast<int>(absl::StatusCode::kDeadlineExceeded));
  CHECK(n->transfer_id() == 6);
}

TEST_CASE("begins are checked: the region's token, what they must carry, and a bound") {
  Receiver r;
  v1::NotifyRequest bad_token = r.Begin(7);
  bad_token.mutable_token()->back() ^= 1;
  CHECK(r.Send(bad_token).error_code() == grpc::StatusCode::PERMISSION_DENIED);
  v1::NotifyRequest no_source = r.Begin(7);
  no_source.clear_source_address();
  CHECK(r.Send(no_source).error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  for (uint64_t id = 10; id < 14; ++id) REQUIRE(r.Send(r.Begin(id)).ok());
  grpc::Status full = r.Send(r.Begin(14));
  CHECK(full.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK(r.inbound.size() == 4);
}

TEST_CASE("a receiver that deregistered its region is not told (nobody waits on it)") {
  Receiver r;
  REQUIRE(r.Send(r.Begin(8)).ok());
  REQUIRE(r.regions.Remove(r.region->id(), r.owner->id()).ok());
  r.region.reset();
  r.answer = kWriter + 1;
  r.inbound.Check(r.clock.Now() + absl::Seconds(1));
  CHECK(!r.Next().has_value());
  CHECK(r.inbound.size() == 0);
}

}  // namespace
}  // namespace ferry
