#include "agent/memory/region_table.h"

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"

namespace ferry {

void RegionTable::UpdateStatsLocked(const Region& r, int sign) {
  KindStats& s = r.kind() == MemoryKind::kHost ? host_ : cuda_;
  s.regions += sign;
  s.bytes += sign * static_cast<int64_t>(r.size());
}

void RegionTable::Notify(MemoryKind kind) {
  if (observer_) observer_(kind, stats(kind));
}

absl::Status RegionTable::AdmitsLocked(uint64_t session, uid_t uid, const RegionQuota& quota) const {
  auto s = per_session_.find(session);
  const size_t own = s == per_session_.end() ? 0 : s->second.regions;
  if (own >= quota.per_session) {
    return absl::ResourceExhaustedError(
        absl::StrCat("this session already has ", own, " regions (--max_regions_per_session); deregister some"));
  }
  auto u = per_uid_.find(uid);
  const size_t pod = u == per_uid_.end() ? 0 : u->second;
  if (pod >= quota.per_uid) {
    return absl::ResourceExhaustedError(absl::StrCat("uid ", uid, " already has ", pod,
                                                     " regions over its sessions (--max_regions_per_uid); deregister "
                                                     "some or end idle sessions"));
  }
  if (regions_.size() >= quota.total) {
    return absl::ResourceExhaustedError(absl::StrCat("the agent already holds ", regions_.size(),
                                                     " regions, its limit for the node (--max_regions); try again "
                                                     "after other pods deregister"));
  }
  return absl::OkStatus();
}

absl::Status RegionTable::Admits(uint64_t session, uid_t uid, const RegionQuota& quota) const {
  absl::MutexLock lock(&mu_);
  return AdmitsLocked(session, uid, quota);
}

void RegionTable::ReleaseLocked(uint64_t session, size_t n) {
  auto s = per_session_.find(session);
  if (s == per_session_.end() || n == 0) return;
  auto u = per_uid_.find(s->second.uid);
  if (u != per_uid_.end() && (u->second -= n) == 0) per_uid_.erase(u);
  if ((s->second.regions -= n) == 0) per_session_.erase(s);
}

absl::Status RegionTable::Insert(std::shared_ptr<Region> region, uid_t uid, const RegionQuota& quota) {
  MemoryKind kind = region->kind();
  {
    absl::MutexLock lock(&mu_);
    FERRY_RETURN_IF_ERROR(AdmitsLocked(region->owner_session(), uid, quota));
    Owner& owner = per_session_[region->owner_session()];
    owner.uid = uid;
    ++owner.regions;
    ++per_uid_[uid];
    UpdateStatsLocked(*region, +1);
    regions_[region->id()] = std::move(region);
  }
  Notify(kind);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Region>> RegionTable::Lookup(uint64_t id) const {
  absl::MutexLock lock(&mu_);
  auto it = regions_.find(id);
  if (it == regions_.end()) {
    return absl::NotFoundError(absl::StrCat("region ", id, " is not registered with this agent"));
  }
  return it->second;
}

absl::Status RegionTable::Remove(uint64_t id, uint64_t session) {
  std::shared_ptr<Region> doomed;  // released outside the lock: unmapping can be slow
  {
    absl::MutexLock lock(&mu_);
    auto it = regions_.find(id);
    if (it == regions_.end()) {
      return absl::NotFoundError(absl::StrCat("region_id ", id, " is not registered with this agent"));
    }
    if (it->second->owner_session() != session) {
      return absl::PermissionDeniedError(absl::StrCat("region_id ", id, " belongs to another session"));
    }
    doomed = std::move(it->second);
    regions_.erase(it);
    UpdateStatsLocked(*doomed, -1);
    ReleaseLocked(session, 1);
  }
  Notify(doomed->kind());
  return absl::OkStatus();
}

size_t RegionTable::RemoveSession(uint64_t session) {
  std::vector<std::shared_ptr<Region>> doomed;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = regions_.begin(); it != regions_.end();) {
      if (it->second->owner_session() == session) {
        UpdateStatsLocked(*it->second, -1);
        doomed.push_back(std::move(it->second));
        regions_.erase(it++);
      } else {
        ++it;
      }
    }
    ReleaseLocked(session, doomed.size());
  }
  if (!doomed.empty()) {
    Notify(MemoryKind::kHost);
    Notify(MemoryKind::kCuda);
  }
  return doomed.size();
}

size_t RegionTable::size() const {
  absl::MutexLock lock(&mu_);
  return regions_.size();
}

uint64_t RegionTable::total_bytes() const {
  absl::MutexLock lock(&mu_);
  return host_.bytes + cuda_.bytes;
}

RegionTable::KindStats RegionTable::stats(MemoryKind kind) const {
  absl::MutexLock lock(&mu_);
  return kind == MemoryKind::kHost ? host_ : cuda_;
}

}  // namespace ferry
