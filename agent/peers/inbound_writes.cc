#include "agent/peers/inbound_writes.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "agent/common/thread_name.h"

namespace ferry {
namespace {

// Ends remembered per writing agent before their begins arrive, and how long an agent
// with no write in flight keeps its entry (for such an early end).
constexpr size_t kMaxEarlyEnds = 1024;
constexpr absl::Duration kIdleSource = absl::Seconds(10);

}  // namespace

InboundWrites::InboundWrites(InboundWritesOptions options, TransferManager* transfers)
    : options_(options), transfers_(transfers) {}

void InboundWrites::StartProbing(Ping ping) {
  ping_ = std::move(ping);
  {
    absl::MutexLock lock(&mu_);
    probing_ = true;  // orders ping_ before Check's reads of it
  }
  if (options_.run_thread) thread_ = std::thread([this] { Run(); });
}

InboundWrites::~InboundWrites() { StopProbing(); }

void InboundWrites::StopProbing() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    probing_ = false;
  }
  if (thread_.joinable()) thread_.join();
}

absl::Status InboundWrites::Begin(const v1::NotifyRequest& req, const std::shared_ptr<Region>& region) {
  if (req.transfer_id() == 0 || req.source_incarnation() == 0 || req.source_address().empty()) {
    return absl::InvalidArgumentError("a write's begin needs transfer_id, source_incarnation and source_address");
  }
  const absl::Time now = options_.clock->Now();
  absl::MutexLock lock(&mu_);
  Source& s = sources_[req.source_incarnation()];
  s.address = req.source_address();
  s.last_activity = now;
  if (s.ended_early.erase(req.transfer_id()) > 0) return absl::OkStatus();  // its end came first
  if (writes_ >= options_.max_writes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("this agent holds ", writes_, " writes in flight into its regions, its most"));
  }
  auto [it, inserted] = s.writes.try_emplace(req.transfer_id());
  if (!inserted) return absl::OkStatus();  // announced twice
  Write& w = it->second;
  w.region = region;
  w.tag = req.tag();
  w.payload = req.payload();
  w.begun = now;
  w.deadline = now + (req.timeout_ms() > 0 ? absl::Milliseconds(req.timeout_ms()) : absl::Hours(1));
  w.window_id = req.window_id();
  if (w.window_id != 0) ++per_window_[w.window_id];
  ++writes_;
  return absl::OkStatus();
}

void InboundWrites::Forget(const Write& w) {
  --writes_;
  if (w.window_id == 0) return;
  auto it = per_window_.find(w.window_id);
  if (it != per_window_.end() && --it->second == 0) per_window_.erase(it);
}

size_t InboundWrites::InWindow(uint64_t window_id) const {
  absl::MutexLock lock(&mu_);
  auto it = per_window_.find(window_id);
  return it == per_window_.end() ? 0 : it->second;
}

void InboundWrites::End(uint64_t source_incarnation, uint64_t transfer_id) {
  absl::MutexLock lock(&mu_);
  Source& s = sources_[source_incarnation];
  s.last_activity = options_.clock->Now();
  if (auto w = s.writes.find(transfer_id); w != s.writes.end()) {
    Forget(w->second);
    s.writes.erase(w);
    return;
  }
  if (s.ended_early.insert(transfer_id).second) {
    s.ended_order.push_back(transfer_id);
    if (s.ended_order.size() > kMaxEarlyEnds) {
      s.ended_early.erase(s.ended_order.front());
      s.ended_order.pop_front();
    }
  }
}

