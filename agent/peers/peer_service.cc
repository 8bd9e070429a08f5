#include "agent/peers/peer_service.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "agent/common/grpc_status.h"
#include "agent/common/log.h"
#include "agent/common/token.h"
#include "agent/peers/peer_table.h"

namespace ferry {

PeerService::PeerService(uint64_t incarnation, std::vector<FabricNic*> nics, RegionTable* regions,
                         TransferManager* transfers, Metrics* metrics)
    : incarnation_(incarnation), nics_(std::move(nics)), regions_(regions), transfers_(transfers), metrics_(metrics) {
  for (FabricNic* nic : nics_) rx_bytes_.push_back(&metrics_->transfer_bytes("rx", "fabric", nic->name()));
}

grpc::Status PeerService::Reply(const char* api, const absl::Status& s) {
  if (!s.ok()) metrics_->errors(api, StatusCodeName(static_cast<int>(s.code()))).Increment();
  return ToGrpcStatus(s);
}

grpc::Status PeerService::Handshake(grpc::ServerContext*, const v1::HandshakeRequest* req,
                                    v1::HandshakeResponse* resp) {
  if (req->protocol_version() != kPeerProtocolVersion) {
    return Reply("peer.Handshake", absl::FailedPreconditionError(absl::StrCat("peer protocol ", req->protocol_version(),
                                                                              " is not supported (this agent speaks ",
                                                                              kPeerProtocolVersion, ")")));
  }
  resp->set_protocol_version(kPeerProtocolVersion);
  resp->set_incarnation(incarnation_);
  resp->set_provider(nics_.empty() ? "" : nics_[0]->provider());
  for (FabricNic* nic : nics_) {
    resp->add_fabric_addresses(nic->address());
    if (nic->latency_lane_of() >= 0) resp->set_latency_lanes(resp->latency_lanes() + 1);
  }
  resp->set_fabric_messages(!nics_.empty() &&
                            std::all_of(nics_.begin(), nics_.end(), [](FabricNic* n) { return n->messages(); }));
  return grpc::Status::OK;
}

absl::StatusOr<std::shared_ptr<Region>> PeerService::Authorize(uint64_t incarnation, uint64_t region_id,
                                                               const std::string& token) {
  if (incarnation != incarnation_) {
    return absl::NotFoundError(absl::StrCat("stale descriptor: this agent is incarnation ", incarnation_,
                                            ", the descriptor names ", incarnation, " (the agent restarted)"));
  }
  absl::StatusOr<Token> t = Token::FromBytes(token, "token");
  if (!t.ok()) return t.status();
  absl::StatusOr<std::shared_ptr<Region>> region = regions_->Lookup(region_id);
  if (!region.ok()) {
    return absl::NotFoundError(
        absl::StrCat("dst.region_id ", region_id, " is not registered (it was deregistered or its owner exited)"));
  }
  if (!(*region)->token().Equals(*t)) {
    return absl::PermissionDeniedError(absl::StrCat("dst.token does not match region ", region_id));
  }
  return region;
}

grpc::Status PeerService::OpenRegion(grpc::ServerContext*, const v1::OpenRegionRequest* req,
                                     v1::OpenRegionResponse* resp) {
  absl::StatusOr<std::shared_ptr<Region>> region = Authorize(req->target_incarnation(), req->region_id(), req->token());
  if (!region.ok()) return Reply("peer.OpenRegion", region.status());
  const std::vector<NicRegistration>& regs = (*region)->nics();
  resp->set_size((*region)->size());
  resp->set_kind((*region)->kind() == MemoryKind::kHost ? v1::MEMORY_KIND_HOST : v1::MEMORY_KIND_CUDA);
  if (staging_ != nullptr && staging_->NeedsStaging(**region)) {
    absl::StatusOr<v1::StagingBuffer> buffer =
        staging_->Open(*region, {req->initiator_incarnation(), req->initiator_address()});
    if (!buffer.ok()) return Reply("peer.OpenRegion", buffer.status());
    *resp->mutable_staging() = std::move(*buffer);
    return grpc::Status::OK;
  }
  if ((*region)->kind() == MemoryKind::kCuda && regs.size() != nics_.size()) {
    return Reply("peer.OpenRegion",
                 absl::FailedPreconditionError(
                     "the destination is GPU memory, which the target's NICs cannot reach and which it cannot stage"));
  }
  if (regs.size() != nics_.size()) {
    return Reply("peer.OpenRegion", absl::FailedPreconditionError("region is not registered with the fabric"));
  }
  for (const NicRegistration& r : regs) {
    v1::RemoteKey* k = resp->add_keys();
    k->set_key(r.key);
    k->set_base(r.remote_base);
  }
  return grpc::Status::OK;
}

grpc::Status PeerService::Notify(grpc::ServerContext*, const v1::NotifyRequest* req, v1::NotifyResponse*) {
  return Reply("peer.Notify", Accept(*req, "rpc"));
}

void PeerService::AcceptMessage(absl::string_view bytes) {
  v1::NotifyRequest req;
  absl::Status s = req.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))
                       ? Accept(req, "fabric_message")
                       : absl::InvalidArgumentError(
                             absl::StrCat("a fabric message of ", bytes.size(), " bytes is no NotifyRequest"));
  // Nobody waits for an answer: what went wrong is counted and logged here.
  if (!s.ok()) {
    Reply("peer.NotifyMessage", s);  // counts it
    FERRY_LOG(WARNING) << "notification by fabric message refused: " << s;
  }
}

