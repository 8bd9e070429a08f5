// Session: one client connection on the session socket, and everything it owns.
//
// The session socket connection is the session's lifetime: when the client process
// exits (or crashes) the kernel closes it, and the agent reclaims the session's regions,
// pending fds and watchers. Identity comes from SO_PEERCRED on that connection; gRPC
// calls name their session with the token the agent sent on it.
//
//   std::shared_ptr<Session> s = registry.Create(creds);
//   uint64_t h = s->AddFd(std::move(fd));          // from SCM_RIGHTS
//   absl::StatusOr<UniqueFd> fd = s->TakeFd(h);    // consumed by RegisterMemory
//   s->BeginTransfer(id); ... s->FinishTransfer(result);
//   absl::StatusOr<v1::WaitResponse> r = s->Wait(id, absl::Seconds(1));
#ifndef FERRY_AGENT_SESSION_SESSION_H_
#define FERRY_AGENT_SESSION_SESSION_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/common/event_queue.h"
#include "agent/common/token.h"
#include "agent/qos/qos_policy.h"
#include "proto/ferry/v1/ferry.pb.h"

namespace ferry {

// Owns a file descriptor; closes it on destruction.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd();
  int get() const { return fd_; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
};

struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

struct SessionLimits {
  size_t max_sessions = SIZE_MAX;          // on the node
  size_t max_sessions_per_uid = SIZE_MAX;  // of one pod (its uid)
  size_t max_pending_fds = 64;
  size_t max_inflight_transfers = 4096;
  size_t max_kept_results = 4096;
  size_t event_queue_capacity = 65536;
  size_t event_queue_bytes = 1 << 20;  // each of the two queues
};

class Session {
 public:
  // `rule`: the --qos_tenants rule the peer's credentials matched.
  Session(uint64_t id, PeerCredentials creds, const SessionLimits& limits, TenantRule rule = {});

  uint64_t id() const { return id_; }
  const Token& token() const { return token_; }
  const PeerCredentials& creds() const { return creds_; }
  const TenantRule& qos_rule() const { return rule_; }
  // This pod's share of the NICs for a transfer of class `c`.
  TenantShare Share(TrafficClass c) const { return {id_, c, rule_.weight, rule_.inflight_cap, rule_.rate_cap}; }
  // Bytes of this session's finished transfers sent over the fabric, by class.
  void AddFabricBytes(TrafficClass c, uint64_t n) {
    fabric_bytes_[ClassIndex(c)].fetch_add(n, std::memory_order_relaxed);
  }
  uint64_t fabric_bytes(TrafficClass c) const { return fabric_bytes_[ClassIndex(c)].load(std::memory_order_relaxed); }

  // Keeps an fd the client sent until RegisterMemory consumes it. Returns its handle,
  // or RESOURCE_EXHAUSTED when the session already holds max_pending_fds.
  absl::StatusOr<uint64_t> AddFd(UniqueFd fd);
  // NOT_FOUND for an unknown or already used handle.
  absl::StatusOr<UniqueFd> TakeFd(uint64_t handle);

  // Transfer bookkeeping. BeginTransfer fails with RESOURCE_EXHAUSTED past the limit.
  absl::Status BeginTransfer(uint64_t transfer_id);
  // Records the result, wakes Wait callers and queues it for WatchCompletions.
  void FinishTransfer(const v1::TransferResult& result);
  // NOT_FOUND when the id was never started by this session or its result expired.
  absl::StatusOr<v1::WaitResponse> Wait(uint64_t transfer_id, absl::Duration timeout);
  size_t inflight() const;

  EventQueue<v1::TransferResult>& completions() { return completions_; }
  EventQueue<v1::Notification>& notifications() { return notifications_; }
  // Who drains notifications(): WatchNotifications streams or one inbox (OpenInbox),
  // never both, or each would take an arbitrary share. A stream is refused
  // (FAILED_PRECONDITION) once there is an inbox; an inbox while a stream is open
  // (FAILED_PRECONDITION) or when there is one already (ALREADY_EXISTS).
  enum class NotificationReader { kStream, kInbox };
  absl::Status ClaimNotifications(NotificationReader reader);
  // A stream ended, or an inbox could not be opened after all.
  void ReleaseNotifications(NotificationReader reader);

  // Ends the session: wakes waiters and closes the event queues. Its transfers still in
  // flight stop at their next check (Transfer::StopStatus).
  void Close();
  // Lock-free: executors ask it per chunk.
  bool closed() const { return closed_.load(std::memory_order_acquire); }

 private:
  const uint64_t id_;
  const Token token_;
  const PeerCredentials creds_;
  const SessionLimits limits_;
  const TenantRule rule_;
  std::atomic<uint64_t> fabric_bytes_[kTrafficClasses] = {};

  mutable absl::Mutex mu_;
  std::atomic<bool> closed_{false};  // set under mu_, read without it
  uint64_t next_fd_handle_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, UniqueFd> fds_ ABSL_GUARDED_BY(mu_);
  // nullopt while in flight.
  absl::flat_hash_map<uint64_t, std::optional<v1::TransferResult>> transfers_ ABSL_GUARDED_BY(mu_);
  size_t inflight_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<uint64_t> finished_order_ ABSL_GUARDED_BY(mu_);
  int notification_streams_ ABSL_GUARDED_BY(mu_) = 0;
  bool inbox_ ABSL_GUARDED_BY(mu_) = false;

  EventQueue<v1::TransferResult> completions_;
  EventQueue<v1::Notification> notifications_;
};

}  // namespace ferry

#endif  // FERRY_AGENT_SESSION_SESSION_H_
