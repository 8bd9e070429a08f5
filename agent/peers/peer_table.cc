#include "agent/peers/peer_table.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "agent/common/log.h"
#include "agent/common/status_macros.h"
#include "proto/ferry/v1/grpc_status.h"

namespace ferry {
namespace {

absl::Status FromRpc(const grpc::Status& s, const std::string& what) {
  absl::Status status = FromGrpcStatus(s, absl::StrCat(what, ": "));
  if (absl::IsDeadlineExceeded(status) || absl::IsCancelled(status)) {
    return absl::UnavailableError(status.message());
  }
  return status;
}

void SetDeadline(grpc::ClientContext& ctx, absl::Time deadline) {
  ctx.set_deadline(absl::ToChronoTime(std::min(deadline, absl::Now() + absl::Seconds(10))));
}

}  // namespace

absl::StatusOr<std::shared_ptr<RemoteRegion>> PeerConnection::OpenRegion(const v1::RegionDescriptor& d,
                                                                         absl::Time deadline, PeerLookup lookup) {
  absl::StatusOr<Token> token = Token::FromBytes(d.token(), "dst.token");
  if (!token.ok()) return token.status();
  const std::pair<uint64_t, uint64_t> key{d.region_id(), d.window_id()};
  {
    absl::MutexLock lock(&mu_);
    auto it = regions_.find(key);
    if (it != regions_.end() && !it->second->staging.has_value() && it->second->opened < last_drop_) {
      regions_.erase(it);
      it = regions_.end();
    }
    if (it != regions_.end()) {
      if (!it->second->token.Equals(*token)) {
        return absl::PermissionDeniedError(absl::StrCat("dst.token does not match region ", d.region_id()));
      }
      if (absl::Now() < it->second->window_expires) return it->second;
      // The window is past its time: ask its agent, which says how it ended.
      regions_.erase(it);
    }
  }
  if (lookup == PeerLookup::kCachedOnly) {
    return WouldBlockError(absl::StrCat("region ", d.region_id(), " of agent ", address_, " is not open yet"));
  }
  v1::OpenRegionRequest req;
  req.set_target_incarnation(incarnation_);
  req.set_region_id(d.region_id());
  req.set_token(d.token());
  req.set_initiator_incarnation(local_incarnation_);
  req.set_initiator_address(local_address_);
  req.set_window_id(d.window_id());
  v1::OpenRegionResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(ctx, deadline);
  const absl::Time asked = absl::Now();
  FERRY_RETURN_IF_ERROR(FromRpc(stub_->OpenRegion(&ctx, req, &resp), absl::StrCat("agent ", address_)));
  const bool staged = resp.has_staging();
  const size_t want_keys = staged ? 0 : remote_nic_count_;
  if (static_cast<size_t>(resp.keys_size()) != want_keys ||
      (staged && static_cast<size_t>(resp.staging().keys_size()) != remote_nic_count_)) {
    return absl::InternalError(absl::StrCat("agent ", address_, " returned ", resp.keys_size(), " region keys and ",
                                            resp.staging().keys_size(), " staging keys for ", remote_nic_count_,
                                            " NICs"));
  }
  if (d.window_id() != 0 && resp.window_ranges().empty()) {
    return absl::InternalError(absl::StrCat("agent ", address_, " opened window ", d.window_id(), " without ranges"));
  }
  auto region = std::make_shared<RemoteRegion>();
  region->region_id = d.region_id();
  region->size = resp.size();
  region->token = *token;
  region->kind = resp.kind();
  region->keys.assign(resp.keys().begin(), resp.keys().end());
  region->opened = asked;
  if (staged) region->staging = resp.staging();
  if (d.window_id() != 0) {
    region->window_id = d.window_id();
    for (const v1::ByteRange& r : resp.window_ranges()) region->window_ranges.push_back({r.offset(), r.length()});
    region->window_writer = {resp.window_writer_incarnation(), resp.window_writer_region_id()};
    region->window_expires = asked + absl::Milliseconds(resp.window_ttl_ms());
  }
  absl::MutexLock lock(&mu_);
  if (staged) {
    // The same buffer as before (see ForgetRegion): stages still in flight hold its slots.
    auto it = forgotten_slots_.find(resp.staging().id());
    if (it != forgotten_slots_.end()) {
      std::shared_ptr<SlotPool> slots = it->second.lock();
      absl::MutexLock slots_lock(&region->staging_mu);
      region->staging_slots = std::move(slots);
      forgotten_slots_.erase(it);
    }
    // One buffer, one pool of slots, however many windows it was opened through.
    std::weak_ptr<RemoteRegion>& owner = staging_owners_[resp.staging().id()];
    if (std::shared_ptr<RemoteRegion> first = owner.lock(); first != nullptr) {
      region->staging_owner = std::move(first);
    } else {
      owner = region;
    }
  }
  if (d.window_id() != 0) {  // windows come and go: keep only those still open
    const absl::Time now = absl::Now();
    absl::erase_if(regions_, [now](const auto& e) { return e.second->window_expires <= now; });
    absl::erase_if(staging_owners_, [](const auto& e) { return e.second.expired(); });
  }
  regions_[key] = region;
  return region;
}

void PeerConnection::ForgetRegion(uint64_t region_id, uint64_t window_id) {
  absl::MutexLock lock(&mu_);
  auto it = regions_.find(std::make_pair(region_id, window_id));
  if (it == regions_.end()) return;
  RemoteRegion& region = *it->second;
  if (region.staging.has_value() && region.staging_owner == nullptr) {
    absl::erase_if(forgotten_slots_, [](const auto& entry) { return entry.second.expired(); });
    absl::MutexLock slots_lock(&region.staging_mu);
    if (region.staging_slots != nullptr) forgotten_slots_[region.staging->id()] = region.staging_slots;
  }
  regions_.erase(it);
}

size_t PeerConnection::open_regions() const {
  absl::MutexLock lock(&mu_);
  return regions_.size();
}

PeerTable::~PeerTable() {
  absl::MutexLock lock(&mu_);
  for (auto& [addr, peer] : peers_) retired_.push_back(peer);
  for (const auto& peer : retired_) {
    for (size_t i = 0; i < nics_.size(); ++i) {
      for (size_t r = 0; r < peer->remote_nic_count(); ++r) nics_[i]->RemovePeer(peer->fi_addr(i, r));
    }
  }
}

absl::StatusOr<v1::HandshakeResponse> PeerTable::Handshake(grpc::Channel& channel, const std::string& address,
                                                           absl::Time deadline) {
  auto stub = v1::Peer::NewStub(std::shared_ptr<grpc::Channel>(&channel, [](grpc::Channel*) {}));
  v1::HandshakeRequest req;
  req.set_protocol_version(kPeerProtocolVersion);
  req.set_incarnation(self_.incarnation);
  req.set_agent_address(self_.address);
  req.set_provider(self_.provider);
  for (const std::string& a : self_.fabric_addresses) req.add_fabric_addresses(a);
  v1::HandshakeResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(ctx, deadline);
  FERRY_RETURN_IF_ERROR(FromRpc(stub->Handshake(&ctx, req, &resp), absl::StrCat("handshake with agent ", address)));
  if (resp.protocol_version() != kPeerProtocolVersion) {
    return absl::FailedPreconditionError(absl::StrCat("agent ", address, " speaks peer protocol ",
                                                      resp.protocol_version(), ", this agent ", kPeerProtocolVersion));
  }
  if (resp.provider() != self_.provider) {
    return absl::FailedPreconditionError(
        absl::StrCat("agent ", address, " uses fabric provider ", resp.provider(), ", this agent ", self_.provider));
  }
  if (resp.fabric_addresses_size() == 0) {
    return absl::FailedPreconditionError(absl::StrCat("agent ", address, " has no fabric NICs"));
  }
  if (resp.latency_lanes() != 0 && 2 * static_cast<size_t>(resp.latency_lanes()) != resp.fabric_addresses().size()) {
    return absl::FailedPreconditionError(absl::StrCat("agent ", address, " names ", resp.latency_lanes(),
                                                      " latency lanes for ", resp.fabric_addresses_size(),
                                                      " fabric addresses (one lane per NIC, or none)"));
  }
  return resp;
}

absl::StatusOr<std::shared_ptr<PeerConnection>> PeerTable::Connect(const std::string& address,
                                                                   std::shared_ptr<grpc::Channel> channel,
                                                                   const v1::HandshakeResponse& resp) {
  const size_t remote = resp.fabric_addresses_size();
  std::vector<fi_addr_t> addrs;
  addrs.reserve(nics_.size() * remote);
  for (FabricNic* nic : nics_) {
    for (const std::string& a : resp.fabric_addresses()) {
      FERRY_ASSIGN_OR_RETURN(fi_addr_t fa, nic->InsertPeer(a));
      addrs.push_back(fa);
    }
  }
  FERRY_LOG(INFO) << "peer " << address << " incarnation " << resp.incarnation() << ": "
                  << remote - resp.latency_lanes() << " NICs" << (resp.latency_lanes() > 0 ? " with latency lanes" : "")
                  << (resp.fabric_messages() ? ", fabric messages" : "");
  return std::make_shared<PeerConnection>(address, resp.incarnation(), std::move(channel), std::move(addrs), remote,
                                          resp.latency_lanes(), resp.fabric_messages(), self_.incarnation,
                                          self_.address);
}

void PeerTable::RetireLocked(const std::shared_ptr<PeerConnection>& peer) {
  // Its address-vector entries stay while ops to it may still be queued or in flight:
  // they must fail through the provider, not use a recycled fi_addr.
  peer->Retire();
  retired_.push_back(peer);
  ++retired_total_;
  if (on_retire_) on_retire_(*peer);
}

bool PeerTable::ReleaseIfUnheldLocked(const std::shared_ptr<PeerConnection>& peer) {
  // Every op and transfer to a peer holds its connection (TransferState::peer,
  // Transfer::peer), and Resolve hands it out under mu_: held by the table's one
  // reference alone, nothing can reach it again, nor any fi_addr of it.
  if (peer.use_count() > 1) return false;
  for (size_t i = 0; i < nics_.size(); ++i) {
    for (size_t r = 0; r < peer->remote_nic_count(); ++r) nics_[i]->RemovePeer(peer->fi_addr(i, r));
  }
  return true;
}

void PeerTable::ForgetHandshakeLocked(const std::string& address) {
  if (auto h = handshaking_.find(address); h != handshaking_.end() && --h->second->callers == 0) {
    handshaking_.erase(h);  // the caller's reference keeps its mutex until it unlocks it
  }
}

void PeerTable::ReleaseRetiredLocked() {
  auto released = [this](const std::shared_ptr<PeerConnection>& peer)
                      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return ReleaseIfUnheldLocked(peer); };
  retired_.erase(std::remove_if(retired_.begin(), retired_.end(), released), retired_.end());
}