absl::Status PeerService::Accept(const v1::NotifyRequest& req, const char* via) {
  absl::StatusOr<std::shared_ptr<Region>> region = Authorize(req.target_incarnation(), req.region_id(), req.token());
  if (!region.ok()) return region.status();
  // Counted only for a caller holding the region's token: nobody else can skew them.
  for (int i = 0; i < req.nic_bytes_size() && i < static_cast<int>(rx_bytes_.size()); ++i) {
    rx_bytes_[i]->Increment(static_cast<double>(req.nic_bytes(i)));
  }
  if (req.payload().size() > kMaxNotifyPayloadBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("payload is ", req.payload().size(), " bytes; at most ", kMaxNotifyPayloadBytes));
  }
  if (req.begin()) {
    if (inbound_ == nullptr) return absl::UnimplementedError("this agent holds no announced writes");
    return inbound_->Begin(req, *region);
  }
  const bool message = req.kind() == v1::NOTIFICATION_KIND_MESSAGE;
  if (req.deliver() && !message && inbound_ != nullptr) inbound_->End(req.source_incarnation(), req.transfer_id());
  if (req.deliver()) {
    metrics_->peer_notifications(via).Increment();
    v1::Notification n;
    n.set_region_id(req.region_id());
    n.set_tag(req.tag());
    n.set_transfer_id(req.transfer_id());
    n.set_source_incarnation(req.source_incarnation());
    n.set_bytes(req.bytes());
    n.set_payload(req.payload());
    n.set_code(req.code());
    n.set_message(req.message());
    n.set_kind(message ? v1::NOTIFICATION_KIND_MESSAGE : v1::NOTIFICATION_KIND_WRITE);
    absl::Status delivered = transfers_->Notify(
        **region, n, message ? TransferManager::SenderKey(req.source_incarnation(), req.source_uid()) : 0);
    // A message's sender learns it was not delivered; a write's bytes landed regardless.
    if (message) return delivered;
  }
  return absl::OkStatus();
}

grpc::Status PeerService::Ping(grpc::ServerContext*, const v1::PingRequest*, v1::PingResponse* resp) {
  resp->set_incarnation(incarnation_);
  return grpc::Status::OK;
}

grpc::Status PeerService::CommitStaged(grpc::ServerContext*, const v1::CommitStagedRequest* req,
                                       v1::CommitStagedResponse*) {
  absl::StatusOr<std::shared_ptr<Region>> region = Authorize(req->target_incarnation(), req->region_id(), req->token());
  if (!region.ok()) return Reply("peer.CommitStaged", region.status());
  if (staging_ == nullptr) {
    return Reply("peer.CommitStaged", absl::FailedPreconditionError("this agent stages no regions"));
  }
  return Reply("peer.CommitStaged", staging_->Commit(*region, req->staging_id(), req->chunks()));
}

}  // namespace ferry
