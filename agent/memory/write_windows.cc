#include "agent/memory/write_windows.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "agent/common/thread_name.h"

namespace ferry {
namespace {

// How many closed windows are remembered to answer a late write precisely.
constexpr size_t kRememberClosed = 4096;

// The first range of `a` that shares a byte with one of `b` (both sorted, merged).
const ByteSpan* FirstOverlap(const std::vector<ByteSpan>& a, const std::vector<ByteSpan>& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (a[i].end() <= b[j].offset) {
      ++i;
    } else if (b[j].end() <= a[i].offset) {
      ++j;
    } else {
      return &a[i];
    }
  }
  return nullptr;
}

}  // namespace

absl::Status WindowModeError(uint64_t region_id) {
  absl::Status s = absl::FailedPreconditionError(
      absl::StrCat("dst: region ", region_id,
                   " takes writes only through write windows its owner opens (it was registered with write_windows); "
                   "write with a window's descriptor; nothing was written"));
  s.SetPayload(kWindowModePayload, absl::Cord());
  return s;
}

bool SpansCover(const std::vector<ByteSpan>& ranges, uint64_t offset, uint64_t length) {
  // The last range starting at or before `offset`.
  auto it = std::upper_bound(ranges.begin(), ranges.end(), offset,
                             [](uint64_t o, const ByteSpan& r) { return o < r.offset; });
  if (it == ranges.begin()) return false;
  --it;
  return length <= it->end() - offset && offset < it->end();
}

bool WriteWindow::HasRegion(uint64_t region_id) const {
  for (const auto& r : regions_) {
    if (r->id() == region_id) return true;
  }
  return false;
}

void WriteWindow::Release() {
  absl::MutexLock lock(&mu_);
  --active_;
}

WriteWindows::WriteWindows(RegionTable* regions, Refused refused) : regions_(regions), refused_(std::move(refused)) {
  thread_ = std::thread([this] { Run(); });
}

WriteWindows::~WriteWindows() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

absl::StatusOr<std::shared_ptr<const WriteWindow>> WriteWindows::Open(uint64_t session, const WindowSpec& spec) {
  if (spec.region_ids.empty() || spec.region_ids.size() > kMaxWindowRegions) {
    return absl::InvalidArgumentError(
        absl::StrCat("region_ids: give 1..", kMaxWindowRegions, " regions, got ", spec.region_ids.size()));
  }
  if (spec.ranges.empty() || spec.ranges.size() > kMaxWindowRanges) {
    return absl::InvalidArgumentError(
        absl::StrCat("ranges: give 1..", kMaxWindowRanges, " byte ranges, got ", spec.ranges.size()));
  }
  if (spec.timeout <= absl::ZeroDuration()) return absl::InvalidArgumentError("timeout_ms must be >= 1");
  if (!spec.writer.any() && spec.writer.region_id == 0) {
    return absl::InvalidArgumentError("writer.region_id must be >= 1 when a writer is given");
  }
  std::vector<ByteSpan> ranges = spec.ranges;
  for (size_t i = 0; i < ranges.size(); ++i) {
    if (ranges[i].length == 0 || ranges[i].offset + ranges[i].length < ranges[i].offset) {
      return absl::InvalidArgumentError(absl::StrCat("ranges[", i, "]: length must be >= 1 and offset + length ",
                                                     "must not overflow, got [", ranges[i].offset, ", +",
                                                     ranges[i].length, ")"));
    }
  }
  std::sort(ranges.begin(), ranges.end(), [](const ByteSpan& a, const ByteSpan& b) { return a.offset < b.offset; });
  std::vector<ByteSpan> merged;  // adjacent ranges join; overlapping ones are a mistake
  for (const ByteSpan& r : ranges) {
    if (!merged.empty() && r.offset < merged.back().end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("ranges: [", r.offset, ", +", r.length, ") overlaps a range ending at ", merged.back().end()));
    }
    if (!merged.empty() && r.offset == merged.back().end()) {
      merged.back().length += r.length;
    } else {
      merged.push_back(r);
    }
  }
  const uint64_t end = merged.back().end();

  std::vector<std::shared_ptr<Region>> regions;
  for (size_t i = 0; i < spec.region_ids.size(); ++i) {
    const uint64_t id = spec.region_ids[i];
    absl::StatusOr<std::shared_ptr<Region>> r = regions_->Lookup(id);
    if (!r.ok() || (*r)->owner_session() != session) {
      return absl::NotFoundError(
          absl::StrCat("region_ids[", i, "]: region ", id, " is not registered by this session"));
    }
    if (!(*r)->write_windows()) {
      return absl::FailedPreconditionError(
          absl::StrCat("region_ids[", i, "]: region ", id, " was not registered with write_windows"));
    }
    if (end > (*r)->size()) {
      return absl::OutOfRangeError(
          absl::StrCat("ranges: they reach byte ", end, ", past region ", id, " (", (*r)->size(), " bytes)"));
    }
    for (const auto& seen : regions) {
      if (seen->id() == id) return absl::InvalidArgumentError(absl::StrCat("region_ids: region ", id, " twice"));
    }
    regions.push_back(*std::move(r));
  }

  absl::MutexLock lock(&mu_);
  // Two open windows over the same bytes would let two writers fill them. A window's
  // ranges apply to each of its regions, so two windows sharing any region are compared
  // once: a decode step's windows all name the same 64 layer halves, and comparing them
  // region by region made opening the step's N windows cost N^2 x 64 range walks.
  const uint64_t stamp = ++opens_;  // marks the windows this call compared (a set of them cost more than the rest)
  for (const auto& r : regions) {
    auto over = over_region_.find(r->id());
    if (over == over_region_.end()) continue;
    for (const WriteWindow* other : over->second) {
      if (other->compared_in_open_ == stamp) continue;
      other->compared_in_open_ = stamp;
      if (const ByteSpan* shared = FirstOverlap(merged, other->ranges()); shared != nullptr) {
        return absl::FailedPreconditionError(absl::StrCat("ranges: [", shared->offset, ", +", shared->length,
                                                          ") of region ", r->id(), " is in open write window ",
                                                          other->id(), "; close it first"));
      }
    }
  }
  size_t& held = per_session_[session];
  if (held >= kMaxWindowsPerSession) {
    return absl::ResourceExhaustedError(
        absl::StrCat("this session has ", held, " write windows open, the most one may hold; close some first"));
  }
  auto w =
      std::shared_ptr<WriteWindow>(new WriteWindow(next_id_++, session, Token::Random(), spec.writer,
                                                   absl::Now() + spec.timeout, std::move(regions), std::move(merged)));
  ++held;
  open_[w->id()] = w;
  for (const auto& r : w->regions()) over_region_[r->id()].push_back(w.get());
  return w;
}

