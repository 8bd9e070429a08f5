// RetiredMemory: memory a region no longer owns, kept harmless until no provider can
// still be writing into it.
//
// A software provider (tcp, shm, rxm over them) copies an incoming RMA write into the
// target buffer piece by piece, across many progress calls. Closing the MR refuses the
// writes that arrive after it, not one whose header the provider has already accepted:
// its remaining bytes still go to the old address. So when a region goes, the agent
//
//   1. detaches its mapping of the client's pages (DetachMapping: the range becomes
//      private anonymous memory in one mmap(MAP_FIXED), never unmapped in between), so
//      that a late write neither faults nor reaches the client's memory, then closes the
//      region's MRs;
//   2. hands the range to RetiredMemory, which unmaps it only after `grace`, so that no
//      region mapped later can be given the same addresses while a late write may still
//      land there.
//
//   RetiredMemory& retired = RetiredMemory::Global();
//   if (DetachMapping(addr, len).ok()) retired.Add([addr, len] { munmap(addr, len); });
//
// Hardware providers (verbs, efa) stop DMA at deregistration; for them this costs only
// the address range for `grace`. Pages a late write touches are the only memory it
// costs (MAP_NORESERVE).
#ifndef FERRY_AGENT_MEMORY_RETIRED_MEMORY_H_
#define FERRY_AGENT_MEMORY_RETIRED_MEMORY_H_

#include <cstddef>
#include <deque>
#include <functional>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ferry {

// Replaces the pages of [addr, addr + len) (page-aligned, currently mapped) with zeroed
// private anonymous memory, atomically. INTERNAL with errno text if mmap refuses.
absl::Status DetachMapping(void* addr, size_t len);

class RetiredMemory {
 public:
  // Far longer than one provider message takes to arrive (at most --fabric_max_op_bytes,
  // 4 MiB by default). A peer that stalls in the middle of a message for longer than
  // this is not covered: the provider would still hold the old address.
  static constexpr absl::Duration kDefaultGrace = absl::Seconds(60);
  // Each retired range is a mapping of its own, and the kernel allows a process ~65,000
  // (vm.max_map_count): past this many, the oldest is released before its grace. A pod
  // registering and deregistering in a loop shortens the grace (to ~4 s at 1,000
  // regions a second) instead of exhausting the agent's mappings.
  static constexpr size_t kDefaultMaxPending = 4096;

  // The process's instance (regions are freed from any thread, late writes land in the
  // process's address space). Never destroyed.
  static RetiredMemory& Global();

  explicit RetiredMemory(absl::Duration grace = kDefaultGrace, std::function<absl::Time()> now = absl::Now,
                         size_t max_pending = kDefaultMaxPending)
      : grace_(grace), now_(std::move(now)), max_pending_(max_pending) {}
  // Releases everything still held, grace or not (tests; process exit needs nothing).
  ~RetiredMemory();

  // Runs `release` at the first Add or Sweep after `grace` has passed (or earlier, the
  // oldest first, when more than `max_pending` are held); first releases whatever is
  // due. There is no timer: until the next region retires, what is due stays held
  // (address space, and only the pages late writes touched).
  void Add(absl::AnyInvocable<void() &&> release);
  // Releases what is due; returns how many.
  size_t Sweep();
  size_t pending() const;

 private:
  struct Entry {
    absl::Time due;
    absl::AnyInvocable<void() &&> release;
  };
  // Takes out what is due, and the oldest beyond `keep`.
  std::vector<absl::AnyInvocable<void() &&>> TakeLocked(size_t keep) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const absl::Duration grace_;
  const std::function<absl::Time()> now_;
  const size_t max_pending_;
  mutable absl::Mutex mu_;
  std::deque<Entry> entries_ ABSL_GUARDED_BY(mu_);  // in `due` order
};

}  // namespace ferry

#endif  // FERRY_AGENT_MEMORY_RETIRED_MEMORY_H_
