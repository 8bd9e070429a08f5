#include "agent/engine/fabric_engine.h"

#include <algorithm>
#include <iterator>

#include "absl/cleanup/cleanup.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "agent/common/check.h"
#include "agent/common/log.h"
#include "agent/common/status_macros.h"
#include "agent/common/thread_name.h"
#include "agent/peers/remote_target.h"
#include "agent/topology/cpu_list.h"

namespace ferry {

absl::StatusOr<std::unique_ptr<FabricEngine>> FabricEngine::Create(const FabricEngineOptions& options,
                                                                   Metrics* metrics) {
  if (options.ifaces.empty()) return absl::InvalidArgumentError("--fabric_iface: at least one NIC is needed");
  std::unique_ptr<FabricEngine> e(new FabricEngine(options, metrics));
  const size_t main_nics = options.ifaces.size();
  const size_t endpoints = options.latency_lanes && options.qos.enabled ? 2 * main_nics : main_nics;
  for (size_t i = 0; i < endpoints; ++i) {
    FabricNicOptions o;
    o.provider = options.provider;
    o.iface = options.ifaces[i % main_nics];
    o.index = static_cast<int>(i);
    if (i >= main_nics) o.latency_lane_of = static_cast<int>(i - main_nics);
    o.tx_size = options.tx_size;
    o.hmem = options.hmem;
    if (options.fabric_messages) o.on_message = [p = e.get()](absl::string_view m) { p->OnMessage(m); };
    FERRY_ASSIGN_OR_RETURN(std::unique_ptr<FabricNic> nic, FabricNic::Open(o));
    if (!e->nics_.empty() && nic->provider() != e->nics_[0]->provider()) {
      return absl::FailedPreconditionError("--fabric_iface: all NICs must resolve to the same provider");
    }
    e->nics_.push_back(std::move(nic));
  }
  e->main_nics_ = main_nics;
  // Split at --fabric_max_op_bytes, and never past what the provider accepts in one op.
  e->max_op_bytes_ = std::max<uint64_t>(options.max_op_bytes, 4096);
  for (const auto& nic : e->nics_) e->max_op_bytes_ = std::min(e->max_op_bytes_, nic->max_msg_size());
  e->gpu_direct_.store(std::all_of(e->nics_.begin(), e->nics_.end(), [](const auto& nic) { return nic->hmem(); }));
  e->topology_ = options.topology != nullptr ? options.topology : std::make_shared<const Topology>();
  for (size_t i = 0; i < main_nics; ++i) {
    const NicDevice* dev = e->topology_->FindNic(e->nics_[i]->netdev());
    if (dev == nullptr) dev = e->topology_->FindNic(e->nics_[i]->domain_name());
    e->nic_devices_.push_back(dev);
  }
  e->rails_ = PlanRails(*e->topology_, e->nic_devices_);  // rails of NICs; a lane goes with its NIC
  for (size_t i = main_nics; i < e->nics_.size(); ++i) e->nic_devices_.push_back(e->nic_devices_[i - main_nics]);
  // Pinning stays inside the cores this process may use (a container's cpuset).
  const std::vector<int> allowed = ProcessCpus(0);
  for (size_t i = 0; i < e->nics_.size(); ++i) {
    std::vector<int> cpus;
    if (options.pin_workers) {
      const std::vector<int>& near = e->rails_.nic_cpus[i % main_nics];
      std::set_intersection(near.begin(), near.end(), allowed.begin(), allowed.end(), std::back_inserter(cpus));
    }
    const NicDevice* dev = e->nic_devices_[i];
    FERRY_LOG(INFO) << e->nics_[i]->name() << ": device " << (dev ? dev->name : "(none in sysfs)") << ", NUMA node "
                    << (dev ? dev->pci.numa_node : -1) << ", worker "
                    << (cpus.empty() ? "unpinned" : "pinned to cores " + FormatCpuList(cpus));
    OpScheduler::Options qos;
    qos.qos = options.qos;
    qos.quantum_bytes = e->max_op_bytes_;  // a round's credit at weight 1: the largest op
    e->workers_.push_back(
        std::make_unique<RailWorker>(e->nics_[i].get(), metrics, options.worker_spin, cpus, absl::Seconds(2), qos));
    e->workers_.back()->Start();
  }
  e->watchdog_ = std::thread([p = e.get()] { p->Watchdog(); });
  return e;
}

FabricEngine::~FabricEngine() { Shutdown(); }

void FabricEngine::StartPeers(const std::string& self_address, std::shared_ptr<grpc::ChannelCredentials> creds,
                              grpc::ChannelArguments args) {
  PeerTable::Self self{options_.incarnation, self_address, provider(), {}, options_.max_peers};
  for (const auto& nic : nics_) self.fabric_addresses.push_back(nic->address());
  peers_ = std::make_unique<PeerTable>(std::move(self), nics(), std::move(creds), std::move(args),
                                       [this](const PeerConnection& p) { FailTransfersTo(p); });
  peers_for_watchdog_.store(peers_.get(), std::memory_order_release);
  metrics_->SetScrapeHook([this] {
    const PeerTable::StateCounts c = peers_->Count();
    metrics_->peers("connected").Set(static_cast<double>(c.connected));
    metrics_->peers("suspect").Set(static_cast<double>(c.suspect));
    metrics_->peers("retired").Set(static_cast<double>(c.retired));
    metrics_->peers("draining").Set(static_cast<double>(c.draining));
    metrics_->peers("idle_closed").Set(static_cast<double>(c.idle_closed));
  });
}

std::vector<FabricNic*> FabricEngine::nics() const {
  std::vector<FabricNic*> out;
  for (const auto& n : nics_) out.push_back(n.get());
  return out;
}

void FabricEngine::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  // Transfers still running fail now; their unposted ops are dropped by the workers.
  watch_.Fail(nullptr, absl::UnavailableError("the agent is shutting down"));
  watch_.Stop();
  if (watchdog_.joinable()) watchdog_.join();
  peer_calls_.Stop();
  for (auto& w : workers_) w->Stop();
  metrics_->SetScrapeHook(nullptr);
  peers_.reset();
}

