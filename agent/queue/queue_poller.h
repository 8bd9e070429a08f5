// QueuePoller: one thread that takes submissions from every session's TransferQueue.
//
//   QueuePoller poller([](const std::shared_ptr<TransferQueue>& q, const queue::SubmitEntry& e) {
//     ... validate and start the transfer; q->Complete(...) exactly once, later ...
//   });
//   poller.Start();
//   poller.Add(queue);                 // from CreateQueue
//   poller.RemoveSession(session_id);  // when the session ends
//
// It polls while submissions keep coming and sleeps on the queues' doorbells (epoll)
// after a short quiet spell, so an idle agent stays idle. The handler runs on the
// poller thread and must not block for long.
#ifndef FERRY_AGENT_QUEUE_QUEUE_POLLER_H_
#define FERRY_AGENT_QUEUE_QUEUE_POLLER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "agent/queue/transfer_queue.h"

namespace ferry {

class QueuePoller {
 public:
  using Handler = std::function<void(const std::shared_ptr<TransferQueue>&, const queue::SubmitEntry&)>;

  explicit QueuePoller(Handler handler);
  ~QueuePoller();  // Stop()

  void Start();
  void Stop();
  // RESOURCE_EXHAUSTED past `max_queues` in total.
  absl::Status Add(std::shared_ptr<TransferQueue> queue, size_t max_queues);
  void RemoveSession(uint64_t session_id);
  size_t size() const;

 private:
  void Loop();
  void Wake();

  const Handler handler_;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> generation_{0};
  mutable absl::Mutex mu_;
  std::vector<std::shared_ptr<TransferQueue>> queues_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry

#endif  // FERRY_AGENT_QUEUE_QUEUE_POLLER_H_
