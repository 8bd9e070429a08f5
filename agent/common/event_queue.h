// EventQueue<T>: a bounded multi-producer queue that a streaming RPC drains.
//
//   EventQueue<Notification> q(/*capacity=*/4096);
//   q.Push(n);                                    // never blocks; drops when full
//   std::optional<Notification> e = q.Pop(absl::Milliseconds(200));
//   q.Close();                                    // wakes every Pop; later Pops return nullopt
//
// Producers are agent threads that must never block on a slow client, so a full queue
// drops the event and counts it (dropped()); consumers see the count in GetStatus.
#ifndef FERRY_AGENT_COMMON_EVENT_QUEUE_H_
#define FERRY_AGENT_COMMON_EVENT_QUEUE_H_

#include <cstddef>
#include <deque>
#include <optional>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ferry {

template <typename T>
class EventQueue {
 public:
  explicit EventQueue(size_t capacity) : capacity_(capacity) {}

  // Returns false when the event was dropped (queue full or closed).
  bool Push(T event) {
    absl::MutexLock lock(&mu_);
    if (closed_ || events_.size() >= capacity_) {
      ++dropped_;
      return false;
    }
    events_.push_back(std::move(event));
    return true;
  }

  // Waits up to `timeout` for an event. nullopt on timeout or when closed and empty.
  std::optional<T> Pop(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return closed_ || !events_.empty(); };
    mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
    if (events_.empty()) return std::nullopt;
    T event = std::move(events_.front());
    events_.pop_front();
    return event;
  }

  void Close() {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }

  bool closed() const {
    absl::MutexLock lock(&mu_);
    return closed_;
  }

  size_t dropped() const {
    absl::MutexLock lock(&mu_);
    return dropped_;
  }

 private:
  const size_t capacity_;
  mutable absl::Mutex mu_;
  std::deque<T> events_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  size_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ferry

#endif  // FERRY_AGENT_COMMON_EVENT_QUEUE_H_
