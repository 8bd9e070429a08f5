#include "agent/queue/queue_poller.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace ferry {
namespace {
constexpr size_t kBatch = 64;
}  // namespace

QueuePoller::QueuePoller(Handler handler) : handler_(std::move(handler)) {
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = nullptr;  // the wake fd
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
}

QueuePoller::~QueuePoller() {
  Stop();
  close(epoll_fd_);
  close(wake_fd_);
}

void QueuePoller::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void QueuePoller::Stop() {
  if (!thread_.joinable()) return;
  stopping_.store(true);
  Wake();
  thread_.join();
}

void QueuePoller::Wake() {
  uint64_t one = 1;
  ssize_t ignored = write(wake_fd_, &one, sizeof(one));
  (void)ignored;
}

absl::Status QueuePoller::Add(std::shared_ptr<TransferQueue> queue, size_t max_queues) {
  {
    absl::MutexLock lock(&mu_);
    if (queues_.size() >= max_queues) {
      return absl::ResourceExhaustedError(absl::StrCat("the agent already serves ", queues_.size(),
                                                       " queues (--max_queues); close some sessions' queues"));
    }
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = queue.get();
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, queue->submit_doorbell(), &ev);
    queues_.push_back(std::move(queue));
  }
  generation_.fetch_add(1);
  Wake();
  return absl::OkStatus();
}

void QueuePoller::RemoveSession(uint64_t session_id) {
  {
    absl::MutexLock lock(&mu_);
    // partition, not remove_if: the session's queues must stay intact past `gone`.
    auto gone = std::stable_partition(queues_.begin(), queues_.end(), [&](const std::shared_ptr<TransferQueue>& q) {
      return q->session_id() != session_id;
    });
    if (gone == queues_.end()) return;
    for (auto it = gone; it != queues_.end(); ++it) {
      epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, (*it)->submit_doorbell(), nullptr);
    }
    queues_.erase(gone, queues_.end());
  }
  generation_.fetch_add(1);
  Wake();
}

size_t QueuePoller::size() const {
  absl::MutexLock lock(&mu_);
  return queues_.size();
}

void QueuePoller::Loop() {
  std::vector<std::shared_ptr<TransferQueue>> queues;  // this thread's copy
  uint64_t seen = ~uint64_t{0};
  queue::SubmitEntry batch[kBatch];
  while (!stopping_.load(std::memory_order_relaxed)) {
    if (generation_.load() != seen) {
      absl::MutexLock lock(&mu_);
      seen = generation_.load();
      queues = queues_;
    }
    bool progressed = false;
    for (const auto& q : queues) {
      for (size_t n; (n = q->Take(batch, kBatch)) > 0;) {
        for (size_t i = 0; i < n; ++i) handler_(q, batch[i]);
        progressed = true;
        if (n < kBatch) break;
      }
    }
    if (progressed) continue;
    // Sleep at once, without spinning: the poller shares its core with the clients and
    // the NIC workers, and a 20 µs spin here cost the queue path ~15 % of its rate
    // (tools/bench/RESULTS.md). Announce the sleep, then look once more so a submission
    // made before the announcement is not left waiting for a doorbell that will not ring.
    bool pending = false;
    for (const auto& q : queues) {
      q->SetSleeping(true);
      pending |= q->HasSubmissions();
    }
    if (!pending) {
      epoll_event events[16];
      int n = epoll_wait(epoll_fd_, events, 16, /*timeout_ms=*/200);
      for (int i = 0; i < n; ++i) {
        if (events[i].data.ptr == nullptr) {
          uint64_t v;
          ssize_t ignored = read(wake_fd_, &v, sizeof(v));
          (void)ignored;
        }
      }
    }
    for (const auto& q : queues) {
      q->SetSleeping(false);
      q->DrainDoorbell();
    }
  }
}

}  // namespace ferry
