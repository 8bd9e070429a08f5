// SessionRegistry: the live sessions of this agent, by id and by token.
//
//   SessionRegistry registry(limits, /*on_close=*/[&](Session& s) { regions.RemoveSession(s.id()); });
//   absl::StatusOr<std::shared_ptr<Session>> s = registry.Create(creds);  // within the limits
//   absl::StatusOr<std::shared_ptr<Session>> found = registry.FindByToken(hex_from_metadata);
//   registry.Close(s->id());   // runs on_close once, then Session::Close()
#ifndef FERRY_AGENT_SESSION_SESSION_REGISTRY_H_
#define FERRY_AGENT_SESSION_SESSION_REGISTRY_H_

#include <functional>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "agent/session/session.h"

namespace ferry {

class SessionRegistry {
 public:
  using Callback = std::function<void(Session&)>;

  // `on_open` / `on_close` run outside the registry lock (for metrics and reclaiming).
  // `qos`: the policy whose rule each new session gets (null: the default rule); it
  // outlives the registry.
  SessionRegistry(SessionLimits limits, Callback on_close, Callback on_open = nullptr, const QosPolicy* qos = nullptr)
      : limits_(limits), on_close_(std::move(on_close)), on_open_(std::move(on_open)), qos_(qos) {}

  // RESOURCE_EXHAUSTED (naming the flag) when the node already has limits.max_sessions
  // sessions, or the peer's uid limits.max_sessions_per_uid.
  absl::StatusOr<std::shared_ptr<Session>> Create(const PeerCredentials& creds);
  // UNAUTHENTICATED when the token names no live session.
  absl::StatusOr<std::shared_ptr<Session>> FindByToken(absl::string_view hex) const;
  std::shared_ptr<Session> FindById(uint64_t id) const;
  void Close(uint64_t id);
  void CloseAll();
  size_t size() const;
  // The live sessions, by id.
  std::vector<std::shared_ptr<Session>> List() const;

 private:
  const SessionLimits limits_;
  Callback on_close_;
  Callback on_open_;
  const QosPolicy* const qos_;
  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Session>> by_id_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uid_t, size_t> per_uid_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry

#endif  // FERRY_AGENT_SESSION_SESSION_REGISTRY_H_