void WriteWindows::CloseLocked(const std::shared_ptr<WriteWindow>& w, const char* why) {
  open_.erase(w->id());
  for (const auto& r : w->regions()) {
    auto over = over_region_.find(r->id());
    if (over == over_region_.end()) continue;
    std::vector<const WriteWindow*>& list = over->second;
    list.erase(std::remove(list.begin(), list.end(), w.get()), list.end());
    if (list.empty()) over_region_.erase(over);
  }
  auto held = per_session_.find(w->owner_session());
  if (held != per_session_.end() && --held->second == 0) per_session_.erase(held);
  closed_[w->id()] = Closed{w->token(), absl::Now(), why, w->owner_session(), w};
  closed_order_.push_back(w->id());
  if (closed_order_.size() > kRememberClosed) {
    closed_.erase(closed_order_.front());
    closed_order_.pop_front();
  }
  absl::MutexLock window_lock(&w->mu_);
  w->closed_ = true;
  w->keys_.clear();  // closes the fabric registrations: a write with them fails at the NIC
}

absl::Status WriteWindows::Close(uint64_t window_id, uint64_t session, absl::Duration wait) {
  std::shared_ptr<WriteWindow> w;
  {
    absl::MutexLock lock(&mu_);
    auto it = open_.find(window_id);
    auto closed = it == open_.end() ? closed_.find(window_id) : closed_.end();
    if (it != open_.end() && it->second->owner_session() == session) {
      w = it->second;
      CloseLocked(w, "closed by its owner");
    } else if (closed != closed_.end() && closed->second.owner_session == session) {
      // Closed already (by its owner, its deadline, the agent): wait for what still moves.
      w = closed->second.window.lock();
    } else {
      return absl::NotFoundError(absl::StrCat("window_id ", window_id, " is not a write window of this session"));
    }
  }
  const absl::Time deadline = absl::Now() + wait;
  if (WriteWindow* closed = w.get(); closed != nullptr) {
    absl::MutexLock window_lock(&closed->mu_);
    auto idle = [closed]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(closed->mu_) { return closed->active_ == 0; };
    if (!closed->mu_.AwaitWithDeadline(absl::Condition(&idle), deadline)) {
      return absl::DeadlineExceededError(absl::StrCat("window ", window_id, " is closed, but ", closed->active_,
                                                      " writes through it were still copying after wait_ms; its "
                                                      "ranges may still change until they end: close it again to "
                                                      "wait"));
    }
  }
  // Fabric writes whose agents announced them: their keys are revoked, so each either
  // landed already or fails; its agent says which, and only then is it over.
  size_t announced = announced_ ? announced_(window_id) : 0;
  while (announced > 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
    announced = announced_(window_id);
  }
  if (announced == 0) return absl::OkStatus();
  return absl::DeadlineExceededError(absl::StrCat("window ", window_id, " is closed, but ", announced,
                                                  " writes other agents announced through it had not ended after "
                                                  "wait_ms; close it again to wait"));
}

