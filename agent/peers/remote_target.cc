#include "agent/peers/remote_target.h"

#include "absl/strings/str_cat.h"

namespace ferry {

absl::Status ResolveRemoteTarget(PeerTable& peers, Transfer& t) {
  const v1::RegionDescriptor& d = *t.dst_descriptor;
  const PeerLookup lookup = t.cached_only ? PeerLookup::kCachedOnly : PeerLookup::kMayConnect;
  absl::StatusOr<std::shared_ptr<PeerConnection>> peer = peers.Resolve(d, t.deadline, lookup);
  if (!peer.ok()) return peer.status();
  absl::StatusOr<std::shared_ptr<RemoteRegion>> region = (*peer)->OpenRegion(d, t.deadline, lookup);
  if (!region.ok()) return region.status();
  for (size_t i = 0; i < t.plan.chunks.size(); ++i) {
    const CopyChunk& c = t.plan.chunks[i];
    if (c.dst_offset > (*region)->size || c.length > (*region)->size - c.dst_offset) {
      return absl::OutOfRangeError(absl::StrCat("destination range of chunk ", i, " [", c.dst_offset, ", +", c.length,
                                                ") is outside region ", d.region_id(), " (", (*region)->size,
                                                " bytes on its agent)"));
    }
  }
  t.peer = std::move(*peer);
  t.remote_region = std::move(*region);
  return absl::OkStatus();
}

}  // namespace ferry
