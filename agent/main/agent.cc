#include "agent/main/agent.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/resource_quota.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>

#include <sys/stat.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "agent/common/log.h"
#include "agent/common/status_macros.h"
#include "agent/common/status_prefix.h"
#include "agent/common/token.h"
#include "agent/dra/claimed_nics.h"
#include "agent/main/topology_report.h"
#include "agent/peers/peer_tls.h"
#include "agent/topology/cpu_list.h"
#include "agent/topology/memory_node.h"
#include "proto/ferry/wire/session_wire.h"

namespace ferry {
namespace {

// Where a new region's memory is: its GPU, or the NUMA node its client runs on (the
// pages are normally first touched, and so placed, there). A client in another pid
// namespace (every pod of a Kubernetes node: SO_PEERCRED says pid 0) has no CPUs the
// agent can read; its region's first page says where the pages are instead.
Placement Place(const Topology& topology, const CudaMemory* cuda, const Session& session, const MemoryBacking& b) {
  Placement p;
  if (b.kind() == MemoryKind::kCuda) {
    if (cuda != nullptr) p.gpu_pci_address = cuda->PciBusId(b.device());
  } else if (session.creds().pid > 0) {
    p.numa_node = topology.NumaNodeOfCpus(ProcessCpus(session.creds().pid));
  } else if (const int node = NumaNodeOfMemory(b.data()); node >= 0 && topology.FindNuma(node) != nullptr) {
    p.numa_node = node;
  }
  return p;
}

}  // namespace

Agent::Agent(const AgentConfig& config) : config_(config), incarnation_(RandomU64()) {
  if (config_.session_socket.empty()) config_.session_socket = SessionSocketPath(config_.socket);
}

absl::StatusOr<std::unique_ptr<Agent>> Agent::Start(const AgentConfig& config) {
  std::unique_ptr<Agent> agent(new Agent(config));
  absl::Status s = agent->Init();
  if (!s.ok()) {
    agent->Shutdown(absl::ZeroDuration());
    return s;
  }
  return agent;
}

absl::Status Agent::Init() {
  metrics_ = std::make_unique<Metrics>();
  Metrics* m = metrics_.get();
  regions_ = std::make_unique<RegionTable>([m](MemoryKind kind, RegionTable::KindStats s) {
    m->regions(MemoryKindName(kind)).Set(static_cast<double>(s.regions));
    m->registered_bytes(MemoryKindName(kind)).Set(static_cast<double>(s.bytes));
  });
  RegionTable* regions = regions_.get();
  SessionLimits limits;
  limits.max_pending_fds = config_.max_pending_fds;
  limits.max_inflight_transfers = config_.max_inflight_transfers;
  limits.event_queue_capacity = config_.max_queued_notifications;
  limits.event_queue_bytes = config_.max_queued_notification_bytes;
  limits.max_sessions = config_.max_sessions;
  limits.max_sessions_per_uid = config_.max_sessions_per_uid;
  sessions_ = std::make_unique<SessionRegistry>(
      limits,
      /*on_close=*/
      [this, m, regions](Session& s) {
        if (queue_poller_) queue_poller_->RemoveSession(s.id());
        if (inboxes_) inboxes_->RemoveSession(s.id());
        if (windows_) windows_->CloseSession(s.id());
        size_t n = regions->RemoveSession(s.id());
        m->sessions().Decrement();
        FERRY_LOG(INFO) << "session " << s.id() << " (pid " << s.creds().pid << ") ended; reclaimed " << n
                        << " regions";
      },
      /*on_open=*/[m](Session&) { m->sessions().Increment(); }, &config_.qos);
  transfers_ = std::make_unique<TransferManager>(incarnation_, m, sessions_.get(), regions);
  windows_ = std::make_unique<WriteWindows>(regions, [t = transfers_.get(), incarnation = incarnation_](
                                                         const Region& r, uint64_t window_id, const absl::Status& why) {
    v1::Notification n;
    n.set_region_id(r.id());
    n.set_kind(v1::NOTIFICATION_KIND_WINDOW_REFUSED);
    n.set_tag(window_id);
    n.set_source_incarnation(incarnation);
    n.set_code(static_cast<int>(why.code()));
    n.set_message(std::string(why.message()));
    t->Notify(r, n).IgnoreError();  // a full queue counts it as lost
  });
  local_copier_ = std::make_unique<HostCopier>(config_.local_copy_threads);
  absl::StatusOr<Topology> topology = DiscoverTopology(config_.sysfs_root);
  if (!topology.ok()) {
    FERRY_LOG(WARNING) << "no topology (" << topology.status().message()
                       << "): every region stripes over every NIC, workers unpinned";
    topology = Topology();
  }
  if (!config_.claimed_devices.empty()) FERRY_RETURN_IF_ERROR(UseClaimedNics(*topology));
  topology_ = std::make_shared<const Topology>(*std::move(topology));
  FERRY_LOG(INFO) << "topology from " << config_.sysfs_root << ": " << topology_->numa_nodes.size() << " NUMA nodes, "
                  << topology_->gpus.size() << " GPUs, " << topology_->nics.size() << " NICs"
                  << (config_.claimed_devices.empty() ? "" : " (claimed)");
  // GPU support when the node has a driver; devices are touched on first use only.
  absl::StatusOr<const CudaDriver*> cu = CudaDriver::Load();
  if (cu.ok()) {
    cuda_memory_ = std::make_unique<CudaMemory>(*cu, [m] { m->registration_cache_hits().Increment(); });
    gpu_copier_ = std::make_unique<GpuCopier>(*cu, config_.gpu_kernel_pull, metrics_.get());
    FERRY_LOG(INFO) << "CUDA driver " << (*cu)->version << ", " << (*cu)->device_count << " devices";
  } else {
    // What a deployment changes to give the agent its GPUs, said where the pods see it.
    cuda_status_ = absl::Status(
        cu.status().code(),
        absl::StrCat(cu.status().message(),
                     ". The agent needs libcuda.so.1 and the GPUs' /dev/nvidia* devices in its container: with the "
                     "Helm chart, gpu.driverHostPath (GKE), gpu.visibleDevices (the NVIDIA container runtime) or "
                     "dra.gpuDeviceClassName (NVIDIA's DRA driver)"));
    FERRY_LOG(INFO) << "GPU memory unavailable: " << cuda_status_.message();
  }

  if (!config_.peer_address.empty()) {
    FERRY_RETURN_IF_ERROR(StartFabric());
    m->SetBuildInfo(kFerryVersion, LibfabricVersion(), engine_->provider());
  } else {
    m->SetBuildInfo(kFerryVersion, LibfabricVersion(), "");
  }

  absl::StatusOr<std::unique_ptr<MetricsServer>> metrics_server =
      MetricsServer::Start(config_.metrics_address, m, [this] { return Readiness(); });
  if (!metrics_server.ok()) return metrics_server.status();
  metrics_server_ = std::move(*metrics_server);
  // Report the bound port, not 0.
  config_.metrics_address =
      absl::StrCat(config_.metrics_address.substr(0, config_.metrics_address.rfind(':')), ":", metrics_server_->port());

  StartTransferPaths();
  return StartLocalApi();
}

absl::Status Agent::UseClaimedNics(Topology& topology) {
  FERRY_ASSIGN_OR_RETURN(v1::ClaimedDevices claimed, ReadClaimedDevices(config_.claimed_devices));
  absl::StatusOr<std::vector<NicDevice>> nics = ClaimedNics(claimed);
  if (!nics.ok()) return WithPrefix(nics.status(), absl::StrCat("--claimed_devices ", config_.claimed_devices, ": "));
  // The claim replaces what sysfs showed of the NICs: in a pod without the host's network,
  // sysfs shows the pod's interfaces, not the node's.
  topology.nics = *std::move(nics);
  if (config_.fabric_ifaces.empty()) config_.fabric_ifaces = FabricNames(topology.nics);
  for (const NicDevice& nic : topology.nics) {
    FERRY_LOG(INFO) << "claimed NIC " << nic.name << " (" << nic.claimed_device << "): PCIe root "
                    << (nic.pci.pcie_root.empty() ? "-" : nic.pci.pcie_root) << ", NUMA node " << nic.pci.numa_node;
  }
  return absl::OkStatus();
}

void Agent::StartTransferPaths() {
  TransferRouterDeps route;
  route.incarnation = incarnation_;
  route.advertise_address = advertise_address_;
  route.regions = regions_.get();
  route.windows = windows_.get();
  route.transfers = transfers_.get();
  route.local = local_copier_.get();
  route.gpu_local = gpu_copier_.get();
  if (engine_ != nullptr) {
    route.remote_targets = engine_->peers();
    route.fabric_nics = engine_->nics().size();
    route.fabric = engine_.get();
    route.notify_peer = [e = engine_.get()](const std::shared_ptr<Transfer>& t,
                                            std::function<void(absl::Status)> done) {
      e->NotifyPeer(t, t->peer, /*nic=*/0, /*nic_bytes=*/{}, std::move(done));
    };
    route.announce_peer = [e = engine_.get()](const std::shared_ptr<Transfer>& t, v1::NotifyRequest req,
                                              std::function<void(absl::Status)> done) {
      e->AnnounceToPeer(t, std::move(req), std::move(done));
    };
    route.staged = staged_.get();
    route.stage_host_regions = config_.stage_host_regions;
  }
  router_ = std::make_unique<TransferRouter>(std::move(route));
  queue_entries_ = std::make_unique<QueueEntries>(router_.get(), sessions_.get(), transfers_.get(), metrics_.get(),
                                                  ChunkLimits{config_.max_chunks_per_write});
  queue_entries_->set_windows(windows_.get(), WindowEntryLimits{config_.max_transfer_timeout_ms, config_.max_wait_ms});
  queue_poller_ = std::make_unique<QueuePoller>(
      [e = queue_entries_.get()](const std::shared_ptr<TransferQueue>& q, const queue::SubmitEntry& entry,
                                 bool may_block) { return e->Handle(q, entry, may_block); },
      [r = router_.get()] { r->Flush(); });
}

absl::Status Agent::StartLocalApi() {
  LocalServiceDeps deps;
  deps.config = &config_;
  deps.incarnation = incarnation_;
  deps.advertise_address = advertise_address_;
  deps.metrics = metrics_.get();
  deps.regions = regions_.get();
  deps.windows = windows_.get();
  deps.sessions = sessions_.get();
  deps.transfers = transfers_.get();
  deps.router = router_.get();
  deps.cuda = cuda_memory_.get();
  if (gpu_copier_ != nullptr) deps.gpu_warm_up = [g = gpu_copier_.get()](int device) { g->WarmUp(device); };
  deps.cuda_unavailable = cuda_status_;
  deps.queues = queue_poller_.get();
  inboxes_ = std::make_unique<Inboxes>();
  deps.inboxes = inboxes_.get();
  if (engine_ != nullptr) {
    deps.registrar = engine_.get();
    deps.fill_status = [e = engine_.get(), st = staging_table_.get()](v1::GetStatusResponse* r) {
      e->FillStatus(r);
      r->set_staging_buffers(static_cast<uint32_t>(st->buffers()));
    };
  }
  deps.fill_topology = [t = topology_, e = engine_.get()](v1::GetTopologyResponse* r) { FillTopology(*t, e, r); };
  deps.place = [t = topology_, c = cuda_memory_.get()](const Session& s, const MemoryBacking& b) {
    return Place(*t, c, s, b);
  };
  local_service_ = std::make_unique<LocalService>(std::move(deps));
  if (engine_ != nullptr && config_.queues_on_nic_worker) {
    queue_poller_->Start(QueuePoller::Mode::kDriven);
    engine_->AttachPollSource(queue_poller_.get());
  } else {
    queue_poller_->Start(QueuePoller::Mode::kOwnThread);
  }

  FERRY_RETURN_IF_ERROR(ClaimSocketPath(config_.socket));
  // Beside the API, the standard services a Kubernetes gRPC probe, grpc-health-probe and
  // grpcurl expect: grpc.health.v1.Health (SERVING until Shutdown starts draining) and
  // server reflection (the API's descriptors, so no .proto is needed to call it).
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + config_.socket, grpc::InsecureServerCredentials());
  builder.RegisterService(local_service_.get());
  builder.SetMaxReceiveMessageSize(64 << 20);
  local_server_ = builder.BuildAndStart();
  if (local_server_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot serve gRPC on unix:", config_.socket, " (does the directory exist and is it writable?)"));
  }
  local_server_->GetHealthCheckService()->SetServingStatus(v1::Agent::service_full_name(), true);
  FERRY_RETURN_IF_ERROR(SetSocketPermissions(config_.socket, config_.socket_mode, config_.socket_gid));

