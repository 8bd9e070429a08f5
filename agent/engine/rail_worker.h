// RailWorker: the thread that owns one NIC's endpoint and completion queue (through
// NicInterface: FabricNic in the agent, a fake in tests/engine/rail_worker_test.cc).
//
//   RailWorker w(nic, metrics);
//   w.Start();
//   w.Submit(ops);               // any thread; the only lock is at this hand-off, and
//                                // none when the worker itself submits (its PollSource)
//   w.Stop();
//
// The loop: take newly submitted ops into the scheduler's queues (one per pod, traffic
// class and peer: agent/engine/op_scheduler.h), post in its order until the provider
// says -FI_EAGAIN (the op stays at the front; a peer still being connected to, or gone,
// never holds up the others), read the CQ, repeat. The scheduler decides who gets the
// slots that completions free: latency-class ops first, then pods and classes by weight.
// It also progresses the endpoint for writes arriving from peers (rxm/tcp need the target
// to call fi_cq_read). When there is nothing to do it blocks on the CQ's wait fd and an
// eventfd, so an idle agent uses no CPU.
//
// A connection-oriented provider (rxm over tcp or verbs) drops the connection to a peer
// on some remote errors, e.g. a write into a region its target just deregistered. Its
// ops fail, and rxm replaces the connection only after it has read the shutdown from its
// event queue, which it does while the CQ is polled, at most every
// FI_OFI_RXM_CM_PROGRESS_INTERVAL (10 ms). Until then every new write to that peer would
// fail too, so after such an error the worker holds that peer's queue for
// kReconnectHold, polling the CQ all the while, then posts on a fresh connection. Ops
// whose remote keys were fetched before the drop are failed instead of posted: a stale
// key, one the target just closed, is what breaks the connection. All these failures
// carry kConnectionResetPayload: the engine writes them again with fresh keys.
//
// Nothing is allocated per op (NCCL's request slots): ops wait in the scheduler's ring
// queues by value, and a posted op lives in one of the worker's preallocated slots, whose
// address is the provider's context; a completion returns the slot to a free list the
// worker alone touches. The slots grow by a block only if more ops are in flight than
// ever before.
//
// A PollSource (the shared-memory queues) may ride on the loop: it is polled every
// turn, its fd joins the sleep, so a queued write reaches the NIC on this thread.
#ifndef FERRY_AGENT_ENGINE_RAIL_WORKER_H_
#define FERRY_AGENT_ENGINE_RAIL_WORKER_H_

#include <array>
#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "agent/common/poll_source.h"
#include "agent/engine/op_scheduler.h"
#include "agent/engine/write_op.h"
#include "agent/fabric/nic_interface.h"
#include "agent/metrics/metrics.h"

namespace ferry {

// Status payload on op failures caused by a dropped connection (nothing was written
// past the failure; the same write may succeed on a new connection).
inline constexpr char kConnectionResetPayload[] = "ferry.dev/connection-reset";
absl::Status ConnectionResetError(absl::string_view message);
bool IsConnectionReset(const absl::Status& status);

class RailWorker {
 public:
  static constexpr absl::Duration kReconnectHold = absl::Milliseconds(50);

  // `spin`: how long the worker keeps polling after the last sign of activity before it
  // blocks on the CQ's fd. Long enough to ride a stream of incoming writes (rxm/tcp move
  // data only while the target polls); short enough that an idle agent sleeps at once.
  // A dedicated progress core may spin far longer (--fabric_spin_us).
  // `stop_grace`: how long Stop() lets queued and posted ops finish before it fails the
  // queued ones.
  // `qos`: how the worker shares its NIC between pods and classes.
  RailWorker(NicInterface* nic, Metrics* metrics, absl::Duration spin, std::vector<int> cpus = {},
             absl::Duration stop_grace = absl::Seconds(2), const OpScheduler::Options& qos = {});
  ~RailWorker();

  void Start();
  void Stop();
  // Hands ops to the worker (copied; each op's state hears of it exactly once, through
  // OpDone). Thread-safe; from the worker's own thread (a PollSource's writes) the ops
  // join its queues directly.
  void Submit(absl::Span<const WriteOp> ops);
  // Runs `source` on this worker's thread from now on (nullptr: none). Returns once the
  // worker has taken the change, so a source detached this way may be destroyed. Not
  // concurrently with Start() or Stop().
  void SetPollSource(PollSource* source);

