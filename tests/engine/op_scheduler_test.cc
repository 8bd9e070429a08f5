// OpScheduler on its own: which op a NIC worker posts next, between pods and traffic
// classes. Deterministic: the test plays the provider (a queue of K ops, completed in
// order) and the clock.
#include "agent/engine/op_scheduler.h"

#include <catch2/catch.hpp>
#include <deque>
#include <map>
#include <memory>
#include <vector>

#include "absl/time/clock.h"
#include "agent/metrics/metrics.h"

namespace ferry {
namespace {

constexpr fi_addr_t kPeerA = 1, kPeerB = 2;
constexpr uint64_t kMiB = 1 << 20;
uint8_t bytes[64];

// A pod's transfer in one class: its ops carry its share.
class Pod {
 public:
  Pod(uint64_t tenant, TrafficClass c, uint32_t weight = 1, uint64_t inflight_cap = 0, uint64_t rate_cap = 0) {
    auto t = std::make_shared<Transfer>();
    t->id = tenant;
    t->submitted = absl::Now();
    t->share = {tenant, c, weight, inflight_cap, rate_cap};
    state_ = TransferState::Create(t, nullptr, kOps, [](absl::Status) {});
  }
  // The state holds itself until all its ops are done: let it go.
  ~Pod() {
    for (uint64_t i = 0; i < kOps; ++i) state_->OpDone(absl::OkStatus());
  }
  WriteOp Op(uint64_t length, fi_addr_t peer = kPeerA) const {
    WriteOp op;
    op.state = state_.get();
    op.local = bytes;
    op.length = length;
    op.peer = peer;
    return op;
  }
  uint64_t tenant() const { return state_->transfer().share.tenant; }

 private:
  static constexpr uint64_t kOps = 1;  // OpDone once is enough to release it
  std::shared_ptr<TransferState> state_;
};

// The provider: takes up to `capacity` ops, completes them in order.
struct Provider {
  size_t capacity = 1000000;
  struct Posted {
    WriteOp op;
    OpScheduler::Ticket ticket;
  };
  std::deque<Posted> queue;
  std::vector<WriteOp> order;  // every op posted, in order
  std::map<uint64_t, uint64_t> bytes_by_tenant;

