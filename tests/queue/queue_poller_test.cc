// QueuePoller on its own: entries a pod submitted reach the handler, and the flush hook
// runs on the handler's thread after each burst it took (where the GPU copier puts a
// burst on its stream without waking its submitter).
#include "agent/queue/queue_poller.h"

#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "proto/ferry/wire/ring_layout.h"
#include "tests/testing/mapped_ring.h"

namespace ferry {
namespace {

constexpr uint32_t kEntries = 16;

// The pod's side of one queue: the ring it maps and the doorbell it rings.
class PodRing {
 public:
  PodRing() {
    int bell = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    submit_bell_ = dup(bell);
    int pair[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) == 0);
    complete_end_ = pair[1];
    absl::StatusOr<std::shared_ptr<TransferQueue>> q =
        TransferQueue::Open(1, 1, ring_.TakeFd(), UniqueFd(bell), UniqueFd(pair[0]), kEntries, 0, {});
    INFO(q.status().ToString());
    REQUIRE(q.ok());
    queue_ = *std::move(q);
  }
  ~PodRing() {
    close(submit_bell_);
    close(complete_end_);
  }

  // Submits `n` entries (user_data 1, 2, ...) and rings the doorbell.
  void Submit(uint32_t n) {
    auto* slots = reinterpret_cast<queue::SubmitEntry*>(ring_.base() + queue::kSubmitOffset);
    uint32_t tail = ring_.header()->sq_tail.value.load(std::memory_order_relaxed);
    for (uint32_t i = 0; i < n; ++i, ++tail) {
      queue::SubmitEntry e{};
      e.user_data = tail + 1;
      slots[tail % kEntries] = e;
    }
    ring_.header()->sq_tail.value.store(tail, std::memory_order_release);
    uint64_t one = 1;
    REQUIRE(write(submit_bell_, &one, sizeof(one)) == sizeof(one));
  }

  const std::shared_ptr<TransferQueue>& queue() const { return queue_; }

 private:
  testing::MappedRing ring_{kEntries};
  int submit_bell_ = -1, complete_end_ = -1;
  std::shared_ptr<TransferQueue> queue_;
};

TEST_CASE("the flush hook runs on the handler's thread after each burst it took") {
  absl::Mutex mu;
  std::vector<uint64_t> handled;         // user_data, in order
  std::vector<size_t> handled_at_flush;  // how many entries had been handled at each flush
  std::thread::id handler_thread, flush_thread;
  QueuePoller poller(
      [&](const std::shared_ptr<TransferQueue>& q, const queue::SubmitEntry& e, bool) {
        absl::MutexLock lock(&mu);
        handled.push_back(e.user_data);
        handler_thread = std::this_thread::get_id();
        q->Complete(queue::CompletionEntry{});
        return true;
      },
      [&] {
        absl::MutexLock lock(&mu);
        handled_at_flush.push_back(handled.size());
        flush_thread = std::this_thread::get_id();
      });
  PodRing pod;
  poller.Start(QueuePoller::Mode::kOwnThread);
  REQUIRE(poller.Add(pod.queue(), 4, 4).ok());

  auto wait_for = [&](size_t entries, size_t flushes) {
    const absl::Time end = absl::Now() + absl::Seconds(10);
    for (;;) {
      {
        absl::MutexLock lock(&mu);
        if (handled.size() >= entries && handled_at_flush.size() >= flushes) return;
      }
      REQUIRE(absl::Now() < end);
      absl::SleepFor(absl::Milliseconds(1));
    }
  };
  pod.Submit(5);  // one burst: one Take, five entries, then one flush
  wait_for(5, 1);
  pod.Submit(3);
  wait_for(8, 2);
  poller.Stop();

  absl::MutexLock lock(&mu);
  CHECK(handled == std::vector<uint64_t>{1, 2, 3, 4, 5, 6, 7, 8});
  REQUIRE(handled_at_flush.size() == 2);
  CHECK(handled_at_flush[0] == 5);  // after the burst, not after each entry
  CHECK(handled_at_flush[1] == 8);
  CHECK(flush_thread == handler_thread);
}

TEST_CASE("one pod (uid) gets at most its share of the node's queues") {
  QueuePoller poller([](const std::shared_ptr<TransferQueue>&, const queue::SubmitEntry&, bool) { return true; },
                     [] {});
  std::vector<std::unique_ptr<PodRing>> pods;
  auto add = [&](uint32_t uid) {
    pods.push_back(std::make_unique<PodRing>());
    pods.back()->queue()->set_owner_uid(uid);
    return poller.Add(pods.back()->queue(), /*max_queues=*/5, /*max_per_uid=*/2);
  };
  CHECK(add(1000).ok());
  CHECK(add(1000).ok());
  absl::Status third = add(1000);
  CHECK(third.code() == absl::StatusCode::kResourceExhausted);
  CHECK(std::string(third.message()).find("uid 1000 already has 2 queues (--max_queues_per_uid)") != std::string::npos);
  CHECK(add(1001).ok());  // another pod still gets queues
  CHECK(add(1001).ok());
  CHECK(add(1002).ok());
  CHECK(add(1003).code() == absl::StatusCode::kResourceExhausted);  // --max_queues for the node
  CHECK(poller.size() == 5);
}

}  // namespace
}  // namespace ferry
