#include "agent/engine/op_scheduler.h"

#include <algorithm>

#include "agent/common/check.h"

namespace ferry {
namespace {
// DRR rounds one Post may run (each gives every backlogged pod and class its credit); a
// bound, not a limit met in practice: the provider's queue fills first.
constexpr int kMaxRounds = 64;
// Empty queues are kept for the next op of their pod, class and peer unless there are
// more than this many (of one class).
constexpr size_t kIdleFlowsKept = 16;
// How many seconds of its rate a capped pod may save up.
constexpr double kRateBurstSeconds = 0.010;
}  // namespace

OpScheduler::OpScheduler(const Options& options, Metrics* metrics, const std::string& nic)
    : options_(options), delay_bounds_(LatencyBuckets()) {
  for (TrafficClass c : {TrafficClass::kLatency, TrafficClass::kBulk, TrafficClass::kBackground}) {
    ClassStats& s = stats_[ClassIndex(c)];
    s.bytes = &metrics->qos_bytes(nic, ClassName(c));
    s.throttled = &metrics->qos_throttled_seconds(nic, ClassName(c));
    s.delay = &metrics->qos_queue_delay(nic, ClassName(c));
    s.delay_counts.assign(delay_bounds_.size() + 1, 0);
  }
}

int64_t OpScheduler::Quantum(const Tenant& t, int c) const {
  return static_cast<int64_t>(options_.quantum_bytes * options_.qos.class_weights[c] * t.weight);
}

uint32_t OpScheduler::TenantSlot(const TenantShare& share, absl::Time now) {
  uint32_t free_slot = static_cast<uint32_t>(tenants_.size());
  for (uint32_t i = 0; i < tenants_.size(); ++i) {
    if (tenants_[i].used && tenants_[i].id == share.tenant) return i;
    if (!tenants_[i].used && free_slot == tenants_.size()) free_slot = i;
  }
  if (free_slot == tenants_.size()) tenants_.emplace_back();
  Tenant& t = tenants_[free_slot];
  t = Tenant();
  t.used = true;
  t.id = share.tenant;
  t.weight = std::max<uint32_t>(share.weight, 1);
  t.inflight_cap = share.inflight_cap;
  t.rate_cap = share.rate_cap;
  t.tokens = static_cast<double>(share.rate_cap) * kRateBurstSeconds;
  t.refilled = now;
  return free_slot;
}

void OpScheduler::Enqueue(const WriteOp& op, absl::Time now) {
  TenantShare share;  // --qos=false: one pod, one class: a FIFO per peer
  TrafficClass cls = TrafficClass::kBulk;
  if (options_.qos.enabled) {
    // A notification (a message op) goes in its write's class, after its write's bytes.
    share = op.state->transfer().share;
    cls = share.traffic_class;
    if (cls == TrafficClass::kLatency) latency_seen_ = now;
  }
  const int c = ClassIndex(cls);
  const uint32_t slot = TenantSlot(share, now);
  Tenant& t = tenants_[slot];
  if (t.queued[c]++ == 0) t.credit[c] = Quantum(t, c);  // a new arrival goes next turn
  ++queued_[c];
  ++pending_;
  for (Flow& f : flows_[c]) {
    if (f.tenant == slot && f.peer == op.peer) {
      f.ops.push_back(op);
      return;
    }
  }
  flows_[c].push_back({slot, op.peer, {}});
  flows_[c].back().ops.push_back(op);
}

bool OpScheduler::Capped(const Tenant& t, uint64_t length) const {
  if (t.inflight_cap != 0 && t.inflight > 0 && t.inflight + length > t.inflight_cap) return true;
  return t.rate_cap != 0 && t.tokens <= 0;
}

void OpScheduler::EndThrottle(Tenant& t, int c, absl::Time now) {
  if (t.throttled_since[c] == absl::InfiniteFuture()) return;
  stats_[c].throttled->Increment(absl::ToDoubleSeconds(now - t.throttled_since[c]));
  t.throttled_since[c] = absl::InfiniteFuture();
}

bool OpScheduler::Post(absl::Time now, HeldFn held, PostFn post) {
  if (pending_ == 0) return false;
  RefillRates(now);
  const uint64_t window = BulkWindow(now);
  bool progressed = false;
  for (int round = 0; round < kMaxRounds; ++round) {
    Pass pass;
    for (int c = 0; c < kTrafficClasses; ++c) {
      std::vector<Flow>& flows = flows_[c];
      const size_t n = flows.size();
      if (n == 0) continue;
      if (round == 0) next_flow_[c] = (next_flow_[c] + 1) % n;
      for (size_t k = 0; k < n; ++k) {
        Flow& f = flows[(next_flow_[c] + k) % n];
        if (f.ops.empty() || held(f.peer)) continue;
        if (!PostFlow(f, c, window, now, post, pass)) return progressed || pass.progressed;  // the provider is full
      }
    }
    progressed |= pass.progressed;
    // A new round once every pod's class that could post has spent its credit (pods held
    // by a cap or a reconnecting peer cannot use theirs; they do not hold up the others).
    if (!pass.out_of_credit || pass.window_with_credit) break;
    EarnCredit();
  }
  Prune();
  return progressed;
}

void OpScheduler::RefillRates(absl::Time now) {
  for (Tenant& t : tenants_) {
    if (!t.used || t.rate_cap == 0) continue;
    const double burst = static_cast<double>(t.rate_cap) * kRateBurstSeconds;
    t.tokens = std::min(burst, t.tokens + static_cast<double>(t.rate_cap) * absl::ToDoubleSeconds(now - t.refilled));
    t.refilled = now;
  }
}

uint64_t OpScheduler::BulkWindow(absl::Time now) const {
  constexpr int kLatency = static_cast<int>(TrafficClass::kLatency);
  const bool latency_about =
      queued_[kLatency] > 0 || inflight_[kLatency] > 0 || now < latency_seen_ + options_.latency_linger;
  return latency_about ? options_.qos.latency_window_bytes : options_.qos.window_bytes;
}

bool OpScheduler::PostFlow(Flow& f, int c, uint64_t window, absl::Time now, PostFn post, Pass& pass) {
  Tenant& t = tenants_[f.tenant];
  const bool windowed = options_.qos.enabled && c != static_cast<int>(TrafficClass::kLatency);
  while (!f.ops.empty()) {
    const WriteOp op = f.ops.front();
    if (windowed && inflight_[1] + inflight_[2] >= window) {
      pass.window_with_credit |= t.credit[c] >= static_cast<int64_t>(op.length);
      return true;
    }
    if (options_.qos.enabled) {
      if (Capped(t, op.length)) {
        if (t.throttled_since[c] == absl::InfiniteFuture()) t.throttled_since[c] = now;
        return true;
      }
      if (t.credit[c] < static_cast<int64_t>(op.length)) {
        pass.out_of_credit = true;
        return true;
      }
    }
    // --qos=false queues every op as bulk; its metrics still count its own class.
    const Ticket ticket{f.tenant, op.state->transfer().share.traffic_class};
    const Outcome outcome = post(op, ticket);
    if (outcome == Outcome::kFull) return false;
    f.ops.pop_front();
    --pending_;
    --queued_[c];
    pass.progressed = true;
    EndThrottle(t, c, now);
    if (outcome == Outcome::kPosted) CountPosted(t, c, op, ticket, now);
    if (--t.queued[c] == 0) t.credit[c] = 0;  // an emptied queue keeps no credit (DRR)
    if (outcome == Outcome::kPeerStopped) return true;
  }
  return true;
}

void OpScheduler::CountPosted(Tenant& t, int c, const WriteOp& op, const Ticket& ticket, absl::Time now) {
  const int counted = ClassIndex(ticket.traffic_class);
  t.credit[c] -= static_cast<int64_t>(op.length);
  t.inflight += op.length;
  if (t.rate_cap != 0) t.tokens -= static_cast<double>(op.length);
  inflight_[counted] += op.length;
  if (op.message) return;
  ClassStats& s = stats_[counted];
  const double delay = absl::ToDoubleSeconds(now - op.state->transfer().submitted);
  s.delay_counts[std::lower_bound(delay_bounds_.begin(), delay_bounds_.end(), delay) - delay_bounds_.begin()] += 1;
  s.delay_sum += delay;
  ++s.delays;
}

void OpScheduler::EarnCredit() {
  // Every pod's class with a backlog earns its credit (at most two rounds' worth saved,
  // for one held back by a cap meanwhile).
  for (Tenant& t : tenants_) {
    if (!t.used) continue;
    for (int c = 0; c < kTrafficClasses; ++c) {
      if (t.queued[c] > 0) t.credit[c] = std::min(t.credit[c] + Quantum(t, c), 2 * Quantum(t, c));
    }
  }
}

void OpScheduler::Done(Ticket ticket, uint64_t length, bool ok, absl::Time now) {
  Tenant& t = tenants_[ticket.tenant];
  const int c = ClassIndex(ticket.traffic_class);
  FERRY_DCHECK(t.used && t.inflight >= length && inflight_[c] >= length)
      << "an op done that the scheduler did not post";
  t.inflight -= length;
  inflight_[c] -= length;
  if (ok) stats_[c].bytes->Increment(static_cast<double>(length));
  if (ticket.traffic_class == TrafficClass::kLatency) latency_seen_ = now;
}

void OpScheduler::Prune() {
  bool pruned = false;
  for (std::vector<Flow>& flows : flows_) {
    if (flows.size() <= kIdleFlowsKept) continue;
    flows.erase(std::remove_if(flows.begin(), flows.end(), [](const Flow& f) { return f.ops.empty(); }), flows.end());
    pruned = true;
  }
  if (!pruned) return;
  // A pod's slot is reused once no queue refers to it and nothing of it is in flight.
  for (Tenant& t : tenants_) t.referenced = false;
  for (const std::vector<Flow>& flows : flows_) {
    for (const Flow& f : flows) tenants_[f.tenant].referenced = true;
  }
  for (Tenant& t : tenants_) {
    if (!t.referenced && t.inflight == 0) t.used = false;
  }
}

void OpScheduler::DrainAll(absl::FunctionRef<void(const WriteOp&)> f) {
  for (std::vector<Flow>& flows : flows_) {
    for (Flow& flow : flows) flow.ops.ForEach(f);
    flows.clear();
  }
  for (Tenant& t : tenants_) std::fill(std::begin(t.queued), std::end(t.queued), 0);
  std::fill(std::begin(queued_), std::end(queued_), 0);
  pending_ = 0;
}

void OpScheduler::Flush() {
  for (ClassStats& s : stats_) {
    if (s.delays == 0) continue;
    s.delay->ObserveMultiple(s.delay_counts, s.delay_sum);
    std::fill(s.delay_counts.begin(), s.delay_counts.end(), 0);
    s.delay_sum = 0;
    s.delays = 0;
  }
}

}  // namespace ferry