void WriteWindows::CloseSession(uint64_t session) {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<WriteWindow>> mine;
  for (const auto& [id, w] : open_) {
    if (w->owner_session() == session) mine.push_back(w);
  }
  for (const auto& w : mine) CloseLocked(w, "closed when its session ended");
}

bool WriteWindows::Revoke(uint64_t window_id, const char* why) {
  absl::MutexLock lock(&mu_);
  auto it = open_.find(window_id);
  if (it == open_.end()) return false;
  CloseLocked(std::shared_ptr<WriteWindow>(it->second), why);
  return true;
}

absl::StatusOr<WindowAdmission> WriteWindows::Admit(uint64_t id, const Token& token, uint64_t region_id) {
  std::shared_ptr<WriteWindow> w;
  {
    absl::ReleasableMutexLock lock(&mu_);
    auto it = open_.find(id);
    if (it != open_.end()) w = it->second;
    if (w == nullptr) {
      auto closed = closed_.find(id);
      if (closed == closed_.end() || !closed->second.token.Equals(token)) {
        return absl::NotFoundError(absl::StrCat("dst.window_id ", id, " is not an open write window"));
      }
      absl::Status why = absl::FailedPreconditionError(
          absl::StrCat("write window ", id, " was ", closed->second.why, " ",
                       absl::FormatDuration(absl::Now() - closed->second.when), " ago; nothing was written"));
      lock.Release();
      if (absl::StatusOr<std::shared_ptr<Region>> r = regions_->Lookup(region_id); r.ok()) Refuse(**r, id, why);
      return why;
    }
  }
  if (!w->token().Equals(token)) {
    return absl::PermissionDeniedError(absl::StrCat("dst.token does not match write window ", id));
  }
  std::shared_ptr<Region> region;
  for (const auto& r : w->regions()) {
    if (r->id() == region_id) region = r;
  }
  if (region == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("write window ", id, " does not cover region ", region_id, "; use the window's own descriptors"));
  }
  {
    absl::MutexLock window_lock(&w->mu_);
    if (!w->closed_ && absl::Now() < w->deadline()) {
      ++w->active_;
      return WindowAdmission(std::move(w));
    }
  }
  absl::Status why =
      absl::FailedPreconditionError(absl::StrCat("write window ", id, " was closed or expired; nothing was written"));
  Refuse(*region, id, why);
  return why;
}

absl::Status WriteWindows::Verify(uint64_t id, const Token& token, uint64_t region_id) const {
  absl::MutexLock lock(&mu_);
  if (auto it = open_.find(id); it != open_.end()) {
    if (it->second->token().Equals(token) && it->second->HasRegion(region_id)) return absl::OkStatus();
  } else if (auto closed = closed_.find(id); closed != closed_.end() && closed->second.token.Equals(token)) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat("token does not match write window ", id, " of region ", region_id));
}

void WriteWindows::Refuse(const Region& region, uint64_t window_id, const absl::Status& why) const {
  if (refused_) refused_(region, window_id, why);
}

absl::StatusOr<std::vector<NicRegistration>> WriteWindows::Keys(const WriteWindow& const_w, const Region& region) {
  auto& w = const_cast<WriteWindow&>(const_w);  // only keys_, under its lock
  if (registrar_ == nullptr) return absl::FailedPreconditionError("this agent has no fabric");
  absl::MutexLock lock(&w.mu_);
  if (w.closed_) return absl::FailedPreconditionError(absl::StrCat("write window ", w.id(), " was closed"));
  auto it = w.keys_.find(region.id());
  if (it == w.keys_.end()) {
    const uint64_t begin = w.ranges().front().offset;
    absl::StatusOr<RegionRegistration> reg =
        registrar_->RegisterRange(region.backing(), begin, w.ranges().back().end() - begin);
    if (!reg.ok()) return reg.status();
    it = w.keys_.emplace(region.id(), *std::move(reg)).first;
  }
  return it->second.nics;
}

size_t WriteWindows::open() const {
  absl::MutexLock lock(&mu_);
  return open_.size();
}

void WriteWindows::Run() {
  NameThisThread("ferry-windows");
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    // Revokes expired windows' keys; admissions check deadlines themselves.
    const absl::Time now = absl::Now();
    std::vector<std::shared_ptr<WriteWindow>> due;
    for (const auto& [id, w] : open_) {
      if (w->deadline() <= now) due.push_back(w);
    }
    for (const auto& w : due) CloseLocked(w, "expired");
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Milliseconds(100));
  }
}

}  // namespace ferry
