#include "agent/engine/receive_reports.h"

namespace ferry {

void ReceiveReports::Add(const Transfer& t, const std::shared_ptr<PeerConnection>& peer,
                         const std::vector<uint64_t>& nic_bytes) {
  const v1::RegionDescriptor& d = *t.dst_descriptor;
  absl::MutexLock lock(&mu_);
  Report& r = pending_[{peer.get(), d.region_id()}];
  if (r.peer == nullptr) {
    r.peer = peer;
    r.request.set_target_incarnation(d.agent_incarnation());
    r.request.set_region_id(d.region_id());
    r.request.set_window_id(d.window_id());
    r.request.set_token(d.token());
    r.request.set_source_incarnation(incarnation_);
    r.request.mutable_nic_bytes()->Resize(static_cast<int>(nic_bytes.size()), 0);
  }
  r.request.set_bytes(r.request.bytes() + t.plan.total_bytes);
  for (size_t i = 0; i < nic_bytes.size() && i < static_cast<size_t>(r.request.nic_bytes_size()); ++i) {
    r.request.set_nic_bytes(static_cast<int>(i), r.request.nic_bytes(static_cast<int>(i)) + nic_bytes[i]);
  }
}

std::vector<ReceiveReports::Report> ReceiveReports::Take() {
  std::map<std::pair<const PeerConnection*, uint64_t>, Report> taken;
  {
    absl::MutexLock lock(&mu_);
    taken.swap(pending_);
  }
  std::vector<Report> out;
  out.reserve(taken.size());
  for (auto& [key, report] : taken) out.push_back(std::move(report));
  return out;
}

}  // namespace ferry
