// RailWorker: the thread that owns one NIC's endpoint and completion queue.
//
//   RailWorker w(nic, metrics);
//   w.Start();
//   w.Submit(std::move(ops));    // any thread; the only lock is at this hand-off
//   w.Stop();
//
// The loop: take newly submitted ops into per-peer queues, post from the front of each
// until the provider says -FI_EAGAIN (the op stays at the front; a peer still being
// connected to, or gone, never holds up the others), read the CQ, repeat. It
// also progresses the endpoint for writes arriving from peers (rxm/tcp need the target
// to call fi_cq_read). When there is nothing to do it blocks on the CQ's wait fd and an
// eventfd, so an idle agent uses no CPU.
#ifndef FERRY_AGENT_ENGINE_RAIL_WORKER_H_
#define FERRY_AGENT_ENGINE_RAIL_WORKER_H_

#include <atomic>
#include <deque>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/engine/write_op.h"
#include "agent/fabric/fabric_nic.h"
#include "agent/metrics/metrics.h"

namespace ferry {

class RailWorker {
 public:
  // `spin`: how long the worker keeps polling after the last sign of activity before it
  // blocks on the CQ's fd. Long enough to ride a stream of incoming writes (rxm/tcp move
  // data only while the target polls); short enough that an idle agent sleeps at once.
  // A dedicated progress core may spin far longer (--fabric_spin_us).
  RailWorker(FabricNic* nic, Metrics* metrics, absl::Duration spin, std::vector<int> cpus = {});
  ~RailWorker();

  void Start();
  void Stop();
  // Hands ops to the worker (ownership moves). Thread-safe.
  void Submit(std::vector<WriteOp*> ops);

  FabricNic* nic() const { return nic_; }
  uint64_t tx_bytes() const { return tx_bytes_.load(std::memory_order_relaxed); }
  uint64_t inflight() const { return inflight_pub_.load(std::memory_order_relaxed); }
  const std::vector<int>& cpus() const { return cpus_; }

 private:
  void Loop();
  bool TakeIncoming();
  void Enqueue(WriteOp* op);
  bool PostPending();
  bool ReadCompletions();
  void Complete(WriteOp* op, const absl::Status& status);
  // Blocks until there may be work; true if woken by activity rather than the timeout.
  bool Sleep(bool busy);
  // During Stop(): true once everything drained or the 2 s grace period is over.
  bool StopNow();
  void Wake();

  FabricNic* nic_;
  const absl::Duration spin_;
  std::vector<int> cpus_;
  prometheus::Counter& tx_counter_;
  prometheus::Histogram& op_duration_;
  prometheus::Gauge& inflight_gauge_;
  prometheus::Counter& eagain_;
  prometheus::Counter& errors_;

  absl::Mutex mu_;
  std::vector<WriteOp*> incoming_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> has_incoming_{false};
  std::atomic<bool> sleeping_{false};  // set around Sleep(); Submit wakes only a sleeper
  int event_fd_ = -1;

  // Owned by the worker thread: ops not yet posted, one FIFO per destination.
  struct PeerQueue {
    fi_addr_t peer;
    std::deque<WriteOp*> ops;
  };
  std::vector<PeerQueue> queues_;
  size_t pending_ = 0;
  size_t inflight_ = 0;
  absl::Time stop_deadline_ = absl::InfiniteFuture();

  std::atomic<uint64_t> tx_bytes_{0};
  std::atomic<uint64_t> inflight_pub_{0};
  std::thread thread_;
};

}  // namespace ferry

#endif  // FERRY_AGENT_ENGINE_RAIL_WORKER_H_
