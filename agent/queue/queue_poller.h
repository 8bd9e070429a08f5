// QueuePoller: takes submissions from every session's TransferQueue.
//
//   QueuePoller poller([](const std::shared_ptr<TransferQueue>& q, const queue::SubmitEntry& e, bool may_block) {
//     ... validate and start the transfer; q->Complete(...) exactly once, later ...
//     return true;   // or false when !may_block and it would have to wait
//   }, [] { ... the entries handled since the last call were a burst: start them ... });
//   poller.Start(QueuePoller::Mode::kOwnThread);  // or kDriven: a NIC worker calls Poll()
//   poller.Add(queue, max_queues, max_per_uid);   // from CreateQueue
//   poller.RemoveSession(session_id);             // when the session ends
//
// kOwnThread: one thread polls while submissions keep coming and sleeps on the queues'
// doorbells (epoll) as soon as the rings are empty, so an idle agent stays idle.
// kDriven: another thread's loop (a RailWorker) drives the PollSource methods.
// Either way the handler runs there with may_block == false, and must not block for
// long. An entry it cannot take without waiting on the network (a peer to handshake
// with, a message to another agent) goes to the blocking lanes: one per pod (the
// queue's owner uid), on up to kBlockingThreads threads, where the handler is called
// again with may_block == true. So one pod's entries to a dead or stopped agent delay
// only that pod's.
#ifndef FERRY_AGENT_QUEUE_QUEUE_POLLER_H_
#define FERRY_AGENT_QUEUE_QUEUE_POLLER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "agent/common/blocking_lanes.h"
#include "agent/common/poll_source.h"
#include "agent/queue/transfer_queue.h"

namespace ferry {

class QueuePoller : public PollSource {
 public:
  // Returns false only when !may_block and the entry needs a thread that may block.
  using Handler = std::function<bool(const std::shared_ptr<TransferQueue>&, const queue::SubmitEntry&, bool may_block)>;
  enum class Mode { kOwnThread, kDriven };
  // Pods whose entries may wait on the network at once before a further one waits.
  static constexpr size_t kBlockingThreads = 8;

  // `flush`, if set, runs on the handler's thread after each burst of entries it took
  // from one queue (TransferExecutor::Flush).
  explicit QueuePoller(Handler handler, std::function<void()> flush = nullptr);
  ~QueuePoller() override;  // Stop()

  void Start(Mode mode);
  // Handles every entry still in the blocking lanes, then joins the threads. In kDriven
  // mode the driver must have stopped calling Poll() before.
  void Stop();
  // RESOURCE_EXHAUSTED past `max_queues` in total, or past `max_per_uid` of the queue's
  // owner_uid (so that one pod cannot take every queue of the node).
  absl::Status Add(std::shared_ptr<TransferQueue> queue, size_t max_queues, size_t max_per_uid);
  void RemoveSession(uint64_t session_id);
  size_t size() const;

  // PollSource: called by the one polling thread (the driver, or the own thread).
  bool Poll() override;
  bool PrepareToSleep() override;
  void Woke() override;
  int wait_fd() const override { return epoll_fd_; }

 private:
  void OwnLoop();
  void Wake();

  const Handler handler_;
  const std::function<void()> flush_;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> generation_{0};
  mutable absl::Mutex mu_;
  std::vector<std::shared_ptr<TransferQueue>> queues_ ABSL_GUARDED_BY(mu_);
  BlockingLanes blocking_{kBlockingThreads, "ferry-slowlane"};

  // The polling thread's copy of queues_, refreshed when generation_ moves.
  std::vector<std::shared_ptr<TransferQueue>> polled_;
  uint64_t polled_generation_ = ~uint64_t{0};
};

}  // namespace ferry

#endif  // FERRY_AGENT_QUEUE_QUEUE_POLLER_H_
