#include "agent/engine/transfer_watch.h"

namespace ferry {

void TransferWatch::Add(const std::shared_ptr<TransferState>& state) {
  absl::MutexLock lock(&mu_);
  active_.push_back(state);
}

bool TransferWatch::AwaitWork(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !active_.empty(); };
  mu_.AwaitWithTimeout(absl::Condition(&has_work), timeout);
  return !stopping_;
}

void TransferWatch::Stop() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
}

std::vector<TransferWatch::Expired> TransferWatch::Sweep(absl::Time now) {
  std::vector<Expired> expired;
  absl::MutexLock lock(&mu_);
  // Compact in place. Never move an element onto itself: libstdc++'s weak_ptr move
  // assignment empties a self-assigned pointer, which would drop that transfer from the
  // watch (and its deadline) for good.
  size_t keep = 0;
  for (size_t i = 0; i < active_.size(); ++i) {
    std::shared_ptr<TransferState> s = active_[i].lock();
    if (s == nullptr || s->finished()) continue;
    if (absl::Status stopped = s->Stopped(now); !stopped.ok()) {
      if (stopped.code() == absl::StatusCode::kDeadlineExceeded) {
        expired.push_back({std::move(s), std::move(stopped)});
        continue;
      }
      // The writer's pod is gone: post no more, end once the posted ops are done.
      if (!s->stopped()) s->Stop(stopped);
    }
    if (keep != i) active_[keep] = std::move(active_[i]);
    ++keep;
  }
  active_.resize(keep);
  return expired;
}

void TransferWatch::Fail(const PeerConnection* peer, const absl::Status& status) {
  std::vector<std::shared_ptr<TransferState>> hit;
  {
    absl::MutexLock lock(&mu_);
    for (const std::weak_ptr<TransferState>& w : active_) {
      std::shared_ptr<TransferState> s = w.lock();
      if (s != nullptr && (peer == nullptr || s->peer().get() == peer)) hit.push_back(std::move(s));
    }
  }
  for (const std::shared_ptr<TransferState>& s : hit) s->Finish(status);  // outside the lock: done may run here
}

size_t TransferWatch::size() const {
  absl::MutexLock lock(&mu_);
  return active_.size();
}

}  // namespace ferry
