#include "agent/session/session.h"

#include <unistd.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ferry {

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) close(fd_);
    fd_ = o.release();
  }
  return *this;
}

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) close(fd_);
}

namespace {

// What a queued message holds: its fields, plus the queue entry and the message's own
// object (a rough, fixed 128 bytes) so that empty messages are not free.
template <typename M>
size_t QueuedBytes(const M& m) {
  return m.ByteSizeLong() + 128;
}

}  // namespace

Session::Session(uint64_t id, PeerCredentials creds, const SessionLimits& limits, TenantRule rule)
    : id_(id),
      token_(Token::Random()),
      creds_(creds),
      limits_(limits),
      rule_(std::move(rule)),
      completions_({limits.event_queue_capacity, limits.event_queue_bytes}, QueuedBytes<v1::TransferResult>),
      // A message's sender (a pod, on this agent or another) may hold a quarter of the
      // room: one flooding pod cannot get every other pod's messages refused.
      notifications_({limits.event_queue_capacity, limits.event_queue_bytes, limits.event_queue_capacity / 4,
                      limits.event_queue_bytes / 4},
                     QueuedBytes<v1::Notification>,
                     [](v1::Notification& n, uint64_t lost) { n.set_lost_before(lost); }) {}

absl::StatusOr<uint64_t> Session::AddFd(UniqueFd fd) {
  absl::MutexLock lock(&mu_);
  if (fds_.size() >= limits_.max_pending_fds) {
    return absl::ResourceExhaustedError(absl::StrCat("the session already holds ", fds_.size(), " unused fds (limit ",
                                                     limits_.max_pending_fds, "); register or close them first"));
  }
  uint64_t handle = next_fd_handle_++;
  fds_.emplace(handle, std::move(fd));
  return handle;
}

absl::StatusOr<UniqueFd> Session::TakeFd(uint64_t handle) {
  absl::MutexLock lock(&mu_);
  auto it = fds_.find(handle);
  if (it == fds_.end()) {
    return absl::NotFoundError(
        absl::StrCat("fd_handle ", handle, " is unknown or already used: send the fd on the session socket first"));
  }
  UniqueFd fd = std::move(it->second);
  fds_.erase(it);
  return fd;
}

absl::Status Session::BeginTransfer(uint64_t transfer_id) {
  absl::MutexLock lock(&mu_);
  if (closed_) return absl::UnavailableError("the session is closing");
  if (inflight_ >= limits_.max_inflight_transfers) {
    return absl::ResourceExhaustedError(absl::StrCat("the session has ", inflight_, " transfers in flight (limit ",
                                                     limits_.max_inflight_transfers,
                                                     ", --max_inflight_transfers); wait for some to complete"));
  }
  transfers_.emplace(transfer_id, std::nullopt);
  ++inflight_;
  return absl::OkStatus();
}

void Session::FinishTransfer(const v1::TransferResult& result) {
  {
    absl::MutexLock lock(&mu_);
    auto it = transfers_.find(result.transfer_id());
    if (it == transfers_.end() || it->second.has_value()) return;
    it->second = result;
    --inflight_;
    finished_order_.push_back(result.transfer_id());
    while (finished_order_.size() > limits_.max_kept_results) {
      transfers_.erase(finished_order_.front());
      finished_order_.pop_front();
    }
  }
  completions_.Push(result);
}

absl::StatusOr<v1::WaitResponse> Session::Wait(uint64_t transfer_id, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto done = [this, transfer_id]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (closed_) return true;
    auto it = transfers_.find(transfer_id);
    return it == transfers_.end() || it->second.has_value();
  };
  mu_.AwaitWithTimeout(absl::Condition(&done), timeout);
  auto it = transfers_.find(transfer_id);
  if (it == transfers_.end()) {
    return absl::NotFoundError(absl::StrCat("transfer_id ", transfer_id,
                                            " was not started by this session, or its result expired (the "
                                            "agent keeps the last ",
                                            limits_.max_kept_results, ")"));
  }
  v1::WaitResponse response;
  response.set_done(it->second.has_value());
  if (it->second.has_value()) response.mutable_result()->CopyFrom(*it->second);
  return response;
}

size_t Session::inflight() const {
  absl::MutexLock lock(&mu_);
  return inflight_;
}

absl::Status Session::ClaimNotifications(NotificationReader reader) {
  absl::MutexLock lock(&mu_);
  if (inbox_) {
    return reader == NotificationReader::kInbox
               ? absl::AlreadyExistsError("this session has an inbox already (one per session)")
               : absl::FailedPreconditionError(
                     "this session reads its notifications through its inbox (OpenInbox), not a stream");
  }
  if (reader == NotificationReader::kStream) {
    ++notification_streams_;
    return absl::OkStatus();
  }
  if (notification_streams_ > 0) {
    return absl::FailedPreconditionError(
        "this session has a WatchNotifications stream open; close it before opening an inbox");
  }
  inbox_ = true;
  return absl::OkStatus();
}

void Session::ReleaseNotifications(NotificationReader reader) {
  absl::MutexLock lock(&mu_);
  if (reader == NotificationReader::kStream) {
    --notification_streams_;
  } else {
    inbox_ = false;
  }
}

void Session::Close() {
  {
    absl::MutexLock lock(&mu_);
    closed_.store(true, std::memory_order_release);
    fds_.clear();
  }
  completions_.Close();
  notifications_.Close();
}

}  // namespace ferry
