// ResolveRemoteTarget: a transfer's remote destination, from its descriptor to the peer
// agent and the region as that agent reports it.
//
//   absl::Status s = ResolveRemoteTarget(targets, t);   // sets t.peer and t.remote_region
//
// The router calls it once per transfer when it decides the path; the engine calls it
// again only to write a transfer anew after a dropped connection (fresh keys). The
// chunks' destination ranges are checked against the region's size as its own agent
// reports it, not the descriptor's claim. With t.cached_only, a peer or region that
// needs an RPC to another agent fails with WouldBlockError instead.
#ifndef FERRY_AGENT_PEERS_REMOTE_TARGET_H_
#define FERRY_AGENT_PEERS_REMOTE_TARGET_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "agent/peers/peer_table.h"
#include "agent/peers/remote_targets.h"
#include "agent/transfer/transfer.h"

namespace ferry {

absl::Status ResolveRemoteTarget(RemoteTargets& targets, Transfer& t);

// The peer Notify that has `d`'s agent deliver a Notification (deliver = true) to the
// region's owner: after a write landed (kind WRITE, its transfer id and bytes) or for a
// message (kind MESSAGE, no transfer, 0 bytes).
v1::NotifyRequest DeliverNotifyRequest(const v1::RegionDescriptor& d, uint64_t source_incarnation,
                                       v1::NotificationKind kind, uint64_t transfer_id, uint64_t tag, uint64_t bytes,
                                       const std::string& payload);

// Sends `req` to `peer` without blocking; `done` gets the outcome, with the agent named,
// on a gRPC thread.
void SendNotifyAsync(std::shared_ptr<PeerConnection> peer, v1::NotifyRequest req, absl::Time deadline,
                     std::function<void(absl::Status)> done);

}  // namespace ferry

#endif  // FERRY_AGENT_PEERS_REMOTE_TARGET_H_