absl::StatusOr<RegionRegistration> FabricEngine::Register(const MemoryBacking& backing) {
  // GPU memory is registered only where every NIC has FI_HMEM and the first attempt
  // worked (FI_HMEM may cover host memory only: Debian's shm); otherwise it stays
  // unregistered and crosses nodes through the staged path.
  const bool gpu = backing.kind() == MemoryKind::kCuda;
  if (gpu && !gpu_direct_.load()) return RegionRegistration{};
  RegionRegistration reg;
  auto owner = std::make_unique<FabricRegistrations>();
  for (const auto& nic : nics_) {
    fid_mr* mr = nullptr;
    absl::StatusOr<NicRegistration> r = nic->Register(backing.data(), backing.size(), &mr, gpu ? backing.device() : -1);
    if (!r.ok() && gpu) {
      if (gpu_direct_.exchange(false)) {
        FERRY_LOG(WARNING) << "GPU memory cannot be registered with the NICs (" << r.status()
                           << "); GPU memory will cross nodes through host staging buffers";
      }
      return RegionRegistration{};
    }
    if (!r.ok()) return r.status();  // `owner` closes the MRs registered so far
    owner->Add(mr);
    reg.nics.push_back(*r);
  }
  reg.owner = std::move(owner);
  return reg;
}

absl::StatusOr<RegionRegistration> FabricEngine::RegisterRange(const MemoryBacking& backing, uint64_t offset,
                                                               uint64_t length) {
  if (offset > backing.size() || length == 0 || length > backing.size() - offset) {
    return absl::OutOfRangeError(
        absl::StrCat("[", offset, ", +", length, ") is outside the region (", backing.size(), " bytes)"));
  }
  const bool gpu = backing.kind() == MemoryKind::kCuda;
  RegionRegistration reg;
  auto owner = std::make_unique<FabricRegistrations>();
  for (const auto& nic : nics_) {
    fid_mr* mr = nullptr;
    absl::StatusOr<NicRegistration> r =
        nic->Register(static_cast<uint8_t*>(backing.data()) + offset, length, &mr, gpu ? backing.device() : -1);
    if (!r.ok()) return r.status();  // `owner` closes the MRs registered so far
    owner->Add(mr);
    r->remote_base -= offset;  // addresses byte 0 of the region, as the region's own keys do
    reg.nics.push_back(*r);
  }
  reg.owner = std::move(owner);
  return reg;
}

