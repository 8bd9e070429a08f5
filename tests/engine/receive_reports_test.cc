// ReceiveReports as one component: un-notified writes added up per (peer, region) and
// taken as one report each, NIC by NIC.
#include "agent/engine/receive_reports.h"

#include <catch2/catch.hpp>
#include <memory>

#include <grpcpp/grpcpp.h>

namespace ferry {
namespace {

std::shared_ptr<PeerConnection> Peer(const char* address) {
  // A channel that is never used: reports are sent by the engine, not here.
  return std::make_shared<PeerConnection>(address, /*incarnation=*/9,
                                          grpc::CreateChannel(address, grpc::InsecureChannelCredentials()),
                                          std::vector<fi_addr_t>{0, 1}, /*remote_nic_count=*/2,
                                          /*remote_latency_lanes=*/0, /*fabric_messages=*/true,
                                          /*local_incarnation=*/7, "127.0.0.1:1");
}

std::unique_ptr<Transfer> Write(uint64_t region, uint64_t bytes) {
  auto t = std::make_unique<Transfer>();
  auto d = std::make_shared<v1::RegionDescriptor>();
  d->set_agent_incarnation(9);
  d->set_region_id(region);
  d->set_window_id(region == 2 ? 5 : 0);
  d->set_token(std::string(16, 't'));
  t->dst_descriptor = d;
  t->plan.total_bytes = bytes;
  return t;
}

TEST_CASE("Writes into one region add up to one report, per NIC; taking leaves none") {
  ReceiveReports reports(/*incarnation=*/7);
  std::shared_ptr<PeerConnection> a = Peer("127.0.0.1:2"), b = Peer("127.0.0.1:3");
  reports.Add(*Write(1, 100), a, {60, 40});
  reports.Add(*Write(1, 50), a, {0, 50});
  reports.Add(*Write(2, 10), a, {10, 0});
  reports.Add(*Write(1, 7), b, {7, 0});  // the same region id on another agent: its own report

  std::vector<ReceiveReports::Report> taken = reports.Take();
  REQUIRE(taken.size() == 3);
  int checked = 0;
  for (const ReceiveReports::Report& r : taken) {
    const v1::NotifyRequest& q = r.request;
    CHECK(q.source_incarnation() == 7);
    CHECK(q.target_incarnation() == 9);
    CHECK(!q.deliver());
    if (r.peer == a && q.region_id() == 1) {
      CHECK(q.bytes() == 150);
      CHECK(q.nic_bytes(0) == 60);
      CHECK(q.nic_bytes(1) == 90);
      ++checked;
    } else if (r.peer == a && q.region_id() == 2) {
      CHECK(q.bytes() == 10);
      CHECK(q.window_id() == 5);
      ++checked;
    } else if (r.peer == b) {
      CHECK(q.bytes() == 7);
      ++checked;
    }
  }
  CHECK(checked == 3);
  CHECK(reports.Take().empty());
}

}  // namespace
}  // namespace ferry
