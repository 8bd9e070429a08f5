// TransferWatch as one component, with transfer states the test makes (no NIC, no
// worker): what a sweep ends, stops and forgets, and what Fail reaches.
#include "agent/engine/transfer_watch.h"

#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "agent/peers/peer_table.h"
#include "agent/session/session_registry.h"

namespace ferry {
namespace {

const absl::Time kNow = absl::FromUnixSeconds(1'000'000);

std::shared_ptr<PeerConnection> Peer(const char* address) {
  // A channel that is never used.
  return std::make_shared<PeerConnection>(address, /*incarnation=*/9,
                                          grpc::CreateChannel(address, grpc::InsecureChannelCredentials()),
                                          std::vector<fi_addr_t>{0}, /*remote_nic_count=*/1,
                                          /*remote_latency_lanes=*/0, /*fabric_messages=*/true,
                                          /*local_incarnation=*/7, "127.0.0.1:1");
}

// A transfer of one op in flight to `peer`, due at `deadline`; its result lands in *result.
struct InFlight {
  InFlight(uint64_t id, std::shared_ptr<PeerConnection> peer, absl::Time deadline,
           std::shared_ptr<Session> session = nullptr) {
    auto t = std::make_shared<Transfer>();
    t->id = id;
    t->deadline = deadline;
    t->session = std::move(session);
    state = TransferState::Create(t, std::move(peer), 1, [this](absl::Status s) { result = s; });
  }
  ~InFlight() {
    if (state != nullptr) state->OpDone(absl::OkStatus());  // its op comes back: the state lets go of itself
  }
  std::shared_ptr<TransferState> state;
  std::optional<absl::Status> result;
};

TEST_CASE("a sweep hands back those past their deadline, and forgets the finished") {
  TransferWatch watch;
  std::shared_ptr<PeerConnection> peer = Peer("127.0.0.1:2");
  InFlight due(1, peer, kNow - absl::Milliseconds(1)), later(2, peer, kNow + absl::Seconds(5)),
      done(3, peer, kNow - absl::Seconds(1));
  for (InFlight* f : {&due, &later, &done}) watch.Add(f->state);
  done.state->Finish(absl::OkStatus());  // already decided: not handed back
  std::vector<TransferWatch::Expired> expired = watch.Sweep(kNow);
  REQUIRE(expired.size() == 1);
  CHECK(expired[0].state == due.state);
  CHECK(expired[0].why.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK_THAT(std::string(expired[0].why.message()), Catch::Contains("transfer 1 passed its deadline"));
  CHECK(!due.result.has_value());  // the caller finishes it
  CHECK(watch.size() == 1);        // `later` alone is still watched
  CHECK(watch.Sweep(kNow).empty());
  CHECK(watch.Sweep(kNow + absl::Seconds(6)).size() == 1);
  CHECK(watch.size() == 0);
}

TEST_CASE("a transfer whose writing pod is gone is stopped, and stays watched to its deadline") {
  SessionRegistry sessions{{}, nullptr};
  std::shared_ptr<Session> writer = sessions.Create({}).value();
  TransferWatch watch;
  InFlight f(4, Peer("127.0.0.1:2"), kNow + absl::Seconds(5), writer);
  watch.Add(f.state);
  CHECK(watch.Sweep(kNow).empty());
  CHECK(!f.state->stopped());
  writer->Close();
  CHECK(watch.Sweep(kNow).empty());
  CHECK(f.state->stopped());  // posts no more; ends when its posted op comes back
  CHECK(!f.result.has_value());
  CHECK(watch.size() == 1);
  CHECK(watch.Sweep(kNow + absl::Seconds(6)).size() == 1);
}

TEST_CASE("Fail reaches one peer's transfers, or every one") {
  TransferWatch watch;
  std::shared_ptr<PeerConnection> a = Peer("127.0.0.1:2"), b = Peer("127.0.0.1:3");
  InFlight to_a(5, a, kNow + absl::Hours(1)), to_b(6, b, kNow + absl::Hours(1));
  watch.Add(to_a.state);
  watch.Add(to_b.state);
  watch.Fail(a.get(), absl::UnavailableError("agent 127.0.0.1:2 restarted"));
  REQUIRE(to_a.result.has_value());
  CHECK(to_a.result->code() == absl::StatusCode::kUnavailable);
  CHECK(!to_b.result.has_value());
  watch.Fail(nullptr, absl::UnavailableError("the agent is shutting down"));
  REQUIRE(to_b.result.has_value());
  CHECK(to_b.result->message() == "the agent is shutting down");
}

TEST_CASE("AwaitWork sleeps while nothing is watched, wakes for the first, and returns false once stopped") {
  TransferWatch watch;
  CHECK(watch.AwaitWork(absl::Milliseconds(5)));  // nothing: times out, not stopped
  InFlight f(7, Peer("127.0.0.1:2"), kNow);
  std::thread adder([&] {
    absl::SleepFor(absl::Milliseconds(20));
    watch.Add(f.state);
  });
  const absl::Time start = absl::Now();
  CHECK(watch.AwaitWork(absl::Seconds(10)));
  CHECK(absl::Now() - start < absl::Seconds(5));  // woken by the Add, not the timeout
  adder.join();
  watch.Stop();
  CHECK(!watch.AwaitWork(absl::Seconds(10)));
}

}  // namespace
}  // namespace ferry
