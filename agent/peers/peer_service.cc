#include "agent/peers/peer_service.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "agent/common/log.h"
#include "agent/common/status_macros.h"
#include "agent/common/token.h"
#include "agent/peers/peer_table.h"
#include "proto/ferry/v1/grpc_status.h"

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
                                                               const std::string& token, uint64_t window_id) {
  FERRY_ASSIGN_OR_RETURN(Token t, ParseToken(incarnation, token));
  return Authorize(region_id, t, window_id);
}

absl::StatusOr<Token> PeerService::ParseToken(uint64_t incarnation, const std::string& token) const {
  if (incarnation != incarnation_) {
    return absl::NotFoundError(absl::StrCat("stale descriptor: this agent is incarnation ", incarnation_,
                                            ", the descriptor names ", incarnation, " (the agent restarted)"));
  }
  return Token::FromBytes(token, "token");
}

absl::StatusOr<std::shared_ptr<Region>> PeerService::Authorize(uint64_t region_id, const Token& t, uint64_t window_id) {
  absl::StatusOr<std::shared_ptr<Region>> region = regions_->Lookup(region_id);
  if (!region.ok()) {
    return absl::NotFoundError(
        absl::StrCat("dst.region_id ", region_id, " is not registered (it was deregistered or its owner exited)"));
  }
  if (window_id != 0) {
    if (windows_ == nullptr) return absl::NotFoundError(absl::StrCat("dst.window_id ", window_id, " is not open"));
    FERRY_RETURN_IF_ERROR(windows_->Verify(window_id, t, region_id));
    return region;
  }
  if (!(*region)->token().Equals(t)) {
    return absl::PermissionDeniedError(absl::StrCat("dst.token does not match region ", region_id));
  }
  return region;
}

absl::StatusOr<PeerService::WriteAccess> PeerService::AuthorizeWrite(uint64_t incarnation, uint64_t region_id,
                                                                     const std::string& token, uint64_t window_id,
                                                                     bool tell_owner) {
  FERRY_ASSIGN_OR_RETURN(Token t, ParseToken(incarnation, token));
  absl::StatusOr<std::shared_ptr<Region>> region = Authorize(region_id, t, window_id);
  if (!region.ok()) return region.status();
  WriteAccess access{*std::move(region), std::nullopt};
  if (window_id != 0) {
    FERRY_ASSIGN_OR_RETURN(WindowAdmission admitted, windows_->Admit(window_id, t, region_id));
    access.window.emplace(std::move(admitted));
  } else if (access.region->write_windows()) {
    absl::Status refused = WindowModeError(region_id);
    // An OpenRegion asks for keys, and a queue's destination is opened ahead of its
    // writes: only a commit is a write to tell the owner of.
    if (windows_ != nullptr && tell_owner) windows_->Refuse(*access.region, 0, refused);
    return refused;
  }
  return access;
}