  bool Post(OpScheduler& s, absl::Time now, fi_addr_t held = 0) {
    return s.Post(
        now, [held](fi_addr_t p) { return p == held; },
        [this](const WriteOp& op, OpScheduler::Ticket t) {
          if (queue.size() >= capacity) return OpScheduler::Outcome::kFull;
          queue.push_back({op, t});
          order.push_back(op);
          bytes_by_tenant[op.state->transfer().share.tenant] += op.length;
          return OpScheduler::Outcome::kPosted;
        });
  }
  // Completes the oldest op at the test's clock `now` (never absl::Now(): the
  // scheduler's latency linger is timed from completions).
  void CompleteOne(OpScheduler& s, absl::Time now) {
    REQUIRE(!queue.empty());
    s.Done(queue.front().ticket, queue.front().op.length, true, now);
    queue.pop_front();
  }
};

OpScheduler::Options Qos() {
  OpScheduler::Options o;
  o.quantum_bytes = kMiB;
  o.qos.latency_window_bytes = kMiB;
  return o;
}

TEST_CASE("latency-class ops go before a queued backlog of bulk") {
  Metrics metrics;
  OpScheduler s(Qos(), &metrics, "nic0");
  Pod bulk(1, TrafficClass::kBulk), latency(2, TrafficClass::kLatency);
  const absl::Time now = absl::Now();
  for (int i = 0; i < 50; ++i) s.Enqueue(bulk.Op(kMiB), now);
  s.Enqueue(latency.Op(64 << 10), now);
  Provider p;
  p.capacity = 4;
  p.Post(s, now);
  REQUIRE(p.order.size() == 2);  // the window: at most ~one bulk op once latency is about
  CHECK(p.order[0].state->transfer().share.tenant == 2);
  CHECK(p.order[1].state->transfer().share.tenant == 1);
  CHECK(s.pending() == 49);
}

TEST_CASE("while latency traffic is about, bulk keeps at most the window (plus one op) posted") {
  Metrics metrics;
  OpScheduler::Options o = Qos();
  o.qos.latency_window_bytes = 3 * kMiB;
  o.qos.window_bytes = 64 * kMiB;
  OpScheduler s(o, &metrics, "nic0");
  Pod bulk(1, TrafficClass::kBulk), latency(2, TrafficClass::kLatency);
  absl::Time now = absl::Now();
  s.Enqueue(latency.Op(4096), now);
  for (int i = 0; i < 40; ++i) s.Enqueue(bulk.Op(kMiB), now);
  Provider p;
  p.Post(s, now);
  CHECK(p.order.size() == 1 + 3);
  CHECK(s.inflight_bytes(TrafficClass::kBulk) == 3 * kMiB);
  // Completions open the window again, an op at a time.
  p.CompleteOne(s, now);  // the latency op
  p.CompleteOne(s, now);
  p.Post(s, now);
  CHECK(s.inflight_bytes(TrafficClass::kBulk) == 3 * kMiB);
  // Once no latency op has been seen for latency_linger, bulk fills the larger window.
  now += o.latency_linger + absl::Milliseconds(1);
  p.Post(s, now);
  CHECK(s.inflight_bytes(TrafficClass::kBulk) == 40 * kMiB - 1 * kMiB);
  CHECK(s.pending() == 0);
}

TEST_CASE("two bulk pods at weights 3:1 post bytes 3:1: the window keeps the backlog in the scheduler") {
  Metrics metrics;
  OpScheduler::Options o = Qos();
  o.qos.window_bytes = 4 * kMiB;
  OpScheduler s(o, &metrics, "nic0");
  Pod heavy(1, TrafficClass::kBulk, 3), light(2, TrafficClass::kBulk, 1);
  const absl::Time now = absl::Now();
  for (int i = 0; i < 2000; ++i) {
    s.Enqueue(heavy.Op(256 << 10), now);
    s.Enqueue(light.Op(256 << 10, kPeerB), now);
  }
  Provider p;  // takes anything: only the window holds ops back
  p.Post(s, now);
  CHECK(s.inflight_bytes(TrafficClass::kBulk) == 4 * kMiB);
  // Steady state: one completion, one post, 1200 times (both pods keep a backlog).
  for (int i = 0; i < 1200; ++i) {
    p.CompleteOne(s, now);
    p.Post(s, now);
  }
  const double ratio = static_cast<double>(p.bytes_by_tenant[1]) / static_cast<double>(p.bytes_by_tenant[2]);
  CHECK(ratio > 2.7);
  CHECK(ratio < 3.3);
}

TEST_CASE("a saturating latency pod leaves bulk its share: bulk is never starved") {
  Metrics metrics;
  OpScheduler s(Qos(), &metrics, "nic0");
  Pod latency(1, TrafficClass::kLatency), bulk(2, TrafficClass::kBulk), background(3, TrafficClass::kBackground);
  const absl::Time now = absl::Now();
  for (int i = 0; i < 5000; ++i) {
    s.Enqueue(latency.Op(64 << 10), now);
    s.Enqueue(bulk.Op(64 << 10), now);
    s.Enqueue(background.Op(64 << 10), now);
  }
  Provider p;
  p.capacity = 8;
  p.Post(s, now);
  for (int i = 0; i < 6000; ++i) {
    p.CompleteOne(s, now);
    p.Post(s, now);
  }
  const double total = static_cast<double>(p.bytes_by_tenant[1] + p.bytes_by_tenant[2] + p.bytes_by_tenant[3]);
  // Class weights 8:4:1.
  CHECK(p.bytes_by_tenant[1] / total == Approx(8.0 / 13).margin(0.05));
  CHECK(p.bytes_by_tenant[2] / total == Approx(4.0 / 13).margin(0.05));
  CHECK(p.bytes_by_tenant[3] / total == Approx(1.0 / 13).margin(0.03));
}

TEST_CASE("a small write of another pod does not wait behind a backlog to the same peer") {
  Metrics metrics;
  OpScheduler s(Qos(), &metrics, "nic0");
  Pod big(1, TrafficClass::kBulk), small(2, TrafficClass::kBulk);
  const absl::Time now = absl::Now();
  for (int i = 0; i < 100; ++i) s.Enqueue(big.Op(kMiB), now);
  Provider p;
  p.capacity = 4;
  p.Post(s, now);
  s.Enqueue(small.Op(4096), now);
  p.CompleteOne(s, now);
  p.Post(s, now);
  REQUIRE(p.order.size() == 5);
  CHECK(p.order[4].state->transfer().share.tenant == 2);
}

TEST_CASE("--qos=false posts each peer's ops first in, first out, whatever their class") {
  Metrics metrics;
  OpScheduler::Options o = Qos();
  o.qos.enabled = false;
  OpScheduler s(o, &metrics, "nic0");
  Pod bulk(1, TrafficClass::kBulk), latency(2, TrafficClass::kLatency);
  const absl::Time now = absl::Now();
  for (int i = 0; i < 10; ++i) s.Enqueue(bulk.Op(kMiB), now);
  s.Enqueue(latency.Op(4096), now);
  Provider p;
  p.Post(s, now);
  REQUIRE(p.order.size() == 11);
  CHECK(p.order.back().state->transfer().share.tenant == 2);
}

TEST_CASE("a pod's inflight cap holds its ops back, and the time is counted") {
  Metrics metrics;
  OpScheduler s(Qos(), &metrics, "nic0");
  Pod capped(1, TrafficClass::kBulk, 1, /*inflight_cap=*/2 * kMiB), other(2, TrafficClass::kBulk);
  absl::Time now = absl::Now();
  for (int i = 0; i < 10; ++i) {
    s.Enqueue(capped.Op(kMiB), now);
    s.Enqueue(other.Op(kMiB), now);
  }
  Provider p;
  p.Post(s, now);
  CHECK(p.bytes_by_tenant[1] == 2 * kMiB);
  CHECK(p.bytes_by_tenant[2] == 10 * kMiB);
  // Once its ops complete, two more of them go.
  while (!p.queue.empty()) p.CompleteOne(s, now);
  now += absl::Milliseconds(5);
  p.Post(s, now);
  CHECK(p.bytes_by_tenant[1] == 4 * kMiB);
  CHECK(metrics.qos_throttled_seconds("nic0", "bulk").Value() == Approx(0.005).margin(1e-6));
}

TEST_CASE("a pod's rate cap paces its posts") {
  Metrics metrics;
  OpScheduler s(Qos(), &metrics, "nic0");
  const uint64_t rate = 100 * kMiB;  // per second; 10 ms of it may be saved up
  Pod paced(1, TrafficClass::kBulk, 1, 0, rate);
  absl::Time now = absl::Now();
  for (int i = 0; i < 200; ++i) s.Enqueue(paced.Op(kMiB), now);
  Provider p;
  for (int ms = 0; ms < 100; ++ms) {
    p.Post(s, now);
    while (!p.queue.empty()) p.CompleteOne(s, now);
    now += absl::Milliseconds(1);
  }
  // 100 ms at 100 MiB/s, plus the first 1 MiB burst, plus at most one op over.
  CHECK(p.bytes_by_tenant[1] >= 9 * kMiB);
  CHECK(p.bytes_by_tenant[1] <= 12 * kMiB);
  CHECK(metrics.qos_throttled_seconds("nic0", "bulk").Value() > 0.05);
}

TEST_CASE("a held peer's queues wait; other peers' go") {
  Metrics metrics;
  OpScheduler s(Qos(), &metrics, "nic0");
  Pod pod(1, TrafficClass::kBulk);
  const absl::Time now = absl::Now();
  for (int i = 0; i < 3; ++i) {
    s.Enqueue(pod.Op(4096, kPeerA), now);
    s.Enqueue(pod.Op(4096, kPeerB), now);
  }
  Provider p;
  p.Post(s, now, /*held=*/kPeerA);
  REQUIRE(p.order.size() == 3);
  for (const WriteOp& op : p.order) CHECK(op.peer == kPeerB);
  p.Post(s, now);
  CHECK(p.order.size() == 6);
  CHECK(s.pending() == 0);
}

TEST_CASE("a post that stops its peer ends that queue's turn; DrainAll hands back the rest") {
  Metrics metrics;
  OpScheduler s(Qos(), &metrics, "nic0");
  Pod pod(1, TrafficClass::kBulk);
  const absl::Time now = absl::Now();
  for (int i = 0; i < 4; ++i) s.Enqueue(pod.Op(4096), now);
  int calls = 0;
  s.Post(
      now, [](fi_addr_t) { return false; },
      [&](const WriteOp&, OpScheduler::Ticket) {
        ++calls;
        return OpScheduler::Outcome::kPeerStopped;
      });
  CHECK(calls == 1);
  CHECK(s.pending() == 3);
  int drained = 0;
  s.DrainAll([&](const WriteOp&) { ++drained; });
  CHECK(drained == 3);
  CHECK(s.pending() == 0);
}

}  // namespace
}  // namespace ferry
