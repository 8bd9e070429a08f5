// SlotPool: a buffer cut into equal slots, lent out one at a time with a deadline.
//
//   SlotPool slots(/*buffer_bytes=*/32 << 20, /*max_slot_bytes=*/1 << 20);  // 32 slots
//   absl::StatusOr<int> slot = slots.Acquire(deadline);
//   if (!slot.ok()) return slot.status();       // DEADLINE_EXCEEDED: every slot stayed busy
//   Fill(buffer + slots.offset(*slot), slots.slot_bytes());
//   ...                                          // later, maybe on another thread:
//   slots.Release(*slot);
//
// The staged path's pipeline: every stage of a transfer holds a slot of the local and of
// the target's staging buffer while it is copied, written and committed, so several
// stages (of one transfer or of several) are in flight at once without sharing bytes.
#ifndef FERRY_AGENT_COMMON_SLOT_POOL_H_
#define FERRY_AGENT_COMMON_SLOT_POOL_H_

#include <algorithm>
#include <cstdint>
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

}  // namespace ferry

#endif  // FERRY_AGENT_COMMON_SLOT_POOL_H_
