#include "agent/session/session_registry.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ferry {

absl::StatusOr<std::shared_ptr<Session>> SessionRegistry::Create(const PeerCredentials& creds) {
  std::shared_ptr<Session> session;
  {
    absl::MutexLock lock(&mu_);
    if (by_id_.size() >= limits_.max_sessions) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the agent already has ", by_id_.size(), " sessions, its limit for the node (--max_sessions)"));
    }
    size_t& own = per_uid_[creds.uid];
    if (own >= limits_.max_sessions_per_uid) {
      return absl::ResourceExhaustedError(absl::StrCat("uid ", creds.uid, " already has ", own,
                                                       " sessions (--max_sessions_per_uid); close some clients"));
    }
    ++own;
    session = std::make_shared<Session>(next_id_++, creds, limits_,
                                        qos_ != nullptr ? qos_->Match(creds.uid, creds.gid) : TenantRule());
    by_id_[session->id()] = session;
  }
  if (on_open_) on_open_(*session);
  return session;
}

absl::StatusOr<std::shared_ptr<Session>> SessionRegistry::FindByToken(absl::string_view hex) const {
  absl::StatusOr<Token> token = Token::FromHex(hex, "metadata ferry-session");
  if (!token.ok()) {
    return absl::UnauthenticatedError(
        "no valid session: connect to the session socket and send its token as gRPC metadata "
        "'ferry-session' (" +
        std::string(token.status().message()) + ")");
  }
  absl::MutexLock lock(&mu_);
  // Linear in the number of sessions (bounded, small) so that every comparison is
  // constant-time; a hash lookup on the token would leak timing.
  for (const auto& [id, session] : by_id_) {
    if (session->token().Equals(*token)) return session;
  }
  return absl::UnauthenticatedError(
      "metadata ferry-session names no live session (it ended, or the agent restarted): reconnect");
}

std::shared_ptr<Session> SessionRegistry::FindById(uint64_t id) const {
  absl::MutexLock lock(&mu_);
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : it->second;
}

void SessionRegistry::Close(uint64_t id) {
  std::shared_ptr<Session> session;
  {
    absl::MutexLock lock(&mu_);
    auto it = by_id_.find(id);
    if (it == by_id_.end()) return;
    session = std::move(it->second);
    by_id_.erase(it);
    auto u = per_uid_.find(session->creds().uid);
    if (u != per_uid_.end() && --u->second == 0) per_uid_.erase(u);
  }
  session->Close();
  if (on_close_) on_close_(*session);
}

void SessionRegistry::CloseAll() {
  std::vector<uint64_t> ids;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, s] : by_id_) ids.push_back(id);
  }
  for (uint64_t id : ids) Close(id);
}

size_t SessionRegistry::size() const {
  absl::MutexLock lock(&mu_);
  return by_id_.size();
}

std::vector<std::shared_ptr<Session>> SessionRegistry::List() const {
  std::vector<std::shared_ptr<Session>> out;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, session] : by_id_) out.push_back(session);
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a->id() < b->id(); });
  return out;
}

}  // namespace ferry