size_t PeerTable::CloseIdle(absl::Time now, absl::Duration idle) {
  absl::MutexLock lock(&mu_);
  ReleaseRetiredLocked();
  size_t closed = 0;
  for (auto it = peers_.begin(); it != peers_.end();) {
    const absl::Duration unused = now - it->second->last_used();
    if (unused > idle && ReleaseIfUnheldLocked(it->second)) {
      FERRY_LOG(INFO) << "peer " << it->first << ": connection closed, unused for " << absl::FormatDuration(unused);
      peers_.erase(it++);
      ++closed;
      continue;
    }
    ++it;
  }
  idle_closed_total_ += closed;
  return closed;
}

grpc::ChannelArguments PeerTable::PeerChannelArgs(grpc::ChannelArguments args) {
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // Not GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: it is also how long one connection attempt
  // may take (20 s by default); at 100 ms a loaded node's attempts were cut short.
  return args;
}

absl::StatusOr<std::shared_ptr<PeerConnection>> PeerTable::Resolve(const v1::RegionDescriptor& d, absl::Time deadline,
                                                                   PeerLookup lookup) {
  const std::string& address = d.agent_address();
  auto usable = [&](const std::shared_ptr<PeerConnection>& p) {
    return p->incarnation() == d.agent_incarnation() && !p->NeedsHandshake();
  };
  std::shared_ptr<PeerConnection> cached;
  {
    absl::MutexLock lock(&mu_);
    auto it = peers_.find(address);
    if (it != peers_.end()) {
      if (usable(it->second)) {
        it->second->Touch(absl::Now());
        return it->second;
      }
      cached = it->second;
    }
  }
  if (lookup == PeerLookup::kCachedOnly) {
    return WouldBlockError(absl::StrCat("agent ", address, " needs a handshake"));
  }
  std::shared_ptr<Handshaking> handshaking;
  {
    absl::MutexLock lock(&mu_);
    std::shared_ptr<Handshaking>& h = handshaking_[address];
    if (h == nullptr) h = std::make_shared<Handshaking>();
    ++h->callers;
    handshaking = h;
  }
  absl::MutexLock handshake_lock(&handshaking->mu);
  {
    absl::MutexLock lock(&mu_);
    auto it = peers_.find(address);
    if (it != peers_.end() && usable(it->second)) {  // another transfer's handshake did it
      ForgetHandshakeLocked(address);
      return it->second;
    }
  }
  // The same agent (a suspect connection): its channel, which may have recovered. A new
  // incarnation, or a first contact: a new channel.
  std::shared_ptr<grpc::Channel> channel = cached && cached->incarnation() == d.agent_incarnation()
                                               ? cached->channel()
                                               : grpc::CreateCustomChannel(address, creds_, args_);
  absl::StatusOr<v1::HandshakeResponse> resp = Handshake(*channel, address, deadline);

  absl::MutexLock lock(&mu_);
  ReleaseRetiredLocked();
  ForgetHandshakeLocked(address);
  auto it = peers_.find(address);
  if (!resp.ok()) {
    // Unreachable: retire the old connection so its transfers fail now, not at their deadline.
    if (it != peers_.end()) {
      RetireLocked(it->second);
      peers_.erase(it);
    }
    return resp.status();
  }
  std::shared_ptr<PeerConnection> current;
  if (it != peers_.end() && it->second->incarnation() == resp->incarnation()) {
    current = it->second;  // same agent, connection back: keep keys and addresses
    current->Confirm();
  } else {
    if (it == peers_.end() && self_.max_peers > 0 && peers_.size() >= self_.max_peers) {
      return absl::ResourceExhaustedError(absl::StrCat("this agent is connected to ", peers_.size(),
                                                       " agents, its most (--max_peers): it cannot ",
                                                       "connect to agent ", address, " too; raise --max_peers"));
    }
    if (it != peers_.end()) {
      FERRY_LOG(INFO) << "peer " << address << " restarted (incarnation " << it->second->incarnation() << " -> "
                      << resp->incarnation() << ")";
      RetireLocked(it->second);
      peers_.erase(it);
    }
    FERRY_ASSIGN_OR_RETURN(std::shared_ptr<PeerConnection> fresh, Connect(address, channel, *resp));
    current = fresh;
    peers_[address] = current;
  }
  if (current->incarnation() != d.agent_incarnation()) {
    return absl::NotFoundError(absl::StrCat("dst is a stale descriptor: agent ", address, " now runs incarnation ",
                                            current->incarnation(), ", the descriptor names ", d.agent_incarnation(),
                                            " (the agent restarted); ask the region's owner for a new descriptor"));
  }
  current->Touch(absl::Now());
  return current;
}

