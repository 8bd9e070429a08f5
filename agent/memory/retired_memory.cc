#include "agent/memory/retired_memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace ferry {

absl::Status DetachMapping(void* addr, size_t len) {
  void* p = mmap(addr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    return absl::InternalError(
        absl::StrCat("cannot detach ", len, " bytes at ", absl::Hex(addr), ": mmap: ", strerror(errno)));
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

std::vector<absl::AnyInvocable<void() &&>> RetiredMemory::TakeLocked(size_t keep) {
  std::vector<absl::AnyInvocable<void() &&>> out;
  const absl::Time now = now_();
  while (!entries_.empty() && (entries_.front().due <= now || entries_.size() > keep)) {
    out.push_back(std::move(entries_.front().release));
    entries_.pop_front();
  }
  return out;
}

void RetiredMemory::Add(absl::AnyInvocable<void() &&> release) {
  std::vector<absl::AnyInvocable<void() &&>> released;
  {
    absl::MutexLock lock(&mu_);
    released = TakeLocked(std::max<size_t>(max_pending_, 1) - 1);  // room for this one
    entries_.push_back({now_() + grace_, std::move(release)});
  }
  for (auto& r : released) std::move(r)();  // munmap outside the lock
}

size_t RetiredMemory::Sweep() {
  std::vector<absl::AnyInvocable<void() &&>> released;
  {
    absl::MutexLock lock(&mu_);
    released = TakeLocked(SIZE_MAX);
  }
  for (auto& r : released) std::move(r)();
  return released.size();
}

size_t RetiredMemory::pending() const {
  absl::MutexLock lock(&mu_);
  return entries_.size();
}

}  // namespace ferry
