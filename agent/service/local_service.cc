#include "agent/service/local_service.h"

#include <unistd.h>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "agent/common/log.h"
#include "agent/common/poll_source.h"
#include "agent/common/status_macros.h"
#include "agent/common/status_prefix.h"
#include "proto/ferry/v1/grpc_status.h"

namespace ferry {
namespace {

constexpr char kSessionMetadata[] = "ferry-session";

}  // namespace

LocalService::LocalService(LocalServiceDeps deps) : deps_(std::move(deps)), started_(absl::Now()) {}

grpc::Status LocalService::Reply(const char* api, const absl::Status& status) {
  if (!status.ok()) {
    deps_.metrics->errors(api, StatusCodeName(static_cast<int>(status.code()))).Increment();
    FERRY_LOG(DEBUG) << api << ": " << status;
  }
  return ToGrpcStatus(status);
}

absl::StatusOr<std::shared_ptr<Session>> LocalService::SessionOf(grpc::ServerContext* ctx) const {
  const auto& md = ctx->client_metadata();
  auto it = md.find(kSessionMetadata);
  if (it == md.end()) {
    return absl::UnauthenticatedError(
        "no session: open the session socket first and send its token as gRPC metadata 'ferry-session'");
  }
  return deps_.sessions->FindByToken(absl::string_view(it->second.data(), it->second.size()));
}

// ---------------------------------------------------------------- RegisterMemory

absl::StatusOr<v1::RegisterMemoryResponse> LocalService::DoRegister(Session& session,
                                                                    const v1::RegisterMemoryRequest& req) {
  const AgentConfig& cfg = *deps_.config;
  if (req.size() == 0 || req.size() > cfg.max_region_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("size must be 1..", cfg.max_region_bytes, " bytes (--max_region_bytes), got ", req.size()));
  }
  const RegionQuota quota{cfg.max_regions_per_session, cfg.max_regions_per_uid, cfg.max_regions};
  // Before anything is mapped: a pod at its bound must not take mappings to find out.
  FERRY_RETURN_IF_ERROR(deps_.regions->Admits(session.id(), session.creds().uid, quota));
  std::unique_ptr<MemoryBacking> backing;
  switch (req.memory_case()) {
    case v1::RegisterMemoryRequest::kHost: {
      absl::StatusOr<UniqueFd> fd = session.TakeFd(req.host().fd_handle());
      if (!fd.ok()) return WithPrefix(fd.status(), "host.");
      FERRY_ASSIGN_OR_RETURN(std::unique_ptr<MemoryBacking> b,
                             MapHostFd(fd->release(), req.host().offset(), req.size()));
      backing = std::move(b);
      break;
    }
    case v1::RegisterMemoryRequest::kCudaIpc: {
      if (deps_.cuda == nullptr)
        return absl::FailedPreconditionError(absl::StrCat("cuda_ipc: ", deps_.cuda_unavailable.message()));
      FERRY_ASSIGN_OR_RETURN(std::unique_ptr<MemoryBacking> b, deps_.cuda->ImportIpc(req.cuda_ipc(), req.size()));
      backing = std::move(b);
      break;
    }
    case v1::RegisterMemoryRequest::kCudaFd: {
      // Taken first: the fd is consumed whatever happens next.
      absl::StatusOr<UniqueFd> fd = session.TakeFd(req.cuda_fd().fd_handle());
      if (!fd.ok()) return WithPrefix(fd.status(), "cuda_fd.");
      if (deps_.cuda == nullptr)
        return absl::FailedPreconditionError(absl::StrCat("cuda_fd: ", deps_.cuda_unavailable.message()));
      FERRY_ASSIGN_OR_RETURN(std::unique_ptr<MemoryBacking> b,
                             deps_.cuda->ImportFd(fd->get(), req.cuda_fd(), req.size()));
      backing = std::move(b);
      break;
    }
    default:
      return absl::InvalidArgumentError("memory: set one of host, cuda_ipc, cuda_fd");
  }