std::vector<PeerTable::PeerInfo> PeerTable::List() const {
  std::vector<PeerInfo> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [addr, p] : peers_) {
    out.push_back({addr, p->incarnation(), p->suspect() ? "suspect" : "connected", p->open_regions()});
  }
  return out;
}

absl::StatusOr<uint64_t> PeerTable::Ping(const std::string& address, absl::Duration timeout) {
  // Bounds the pinged agents' channels; those still writing get theirs back at once.
  constexpr size_t kMaxPingChannels = 256;
  std::shared_ptr<grpc::Channel> channel;
  {
    absl::MutexLock lock(&mu_);
    auto peer = peers_.find(address);
    if (peer != peers_.end()) {
      channel = peer->second->channel();
    } else {
      auto kept = ping_channels_.find(address);
      if (kept == ping_channels_.end()) {
        if (ping_channels_.size() >= kMaxPingChannels) ping_channels_.clear();
        kept = ping_channels_.emplace(address, grpc::CreateCustomChannel(address, creds_, args_)).first;
      }
      channel = kept->second;
    }
  }
  std::unique_ptr<v1::Peer::Stub> stub = v1::Peer::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  v1::PingResponse resp;
  grpc::Status s = stub->Ping(&ctx, v1::PingRequest(), &resp);
  if (!s.ok()) return FromGrpcStatus(s, absl::StrCat("ping of agent ", address, ": "));
  return resp.incarnation();
}

PeerTable::StateCounts PeerTable::Count() {
  StateCounts c;
  absl::MutexLock lock(&mu_);
  ReleaseRetiredLocked();
  for (const auto& [addr, p] : peers_) ++(p->suspect() ? c.suspect : c.connected);
  c.retired = retired_total_;
  c.draining = retired_.size();
  c.idle_closed = idle_closed_total_;
  return c;
}

}  // namespace ferry
