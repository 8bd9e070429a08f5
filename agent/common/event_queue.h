// EventQueue<T>: a bounded multi-producer queue that a streaming RPC drains.
//
//   EventQueue<Notification> q(/*capacity=*/4096);
//   q.Push(n);                                    // never blocks; drops when full
//   std::optional<Notification> e = q.Pop(absl::Milliseconds(200));
//   q.Close();                                    // wakes every Pop; later Pops return nullopt
//
//   // Bounded in bytes too, by what each event costs:
//   EventQueue<Notification> q({4096, 1 << 20}, [](const Notification& n) { return n.ByteSizeLong(); });
//
// Producers are agent threads that must never block on a slow client, so a full queue
// (too many events, or with a cost function too many bytes) drops the event and counts
// it (dropped()); with a `mark_lost` function, the next event the queue takes is marked
// with how many were dropped just before it, so that the consumer learns of the loss in
// order.
//
// Events pushed with a sender (any key but 0) share the room out: one sender's events
// waiting here may hold at most `sender_events` and `sender_bytes`, so that one
// flooding sender cannot get every other sender's events dropped.
//
//   EventQueue<Notification> q({4096, 1 << 20, /*sender_events=*/1024, /*sender_bytes=*/256 << 10}, cost);
//   q.Push(message, sender_key);
//
// A consumer that can take an event without blocking (a ring in the client's shared
// memory) attaches a sink instead of popping: the producer's own thread hands it each
// event while none waits before it, so the event reaches the client without waking a
// consumer thread. What the sink refuses (its ring is full) waits here, in order, until
// the consumer's thread moves it with DrainToSink.
//
//   q.SetSink([&](const Notification& n) { return ring.TryWrite(n); });
//   while (running) if (q.DrainToSink(absl::Milliseconds(200)) > 0) Backoff();
//   q.SetSink(nullptr);                           // never called again once this returns
#ifndef FERRY_AGENT_COMMON_EVENT_QUEUE_H_
#define FERRY_AGENT_COMMON_EVENT_QUEUE_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ferry {

template <typename T>
class EventQueue {
 public:
  // Takes one event, or returns false when it cannot now. Runs under the queue's lock,
  // on whichever thread pushes: it must not block.
  using Sink = std::function<bool(const T&)>;
  // Marks `event` as following `lost` dropped events.
  using MarkLost = std::function<void(T& event, uint64_t lost)>;

  // What an event holds in memory, for the byte bound.
  using Cost = std::function<size_t(const T&)>;
  struct Bounds {
    size_t events = SIZE_MAX;
    size_t bytes = SIZE_MAX;  // counted by the Cost function
    // Of those, what the events of one sender may hold (events pushed with sender 0 are
    // not counted against any).
    size_t sender_events = SIZE_MAX;
    size_t sender_bytes = SIZE_MAX;
  };

  explicit EventQueue(size_t capacity, MarkLost mark_lost = nullptr)
      : EventQueue(Bounds{capacity, SIZE_MAX}, nullptr, std::move(mark_lost)) {}
  EventQueue(Bounds bounds, Cost cost, MarkLost mark_lost = nullptr)
      : bounds_(bounds), cost_(std::move(cost)), mark_lost_(std::move(mark_lost)) {}

  // Returns false when the event was dropped (queue full, `sender`'s share of it full,
  // or closed).
  bool Push(T event, uint64_t sender = 0) {
    absl::MutexLock lock(&mu_);
    if (closed_) {
      ++dropped_;
      return false;
    }
    // Straight to the sink only when nothing waits before it: events keep their order.
    const bool sink_first = sink_ && events_.empty();
    if (!sink_first && events_.size() >= bounds_.events) return Lost();
    if (lost_since_taken_ > 0 && mark_lost_) mark_lost_(event, lost_since_taken_);
    if (!(sink_first && sink_(event))) {
      // The sink refused it (or there is none): it waits here if there is room.
      const size_t cost = cost_ ? cost_(event) : 0;
      if (events_.size() >= bounds_.events || cost > bounds_.bytes - bytes_) return Lost();
      if (sender != 0) {
        Held& held = held_by_sender_[sender];
        if (held.events >= bounds_.sender_events || cost > bounds_.sender_bytes - held.bytes) {
          if (held.events == 0) held_by_sender_.erase(sender);
          return Lost();
        }
        ++held.events;
        held.bytes += cost;
      }
      events_.push_back({std::move(event), cost, sender});
      bytes_ += cost;
      if (on_backlog_) on_backlog_();
    }
    lost_since_taken_ = 0;
    return true;
  }

  // Waits up to `timeout` for an event. nullopt on timeout or when closed and empty.
  std::optional<T> Pop(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return closed_ || !events_.empty(); };
    mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
    if (events_.empty()) return std::nullopt;
    T event = std::move(events_.front().event);
    PopFront();
    return event;
  }

  // Attaches `sink` (or detaches, with null). Once this returns, a sink it replaced is
  // never called again. `on_backlog`, if set, runs (under the queue's lock: it must only
  // note the fact) each time an event has to wait here because the sink refused it or
  // others wait before it: whoever drains with DrainToSink learns there is work.
  void SetSink(Sink sink, std::function<void()> on_backlog = nullptr) {
    absl::MutexLock lock(&mu_);
    sink_ = std::move(sink);
    on_backlog_ = sink_ ? std::move(on_backlog) : nullptr;
  }

  // Waits up to `timeout` for a waiting event (or Close), then hands the sink the waiting
  // events in order until it refuses one. Returns how many still wait.
  size_t DrainToSink(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return closed_ || !events_.empty(); };
    mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
    while (sink_ && !events_.empty() && sink_(events_.front().event)) PopFront();
    return events_.size();
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
  struct Entry {
    T event;
    size_t cost;
    uint64_t sender;
  };
  struct Held {
    size_t events = 0;
    size_t bytes = 0;
  };

  void PopFront() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const Entry& front = events_.front();
    bytes_ -= front.cost;
    if (front.sender != 0) {
      auto held = held_by_sender_.find(front.sender);
      held->second.bytes -= front.cost;
      if (--held->second.events == 0) held_by_sender_.erase(held);
    }
    events_.pop_front();
  }

  bool Lost() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ++dropped_;
    ++lost_since_taken_;
    return false;
  }

  const Bounds bounds_;
  const Cost cost_;
  const MarkLost mark_lost_;
  mutable absl::Mutex mu_;
  std::deque<Entry> events_ ABSL_GUARDED_BY(mu_);
  size_t bytes_ ABSL_GUARDED_BY(mu_) = 0;                                    // the costs of events_
  absl::flat_hash_map<uint64_t, Held> held_by_sender_ ABSL_GUARDED_BY(mu_);  // of events_, senders' but 0
  Sink sink_ ABSL_GUARDED_BY(mu_);
  std::function<void()> on_backlog_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  size_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t lost_since_taken_ ABSL_GUARDED_BY(mu_) = 0;  // dropped since the last event taken
};

}  // namespace ferry

#endif  // FERRY_AGENT_COMMON_EVENT_QUEUE_H_