  auto region = std::make_shared<Region>(deps_.regions->NextId(), session.id(), Token::Random(), std::move(backing));
  region->set_write_windows(req.write_windows());
  if (deps_.place) region->set_placement(deps_.place(session, region->backing()));
  if (deps_.registrar != nullptr) {
    FERRY_ASSIGN_OR_RETURN(RegionRegistration reg, deps_.registrar->Register(region->backing()));
    region->set_registration(std::move(reg));
  }
  FERRY_RETURN_IF_ERROR(deps_.regions->Insert(region, session.creds().uid, quota));
  if (region->kind() == MemoryKind::kCuda && deps_.gpu_warm_up) deps_.gpu_warm_up(region->device());

  v1::RegisterMemoryResponse resp;
  resp.set_region_id(region->id());
  *resp.mutable_region() = DescriptorOf(*region);
  return resp;
}

v1::RegionDescriptor LocalService::DescriptorOf(const Region& region) const {
  v1::RegionDescriptor d;
  d.set_version(1);
  d.set_agent_address(deps_.advertise_address);
  d.set_agent_incarnation(deps_.incarnation);
  d.set_region_id(region.id());
  d.set_token(region.token().bytes());
  d.set_size(region.size());
  d.set_kind(region.kind() == MemoryKind::kHost ? v1::MEMORY_KIND_HOST : v1::MEMORY_KIND_CUDA);
  return d;
}

// ---------------------------------------------------------------- write windows

absl::StatusOr<v1::OpenWriteWindowResponse> LocalService::DoOpenWindow(const Session& session,
                                                                       const v1::OpenWriteWindowRequest& req) {
  if (req.timeout_ms() == 0 || req.timeout_ms() > deps_.config->max_transfer_timeout_ms) {
    return absl::InvalidArgumentError(absl::StrCat("timeout_ms must be 1..", deps_.config->max_transfer_timeout_ms,
                                                   " (--max_transfer_timeout_ms), got ", req.timeout_ms()));
  }
  WindowSpec spec;
  spec.region_ids.assign(req.region_ids().begin(), req.region_ids().end());
  for (const v1::ByteRange& r : req.ranges()) spec.ranges.push_back({r.offset(), r.length()});
  spec.timeout = absl::Milliseconds(req.timeout_ms());
  if (req.has_writer()) {
    if (req.writer().agent_incarnation() == 0 || req.writer().region_id() == 0) {
      return absl::InvalidArgumentError(
          "writer: a descriptor of one of the writer's regions (its agent_incarnation "
          "and region_id), or unset for any holder of the window");
    }
    spec.writer = {req.writer().agent_incarnation(), req.writer().region_id()};
  }
  FERRY_ASSIGN_OR_RETURN(std::shared_ptr<const WriteWindow> w, deps_.windows->Open(session.id(), spec));
  v1::OpenWriteWindowResponse resp;
  resp.set_window_id(w->id());
  for (const auto& region : w->regions()) {
    v1::RegionDescriptor* d = resp.add_regions();
    *d = DescriptorOf(*region);
    d->set_window_id(w->id());
    d->set_token(w->token().bytes());
  }
  return resp;
}

grpc::Status LocalService::OpenWriteWindow(grpc::ServerContext* ctx, const v1::OpenWriteWindowRequest* req,
                                           v1::OpenWriteWindowResponse* resp) {
  absl::StatusOr<std::shared_ptr<Session>> session = SessionOf(ctx);
  if (!session.ok()) return Reply("OpenWriteWindow", session.status());
  absl::StatusOr<v1::OpenWriteWindowResponse> r = DoOpenWindow(**session, *req);
  if (!r.ok()) return Reply("OpenWriteWindow", r.status());
  *resp = std::move(*r);
  return grpc::Status::OK;
}

grpc::Status LocalService::CloseWriteWindow(grpc::ServerContext* ctx, const v1::CloseWriteWindowRequest* req,
                                            v1::CloseWriteWindowResponse*) {
  absl::StatusOr<std::shared_ptr<Session>> session = SessionOf(ctx);
  if (!session.ok()) return Reply("CloseWriteWindow", session.status());
  if (req->wait_ms() > deps_.config->max_wait_ms) {
    return Reply("CloseWriteWindow",
                 absl::InvalidArgumentError(absl::StrCat("wait_ms must be 0..", deps_.config->max_wait_ms,
                                                         " (--max_wait_ms), got ", req->wait_ms())));
  }
  return Reply("CloseWriteWindow",
               deps_.windows->Close(req->window_id(), (*session)->id(), WaitBudget(*ctx, req->wait_ms())));
}

