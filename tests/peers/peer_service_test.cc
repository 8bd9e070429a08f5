// PeerService against the real region table, sessions and transfer manager: the
// notifications that arrive as fabric messages (untrusted bytes from any fabric peer)
// are checked as the Notify RPC's are, and what is refused is counted, not delivered.
#include "agent/peers/peer_service.h"

#include <catch2/catch.hpp>
#include <string>

#include "agent/session/session_registry.h"
#include "tests/testing/host_region.h"

namespace ferry {
namespace {

constexpr uint64_t kIncarnation = 0x5eed;

struct Target {
  Metrics metrics;
  SessionRegistry sessions{{}, nullptr};
  RegionTable regions;
  TransferManager transfers{kIncarnation, &metrics, &sessions, &regions};
  PeerService service{kIncarnation, {}, &regions, &transfers, &metrics};
  std::shared_ptr<Session> owner = sessions.Create({}).value();
  std::shared_ptr<Region> region = testing::MemfdRegion(7, 4096, owner->id());

  Target() { REQUIRE(regions.Insert(region).ok()); }

  // A notified write's NotifyRequest, as the writer's agent sends it.
  v1::NotifyRequest Request() const {
    v1::NotifyRequest r;
    r.set_target_incarnation(kIncarnation);
    r.set_region_id(region->id());
    r.set_token(region->token().bytes());
    r.set_transfer_id(31);
    r.set_tag(5);
    r.set_bytes(4096);
    r.set_deliver(true);
    r.set_payload("request-9");
    r.set_kind(v1::NOTIFICATION_KIND_WRITE);
    r.add_nic_bytes(4096);
    return r;
  }
  double Refused(const char* code) { return metrics.errors("peer.NotifyMessage", code).Value(); }
  bool NothingDelivered() { return !owner->notifications().Pop(absl::ZeroDuration()).has_value(); }
};

TEST_CASE("a notification by fabric message reaches the region's owner") {
  Target t;
  t.service.AcceptMessage(t.Request().SerializeAsString());
  std::optional<v1::Notification> n = t.owner->notifications().Pop(absl::ZeroDuration());
  REQUIRE(n.has_value());
  CHECK(n->tag() == 5);
  CHECK(n->transfer_id() == 31);
  CHECK(n->bytes() == 4096);
  CHECK(n->payload() == "request-9");
  CHECK(n->kind() == v1::NOTIFICATION_KIND_WRITE);
  CHECK(t.metrics.peer_notifications("fabric_message").Value() == 1);
  CHECK(t.metrics.peer_notifications("rpc").Value() == 0);
}

TEST_CASE("fabric messages that are not a valid notification are counted and dropped") {
  Target t;
  SECTION("bytes that are no NotifyRequest") {
    t.service.AcceptMessage(std::string("\xff\xff\xff\xff garbage", 12));
    CHECK(t.Refused("INVALID_ARGUMENT") == 1);
  }
  SECTION("a wrong token") {
    v1::NotifyRequest r = t.Request();
    r.set_token(std::string(r.token().size(), '\x01'));
    t.service.AcceptMessage(r.SerializeAsString());
    CHECK(t.Refused("PERMISSION_DENIED") == 1);
  }
  SECTION("a token of the wrong length") {
    v1::NotifyRequest r = t.Request();
    r.set_token("short");
    t.service.AcceptMessage(r.SerializeAsString());
    CHECK(t.Refused("INVALID_ARGUMENT") == 1);
  }
  SECTION("another incarnation of this agent") {
    v1::NotifyRequest r = t.Request();
    r.set_target_incarnation(kIncarnation + 1);
    t.service.AcceptMessage(r.SerializeAsString());
    CHECK(t.Refused("NOT_FOUND") == 1);
  }
  SECTION("a region that is not registered") {
    v1::NotifyRequest r = t.Request();
    r.set_region_id(8);
    t.service.AcceptMessage(r.SerializeAsString());
    CHECK(t.Refused("NOT_FOUND") == 1);
  }
  SECTION("a payload over 4 KiB") {
    v1::NotifyRequest r = t.Request();
    r.set_payload(std::string(4097, 'x'));
    t.service.AcceptMessage(r.SerializeAsString());
    CHECK(t.Refused("INVALID_ARGUMENT") == 1);
  }
  SECTION("an empty message") {
    // Parses (every field at its default) and names incarnation 0: stale.
    t.service.AcceptMessage("");
    CHECK(t.Refused("NOT_FOUND") == 1);
  }
  CHECK(t.NothingDelivered());
  CHECK(t.metrics.peer_notifications("fabric_message").Value() == 0);
}

}  // namespace
}  // namespace ferry