  session_server_ = std::make_unique<SessionSocketServer>(sessions_.get(), [this](const PeerCredentials& c) {
    if (config_.allowed_uids.empty() ||
        std::find(config_.allowed_uids.begin(), config_.allowed_uids.end(), c.uid) != config_.allowed_uids.end()) {
      return absl::OkStatus();
    }
    return absl::PermissionDeniedError(absl::StrCat("uid ", c.uid, " is not in --allowed_uids"));
  });
  FERRY_RETURN_IF_ERROR(session_server_->Start(config_.session_socket, config_.socket_mode, config_.socket_gid));

  serving_.store(true);
  FERRY_LOG(INFO) << "ferryd " << kFerryVersion << " incarnation " << incarnation_ << " serving unix:" << config_.socket
                  << " (sessions " << config_.session_socket << "), metrics http://" << config_.metrics_address
                  << "/metrics";
  return absl::OkStatus();
}

absl::Status Agent::Readiness() const {
  if (!serving_.load()) return absl::UnavailableError("the agent is starting or draining");
  struct stat st;
  if (stat(config_.socket.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) {
    return absl::UnavailableError(absl::StrCat("the API socket ", config_.socket, " is gone"));
  }
  if (!config_.peer_address.empty() && (engine_ == nullptr || engine_->nics().empty())) {
    return absl::UnavailableError("the fabric is not up");
  }
  if (gpu_copier_ != nullptr) {
    absl::Status gpu = gpu_copier_->health();
    if (!gpu.ok()) return absl::UnavailableError(gpu.message());
  }
  return absl::OkStatus();
}

absl::Status Agent::StartFabric() {
  FabricEngineOptions options;
  options.provider = config_.fabric_provider;
  options.ifaces = config_.fabric_ifaces;
  options.incarnation = incarnation_;
  options.tx_size = config_.fabric_tx_size;
  options.hmem = config_.fabric_hmem;
  options.fabric_messages = config_.fabric_messages;
  options.latency_lanes = config_.fabric_latency_lane;
  options.max_op_bytes = config_.fabric_max_op_bytes;
  options.worker_spin = absl::Microseconds(config_.fabric_spin_us);
  options.topology = topology_;
  options.pin_workers = config_.pin_workers;
  options.max_peers = config_.max_peers;
  options.peer_idle = absl::Seconds(config_.peer_idle_s);
  options.qos = config_.qos.scheduling;
  absl::StatusOr<std::unique_ptr<FabricEngine>> engine = FabricEngine::Create(options, metrics_.get());
  if (!engine.ok()) return engine.status();
  engine_ = std::move(*engine);
  for (size_t i = 0; i < engine_->nics().size(); ++i) {
    const NicDevice* dev = engine_->nic_devices()[i];
    metrics_->SetNicInfo(engine_->nics()[i]->name(), dev != nullptr ? dev->name : "",
                         dev != nullptr ? dev->pci.numa_node : -1, dev != nullptr ? dev->pci.pcie_root : "");
  }

  FERRY_ASSIGN_OR_RETURN(PeerTls tls, PeerTls::Load(config_));
  peer_service_ =
      std::make_unique<PeerService>(incarnation_, engine_->nics(), regions_.get(), transfers_.get(), metrics_.get());
  inbound_ = std::make_unique<InboundWrites>(InboundWritesOptions(), transfers_.get());
  peer_service_->set_inbound(inbound_.get());
  windows_->set_registrar(engine_.get());
  windows_->set_announced([inbound = inbound_.get()](uint64_t window_id) { return inbound->InWindow(window_id); });
  inbound_->set_fence([windows = windows_.get()](uint64_t window_id) {
    return windows->Revoke(window_id, "closed when its writer's agent was lost");
  });
  peer_service_->set_windows(windows_.get());
  peer_service_->set_registrar(engine_.get());
  engine_->SetMessageHandler([p = peer_service_.get()](absl::string_view m) { p->AcceptMessage(m); });
  // The staged path, both sides: GPU memory through host staging buffers.
  const CudaDriver* cu = cuda_memory_ != nullptr ? *CudaDriver::Load() : nullptr;
  if (cu != nullptr) {
    stage_copier_ = std::make_unique<CudaStageCopier>(cu);
  } else {
    stage_copier_ = std::make_unique<HostStageCopier>();
  }
  StagingOptions staging;
  staging.buffer_bytes = config_.staging_buffer_bytes;
  staging.max_buffers = config_.max_staging_buffers;
  staging.stage_host_regions = config_.stage_host_regions;
  staging.on_count = [m = metrics_.get()](size_t n) { m->staging_buffers().Set(static_cast<double>(n)); };
  staging_table_ = std::make_unique<StagingTable>(staging, cu, engine_.get(), stage_copier_.get());
  peer_service_->set_staging(staging_table_.get());
  StagedExecutorOptions staged;
  staged.buffer_bytes = config_.staging_buffer_bytes;
  staged.stage_bytes = config_.stage_bytes;
  staged_ = std::make_unique<StagedExecutor>(staged, engine_.get(), cu, stage_copier_.get());
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(config_.peer_address, tls.server, &port);
  builder.RegisterService(peer_service_.get());
  peer_server_ = builder.BuildAndStart();
  if (peer_server_ == nullptr || port == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot serve the peer API on ", config_.peer_address, " (--peer_address)"));
  }
  advertise_address_ = config_.advertise_address;
  if (advertise_address_.empty()) {
    // A wildcard bind is not an address others can dial: use the first NIC's.
    std::string host = config_.peer_address.substr(0, config_.peer_address.rfind(':'));
    if (host.empty() || host == "0.0.0.0" || host == "[::]") {
      host = engine_->nics()[0]->iface();
      if (engine_->nics()[0]->netdev().empty() && host.find('.') == std::string::npos) {
        return absl::InvalidArgumentError(absl::StrCat("--peer_address ", config_.peer_address,
                                                       " binds every address and NIC ", host,
                                                       " has none to advertise: set --advertise_address"));
      }
    }
    advertise_address_ = absl::StrCat(host, ":", port);
  }
  engine_->StartPeers(advertise_address_, tls.channel, tls.channel_args);
  inbound_->StartProbing([peers = engine_->peers()](const std::string& address, absl::Duration timeout) {
    return peers->Ping(address, timeout);
  });
  FERRY_LOG(INFO) << "peer API on " << config_.peer_address << ", advertised as " << advertise_address_
                  << (tls.enabled ? " (mTLS)" : " (plaintext)");
  return absl::OkStatus();
}

void Agent::Shutdown(absl::Duration grace) {
  if (shut_down_) return;
  shut_down_ = true;
  serving_.store(false);  // /readyz turns 503 first, so load balancers stop sending work
  if (local_server_ && local_server_->GetHealthCheckService() != nullptr) {
    local_server_->GetHealthCheckService()->SetServingStatus(false);  // and so does grpc.health.v1
  }
  if (local_service_) local_service_->BeginShutdown();
  if (queue_entries_) queue_entries_->BeginShutdown();
  if (router_) router_->BeginShutdown();
  // Let in-flight transfers finish (bounded).
  absl::Time deadline = absl::Now() + grace;
  while (transfers_ && transfers_->inflight() > 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  if (transfers_ && transfers_->inflight() > 0) {
    FERRY_LOG(WARNING) << transfers_->inflight() << " transfers still in flight after the grace period";
  }
  if (local_server_) local_server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  if (peer_server_) peer_server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  if (inbound_) inbound_->StopProbing();  // its pings use the engine's peer table
  // Before the parts /readyz and scrapes look at go away (found by TSan: a readiness
  // check reading the GPU copier while it was destroyed).
  metrics_server_.reset();
  if (session_server_) session_server_->Stop();
  if (engine_ && queue_poller_) engine_->AttachPollSource(nullptr);
  if (queue_poller_) queue_poller_->Stop();
  if (sessions_) sessions_->CloseAll();
  inboxes_.reset();  // their sessions ended: each pump stops
  windows_.reset();  // its fabric keys close before the NICs do
  // After the sessions: their regions' fabric registrations close before the NICs do.
  if (engine_) engine_->Shutdown();
  staged_.reset();
  staging_table_.reset();  // its buffers' registrations close before the NICs do
  local_copier_.reset();   // finishes queued copies
  gpu_copier_.reset();
  if (local_server_) unlink(config_.socket.c_str());
  FERRY_LOG(INFO) << "ferryd stopped";
}

Agent::~Agent() { Shutdown(absl::ZeroDuration()); }

}  // namespace ferry
