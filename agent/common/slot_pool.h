// SlotPool: a buffer cut into equal slots, lent out one at a time with a deadline.
//
//   SlotPool slots(/*buffer_bytes=*/32 << 20, /*max_slot_bytes=*/1 << 20);  // 32 slots
//   absl::StatusOr<int> slot = slots.Acquire(deadline);
//   if (!slot.ok()) return slot.status();       // DEADLINE_EXCEEDED: every slot stayed busy
//   Fill(buffer + slots.offset(*slot), slots.slot_bytes());
//   ...                                          // later, maybe on another thread:
//   slots.Release(*slot);
//
// Or held by a SlotLease, which gives the slot back when it goes (every early return of
// the code that took it), or sooner with Release():
//
//   absl::StatusOr<SlotLease> lease = SlotLease::Acquire(pool, deadline);
//   Fill(buffer + lease->offset(), pool->slot_bytes());
//
// The staged path's pipeline: every stage of a transfer holds a slot of the local and of
// the target's staging buffer while it is copied, written and committed, so several
// stages (of one transfer or of several) are in flight at once without sharing bytes.
#ifndef FERRY_AGENT_COMMON_SLOT_POOL_H_
#define FERRY_AGENT_COMMON_SLOT_POOL_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ferry {

class SlotPool {
 public:
  // As many slots of at most `max_slot_bytes` as fit in `buffer_bytes` (at least one,
  // of the whole buffer when it is smaller). Both must be > 0.
  SlotPool(uint64_t buffer_bytes, uint64_t max_slot_bytes)
      : slot_bytes_(std::min(buffer_bytes, max_slot_bytes)),
        slots_(static_cast<int>(buffer_bytes / slot_bytes_)),
        busy_(static_cast<size_t>(slots_), false) {}

  uint64_t slot_bytes() const { return slot_bytes_; }
  int slots() const { return slots_; }
  uint64_t offset(int slot) const { return static_cast<uint64_t>(slot) * slot_bytes_; }

  // A free slot, waiting for one until `deadline`.
  absl::StatusOr<int> Acquire(absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    auto free_slot = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return in_use_ < busy_.size(); };
    if (!mu_.AwaitWithDeadline(absl::Condition(&free_slot), deadline)) {
      return absl::DeadlineExceededError(absl::StrCat("all ", slots_, " staging slots stayed busy until the deadline"));
    }
    const size_t slot = std::find(busy_.begin(), busy_.end(), false) - busy_.begin();
    busy_[slot] = true;
    ++in_use_;
    return static_cast<int>(slot);
  }

  // Returns a slot from Acquire.
  void Release(int slot) {
    absl::MutexLock lock(&mu_);
    busy_[slot] = false;
    --in_use_;
  }

 private:
  const uint64_t slot_bytes_;
  const int slots_;  // busy_.size(), fixed: readable without the lock
  absl::Mutex mu_;
  std::vector<bool> busy_ ABSL_GUARDED_BY(mu_);
  size_t in_use_ ABSL_GUARDED_BY(mu_) = 0;
};

// One slot of a SlotPool, given back when the lease is destroyed or Release()d (which
// may come first, on any thread). Move-only; an empty lease (default, moved from,
// released) holds nothing.
class SlotLease {
 public:
  SlotLease() = default;
  // A free slot of `pool`, waiting for one until `deadline` (SlotPool::Acquire).
  static absl::StatusOr<SlotLease> Acquire(std::shared_ptr<SlotPool> pool, absl::Time deadline) {
    absl::StatusOr<int> slot = pool->Acquire(deadline);
    if (!slot.ok()) return slot.status();
    return SlotLease(std::move(pool), *slot);
  }
  SlotLease(SlotLease&& other) noexcept : pool_(std::move(other.pool_)), slot_(std::exchange(other.slot_, -1)) {}
  SlotLease& operator=(SlotLease&& other) noexcept {
    if (this != &other) {
      Release();
      pool_ = std::move(other.pool_);
      slot_ = std::exchange(other.slot_, -1);
    }
    return *this;
  }
  SlotLease(const SlotLease&) = delete;
  SlotLease& operator=(const SlotLease&) = delete;
  ~SlotLease() { Release(); }

  bool held() const { return slot_ >= 0; }
  // The slot's offset in the pool's buffer; held() only.
  uint64_t offset() const { return pool_->offset(slot_); }
  void Release() {
    if (slot_ >= 0) pool_->Release(std::exchange(slot_, -1));
  }

 private:
  SlotLease(std::shared_ptr<SlotPool> pool, int slot) : pool_(std::move(pool)), slot_(slot) {}

  std::shared_ptr<SlotPool> pool_;
  int slot_ = -1;
};

}  // namespace ferry

#endif  // FERRY_AGENT_COMMON_SLOT_POOL_H_