void FabricEngine::Submit(std::shared_ptr<Transfer> t, Done done) {
  auto retry_once = [this, t, done](absl::Status s) {
    // Every op of the attempt has completed (only op failures carry the payload), so
    // nothing of it can land later; writing the same bytes again is safe. The region is
    // looked up afresh: if its owner deregistered it meanwhile (the usual reason rxm
    // dropped the connection), the writer gets NOT_FOUND instead of a second write.
    if (!IsConnectionReset(s) || absl::Now() >= t->deadline) return done(s);
    metrics_->transfer_retries().Increment();
    CallPeer(*t->peer, [this, t, done] {
      {
        absl::MutexLock lock(&mu_);
        if (stopping_) return done(absl::UnavailableError("the agent is shutting down"));
      }
      t->cached_only = false;  // this thread may wait for a handshake
      absl::Status resolved = ResolveRemoteTarget(*peers_, *t);
      if (!resolved.ok()) return done(resolved);
      const RemoteRegion& region = *t->remote_region;
      SubmitTo(t, t->peer, region.keys, region.region_id, region.opened, done);
    });
  };
  const RemoteRegion& region = *t->remote_region;
  SubmitTo(t, t->peer, region.keys, region.region_id, region.opened, std::move(retry_once));
}

void FabricEngine::NotifyDelivered(const std::shared_ptr<Transfer>& t, Done done) {
  SendNotify(t, DeliveredRequest(*t, {}), std::move(done));
}

void FabricEngine::OnMessage(absl::string_view bytes) {
  absl::ReaderMutexLock lock(&handler_mu_);
  if (handler_) handler_(bytes);
}

void FabricEngine::SubmitTo(std::shared_ptr<Transfer> t, std::shared_ptr<PeerConnection> peer,
                            const std::vector<v1::RemoteKey>& keys, uint64_t region_id, absl::Time keys_since,
                            Done done) {
  const std::vector<int>& rail = t->rail.empty() ? RailFor(*t->src) : t->rail;
  const size_t local_nics = rail.size();
  const size_t lane_offset = UsesLanes(*t, *peer) ? main_nics_ : 0;  // the rail's NICs, or their lanes
  const uint64_t max_op = max_op_bytes_;

  // Coalesce chunks that continue each other on both sides, then split to max_op. A
  // queue entry is one piece: no allocation for it.
  absl::InlinedVector<CopyChunk, 1> pieces;
  pieces.reserve(t->plan.size());
  for (size_t i = 0; i < t->plan.size(); ++i) {
    const CopyChunk c = t->plan.chunk(i);
    if (!pieces.empty()) {
      CopyChunk& last = pieces.back();
      if (last.src_offset + last.length == c.src_offset && last.dst_offset + last.length == c.dst_offset &&
          last.length + c.length <= max_op) {
        last.length += c.length;
        continue;
      }
    }
    for (uint64_t off = 0; off < c.length; off += max_op) {
      pieces.push_back({c.src_offset + off, c.dst_offset + off, std::min(max_op, c.length - off)});
    }
  }

  std::vector<uint64_t> nic_bytes(peer->remote_nic_count(), 0);
  for (size_t i = 0; i < pieces.size(); ++i) {
    nic_bytes[RemoteNic(lane_offset + rail[i % local_nics], *peer)] += pieces[i].length;
  }

  auto state = TransferState::Create(
      t, peer, pieces.size(),
      [this, t, peer, region_id, first_nic = lane_offset + rail[0], nic_bytes = std::move(nic_bytes),
       done = std::move(done)](absl::Status s) {
        if (!s.ok()) {
          if (s.code() == absl::StatusCode::kUnavailable) {
            peer->MarkSuspect();
            peer->ForgetRegion(region_id, t->dst_descriptor != nullptr ? t->dst_descriptor->window_id() : 0);
            if (IsConnectionReset(s)) peer->NoteConnectionDrop();
          }
          done(s);
        } else if (t->notify) {
          NotifyPeer(t, peer, first_nic, nic_bytes, done);
        } else {
          receive_reports_.Add(*t, peer, nic_bytes);
          done(absl::OkStatus());
        }
      });
  watch_.Add(state);

  // Piece i goes to the rail's NIC i % local_nics; each NIC's ops in one hand-off.
  for (size_t j = 0; j < local_nics && j < pieces.size(); ++j) {
    const size_t l = lane_offset + rail[j], r = RemoteNic(l, *peer);
    // This thread's batch, reused: no allocation per op once it has grown.
    thread_local std::vector<WriteOp> ops;
    ops.clear();
    for (size_t i = j; i < pieces.size(); i += local_nics) {
      WriteOp& op = ops.emplace_back();
      op.state = state.get();
      op.local = t->src->data() + pieces[i].src_offset;
      op.length = pieces[i].length;
      op.desc = t->src->nics()[l].local_desc;
      op.peer = peer->fi_addr(l, r);
      op.remote_addr = keys[r].base() + pieces[i].dst_offset;
      op.key = keys[r].key();
      op.keys_since = keys_since;
    }
    workers_[l]->Submit(ops);
  }
}

