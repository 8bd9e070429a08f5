// RegionTable: every region registered with this agent, by id.
//
//   RegionTable table;
//   uint64_t id = table.NextId();
//   RegionQuota quota{.per_session = 4096, .per_uid = 16384, .total = 32768};
//   absl::Status room = table.Admits(session, uid, quota);   // before mapping anything
//   table.Insert(std::make_shared<Region>(id, session, Token::Random(), std::move(backing)), uid, quota);
//   absl::StatusOr<std::shared_ptr<Region>> r = table.Lookup(id);
//   table.Remove(id, session);           // only the owner may remove
//   table.RemoveSession(session);        // when a session ends
//
// Removing a region drops the table's reference; the memory goes when the last
// operation holding the region finishes (see region.h).
#ifndef FERRY_AGENT_MEMORY_REGION_TABLE_H_
#define FERRY_AGENT_MEMORY_REGION_TABLE_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "agent/memory/region.h"

namespace ferry {

// How many regions one session, one pod (its sessions' uid) and the whole node may have.
// Each region is at least one mapping in the agent, and the kernel's vm.max_map_count
// (65,530 by default) is one pool for all of them: the per-uid and total bounds keep one
// pod from taking the mappings every other pod's RegisterMemory needs.
struct RegionQuota {
  size_t per_session = SIZE_MAX;
  size_t per_uid = SIZE_MAX;
  size_t total = SIZE_MAX;
};

class RegionTable {
 public:
  struct KindStats {
    uint64_t regions = 0;
    uint64_t bytes = 0;
  };
  // Called with (kind, stats of that kind) after every change, for metrics.
  using Observer = std::function<void(MemoryKind, KindStats)>;

  explicit RegionTable(Observer observer = nullptr) : observer_(std::move(observer)) {}

  uint64_t NextId() { return next_id_.fetch_add(1); }

  // OK when one more region of `session` (whose peer is `uid`) fits `quota`; else
  // RESOURCE_EXHAUSTED naming the flag of the bound it would pass.
  absl::Status Admits(uint64_t session, uid_t uid, const RegionQuota& quota) const;
  // Adds `region` when it fits `quota` (the same check as Admits, under the same lock).
  absl::Status Insert(std::shared_ptr<Region> region, uid_t uid = 0, const RegionQuota& quota = {});
  // NOT_FOUND if no region has this id.
  absl::StatusOr<std::shared_ptr<Region>> Lookup(uint64_t id) const;
  // NOT_FOUND if unknown, PERMISSION_DENIED if `session` does not own it.
  absl::Status Remove(uint64_t id, uint64_t session);
  // Removes every region of `session`; returns how many.
  size_t RemoveSession(uint64_t session);

  size_t size() const;
  uint64_t total_bytes() const;
  KindStats stats(MemoryKind kind) const;

 private:
  struct Owner {
    uid_t uid = 0;
    size_t regions = 0;
  };
  absl::Status AdmitsLocked(uint64_t session, uid_t uid, const RegionQuota& quota) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets `n` regions of `session`.
  void ReleaseLocked(uint64_t session, size_t n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateStatsLocked(const Region& r, int sign) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Notify(MemoryKind kind);

  std::atomic<uint64_t> next_id_{1};
  Observer observer_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Region>> regions_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Owner> per_session_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uid_t, size_t> per_uid_ ABSL_GUARDED_BY(mu_);
  KindStats host_ ABSL_GUARDED_BY(mu_);
  KindStats cuda_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry

#endif  // FERRY_AGENT_MEMORY_REGION_TABLE_H_
