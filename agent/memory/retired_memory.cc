#include "agent/memory/retired_memory.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace ferry {

absl::Status DetachMapping(void* addr, size_t len) {
  void* p = mmap(addr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("cannot detach ", len, " bytes at ", absl::Hex(addr), ": mmap: ",
                                            strerror(errno)));
  }
  return absl::OkStatus();
}

RetiredMemory& RetiredMemory::Global() {
  static RetiredMemory* const global = new RetiredMemory();
  return *global;
}

RetiredMemory::~RetiredMemory() {
  absl::MutexLock lock(&mu_);
  for (Entry& e : entries_) std::move(e.release)();
}

void RetiredMemory::Add(absl::AnyInvocable<void() &&> release) {
  Sweep();
  std::vector<absl::AnyInvocable<void() &&>> early;
  {
    absl::MutexLock lock(&mu_);
    while (!entries_.empty() && entries_.size() >= max_pending_) {
      early.push_back(std::move(entries_.front().release));
      entries_.pop_front();
    }
    entries_.push_back({now_() + grace_, std::move(release)});
  }
  for (auto& r : early) std::move(r)();
}

size_t RetiredMemory::Sweep() {
  std::vector<absl::AnyInvocable<void() &&>> due;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = now_();
    while (!entries_.empty() && entries_.front().due <= now) {
      due.push_back(std::move(entries_.front().release));
      entries_.pop_front();
    }
  }
  for (auto& release : due) std::move(release)();  // munmap outside the lock
  return due.size();
}

size_t RetiredMemory::pending() const {
  absl::MutexLock lock(&mu_);
  return entries_.size();
}

}  // namespace ferry