v1::NotifyRequest FabricEngine::DeliveredRequest(const Transfer& t, const std::vector<uint64_t>& nic_bytes) const {
  v1::NotifyRequest req = DeliverNotifyRequest(*t.dst_descriptor, options_.incarnation, v1::NOTIFICATION_KIND_WRITE,
                                               t.id, t.tag, t.plan.total_bytes, t.notify_payload);
  for (uint64_t b : nic_bytes) req.add_nic_bytes(b);
  return req;
}

bool FabricEngine::UsesLanes(const Transfer& t, const PeerConnection& peer) const {
  return nics_.size() > main_nics_ && peer.remote_latency_lanes() > 0 &&
         t.share.traffic_class == TrafficClass::kLatency;
}

size_t FabricEngine::RemoteNic(size_t nic, const PeerConnection& peer) const {
  const size_t remote_main = peer.remote_main_nics();
  if (nic < main_nics_) return nic % remote_main;
  // A lane is used only towards peers with lanes (UsesLanes), and reaches their lanes only.
  FERRY_DCHECK(peer.remote_latency_lanes() > 0)
      << nics_[nic]->name() << " used towards " << peer.address() << ", which has no latency lanes";
  return remote_main + (nic - main_nics_) % remote_main;
}

bool FabricEngine::ByMessage(const PeerConnection& peer, size_t nic, const v1::NotifyRequest& req) const {
  return nics_[nic]->messages() && peer.fabric_messages() && req.ByteSizeLong() <= kMaxFabricMessageBytes;
}

void FabricEngine::NotifyPeer(const std::shared_ptr<Transfer>& t, const std::shared_ptr<PeerConnection>& peer,
                              size_t nic, const std::vector<uint64_t>& nic_bytes, Done done) {
  v1::NotifyRequest req = DeliveredRequest(*t, nic_bytes);
  if (ByMessage(*peer, nic, req)) {
    SendNotifyMessage(t, peer, nic, req,
                      [agent = t->dst_descriptor->agent_address(), done = std::move(done)](absl::Status s) {
                        if (s.ok()) return done(s);
                        done(absl::UnavailableError(
                            absl::StrCat("the bytes landed but notifying agent ", agent, " failed: ", s.message())));
                      });
  } else {
    CallPeer(*peer, [this, t, req = std::move(req), done = std::move(done)] { SendNotify(t, req, done); });
  }
}

void FabricEngine::AnnounceToPeer(const std::shared_ptr<Transfer>& t, v1::NotifyRequest req, Done done) {
  // Any NIC reaches the peer and its order against the data does not matter; a latency
  // write's announcement takes its lane, not a connection bulk bytes may fill.
  const size_t nic = UsesLanes(*t, *t->peer) ? main_nics_ : 0;
  if (ByMessage(*t->peer, nic, req)) {
    SendNotifyMessage(t, t->peer, nic, req, std::move(done));
  } else {
    SendNotifyAsync(t->peer, std::move(req), absl::Now() + absl::Seconds(2), std::move(done));
  }
}

void FabricEngine::SendNotifyMessage(const std::shared_ptr<Transfer>& t, const std::shared_ptr<PeerConnection>& peer,
                                     size_t nic, const v1::NotifyRequest& req, Done done) {
  auto state = TransferState::Create(t, peer, 1, [peer, done = std::move(done)](absl::Status s) {
    if (s.code() == absl::StatusCode::kUnavailable) peer->MarkSuspect();
    done(s);
  });
  req.SerializeToString(&state->message());
  watch_.Add(state);  // held to the transfer's deadline
  WriteOp op;
  op.state = state.get();
  op.message = true;
  op.local = reinterpret_cast<const uint8_t*>(state->message().data());
  op.length = state->message().size();
  op.peer = peer->fi_addr(nic, RemoteNic(nic, *peer));
  workers_[nic]->Submit(absl::MakeConstSpan(&op, 1));
}

