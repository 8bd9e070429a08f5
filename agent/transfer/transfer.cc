#include "agent/transfer/transfer.h"

#include <utility>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "agent/common/check.h"

namespace ferry {

const char* PathLabel(v1::TransferPath path) {
  switch (path) {
    case v1::TRANSFER_PATH_LOCAL:
      return "local";
    case v1::TRANSFER_PATH_FABRIC:
      return "fabric";
    case v1::TRANSFER_PATH_STAGED:
      return "staged";
    default:
      return "unknown";
  }
}

TransferManager::TransferManager(uint64_t incarnation, Metrics* metrics, SessionRegistry* sessions,
                                 RegionTable* regions)
    : incarnation_(incarnation), metrics_(metrics), sessions_(sessions), regions_(regions) {
  for (v1::TransferPath p : {v1::TRANSFER_PATH_LOCAL, v1::TRANSFER_PATH_FABRIC, v1::TRANSFER_PATH_STAGED}) {
    const char* label = PathLabel(p);
    path_metrics_[p] = {&metrics->transfers_total(label, "OK"), &metrics->transfer_duration(label)};
  }
  local_tx_ = &metrics->transfer_bytes("tx", PathLabel(v1::TRANSFER_PATH_LOCAL), "none");
  local_rx_ = &metrics->transfer_bytes("rx", PathLabel(v1::TRANSFER_PATH_LOCAL), "none");
}

absl::Status Transfer::Stopped(absl::Time now, absl::string_view when) const {
  if (now > deadline) return absl::DeadlineExceededError(absl::StrCat("transfer ", id, " passed its deadline", when));
  if (session != nullptr && session->closed()) {
    return absl::AbortedError(absl::StrCat("transfer ", id, " stopped", when, ": the writing pod's session ended"));
  }
  return absl::OkStatus();
}

void TransferManager::Finish(const Transfer& t, const absl::Status& status) {
  FERRY_DCHECK(!t.finished.exchange(true)) << "transfer " << t.id << " finished twice (" << status << ")";
  const absl::Duration elapsed = absl::Now() - t.submitted;
  const char* path = PathLabel(t.path);
  const PathMetrics* m = t.path > 0 && t.path < kPaths ? &path_metrics_[t.path] : nullptr;
  if (status.ok() && m != nullptr) {
    m->ok->Increment();
  } else {
    metrics_->transfers_total(path, StatusCodeName(static_cast<int>(status.code()))).Increment();
  }
  (m != nullptr ? *m->duration : metrics_->transfer_duration(path)).Observe(absl::ToDoubleSeconds(elapsed));
  (status.ok() ? completed_ : failed_).fetch_add(1);
  if (status.ok() && t.path != v1::TRANSFER_PATH_LOCAL && t.session != nullptr) {
    t.session->AddFabricBytes(t.share.traffic_class, t.plan.total_bytes);
  }
  if (status.ok() && t.path == v1::TRANSFER_PATH_LOCAL) {
    // Node-local: this agent both sends and receives; no NIC is involved.
    local_tx_->Increment(static_cast<double>(t.plan.total_bytes));
    local_rx_->Increment(static_cast<double>(t.plan.total_bytes));
  }
  inflight_.fetch_sub(1);

  v1::TransferResult result;
  result.set_transfer_id(t.id);
  result.set_code(static_cast<int>(status.code()));
  result.set_message(std::string(status.message()));
  result.set_bytes(status.ok() ? t.plan.total_bytes : 0);
  result.set_duration_ns(absl::ToInt64Nanoseconds(elapsed));
  result.set_path(t.path);
  result.set_tag(t.tag);
  // Notify the receiver before the writer learns of completion, so a writer that tells
  // the receiver out of band never races its notification. A failed write notifies too
  // (with its status): the receiver is not left waiting for it.
  if (t.notify && t.dst != nullptr) {
    v1::Notification n;
    n.set_region_id(t.dst->id());
    n.set_tag(t.tag);
    n.set_transfer_id(t.id);
    n.set_source_incarnation(incarnation_);
    n.set_bytes(status.ok() ? t.plan.total_bytes : 0);
    n.set_payload(t.notify_payload);
    n.set_kind(v1::NOTIFICATION_KIND_WRITE);
    n.set_code(static_cast<int>(status.code()));
    n.set_message(std::string(status.message()));
    // The write's result stands whether or not its receiver is still there to hear.
    Notify(*t.dst, n).IgnoreError();
  }
  if (t.on_result) {
    t.on_result(result);
  } else {
    t.session->FinishTransfer(result);
  }
}

uint64_t TransferManager::SenderKey(uint64_t incarnation, uint32_t uid) {
  return absl::Hash<std::pair<uint64_t, uint32_t>>{}({incarnation, uid}) | 1;
}

absl::Status TransferManager::Notify(const Region& region, const v1::Notification& n, uint64_t sender) {
  std::shared_ptr<Session> owner = sessions_->FindById(region.owner_session());
  if (owner == nullptr) {  // the receiver is gone; its region goes with it
    return absl::UnavailableError(absl::StrCat("the owner of region ", region.id(), " has ended its session"));
  }
  if (!owner->notifications().Push(n, sender)) {
    metrics_->notifications_dropped().Increment();
    notifications_lost_.fetch_add(1, std::memory_order_relaxed);
    return absl::ResourceExhaustedError(absl::StrCat(
        "the owner of region ", region.id(), " is not reading its notifications and its queue is full",
        sender != 0 ? " (or holds this pod's share of it: a quarter, --max_queued_notification_bytes)" : ""));
  }
  metrics_->notifications().Increment();
  return absl::OkStatus();
}

}  // namespace ferry
