#include "agent/queue/queue_poller.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "agent/common/thread_name.h"

namespace ferry {
namespace {
constexpr size_t kBatch = 64;
}  // namespace

QueuePoller::QueuePoller(Handler handler, std::function<void()> flush)
    : handler_(std::move(handler)), flush_(std::move(flush)) {
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

void QueuePoller::Start(Mode mode) {
  if (mode == Mode::kOwnThread) thread_ = std::thread([this] { OwnLoop(); });
}

void QueuePoller::Stop() {
  stopping_.store(true);
  if (thread_.joinable()) {
    Wake();
    thread_.join();
  }
  blocking_.Stop();
}

void QueuePoller::Wake() {
  uint64_t one = 1;
  ssize_t ignored = write(wake_fd_, &one, sizeof(one));
  (void)ignored;
}

absl::Status QueuePoller::Add(std::shared_ptr<TransferQueue> queue, size_t max_queues, size_t max_per_uid) {
  {
    absl::MutexLock lock(&mu_);
    if (queues_.size() >= max_queues) {
      return absl::ResourceExhaustedError(absl::StrCat("the agent already serves ", queues_.size(),
                                                       " queues (--max_queues); close some sessions' queues"));
    }
    const uint32_t uid = queue->owner_uid();
    const size_t own = std::count_if(queues_.begin(), queues_.end(),
                                     [uid](const std::shared_ptr<TransferQueue>& q) { return q->owner_uid() == uid; });
    if (own >= max_per_uid) {
      return absl::ResourceExhaustedError(
          absl::StrCat("uid ", uid, " already has ", own, " queues (--max_queues_per_uid); close some of its queues"));
    }
    // Edge-triggered: each ring of the doorbell wakes us once, and we never read it (a
    // read could block: CheckEventFd says why).
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLET;
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

bool QueuePoller::Poll() {
  if (generation_.load() != polled_generation_) {
    absl::MutexLock lock(&mu_);
    polled_generation_ = generation_.load();
    polled_ = queues_;
  }
  bool progressed = false;
  queue::SubmitEntry batch[kBatch];
  for (const auto& q : polled_) {
    for (size_t n; (n = q->Take(batch, kBatch)) > 0;) {
      for (size_t i = 0; i < n; ++i) {
        if (!handler_(q, batch[i], /*may_block=*/false)) {
          blocking_.Post(q->owner_uid(), [this, q, entry = batch[i]] {
            handler_(q, entry, /*may_block=*/true);
            if (flush_) flush_();
          });
        }
      }
      if (flush_) flush_();
      progressed = true;
      if (n < kBatch) break;
    }
  }
  return progressed;
}

bool QueuePoller::PrepareToSleep() {
  // Announce the sleep, then look once more: a submission made before the announcement
  // rang no doorbell.
  bool pending = false;
  for (const auto& q : polled_) {
    q->SetSleeping(true);
    pending |= q->HasSubmissions();
  }
  return !pending;
}

void QueuePoller::Woke() {
  uint64_t v;
  ssize_t ignored = read(wake_fd_, &v, sizeof(v));  // our own eventfd
  (void)ignored;
  // Takes the doorbells' edges that woke us (or came since), so that wait_fd() reads
  // ready again only for new rings.
  epoll_event events[16];
  while (epoll_wait(epoll_fd_, events, 16, 0) == 16) {
  }
  for (const auto& q : polled_) q->SetSleeping(false);
}

void QueuePoller::OwnLoop() {
  NameThisThread("ferry-queues");
  while (!stopping_.load(std::memory_order_relaxed)) {
    if (Poll()) continue;
    // Sleep at once, without spinning: the poller shares its core with the clients and
    // the NIC workers, and a 20 µs spin here cost the queue path ~15 % of its rate
    // (tools/bench/RESULTS.md).
    if (PrepareToSleep()) {
      epoll_event events[16];
      epoll_wait(epoll_fd_, events, 16, /*timeout_ms=*/200);
    }
    Woke();
  }
}

}  // namespace ferry
