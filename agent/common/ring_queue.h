// RingQueue<T>: a first-in-first-out queue in one array that keeps its capacity.
//
//   RingQueue<WriteOp> q;
//   q.push_back(op);              // allocates only when the queue outgrows its array
//   WriteOp& next = q.front();
//   q.pop_front();                // never frees
//
// std::deque allocates and frees a block every few elements as a queue drains and
// refills; a NIC worker's per-peer queues do that millions of times a second. This one
// grows by doubling and then stays: after warm-up the hot path allocates nothing.
// Not thread-safe (one owner). T must be default-constructible and movable.
#ifndef FERRY_AGENT_COMMON_RING_QUEUE_H_
#define FERRY_AGENT_COMMON_RING_QUEUE_H_

#include <cstddef>
#include <utility>
#include <vector>

#include "agent/common/check.h"

namespace ferry {

template <typename T>
class RingQueue {
 public:
  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }
  size_t capacity() const { return slots_.size(); }

  T& front() {
    FERRY_DCHECK(size_ > 0) << "front() of an empty RingQueue";
    return slots_[head_];
  }
  void pop_front() {
    FERRY_DCHECK(size_ > 0) << "pop_front() of an empty RingQueue";
    slots_[head_] = T();  // drop what the element holds now, not when overwritten
    head_ = Next(head_);
    --size_;
  }
  void push_back(T value) {
    if (size_ == slots_.size()) Grow();
    slots_[(head_ + size_) % slots_.size()] = std::move(value);
    ++size_;
  }
  // Visits the elements front to back.
  template <typename F>
  void ForEach(F&& f) {
    for (size_t i = 0; i < size_; ++i) f(slots_[(head_ + i) % slots_.size()]);
  }
  void clear() {
    while (!empty()) pop_front();
    head_ = 0;
  }

 private:
  size_t Next(size_t i) const { return i + 1 == slots_.size() ? 0 : i + 1; }
  void Grow() {
    std::vector<T> bigger(slots_.empty() ? 8 : 2 * slots_.size());
    for (size_t i = 0; i < size_; ++i) bigger[i] = std::move(slots_[(head_ + i) % slots_.size()]);
    slots_.swap(bigger);
    head_ = 0;
  }

  std::vector<T> slots_;
  size_t head_ = 0;
  size_t size_ = 0;
};

}  // namespace ferry

#endif  // FERRY_AGENT_COMMON_RING_QUEUE_H_