grpc::Status LocalService::RegisterMemory(grpc::ServerContext* ctx, const v1::RegisterMemoryRequest* req,
                                          v1::RegisterMemoryResponse* resp) {
  absl::StatusOr<std::shared_ptr<Session>> session = SessionOf(ctx);
  if (!session.ok()) return Reply("RegisterMemory", session.status());
  absl::Time start = absl::Now();
  absl::StatusOr<v1::RegisterMemoryResponse> r = DoRegister(**session, *req);
  if (!r.ok()) return Reply("RegisterMemory", r.status());
  deps_.metrics->registration_duration(req->has_host() ? "host" : "cuda")
      .Observe(absl::ToDoubleSeconds(absl::Now() - start));
  // The session may have ended while we registered: its cleanup already ran, so undo.
  if ((*session)->closed()) {
    deps_.regions->RemoveSession((*session)->id());
    return Reply("RegisterMemory", absl::UnavailableError("the session ended during registration"));
  }
  *resp = std::move(*r);
  return grpc::Status::OK;
}

grpc::Status LocalService::DeregisterMemory(grpc::ServerContext* ctx, const v1::DeregisterMemoryRequest* req,
                                            v1::DeregisterMemoryResponse*) {
  absl::StatusOr<std::shared_ptr<Session>> session = SessionOf(ctx);
  if (!session.ok()) return Reply("DeregisterMemory", session.status());
  if (req->region_id() == 0) {
    return Reply("DeregisterMemory", absl::InvalidArgumentError("region_id must be >= 1, got 0"));
  }
  return Reply("DeregisterMemory", deps_.regions->Remove(req->region_id(), (*session)->id()));
}

// ---------------------------------------------------------------- Write

absl::StatusOr<std::shared_ptr<Transfer>> LocalService::PrepareWrite(const std::shared_ptr<Session>& session,
                                                                     const v1::WriteRequest& req) {
  WriteSpec spec;
  spec.src_region_id = req.src_region_id();
  if (req.has_dst()) spec.dst = std::make_shared<const v1::RegionDescriptor>(req.dst());
  spec.notify = req.notify();
  spec.tag = req.tag();
  spec.notify_payload = req.notify_payload();
  FERRY_ASSIGN_OR_RETURN(uint32_t timeout_ms, TimeoutMs(req.timeout_ms()));
  spec.timeout = absl::Milliseconds(timeout_ms);
  spec.traffic_class = req.traffic_class();
  const ChunkLimits limits{deps_.config->max_chunks_per_write};
  return deps_.router->Prepare(
      session, spec,
      [&](uint64_t src_size, uint64_t dst_size) { return BuildChunkPlan(req, src_size, dst_size, limits); },
      /*cached_only=*/false);
}

