#include "agent/common/blocking_lanes.h"

#include <utility>

#include "agent/common/thread_name.h"

namespace ferry {

BlockingLanes::BlockingLanes(size_t max_threads, std::string thread_name)
    : max_threads_(max_threads == 0 ? 1 : max_threads), thread_name_(std::move(thread_name)) {}

BlockingLanes::~BlockingLanes() { Stop(); }

void BlockingLanes::Post(uint64_t key, Work work) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      std::deque<Work>& lane = lanes_[key];
      lane.push_back(std::move(work));
      ++pending_;
      // A key is in ready_ exactly while it has work and no thread is on it.
      if (lane.size() == 1 && !running_.contains(key)) ready_.push_back(key);
      // A thread more when there are more lanes ready than threads waiting for one.
      if (ready_.size() > idle_ && threads_.size() < max_threads_) threads_.emplace_back([this] { Run(); });
      return;
    }
  }
  work();
}

void BlockingLanes::Stop() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    threads.swap(threads_);
  }
  for (std::thread& t : threads) t.join();
}

size_t BlockingLanes::pending() const {
  absl::MutexLock lock(&mu_);
  return pending_;
}

void BlockingLanes::Run() {
  NameThisThread(thread_name_);
  mu_.Lock();
  for (;;) {
    ++idle_;
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !ready_.empty(); };
    mu_.Await(absl::Condition(&ready));
    --idle_;
    if (ready_.empty()) {  // stopping, and nothing left to run
      mu_.Unlock();
      return;
    }
    const uint64_t key = ready_.front();
    ready_.pop_front();
    running_.insert(key);
    std::deque<Work>& lane = lanes_[key];
    Work work = std::move(lane.front());
    lane.pop_front();
    mu_.Unlock();
    work();
    work = nullptr;  // what it captured goes before the lock is taken again
    mu_.Lock();
    --pending_;
    running_.erase(key);
    // Behind the other lanes with work: a busy key does not starve the rest.
    if (lanes_[key].empty()) {
      lanes_.erase(key);
    } else {
      ready_.push_back(key);
    }
  }
}

}  // namespace ferry
