#include "agent/peers/remote_target.h"

#include "absl/strings/str_cat.h"
#include "proto/ferry/v1/grpc_status.h"

namespace ferry {

absl::Status ResolveRemoteTarget(RemoteTargets& targets, Transfer& t) {
  const v1::RegionDescriptor& d = *t.dst_descriptor;
  const PeerLookup lookup = t.cached_only ? PeerLookup::kCachedOnly : PeerLookup::kMayConnect;
  absl::StatusOr<std::shared_ptr<PeerConnection>> peer = targets.Resolve(d, t.deadline, lookup);
  if (!peer.ok()) return peer.status();
  absl::StatusOr<std::shared_ptr<RemoteRegion>> region = targets.OpenRegion(*peer, d, t.deadline, lookup);
  if (!region.ok()) return region.status();
  for (size_t i = 0; i < t.plan.size(); ++i) {
    const CopyChunk c = t.plan.chunk(i);
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

v1::NotifyRequest DeliverNotifyRequest(const v1::RegionDescriptor& d, uint64_t source_incarnation,
                                       v1::NotificationKind kind, uint64_t transfer_id, uint64_t tag, uint64_t bytes,
                                       const std::string& payload) {
  v1::NotifyRequest req;
  req.set_target_incarnation(d.agent_incarnation());
  req.set_region_id(d.region_id());
  req.set_token(d.token());
  req.set_window_id(d.window_id());
  req.set_transfer_id(transfer_id);
  req.set_source_incarnation(source_incarnation);
  req.set_tag(tag);
  req.set_bytes(bytes);
  req.set_deliver(true);
  req.set_payload(payload);
  req.set_kind(kind);
  return req;
}

void SendNotifyAsync(std::shared_ptr<PeerConnection> peer, v1::NotifyRequest req, absl::Time deadline,
                     std::function<void(absl::Status)> done) {
  // The call's context, request and response live until its callback has run.
  struct Call {
    grpc::ClientContext ctx;
    v1::NotifyRequest req;
    v1::NotifyResponse resp;
  };
  auto call = std::make_shared<Call>();
  call->req = std::move(req);
  call->ctx.set_deadline(absl::ToChronoTime(deadline));
  PeerConnection* p = peer.get();
  p->stub()->async()->Notify(&call->ctx, &call->req, &call->resp,
                             [call, peer = std::move(peer), done = std::move(done)](grpc::Status s) {
                               if (s.ok()) return done(absl::OkStatus());
                               if (s.error_code() == grpc::StatusCode::UNAVAILABLE) peer->MarkSuspect();
                               done(FromGrpcStatus(s, absl::StrCat("notifying agent ", peer->address(), " failed: ")));
                             });
}

}  // namespace ferry