absl::StatusOr<std::shared_ptr<Transfer>> LocalService::PrepareBatch(const std::shared_ptr<Session>& session,
                                                                     const v1::WriteBatchRequest& req) {
  constexpr int kMaxParts = 1024;
  if (req.parts_size() < 1 || req.parts_size() > kMaxParts) {
    return absl::InvalidArgumentError(absl::StrCat("parts must hold 1..", kMaxParts, " parts, got ", req.parts_size()));
  }
  FERRY_RETURN_IF_ERROR(TransferRouter::CheckNotifyPayload(req.notify(), req.notify_payload()));
  const ChunkLimits limits{deps_.config->max_chunks_per_write};
  FERRY_ASSIGN_OR_RETURN(uint32_t timeout_ms, TimeoutMs(req.timeout_ms()));
  const absl::Duration timeout = absl::Milliseconds(timeout_ms);
  TransferBatch batch(*deps_.router, session, req.parts_size(), limits, /*cached_only=*/false);
  std::shared_ptr<const PagedIds> batch_ids;  // req.blocks, checked at the first part that uses them
  for (int i = 0; i < req.parts_size(); ++i) {
    const v1::WritePart& part = req.parts(i);
    WriteSpec spec;
    spec.src_region_id = part.src_region_id();
    if (part.has_dst()) spec.dst = std::make_shared<const v1::RegionDescriptor>(part.dst());
    spec.timeout = timeout;
    spec.traffic_class = req.traffic_class();
    auto plan = [&](uint64_t src_size, uint64_t dst_size) -> absl::StatusOr<ChunkPlan> {
      switch (part.layout_case()) {
        case v1::WritePart::kChunks:
          return ChunkListPlan(part.chunks(), src_size, dst_size, limits);
        case v1::WritePart::kPaged:
          return PagedPlan(part.paged(), part.paged().src_base(), part.paged().dst_base(), src_size, dst_size, limits);
        default:
          if (!req.has_blocks()) {
            return absl::InvalidArgumentError("layout: set chunks or paged, or the batch's blocks");
          }
          if (batch_ids == nullptr) {
            FERRY_ASSIGN_OR_RETURN(BlockMapping mapping, MappingOf(req.blocks()));
            FERRY_ASSIGN_OR_RETURN(std::shared_ptr<const PagedIds> ids, CheckPagedIds(mapping, limits));
            batch_ids = std::move(ids);
          }
          return PagedPlan(batch_ids, part.src_base(), part.dst_base(), src_size, dst_size);
      }
    };
    FERRY_RETURN_IF_ERROR(batch.Add(spec, plan));
  }
  WriteSpec whole;
  whole.notify = req.notify();
  whole.tag = req.tag();
  whole.notify_payload = req.notify_payload();
  return std::move(batch).Join(whole);
}

absl::StatusOr<uint32_t> LocalService::TimeoutMs(uint32_t requested) const {
  if (requested == 0) return deps_.config->transfer_timeout_ms;
  if (requested > deps_.config->max_transfer_timeout_ms) {
    return absl::InvalidArgumentError(absl::StrCat("timeout_ms must be at most --max_transfer_timeout_ms (",
                                                   deps_.config->max_transfer_timeout_ms, "), got ", requested));
  }
  return requested;
}

absl::Duration LocalService::WaitBudget(const grpc::ServerContext& ctx, uint32_t wait_ms) const {
  absl::Duration timeout = absl::Milliseconds(std::min(wait_ms, deps_.config->max_wait_ms));
  const absl::Duration until_deadline = absl::FromChrono(ctx.deadline()) - absl::Now();
  return std::max(std::min(timeout, until_deadline), absl::ZeroDuration());
}

void LocalService::Answer(const grpc::ServerContext& ctx, Session& session, uint64_t id, uint32_t wait_ms,
                          v1::WriteResponse* resp) {
  resp->set_transfer_id(id);
  absl::StatusOr<v1::WaitResponse> now = session.Wait(id, WaitBudget(ctx, wait_ms));
  if (now.ok() && now->done()) *resp->mutable_result() = std::move(*now->mutable_result());
}

absl::StatusOr<uint64_t> LocalService::Start(Session& session, std::shared_ptr<Transfer> t) {
  t->id = deps_.transfers->NextId();
  FERRY_RETURN_IF_ERROR(session.BeginTransfer(t->id));
  const uint64_t id = t->id;
  deps_.router->Launch(std::move(t));
  return id;
}

grpc::Status LocalService::Write(grpc::ServerContext* ctx, const v1::WriteRequest* req, v1::WriteResponse* resp) {
  absl::StatusOr<std::shared_ptr<Session>> session = SessionOf(ctx);
  if (!session.ok()) return Reply("Write", session.status());
  if (shutting_down_.load()) return Reply("Write", absl::UnavailableError("the agent is shutting down"));
  absl::StatusOr<std::shared_ptr<Transfer>> t = PrepareWrite(*session, *req);
  if (!t.ok()) return Reply("Write", t.status());
  absl::StatusOr<uint64_t> id = Start(**session, std::move(*t));
  if (!id.ok()) return Reply("Write", id.status());
  Answer(*ctx, **session, *id, req->wait_ms(), resp);
  return grpc::Status::OK;
}

