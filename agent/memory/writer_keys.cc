#include "agent/memory/writer_keys.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace ferry {

absl::Status WriterKeys::Refusal(uint64_t incarnation, const Writer& w, absl::Time now) const {
  if (now >= w.fenced_until) return absl::OkStatus();
  const std::string left =
      w.fenced_until == absl::InfiniteFuture()
          ? "for good"
          : absl::StrCat("for ", absl::FormatDuration(absl::Ceil(w.fenced_until - now, absl::Milliseconds(1))),
                         " more");
  return absl::FailedPreconditionError(absl::StrCat("writes from agent incarnation ", incarnation, " are refused ",
                                                    left, ": ", w.why, "; nothing was written"));
}

absl::StatusOr<std::vector<NicRegistration>> WriterKeys::Keys(uint64_t incarnation, const MemoryBacking& backing,
                                                              RegionRegistrar& registrar) {
  if (incarnation == 0) return absl::InvalidArgumentError("initiator_incarnation is 0: name the writing agent");
  {
    absl::MutexLock lock(&mu_);
    auto it = writers_.find(incarnation);
    if (it != writers_.end()) {
      if (absl::Status refused = Refusal(incarnation, it->second, absl::Now()); !refused.ok()) return refused;
      if (!it->second.keys.nics.empty()) return it->second.keys.nics;
    }
  }
  // Registered outside the lock: on verbs and EFA registering a large GPU region takes
  // long, and other writers' opens of this region must not wait for it. Whatever this
  // call does not keep (keys a racing open of the same writer made first, an evicted
  // writer's) closes after the lock, like Fence's.
  absl::StatusOr<RegionRegistration> made = registrar.Register(backing);
  if (!made.ok()) return made.status();
  RegionRegistration evicted;
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  auto it = writers_.find(incarnation);
  if (it != writers_.end()) {  // opened or fenced meanwhile
    if (absl::Status refused = Refusal(incarnation, it->second, now); !refused.ok()) return refused;
    if (!it->second.keys.nics.empty()) return it->second.keys.nics;
  } else {
    // Room for one more: fences past their time go, then the writer whose keys are oldest.
    size_t holding = 0;
    auto oldest = writers_.end();
    for (auto w = writers_.begin(); w != writers_.end();) {
      if (w->second.keys.nics.empty() && now >= w->second.fenced_until) {
        writers_.erase(w++);
        continue;
      }
      if (!w->second.keys.nics.empty()) {
        ++holding;
        if (oldest == writers_.end() || w->second.opened < oldest->second.opened) oldest = w;
      }
      ++w;
    }
    if (holding >= kMaxWriters && oldest != writers_.end()) {
      evicted = std::move(oldest->second.keys);
      writers_.erase(oldest);
    }
    it = writers_.try_emplace(incarnation).first;
  }
  it->second.keys = *std::move(made);
  it->second.opened = now;
  it->second.fenced_until = absl::InfinitePast();
  return it->second.keys.nics;
}

void WriterKeys::Fence(uint64_t incarnation, absl::Time until, std::string why) {
  RegionRegistration closing;  // closed after the lock: closing an MR may wait for the NIC
  absl::MutexLock lock(&mu_);
  Writer& w = writers_[incarnation];
  closing = std::move(w.keys);
  w.keys = RegionRegistration();
  if (until > w.fenced_until) {
    w.fenced_until = until;
    w.why = std::move(why);
  }
}

absl::Status WriterKeys::Admit(uint64_t incarnation) const {
  absl::MutexLock lock(&mu_);
  auto it = writers_.find(incarnation);
  return it == writers_.end() ? absl::OkStatus() : Refusal(incarnation, it->second, absl::Now());
}

size_t WriterKeys::writers() const {
  absl::MutexLock lock(&mu_);
  return writers_.size();
}

}  // namespace ferry