void InboundWrites::Check(absl::Time now) {
  std::vector<std::pair<uint64_t, std::string>> due;  // incarnation, address
  std::vector<Lost> lost;
  {
    absl::MutexLock lock(&mu_);
    if (!probing_) return;
    for (auto it = sources_.begin(); it != sources_.end();) {
      Source& s = it->second;
      absl::Time oldest = absl::InfiniteFuture();
      for (auto w = s.writes.begin(); w != s.writes.end();) {
        if (now > w->second.deadline + options_.grace) {
          Forget(w->second);
          lost.push_back({std::move(w->second), w->first, it->first,
                          absl::DeadlineExceededError(
                              absl::StrCat("agent ", s.address, " never said how its write ended, ",
                                           absl::FormatDuration(options_.grace), " after the write's deadline"))});
          w = s.writes.erase(w);
          continue;
        }
        oldest = std::min(oldest, w->second.begun);
        ++w;
      }
      if (s.writes.empty()) {
        if (now - s.last_activity > kIdleSource) {
          sources_.erase(it++);
          continue;
        }
      } else if (now - oldest >= options_.probe_after && now - s.last_probe >= options_.probe_every) {
        s.last_probe = now;
        due.emplace_back(it->first, s.address);
      }
      ++it;
    }
  }
  for (const auto& [incarnation, address] : due) {
    absl::StatusOr<uint64_t> answer = ping_(address, options_.probe_timeout);
    absl::MutexLock lock(&mu_);
    auto it = sources_.find(incarnation);
    if (it == sources_.end()) continue;
    Source& s = it->second;
    absl::Status why;
    if (answer.ok() && *answer == incarnation) {
      s.failed_pings = 0;
      continue;
    }
    if (answer.ok()) {
      why = absl::UnavailableError(absl::StrCat("agent ", address, ", which was writing into this region, restarted"));
    } else if (++s.failed_pings < options_.lost_after_failures) {
      continue;
    } else {
      why = absl::UnavailableError(absl::StrCat("agent ", address, ", which was writing into this region, stopped ",
                                                "answering (", s.failed_pings, " pings: ", answer.status().message(),
                                                ")"));
    }
    for (auto& [id, w] : s.writes) {
      Forget(w);
      lost.push_back({std::move(w), id, incarnation, why});
    }
    sources_.erase(it);  // that incarnation sends nothing more
  }
  Tell(std::move(lost), now);
}

void InboundWrites::Tell(std::vector<Lost> lost, absl::Time now) {
  for (Lost& l : lost) {
    std::shared_ptr<Region> region = l.write.region.lock();
    if (region == nullptr) continue;  // deregistered since: nobody waits on it
    v1::Notification n;
    n.set_region_id(region->id());
    n.set_tag(l.write.tag);
    n.set_transfer_id(l.transfer_id);
    n.set_source_incarnation(l.source_incarnation);
    n.set_payload(std::move(l.write.payload));
    n.set_kind(v1::NOTIFICATION_KIND_WRITE);
    n.set_code(static_cast<int>(l.status.code()));
    // The writer is fenced first, so that a writer's agent that was only stopped cannot go
    // on writing once it resumes: through a write window, the window closes (its keys
    // revoked); otherwise that agent's own keys of the region close and it is refused new
    // ones until the write's deadline has passed (after which its agent writes none of it).
    if (l.write.window_id != 0 && fence_ && fence_(l.write.window_id)) {
      n.set_message(absl::StrCat(l.status.message(), ": write ", l.transfer_id, " will not complete; its write window ",
                                 l.write.window_id,
                                 " is closed, so no further operation of it is accepted (one the NIC was already "
                                 "receiving may still finish); some, all or none of its bytes may be in the region"));
    } else if (l.write.window_id == 0) {
      const absl::Duration left = std::max(l.write.deadline - now, absl::ZeroDuration());
      region->writers().Fence(l.source_incarnation, absl::Now() + left + options_.grace,
                              absl::StrCat("its write ", l.transfer_id, " into region ", region->id(),
                                           " was declared lost (", l.status.message(), ")"));
      n.set_message(absl::StrCat(l.status.message(), ": write ", l.transfer_id,
                                 " will not complete; its writer's keys of this region are revoked and it is refused "
                                 "until the write's deadline, so no further operation of it is accepted (one the NIC "
                                 "was already receiving may still finish); some, all or none of its bytes may be in "
                                 "the region"));
    } else {
      n.set_message(absl::StrCat(l.status.message(), ": write ", l.transfer_id,
                                 " will not complete; some, all or none of its bytes may be in the region"));
    }
    transfers_->Notify(*region, n).IgnoreError();  // counted there when the owner's queue is full
  }
}

void InboundWrites::Run() {
  NameThisThread("ferry-inbound");
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      // Idle (no write held): wake for the first begin, or to forget idle agents.
      auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || writes_ > 0; };
      mu_.AwaitWithTimeout(absl::Condition(&wake), kIdleSource);
      if (stopping_) return;
    }
    Check(options_.clock->Now());
    absl::MutexLock lock(&mu_);
    auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
    mu_.AwaitWithTimeout(absl::Condition(&stop), options_.probe_every / 2);
    if (stopping_) return;
  }
}

size_t InboundWrites::size() const {
  absl::MutexLock lock(&mu_);
  return writes_;
}

size_t InboundWrites::sources() const {
  absl::MutexLock lock(&mu_);
  return sources_.size();
}

}  // namespace ferry
