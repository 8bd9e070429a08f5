// RemoteTargets: how a write reaches a region on another agent: the connection to the
// agent a descriptor names, then the region as that agent reports it (size, kind, keys,
// staging buffer, write window). PeerTable implements it with handshakes and OpenRegion
// calls; the router's unit tests give the router their own.
//
//   absl::StatusOr<std::shared_ptr<PeerConnection>> peer = targets.Resolve(d, deadline, lookup);
//   absl::StatusOr<std::shared_ptr<RemoteRegion>> region = targets.OpenRegion(*peer, d, deadline, lookup);
//
// Contract: Resolve fails NOT_FOUND for a stale descriptor (the agent restarted) and
// UNAVAILABLE for an agent that cannot be reached; with PeerLookup::kCachedOnly, what
// would need an RPC fails with WouldBlockError (agent/common/poll_source.h) instead.
#ifndef FERRY_AGENT_PEERS_REMOTE_TARGETS_H_
#define FERRY_AGENT_PEERS_REMOTE_TARGETS_H_

#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/ferry/v1/ferry.pb.h"

namespace ferry {

class PeerConnection;
struct RemoteRegion;

// kCachedOnly: what needs an RPC (a handshake, an OpenRegion) fails with
// WouldBlockError instead, for callers that must not block.
enum class PeerLookup { kMayConnect, kCachedOnly };

class RemoteTargets {
 public:
  virtual ~RemoteTargets() = default;
  // The connection to the agent `d` names.
  virtual absl::StatusOr<std::shared_ptr<PeerConnection>> Resolve(const v1::RegionDescriptor& d, absl::Time deadline,
                                                                  PeerLookup lookup) = 0;
  // `d`'s region through `peer`, what Resolve returned for `d`.
  virtual absl::StatusOr<std::shared_ptr<RemoteRegion>> OpenRegion(const std::shared_ptr<PeerConnection>& peer,
                                                                   const v1::RegionDescriptor& d, absl::Time deadline,
                                                                   PeerLookup lookup) = 0;
};

}  // namespace ferry

#endif  // FERRY_AGENT_PEERS_REMOTE_TARGETS_H_
