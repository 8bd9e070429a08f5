// ResolveRemoteTarget: a transfer's remote destination, from its descriptor to the peer
// agent and the region as that agent reports it.
//
//   absl::Status s = ResolveRemoteTarget(peers, t);   // sets t.peer and t.remote_region
//
// The router calls it once per transfer when it decides the path; the engine calls it
// again only to write a transfer anew after a dropped connection (fresh keys). The
// chunks' destination ranges are checked against the region's size as its own agent
// reports it, not the descriptor's claim. With t.cached_only, a peer or region that
// needs an RPC to another agent fails with WouldBlockError instead.
#ifndef FERRY_AGENT_PEERS_REMOTE_TARGET_H_
#define FERRY_AGENT_PEERS_REMOTE_TARGET_H_

#include "absl/status/status.h"
#include "agent/peers/peer_table.h"
#include "agent/transfer/transfer.h"

namespace ferry {

absl::Status ResolveRemoteTarget(PeerTable& peers, Transfer& t);

}  // namespace ferry

#endif  // FERRY_AGENT_PEERS_REMOTE_TARGET_H_