grpc::Status LocalService::WriteBatch(grpc::ServerContext* ctx, const v1::WriteBatchRequest* req,
                                      v1::WriteResponse* resp) {
  absl::StatusOr<std::shared_ptr<Session>> session = SessionOf(ctx);
  if (!session.ok()) return Reply("WriteBatch", session.status());
  if (shutting_down_.load()) return Reply("WriteBatch", absl::UnavailableError("the agent is shutting down"));
  absl::StatusOr<std::shared_ptr<Transfer>> t = PrepareBatch(*session, *req);
  if (!t.ok()) return Reply("WriteBatch", t.status());
  absl::StatusOr<uint64_t> id = Start(**session, std::move(*t));
  if (!id.ok()) return Reply("WriteBatch", id.status());
  Answer(*ctx, **session, *id, req->wait_ms(), resp);
  return grpc::Status::OK;
}

grpc::Status LocalService::SendMessage(grpc::ServerContext* ctx, const v1::SendMessageRequest* req,
                                       v1::SendMessageResponse*) {
  absl::StatusOr<std::shared_ptr<Session>> session = SessionOf(ctx);
  if (!session.ok()) return Reply("SendMessage", session.status());
  if (shutting_down_.load()) return Reply("SendMessage", absl::UnavailableError("the agent is shutting down"));
  if (!req->has_dst()) {
    return Reply("SendMessage", absl::InvalidArgumentError("dst: the destination RegionDescriptor is missing"));
  }
  absl::StatusOr<uint32_t> timeout_ms = TimeoutMs(req->timeout_ms());
  if (!timeout_ms.ok()) return Reply("SendMessage", timeout_ms.status());
  return Reply("SendMessage", deps_.router->SendMessage(
                                  std::make_shared<const v1::RegionDescriptor>(req->dst()), req->tag(), req->payload(),
                                  absl::Now() + absl::Milliseconds(*timeout_ms), (*session)->creds().uid));
}

grpc::Status LocalService::Wait(grpc::ServerContext* ctx, const v1::WaitRequest* req, v1::WaitResponse* resp) {
  absl::StatusOr<std::shared_ptr<Session>> session = SessionOf(ctx);
  if (!session.ok()) return Reply("Wait", session.status());
  if (req->transfer_id() == 0) return Reply("Wait", absl::InvalidArgumentError("transfer_id must be >= 1, got 0"));
  absl::StatusOr<v1::WaitResponse> r = (*session)->Wait(req->transfer_id(), WaitBudget(*ctx, req->timeout_ms()));
  if (!r.ok()) return Reply("Wait", r.status());
  *resp = std::move(*r);
  return grpc::Status::OK;
}

// ---------------------------------------------------------------- queues

