#include "agent/memory/region_table.h"

#include "absl/strings/str_cat.h"

namespace ferry {

void RegionTable::UpdateStatsLocked(const Region& r, int sign) {
  KindStats& s = r.kind() == MemoryKind::kHost ? host_ : cuda_;
  s.regions += sign;
  s.bytes += sign * static_cast<int64_t>(r.size());
}

void RegionTable::Notify(MemoryKind kind) {
  if (observer_) observer_(kind, stats(kind));
}

absl::Status RegionTable::Insert(std::shared_ptr<Region> region, size_t max_per_session) {
  MemoryKind kind = region->kind();
  {
    absl::MutexLock lock(&mu_);
    size_t& owned = per_session_[region->owner_session()];
    if (owned >= max_per_session) {
      return absl::ResourceExhaustedError(
          absl::StrCat("this session already has ", owned, " regions (--max_regions_per_session); deregister some"));
    }
    ++owned;
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
    if (--per_session_[session] == 0) per_session_.erase(session);
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
    per_session_.erase(session);
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