void FabricEngine::SendNotify(const std::shared_ptr<Transfer>& t, const v1::NotifyRequest& req, Done done) {
  const v1::RegionDescriptor& d = *t->dst_descriptor;
  v1::NotifyResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(std::max(t->deadline, absl::Now() + absl::Milliseconds(100))));
  grpc::Status s = t->peer->stub()->Notify(&ctx, req, &resp);
  if (s.ok()) {
    done(absl::OkStatus());
  } else {
    done(absl::UnavailableError(
        absl::StrCat("the bytes landed but notifying agent ", d.agent_address(), " failed: ", s.error_message())));
  }
}

void FabricEngine::SendReceiveReports() {
  for (ReceiveReports::Report& report : receive_reports_.Take()) {
    const PeerConnection& peer = *report.peer;
    CallPeer(peer, [r = std::move(report)] {
      v1::NotifyResponse resp;
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
      grpc::Status s = r.peer->stub()->Notify(&ctx, r.request, &resp);
      // Accounting only: a target that restarted or dropped the region loses the count.
      if (!s.ok()) {
        FERRY_LOG(DEBUG) << "receive report to " << r.peer->address() << ": " << s.error_message();
      }
    });
  }
}

void FabricEngine::CallPeer(const PeerConnection& peer, std::function<void()> call) {
  peer_calls_.Post(reinterpret_cast<uintptr_t>(&peer), std::move(call));
}

void FabricEngine::Watchdog() {
  NameThisThread("ferry-watchdog");
  absl::Time last_report = absl::Now();
  for (;;) {
    if (absl::Now() - last_report >= absl::Seconds(1)) {
      SendReceiveReports();
      last_report = absl::Now();
      PeerTable* peers = peers_for_watchdog_.load(std::memory_order_acquire);
      if (peers != nullptr && options_.peer_idle > absl::ZeroDuration()) {
        peers->CloseIdle(last_report, options_.peer_idle);
      }
    }
    // Nothing in flight: sleep until a transfer starts (an idle agent stays idle).
    if (!watch_.AwaitWork(absl::Seconds(1))) return;
    for (TransferWatch::Expired& e : watch_.Sweep(absl::Now())) {
      const absl::Status status = absl::DeadlineExceededError(
          absl::StrCat(e.why.message(), " (writing to agent ", e.state->peer()->address(), ")"));
      FERRY_LOG(WARNING) << status.message();
      e.state->Finish(status);
      e.state->peer()->MarkSuspect();  // it may be gone: the next transfer to it checks
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

void FabricEngine::FailTransfersTo(const PeerConnection& peer) {
  watch_.Fail(&peer,
              absl::UnavailableError(absl::StrCat("agent ", peer.address(), " restarted or became unreachable")));
}

void FabricEngine::FillStatus(v1::GetStatusResponse* resp) const {
  resp->set_fabric_provider(provider());
  for (size_t i = 0; i < workers_.size(); ++i) {
    const RailWorker* w = workers_[i].get();
    v1::NicStatus* n = resp->add_nics();
    const FabricNic* nic = nics_[i].get();
    n->set_name(nic->name());
    n->set_provider(nic->provider());
    n->set_address(nic->address_string());
    n->set_tx_bytes(w->tx_bytes());
    n->set_rx_bytes(static_cast<uint64_t>(metrics_->transfer_bytes("rx", "fabric", nic->name()).Value()));
    n->set_ops_inflight(w->inflight());
    for (int c : w->cpus()) n->add_cpus(c);
    const NicDevice* dev = nic_devices_[i];
    n->set_numa_node(dev != nullptr ? dev->pci.numa_node : -1);
    if (dev != nullptr) n->set_device(dev->name);
  }
  if (peers_ == nullptr) return;
  for (const PeerTable::PeerInfo& p : peers_->List()) {
    v1::PeerStatus* ps = resp->add_peers();
    ps->set_address(p.address);
    ps->set_incarnation(p.incarnation);
    ps->set_state(p.state);
    ps->set_open_regions(p.open_regions);
  }
}

}  // namespace ferry