grpc::Status PeerService::OpenRegion(grpc::ServerContext*, const v1::OpenRegionRequest* req,
                                     v1::OpenRegionResponse* resp) {
  absl::StatusOr<WriteAccess> access =
      AuthorizeWrite(req->target_incarnation(), req->region_id(), req->token(), req->window_id(),
                     /*tell_owner=*/false);
  if (!access.ok()) return Reply("peer.OpenRegion", access.status());
  const std::shared_ptr<Region>& region = access->region;
  std::vector<NicRegistration> regs = region->nics();
  if (access->window.has_value()) {
    const WriteWindow& w = access->window->window();
    if (!w.writer().any() && w.writer().incarnation != req->initiator_incarnation()) {
      absl::Status refused =
          absl::PermissionDeniedError(absl::StrCat("write window ", w.id(), " is for a writer on agent incarnation ",
                                                   w.writer().incarnation, ", not on this one; nothing was written"));
      windows_->Refuse(*region, w.id(), refused);
      return Reply("peer.OpenRegion", refused);
    }
    for (const ByteSpan& r : w.ranges()) {
      v1::ByteRange* out = resp->add_window_ranges();
      out->set_offset(r.offset);
      out->set_length(r.length);
    }
    resp->set_window_writer_incarnation(w.writer().incarnation);
    resp->set_window_writer_region_id(w.writer().region_id);
    const int64_t ttl_ms = absl::ToInt64Milliseconds(w.deadline() - absl::Now());
    resp->set_window_ttl_ms(static_cast<uint32_t>(std::clamp<int64_t>(ttl_ms, 0, UINT32_MAX)));
    if (!region->nics().empty()) {  // fabric keys of the window alone
      absl::StatusOr<std::vector<NicRegistration>> keys = windows_->Keys(w, *region);
      if (!keys.ok()) return Reply("peer.OpenRegion", keys.status());
      regs = *std::move(keys);
    }
  }
  const uint64_t writer = req->initiator_incarnation();
  const bool own_keys = !access->window.has_value() && writer != 0;  // older agents send no incarnation
  if (own_keys) {  // a writer whose write was declared lost is refused for a while
    if (absl::Status fenced = region->writers().Admit(writer); !fenced.ok()) return Reply("peer.OpenRegion", fenced);
  }
  resp->set_size(region->size());
  resp->set_kind(region->kind() == MemoryKind::kHost ? v1::MEMORY_KIND_HOST : v1::MEMORY_KIND_CUDA);
  if (staging_ != nullptr && staging_->NeedsStaging(*region)) {
    absl::StatusOr<v1::StagingBuffer> buffer =
        staging_->Open(region, {req->initiator_incarnation(), req->initiator_address()});
    if (!buffer.ok()) return Reply("peer.OpenRegion", buffer.status());
    *resp->mutable_staging() = std::move(*buffer);
    return grpc::Status::OK;
  }
  if (region->kind() == MemoryKind::kCuda && regs.size() != nics_.size()) {
    return Reply("peer.OpenRegion",
                 absl::FailedPreconditionError(
                     "the destination is GPU memory, which the target's NICs cannot reach and which it cannot stage"));
  }
  if (regs.size() != nics_.size()) {
    return Reply("peer.OpenRegion", absl::FailedPreconditionError("region is not registered with the fabric"));
  }
  if (own_keys && registrar_ != nullptr && !regs.empty()) {  // keys InboundWrites can take away from this writer
    absl::StatusOr<std::vector<NicRegistration>> keys = region->writers().Keys(writer, region->backing(), *registrar_);
    if (!keys.ok()) return Reply("peer.OpenRegion", keys.status());
    regs = *std::move(keys);
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
  absl::StatusOr<std::shared_ptr<Region>> region =
      Authorize(req.target_incarnation(), req.region_id(), req.token(), req.window_id());
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
  if (req.kind() == v1::NOTIFICATION_KIND_WINDOW_REFUSED) {  // the writer's agent refused a write
    if (req.window_id() == 0) return absl::InvalidArgumentError("a window refusal names no window");
    windows_->Refuse(**region, req.window_id(), absl::Status(static_cast<absl::StatusCode>(req.code()), req.message()));
    return absl::OkStatus();
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
  absl::StatusOr<WriteAccess> access =
      AuthorizeWrite(req->target_incarnation(), req->region_id(), req->token(), req->window_id(),
                     /*tell_owner=*/true);
  if (!access.ok()) return Reply("peer.CommitStaged", access.status());
  if (staging_ == nullptr) {
    return Reply("peer.CommitStaged", absl::FailedPreconditionError("this agent stages no regions"));
  }
  if (access->window.has_value()) {  // every chunk inside the window, before any is copied
    const WriteWindow& w = access->window->window();
    for (int i = 0; i < req->chunks_size(); ++i) {
      const v1::Chunk& c = req->chunks(i);
      if (c.length() == 0 || !w.Covers(c.dst_offset(), c.length())) {
        absl::Status outside = absl::OutOfRangeError(
            absl::StrCat("chunks[", i, "]: [", c.dst_offset(), ", +", c.length(), ") is outside write window ", w.id(),
                         " of region ", req->region_id(), "; nothing of this stage was written"));
        windows_->Refuse(*access->region, w.id(), outside);
        return Reply("peer.CommitStaged", outside);
      }
    }
  }
  // The admission, held until the stage's bytes are in, keeps a Close waiting for them.
  return Reply("peer.CommitStaged", staging_->Commit(access->region, req->staging_id(), req->chunks()));
}

}  // namespace ferry