  uint64_t tx_bytes() const { return tx_bytes_.load(std::memory_order_relaxed); }
  uint64_t inflight() const { return inflight_pub_.load(std::memory_order_relaxed); }
  const std::vector<int>& cpus() const { return cpus_; }

 private:
  void Loop();
  bool TakeIncoming();
  bool PostPending();
  // Posts `op` (PostPending's part for one op).
  OpScheduler::Outcome PostOne(const WriteOp& op, OpScheduler::Ticket ticket, absl::Time now);
  bool ReadCompletions();
  // Fails `op` for error `err` (a negative or positive fi_errno), holding its peer's
  // queue if the error means the connection is gone.
  void Fail(const WriteOp& op, int err, absl::string_view what);
  struct Drop {
    fi_addr_t peer;
    absl::Time at;  // when the worker saw the connection go
  };
  const Drop* LastDrop(fi_addr_t peer) const;
  // Reports `op` done to its transfer.
  void Complete(const WriteOp& op, const absl::Status& status);
  // Counts a completed op's time from post to completion in its class's histogram.
  void ObserveLatency(TrafficClass c, absl::Duration took);
  // Hands the op latencies gathered since the last call to prometheus.
  void FlushLatencies();
  // Blocks until there may be work; true if woken by activity rather than the timeout.
  bool Sleep(bool busy);
  // During Stop(): true once everything drained or the grace period is over.
  bool StopNow();
  void Wake();

  NicInterface* nic_;
  const absl::Duration spin_;
  const absl::Duration stop_grace_;
  std::vector<int> cpus_;
  prometheus::Counter& tx_counter_;
  std::array<prometheus::Histogram*, kTrafficClasses> op_duration_;  // by ClassIndex
  prometheus::Gauge& inflight_gauge_;
  prometheus::Counter& eagain_;
  prometheus::Counter& errors_;
  prometheus::Counter& reconnects_;

  absl::Mutex mu_;
  std::vector<WriteOp> incoming_ ABSL_GUARDED_BY(mu_);
  PollSource* next_source_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool source_change_ ABSL_GUARDED_BY(mu_) = false;
  bool loop_done_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> has_incoming_{false};
  std::atomic<bool> stopping_{false};  // read every idle turn, so not behind mu_
  std::atomic<bool> sleeping_{false};  // set around Sleep(); Submit wakes only a sleeper
  int event_fd_ = -1;

  // Owned by the worker thread from here on.
  OpScheduler scheduler_;       // the ops not yet posted
  std::vector<WriteOp> taken_;  // incoming_'s twin: the two swap, both keep their capacity
  // A posted op. `context` comes first: the provider hands its address back in the
  // completion, and that address is the slot's.
  struct PostedOp {
    fi_context2 context;
    WriteOp op;
    absl::Time posted;
    OpScheduler::Ticket ticket;
    PostedOp* next_free = nullptr;
  };
  PostedOp* FreeSlot();  // the next free slot (still on the free list); grows if none
  std::vector<std::unique_ptr<PostedOp[]>> slot_blocks_;
  PostedOp* free_slots_ = nullptr;
  // Set while a loop walks the scheduler's queues: an op submitted from inside it (a
  // completion callback) takes the locked path instead of changing them under the walk.
  bool walking_queues_ = false;
  PollSource* source_ = nullptr;
  // The last connection drop of each peer that had one. Nothing is posted to it for
  // kReconnectHold after; ops whose keys were fetched before it are never posted.
  std::vector<Drop> drops_;
  bool holding_ = false;  // some peer is held now
  size_t inflight_ = 0;
  absl::Time stop_deadline_ = absl::InfiniteFuture();
  // Op latencies not yet in op_duration_, per class and bucket of LatencyBuckets() (+Inf
  // last): one prometheus lock per class and batch, not per op.
  std::vector<double> latency_bounds_;
  std::array<std::vector<double>, kTrafficClasses> latency_counts_;
  std::array<double, kTrafficClasses> latency_sum_ = {};
  size_t latency_ops_ = 0;

  std::atomic<uint64_t> tx_bytes_{0};
  std::atomic<uint64_t> inflight_pub_{0};
  std::thread thread_;
};

}  // namespace ferry

#endif  // FERRY_AGENT_ENGINE_RAIL_WORKER_H_