absl::StatusOr<uint64_t> LocalService::DoCreateQueue(const std::shared_ptr<Session>& session,
                                                     const v1::CreateQueueRequest& req) {
  constexpr int kMaxDestinations = 64;
  if (deps_.queues == nullptr) return absl::FailedPreconditionError("this agent serves no transfer queues");
  if (req.destinations_size() < 1 || req.destinations_size() > kMaxDestinations) {
    return absl::InvalidArgumentError(
        absl::StrCat("destinations must hold 1..", kMaxDestinations, " descriptors, got ", req.destinations_size()));
  }
  FERRY_ASSIGN_OR_RETURN(uint32_t timeout_ms, TimeoutMs(req.timeout_ms()));
  absl::StatusOr<TrafficClass> traffic_class = ResolveClass(session->qos_rule(), req.traffic_class());
  if (!traffic_class.ok()) return traffic_class.status();
  // Check every destination now and warm the peer and region caches, so that entries
  // (taken on a NIC worker, which never waits on the network) find them cached.
  std::vector<std::shared_ptr<const v1::RegionDescriptor>> destinations;
  for (int i = 0; i < req.destinations_size(); ++i) {
    destinations.push_back(std::make_shared<const v1::RegionDescriptor>(req.destinations(i)));
    absl::Status s = deps_.router->CheckDestination(destinations.back(), absl::Now() + absl::Milliseconds(timeout_ms));
    if (!s.ok()) return WithPrefix(s, absl::StrCat("destinations[", i, "]: "));
  }
  absl::StatusOr<UniqueFd> ring = session->TakeFd(req.ring_fd());
  if (!ring.ok()) return WithPrefix(ring.status(), "ring_fd: ");
  absl::StatusOr<UniqueFd> submit = session->TakeFd(req.submit_doorbell_fd());
  if (!submit.ok()) {
    return WithPrefix(submit.status(), "submit_doorbell_fd: ");
  }
  absl::StatusOr<UniqueFd> complete = session->TakeFd(req.complete_doorbell_fd());
  if (!complete.ok()) {
    return WithPrefix(complete.status(), "complete_doorbell_fd: ");
  }
  const uint64_t id = next_queue_id_.fetch_add(1);
  absl::StatusOr<std::shared_ptr<TransferQueue>> q =
      TransferQueue::Open(id, session->id(), std::move(*ring), std::move(*submit), std::move(*complete), req.entries(),
                          req.table_ids(), std::move(destinations));
  if (!q.ok()) return q.status();
  (*q)->set_timeout_ms(timeout_ms);
  (*q)->set_traffic_class(req.traffic_class());
  (*q)->set_owner_uid(session->creds().uid);
  FERRY_RETURN_IF_ERROR(deps_.queues->Add(*q, deps_.config->max_queues, deps_.config->max_queues_per_uid));
  return id;
}

grpc::Status LocalService::CreateQueue(grpc::ServerContext* ctx, const v1::CreateQueueRequest* req,
                                       v1::CreateQueueResponse* resp) {
  absl::StatusOr<std::shared_ptr<Session>> session = SessionOf(ctx);
  if (!session.ok()) return Reply("CreateQueue", session.status());
  absl::StatusOr<uint64_t> id = DoCreateQueue(*session, *req);
  if (!id.ok()) return Reply("CreateQueue", id.status());
  resp->set_queue_id(*id);
  return grpc::Status::OK;
}

absl::Status LocalService::DoOpenInbox(const std::shared_ptr<Session>& session, const v1::OpenInboxRequest& req) {
  if (deps_.inboxes == nullptr) return absl::UnimplementedError("this agent serves no inboxes");
  absl::StatusOr<UniqueFd> ring = session->TakeFd(req.ring_fd());
  if (!ring.ok()) return WithPrefix(ring.status(), "ring_fd: ");
  absl::StatusOr<UniqueFd> doorbell = session->TakeFd(req.doorbell_fd());
  if (!doorbell.ok()) {
    return WithPrefix(doorbell.status(), "doorbell_fd: ");
  }
  // Claimed before the pump starts: from then on it drains the session's notifications.
  FERRY_RETURN_IF_ERROR(session->ClaimNotifications(Session::NotificationReader::kInbox));
  absl::StatusOr<std::unique_ptr<Inbox>> inbox =
      Inbox::Open(session, std::move(*ring), std::move(*doorbell), req.slots());
  if (!inbox.ok()) {
    session->ReleaseNotifications(Session::NotificationReader::kInbox);
    return inbox.status();
  }
  deps_.inboxes->Add(std::move(*inbox));
  return absl::OkStatus();
}

grpc::Status LocalService::OpenInbox(grpc::ServerContext* ctx, const v1::OpenInboxRequest* req,
                                     v1::OpenInboxResponse*) {
  absl::StatusOr<std::shared_ptr<Session>> session = SessionOf(ctx);
  if (!session.ok()) return Reply("OpenInbox", session.status());
  return Reply("OpenInbox", DoOpenInbox(*session, *req));
}

// ---------------------------------------------------------------- streams

