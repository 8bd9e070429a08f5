// ReceiveReports: the bytes this agent's writes delivered into each remote region
// without a notification, added up between reports. One-sided writes are invisible to
// the agent they land on, so the writer counts them for it (per region, per NIC) and
// reports them now and then (a Notify with deliver=false: the target's receive
// counters, no notification to the region's owner).
//
//   ReceiveReports reports(self_incarnation);
//   reports.Add(transfer, peer, nic_bytes);        // each un-notified write, as it lands
//   for (ReceiveReports::Report& r : reports.Take()) Send(r.peer, r.request);  // once a second
//
// Thread-safe.
#ifndef FERRY_AGENT_ENGINE_RECEIVE_REPORTS_H_
#define FERRY_AGENT_ENGINE_RECEIVE_REPORTS_H_

#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "agent/peers/peer_table.h"
#include "agent/transfer/transfer.h"
#include "proto/ferry/v1/peer.pb.h"

namespace ferry {

class ReceiveReports {
 public:
  // `incarnation`: this agent's, named in each report as its source.
  explicit ReceiveReports(uint64_t incarnation) : incarnation_(incarnation) {}

  struct Report {
    std::shared_ptr<PeerConnection> peer;
    v1::NotifyRequest request;  // deliver=false; bytes and nic_bytes of every write added
  };

  // `t` (with its dst_descriptor) landed on `peer`; `nic_bytes`: what arrived through
  // each of the peer's NICs. Reports of a region keep the first write's NIC count.
  void Add(const Transfer& t, const std::shared_ptr<PeerConnection>& peer, const std::vector<uint64_t>& nic_bytes);
  // What was added since the last call, a report per (peer, region); leaves none.
  std::vector<Report> Take();

 private:
  const uint64_t incarnation_;
  absl::Mutex mu_;
  std::map<std::pair<const PeerConnection*, uint64_t>, Report> pending_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry

#endif  // FERRY_AGENT_ENGINE_RECEIVE_REPORTS_H_
