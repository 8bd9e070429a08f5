// RailWorker against a fake NIC: posting order, -FI_EAGAIN, dropped connections, stale
// keys and error completions, each in milliseconds and without a provider.
#include "agent/engine/rail_worker.h"

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "agent/engine/write_op.h"
#include "agent/metrics/metrics.h"
#include "tests/engine/fake_nic.h"

namespace ferry {
namespace {

using testing::FakeNic;

constexpr fi_addr_t kPeerA = 1, kPeerB = 2, kPeerC = 3;
uint8_t source_bytes[1 << 16];

// One transfer's result, as the engine's done callback would see it.
struct Outcome {
  absl::Notification done;
  absl::Status status;
  absl::Time at;
  bool Wait() { return done.WaitForNotificationWithTimeout(absl::Seconds(10)); }
};

struct Transfer_ {
  std::shared_ptr<TransferState> state;
  std::weak_ptr<TransferState> watch;  // expires once every op is done
  std::unique_ptr<Outcome> outcome = std::make_unique<Outcome>();
};

Transfer_ NewTransfer(uint64_t ops, uint64_t id, TrafficClass cls = TrafficClass::kBulk) {
  Transfer_ t;
  auto transfer = std::make_shared<Transfer>();
  transfer->id = id;
  transfer->share = {/*tenant=*/id, cls};
  transfer->deadline = absl::Now() + absl::Seconds(30);
  Outcome* out = t.outcome.get();
  t.state = TransferState::Create(transfer, nullptr, ops, [out](absl::Status s) {
    out->status = std::move(s);
    out->at = absl::Now();
    out->done.Notify();
  });
  t.watch = t.state;
  return t;
}

// Op `i` of `t` to `peer`; its remote address says which transfer and op it is.
WriteOp MakeOp(const Transfer_& t, fi_addr_t peer, uint64_t i, absl::Time keys_since = absl::Now()) {
  WriteOp op;
  op.state = t.state.get();
  op.local = source_bytes;
  op.length = 4096;
  op.peer = peer;
  op.remote_addr = t.state->transfer().id * 1000000 + i;
  op.key = 7;
  op.keys_since = keys_since;
  return op;
}

// Whether every op of `t` reported done: the state lets go of itself then (the test's
// own reference dropped here). Bounded wait: the last OpDone releases the state just
// after the done callback returns.
bool AllOpsDone(Transfer_& t) {
  t.state.reset();
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (!t.watch.expired() && absl::Now() < until) absl::SleepFor(absl::Milliseconds(1));
  return t.watch.expired();
}

struct Harness {
  Metrics metrics;
  FakeNic nic;
  RailWorker worker{&nic, &metrics, absl::Microseconds(50)};
  Harness() { worker.Start(); }
  ~Harness() { worker.Stop(); }
};

// How many ops of `traffic_class` ferry_op_duration_seconds has counted, once it has
// counted `want` (the worker adds its batch when it goes idle), or what it has after 5 s.
uint64_t OpsTimed(Metrics& metrics, const std::string& traffic_class, uint64_t want) {
  const absl::Time until = absl::Now() + absl::Seconds(5);
  uint64_t n = 0;
  for (bool first = true; first || (n < want && absl::Now() < until); first = false) {
    for (const prometheus::MetricFamily& f : metrics.registry()->Collect()) {
      if (f.name != "ferry_op_duration_seconds") continue;
      for (const prometheus::ClientMetric& m : f.metric) {
        for (const prometheus::ClientMetric::Label& l : m.label) {
          if (l.name == "class" && l.value == traffic_class) n = m.histogram.sample_count;
        }
      }
    }
    if (n < want) absl::SleepFor(absl::Milliseconds(5));
  }
  return n;
}

// Transfer 1, one op to `peer` whose completion reports a dropped connection (the
// worker then holds that peer for kReconnectHold); returns once it has failed.
Transfer_ DropConnection(Harness& h, fi_addr_t peer) {
  h.nic.FailNextCompletion(peer, FI_ECONNRESET);
  Transfer_ dropped = NewTransfer(1, 1);
  h.worker.Submit({MakeOp(dropped, peer, 0)});
  REQUIRE(dropped.outcome->Wait());
  return dropped;
}

TEST_CASE("rail worker: every op is posted once, in order, and the transfer ends when the last completes") {
  Harness h;
  Transfer_ t = NewTransfer(100, 1);
  std::vector<WriteOp> ops;
  for (uint64_t i = 0; i < 100; ++i) ops.push_back(MakeOp(t, kPeerA, i));
  h.worker.Submit(ops);
  t.state.reset();  // the ops alone keep it alive now
  REQUIRE(t.outcome->Wait());
  CHECK(t.outcome->status.ok());
  const auto posts = h.nic.posts();
  REQUIRE(posts.size() == 100);
  for (uint64_t i = 0; i < 100; ++i) CHECK(posts[i].remote_addr == 1000000 + i);
  CHECK(h.worker.tx_bytes() == 100 * 4096);
  CHECK(AllOpsDone(t));  // the state let go of itself with its last op
}

TEST_CASE("rail worker: an op the full provider queue refuses (-FI_EAGAIN) stays at the front and goes next") {
  Harness h;
  h.nic.set_capacity(3);
  Transfer_ t = NewTransfer(50, 1);
  std::vector<WriteOp> ops;
  for (uint64_t i = 0; i < 50; ++i) ops.push_back(MakeOp(t, kPeerA, i));
  h.worker.Submit(ops);
  REQUIRE(t.outcome->Wait());
  CHECK(t.outcome->status.ok());
  CHECK(h.nic.eagains() > 0);
  const auto posts = h.nic.posts();
  REQUIRE(posts.size() == 50);  // none lost, none posted twice
  for (uint64_t i = 0; i < 50; ++i) CHECK(posts[i].remote_addr == 1000000 + i);
}

TEST_CASE("rail worker: a latency-class write goes before another pod's bulk backlog to the same peer") {
  Harness h;
  h.nic.set_capacity(1);
  Transfer_ bulk = NewTransfer(40, 1, TrafficClass::kBulk);
  Transfer_ urgent = NewTransfer(1, 2, TrafficClass::kLatency);
  std::vector<WriteOp> ops;
  for (uint64_t i = 0; i < 40; ++i) ops.push_back(MakeOp(bulk, kPeerA, i));
  ops.push_back(MakeOp(urgent, kPeerA, 0));
  h.worker.Submit(ops);  // one hand-off: the worker sees the backlog and the urgent op together
  REQUIRE(urgent.outcome->Wait());
  REQUIRE(bulk.outcome->Wait());
  CHECK(bulk.outcome->status.ok());
  const auto posts = h.nic.posts();
  REQUIRE(posts.size() == 41);
  CHECK(posts[0].remote_addr == 2000000);                                            // first, though queued last
  for (uint64_t i = 0; i < 40; ++i) CHECK(posts[1 + i].remote_addr == 1000000 + i);  // bulk in its own order
  // Each op's post-to-completion time is counted in its own class's histogram.
  CHECK(OpsTimed(h.metrics, "latency", 1) == 1);
  CHECK(OpsTimed(h.metrics, "bulk", 40) == 40);
  CHECK(OpsTimed(h.metrics, "background", 0) == 0);
}

TEST_CASE("rail worker: with the provider queue full, freed slots go to every peer in turn") {
  Harness h;
  h.nic.set_capacity(1);
  Transfer_ t = NewTransfer(60, 1);
  std::vector<WriteOp> ops;  // peer A's backlog first, then B's, then C's
  for (fi_addr_t peer : {kPeerA, kPeerB, kPeerC}) {
    for (uint64_t i = 0; i < 20; ++i) ops.push_back(MakeOp(t, peer, i));
  }
  h.worker.Submit(ops);
  REQUIRE(t.outcome->Wait());
  CHECK(t.outcome->status.ok());
  const auto posts = h.nic.posts();
  REQUIRE(posts.size() == 60);
  // First in, first out across peers would post A's 20 before any of B's.
  std::map<fi_addr_t, int> first_30;
  for (size_t i = 0; i < 30; ++i) first_30[posts[i].peer]++;
  INFO("A " << first_30[kPeerA] << ", B " << first_30[kPeerB] << ", C " << first_30[kPeerC]);
  CHECK(first_30[kPeerA] >= 8);
  CHECK(first_30[kPeerB] >= 8);
  CHECK(first_30[kPeerC] >= 8);
}

TEST_CASE("rail worker: a dropped connection fails the op as connection-reset and holds only that peer") {
  Harness h;
  Transfer_ dropped = DropConnection(h, kPeerA);
  CHECK(dropped.outcome->status.code() == absl::StatusCode::kUnavailable);
  CHECK(IsConnectionReset(dropped.outcome->status));
  CHECK(dropped.outcome->status.message().find("injected by the test") != std::string::npos);

  // Fresh keys to A wait out the reconnect hold; B is not held.
  Transfer_ to_a = NewTransfer(1, 2), to_b = NewTransfer(1, 3);
  h.worker.Submit({MakeOp(to_a, kPeerA, 0), MakeOp(to_b, kPeerB, 0)});
  REQUIRE(to_a.outcome->Wait());
  REQUIRE(to_b.outcome->Wait());
  CHECK(to_a.outcome->status.ok());
  CHECK(to_b.outcome->status.ok());
  const auto posts = h.nic.posts();
  REQUIRE(posts.size() == 3);
  CHECK(posts[1].peer == kPeerB);  // B went first although A's op was submitted before it
  CHECK(posts[2].peer == kPeerA);
  CHECK(posts[2].at - dropped.outcome->at >= RailWorker::kReconnectHold - absl::Milliseconds(5));
}

TEST_CASE(
    "rail worker: ops whose keys predate a drop are failed, never posted (a stale key breaks the new connection)") {
  Harness h;
  const absl::Time before_drop = absl::Now();
  Transfer_ dropped = DropConnection(h, kPeerA);

  Transfer_ stale = NewTransfer(3, 2);
  h.worker.Submit({MakeOp(stale, kPeerA, 0, before_drop), MakeOp(stale, kPeerA, 1, before_drop),
                   MakeOp(stale, kPeerA, 2, before_drop)});
  REQUIRE(stale.outcome->Wait());
  CHECK(IsConnectionReset(stale.outcome->status));
  CHECK(stale.outcome->status.message().find("keys were fetched") != std::string::npos);
  CHECK(h.nic.posts().size() == 1);  // only the op that dropped
  CHECK(AllOpsDone(stale));
}

TEST_CASE("rail worker: a message (a notification) is posted as one, waits out a drop's hold, and is no data") {
  Harness h;
  Transfer_ dropped = DropConnection(h, kPeerA);

  // A message carries no key, so no drop makes it stale; it goes once the hold is over.
  static const char kRecord[] = "a notification record";
  Transfer_ notify = NewTransfer(1, 2);
  WriteOp m;
  m.state = notify.state.get();
  m.message = true;
  m.local = reinterpret_cast<const uint8_t*>(kRecord);
  m.length = sizeof(kRecord);
  m.peer = kPeerA;
  h.worker.Submit({m});
  REQUIRE(notify.outcome->Wait());
  CHECK(notify.outcome->status.ok());
  const auto posts = h.nic.posts();
  REQUIRE(posts.size() == 2);
  CHECK(posts[1].message);
  CHECK(posts[1].length == sizeof(kRecord));
  CHECK(posts[1].at - dropped.outcome->at >= RailWorker::kReconnectHold - absl::Milliseconds(5));
  CHECK(h.worker.tx_bytes() == 0);  // the data counters count data
  CHECK(AllOpsDone(notify));

  h.nic.FailPosts(kPeerB, FI_EINVAL);
  Transfer_ refused = NewTransfer(1, 3);
  m.state = refused.state.get();
  m.peer = kPeerB;
  h.worker.Submit({m});
  REQUIRE(refused.outcome->Wait());
  CHECK(refused.outcome->status.message().find("posting a message failed") != std::string::npos);
}

TEST_CASE("rail worker: an error completion that keeps the connection fails the transfer and holds nobody") {
  Harness h;
  h.nic.FailNextCompletion(kPeerA, FI_EIO, "remote access error");
  Transfer_ t = NewTransfer(4, 1);
  h.worker.Submit({MakeOp(t, kPeerA, 0), MakeOp(t, kPeerA, 1), MakeOp(t, kPeerA, 2), MakeOp(t, kPeerA, 3)});
  REQUIRE(t.outcome->Wait());
  CHECK(t.outcome->status.code() == absl::StatusCode::kUnavailable);
  CHECK_FALSE(IsConnectionReset(t.outcome->status));
  CHECK(t.outcome->status.message().find("remote access error") != std::string::npos);
  CHECK(t.outcome->status.message().find("fake0") != std::string::npos);  // names the NIC

  Transfer_ next = NewTransfer(1, 2);
  const absl::Time submitted = absl::Now();
  h.worker.Submit({MakeOp(next, kPeerA, 0)});
  REQUIRE(next.outcome->Wait());
  CHECK(next.outcome->status.ok());
  CHECK(next.outcome->at - submitted < RailWorker::kReconnectHold);
}

TEST_CASE("rail worker: a post the provider rejects fails its transfer; the same transfer's other ops still complete") {
  Harness h;
  h.nic.FailPosts(kPeerC, FI_EINVAL);
  Transfer_ t = NewTransfer(2, 1);
  h.worker.Submit({MakeOp(t, kPeerA, 0), MakeOp(t, kPeerC, 1)});
  REQUIRE(t.outcome->Wait());
  CHECK(t.outcome->status.code() == absl::StatusCode::kUnavailable);
  CHECK(t.outcome->status.message().find("posting a write failed") != std::string::npos);
  CHECK(AllOpsDone(t));  // both ops reported done
}

TEST_CASE("rail worker: ops of a transfer that already finished (deadline) are dropped, not posted") {
  Harness h;
  Transfer_ t = NewTransfer(5, 1);
  t.state->Finish(absl::DeadlineExceededError("past its deadline"));
  std::vector<WriteOp> ops;
  for (uint64_t i = 0; i < 5; ++i) ops.push_back(MakeOp(t, kPeerA, i));
  h.worker.Submit(ops);
  CHECK(AllOpsDone(t));
  CHECK(h.nic.posts().empty());
  CHECK(t.outcome->status.code() == absl::StatusCode::kDeadlineExceeded);
}

TEST_CASE("rail worker: Stop fails what the provider never accepted, after a grace period") {
  Metrics metrics;
  FakeNic nic;
  nic.set_capacity(0);  // everything answers -FI_EAGAIN
  RailWorker worker(&nic, &metrics, absl::Microseconds(50), {}, /*stop_grace=*/absl::Milliseconds(100));
  worker.Start();
  Transfer_ t = NewTransfer(3, 1);
  worker.Submit({MakeOp(t, kPeerA, 0), MakeOp(t, kPeerA, 1), MakeOp(t, kPeerB, 2)});
  const absl::Time stop = absl::Now();
  worker.Stop();
  REQUIRE(t.outcome->done.HasBeenNotified());
  CHECK(t.outcome->status.message().find("shutting down") != std::string::npos);
  CHECK(absl::Now() - stop >= absl::Milliseconds(100));  // the grace period was given
  CHECK(absl::Now() - stop < absl::Seconds(5));
  CHECK(nic.posts().empty());
}

}  // namespace
}  // namespace ferry
