// OpScheduler: the order in which one NIC worker posts its queued ops, between pods
// (tenants) and traffic classes.
//
//   OpScheduler s(options, metrics, "nic0");
//   s.Enqueue(op, now);                                // any op the worker was handed
//   s.Post(now, held, [&](const WriteOp& op, OpScheduler::Ticket t) {
//     ... post it; keep `t` with the posted op ...
//     return OpScheduler::Outcome::kPosted;
//   });
//   s.Done(t, op.length, ok, now);                     // its completion
//
// Queues: one FIFO per (pod, class, peer), so a small write never waits behind another
// pod's backlog or another class's, and a peer being reconnected to holds up only its
// own queues (`held`). Order of service, every turn of the worker:
//  - classes in priority order: latency, bulk, background. The other classes keep at most
//    `window_bytes` posted on this NIC (plus the op that crosses it): past that, ops wait
//    in these queues, where classes and weights order them, not in the provider's FIFO.
//    While latency-class ops are queued or in flight, and for `latency_linger` after the
//    last one (a pod writing one at a time leaves gaps between its writes), the limit is
//    `latency_window_bytes`, so a latency op finds at most about one op of theirs ahead of
//    it in the provider's queue. With bigger ops (--fabric_max_op_bytes) that bound grows
//    with them.
//  - deficit round robin (Shreedhar & Varghese) over (pod, class): each round a pod's
//    class earns quantum_bytes x class weight x the pod's weight of credit, and posts
//    while its credit covers the next op. So two bulk pods at weights 3:1 post bytes 3:1,
//    and the latency class, though served first, takes at most its weight's share
//    (8 of 13 by default) while bulk has a backlog: bulk is never starved. A pod whose
//    queue was empty starts with a round's credit: its first op goes in the next turn.
//  - caps, per pod and NIC: bytes posted at once (`inflight_cap`) and a rate (a token
//    bucket holding 10 ms of it); a capped pod waits, the time is counted.
// With `enabled` false every op joins one queue per peer, posted first in, first out (no
// classes, credit, window or caps): ferry before traffic classes (--qos=false).
//
// The worker's thread alone calls every method; nothing is allocated per op once the
// queues have grown (flows and pods live in vectors, reused).
#ifndef FERRY_AGENT_ENGINE_OP_SCHEDULER_H_
#define FERRY_AGENT_ENGINE_OP_SCHEDULER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/time/time.h"
#include "agent/common/ring_queue.h"
#include "agent/engine/write_op.h"
#include "agent/metrics/metrics.h"
#include "agent/qos/qos_policy.h"
#include "agent/qos/traffic_class.h"

namespace ferry {

class OpScheduler {
 public:
  struct Options {
    QosScheduling qos;                 // the agent's --qos* flags
    uint64_t quantum_bytes = 1 << 20;  // one round's credit at weight 1 (the largest op)
    absl::Duration latency_linger = absl::Milliseconds(100);
  };

  // What `post` did with the op it was handed.
  enum class Outcome {
    kPosted,       // in flight now; Done(ticket, ...) follows
    kDropped,      // finished without a post (its transfer is over, a stale key, an error)
    kPeerStopped,  // as kDropped, and the rest of that peer's ops wait for this turn
    kFull,         // the provider pushed back: the op stays at the front; the turn ends
  };
  // Kept with a posted op, handed back to Done.
  struct Ticket {
    uint32_t tenant = 0;  // a slot of tenants_
    TrafficClass traffic_class = TrafficClass::kBulk;
  };
  using HeldFn = absl::FunctionRef<bool(fi_addr_t peer)>;
  using PostFn = absl::FunctionRef<Outcome(const WriteOp& op, Ticket ticket)>;

  OpScheduler(const Options& options, Metrics* metrics, const std::string& nic);

  void Enqueue(const WriteOp& op, absl::Time now);
  // Hands queued ops to `post` in the order above until the provider is full or nothing
  // else may go now. True if any op left the queues.
  bool Post(absl::Time now, HeldFn held, PostFn post);
  // A posted op is over (completed, or failed with `ok` false) at `now`.
  void Done(Ticket ticket, uint64_t length, bool ok, absl::Time now);
  // Hands every queued op to `f` and forgets them (the worker's shutdown).
  void DrainAll(absl::FunctionRef<void(const WriteOp&)> f);
  // Hands the queue delays gathered since the last call to prometheus.
  void Flush();

  size_t pending() const { return pending_; }
  // Bytes posted and not yet done, by class.
  uint64_t inflight_bytes(TrafficClass c) const { return inflight_[ClassIndex(c)]; }

 private:
  struct Tenant {
    bool used = false;
    bool referenced = false;  // by a queue (Prune's mark)
    uint64_t id = 0;
    uint32_t weight = 1;
    uint64_t inflight_cap = 0, rate_cap = 0;
    uint64_t inflight = 0;  // bytes posted, not yet done
    double tokens = 0;      // the rate cap's bucket, in bytes
    absl::Time refilled;
    int64_t credit[kTrafficClasses] = {};
    size_t queued[kTrafficClasses] = {};
    absl::Time throttled_since[kTrafficClasses] = {absl::InfiniteFuture(), absl::InfiniteFuture(),
                                                   absl::InfiniteFuture()};
  };
  struct Flow {
    uint32_t tenant;
    fi_addr_t peer;
    RingQueue<WriteOp> ops;
  };
  // Per class: the queue-delay histogram's batch (as RailWorker's op latencies).
  struct ClassStats {
    prometheus::Counter* bytes = nullptr;
    prometheus::Counter* throttled = nullptr;
    prometheus::Histogram* delay = nullptr;
    std::vector<double> delay_counts;
    double delay_sum = 0;
    size_t delays = 0;
  };

  // What one pass over every flow found: whether another round of credit follows.
  struct Pass {
    bool progressed = false;          // something was posted (or ended without a post)
    bool out_of_credit = false;       // some pod's class has ops its credit does not cover
    bool window_with_credit = false;  // and some other still has credit, once the window opens
  };

  // Post's steps: the rate caps' buckets refilled; the bytes bulk and background may
  // have in flight (smaller while latency ops are about); one flow's ops posted while its
  // credit, its caps and the window allow (false: the provider is full, stop); a posted
  // op booked; every backlogged pod's class given its next quantum.
  void RefillRates(absl::Time now);
  uint64_t BulkWindow(absl::Time now) const;
  bool PostFlow(Flow& f, int c, uint64_t window, absl::Time now, PostFn post, Pass& pass);
  void CountPosted(Tenant& t, int c, const WriteOp& op, const Ticket& ticket, absl::Time now);
  void EarnCredit();
  uint32_t TenantSlot(const TenantShare& share, absl::Time now);
  int64_t Quantum(const Tenant& t, int c) const;
  bool Capped(const Tenant& t, uint64_t length) const;
  void EndThrottle(Tenant& t, int c, absl::Time now);
  void Prune();

  const Options options_;
  std::vector<Tenant> tenants_;
  std::vector<Flow> flows_[kTrafficClasses];
  size_t next_flow_[kTrafficClasses] = {};  // where each class's walk starts; rotates
  uint64_t inflight_[kTrafficClasses] = {};
  size_t queued_[kTrafficClasses] = {};
  size_t pending_ = 0;
  absl::Time latency_seen_ = absl::InfinitePast();  // the last latency op queued or done
  std::vector<double> delay_bounds_;
  ClassStats stats_[kTrafficClasses];
};

}  // namespace ferry

#endif  // FERRY_AGENT_ENGINE_OP_SCHEDULER_H_