template <typename Event>
grpc::Status LocalService::Drain(grpc::ServerContext* ctx, const char* api, EventQueue<Event>& (Session::*queue)(),
                                 grpc::ServerWriter<Event>* writer) {
  absl::StatusOr<std::shared_ptr<Session>> session = SessionOf(ctx);
  if (!session.ok()) return Reply(api, session.status());
  EventQueue<Event>& events = ((**session).*queue)();
  // Bounded waits: notice cancellation, session end and shutdown within 200 ms.
  while (!ctx->IsCancelled() && !shutting_down_.load()) {
    std::optional<Event> e = events.Pop(absl::Milliseconds(200));
    if (e.has_value()) {
      if (!writer->Write(*e)) return grpc::Status::OK;  // client went away
    } else if (events.closed()) {
      return Reply(api, absl::CancelledError("the session ended"));
    }
  }
  return grpc::Status::OK;
}

grpc::Status LocalService::WatchCompletions(grpc::ServerContext* ctx, const v1::WatchCompletionsRequest*,
                                            grpc::ServerWriter<v1::TransferResult>* writer) {
  return Drain(ctx, "WatchCompletions", &Session::completions, writer);
}

grpc::Status LocalService::WatchNotifications(grpc::ServerContext* ctx, const v1::WatchNotificationsRequest*,
                                              grpc::ServerWriter<v1::Notification>* writer) {
  absl::StatusOr<std::shared_ptr<Session>> session = SessionOf(ctx);
  if (!session.ok()) return Reply("WatchNotifications", session.status());
  if (absl::Status s = (*session)->ClaimNotifications(Session::NotificationReader::kStream); !s.ok()) {
    return Reply("WatchNotifications", s);
  }
  grpc::Status drained = Drain(ctx, "WatchNotifications", &Session::notifications, writer);
  (*session)->ReleaseNotifications(Session::NotificationReader::kStream);
  return drained;
}

// ---------------------------------------------------------------- status

grpc::Status LocalService::GetStatus(grpc::ServerContext*, const v1::GetStatusRequest*, v1::GetStatusResponse* resp) {
  const AgentConfig& cfg = *deps_.config;
  resp->set_version(kFerryVersion);
  resp->set_incarnation(deps_.incarnation);
  resp->set_socket(cfg.socket);
  resp->set_peer_address(deps_.advertise_address);
  resp->set_metrics_address(cfg.metrics_address);
  resp->set_uptime_seconds(absl::ToInt64Seconds(absl::Now() - started_));
  resp->set_sessions(deps_.sessions->size());
  resp->set_regions(deps_.regions->size());
  resp->set_registered_bytes(deps_.regions->total_bytes());
  resp->set_transfers_inflight(deps_.transfers->inflight());
  resp->set_transfers_completed(deps_.transfers->completed());
  resp->set_transfers_failed(deps_.transfers->failed());
  resp->set_notifications_lost(deps_.transfers->notifications_lost());
  if (deps_.cuda != nullptr) {
    const CudaDriver* cu = *CudaDriver::Load();
    resp->set_cuda(absl::StrCat("driver ", cu->version, ", ", cu->device_count, " devices"));
    resp->set_cuda_imports(deps_.cuda->live_imports());
  } else {
    resp->set_cuda(std::string(deps_.cuda_unavailable.message()));
  }
  resp->set_qos(cfg.qos.scheduling.enabled);
  for (const std::shared_ptr<Session>& s : deps_.sessions->List()) {
    const TenantRule& rule = s->qos_rule();
    v1::TenantStatus* t = resp->add_tenants();
    t->set_session_id(s->id());
    t->set_pid(s->creds().pid);
    t->set_uid(s->creds().uid);
    t->set_gid(s->creds().gid);
    t->set_rule(rule.name);
    t->set_ceiling(ToProto(rule.ceiling));
    t->set_default_class(ToProto(rule.default_class));
    t->set_weight(rule.weight);
    for (TrafficClass c : {TrafficClass::kLatency, TrafficClass::kBulk, TrafficClass::kBackground}) {
      t->add_fabric_bytes(s->fabric_bytes(c));
    }
  }
  if (deps_.fill_status) deps_.fill_status(resp);
  return grpc::Status::OK;
}

grpc::Status LocalService::GetTopology(grpc::ServerContext*, const v1::GetTopologyRequest*,
                                       v1::GetTopologyResponse* resp) {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  resp->set_hostname(host);
  if (deps_.fill_topology) deps_.fill_topology(resp);
  return grpc::Status::OK;
}

}  // namespace ferry
