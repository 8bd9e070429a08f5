#include "agent/router/transfer_router.h"

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "agent/common/check.h"
#include "agent/common/log.h"
#include "agent/common/poll_source.h"
#include "agent/common/status_macros.h"
#include "agent/common/status_prefix.h"
#include "agent/common/token.h"
#include "agent/peers/remote_target.h"
#include "proto/ferry/v1/grpc_status.h"

namespace ferry {

absl::StatusOr<std::shared_ptr<Transfer>> TransferRouter::Prepare(const std::shared_ptr<Session>& session,
                                                                  const WriteSpec& spec, PlanChunks plan,
                                                                  bool cached_only) const {
  auto t = std::make_shared<Transfer>();
  FERRY_RETURN_IF_ERROR(PrepareInto(session, spec, plan, cached_only, /*batch=*/nullptr, *t));
  return t;
}

absl::Status TransferRouter::PrepareInto(const std::shared_ptr<Session>& session, const WriteSpec& spec,
                                         PlanChunks plan, bool cached_only, BatchLookups* batch, Transfer& t) const {
  absl::StatusOr<std::shared_ptr<Region>> src = Source(*session, spec.src_region_id, batch);
  if (!src.ok()) return src.status();
  if (spec.dst == nullptr) return absl::InvalidArgumentError("dst: the destination RegionDescriptor is missing");

  FERRY_RETURN_IF_ERROR(CheckNotifyPayload(spec.notify, spec.notify_payload));
  FERRY_ASSIGN_OR_RETURN(TrafficClass traffic_class, ResolveClass(session->qos_rule(), spec.traffic_class));

  t.session = session;
  t.share = session->Share(traffic_class);
  t.src = *std::move(src);
  t.notify = spec.notify;
  t.tag = spec.tag;
  t.notify_payload = spec.notify_payload;
  t.submitted = batch != nullptr ? batch->now : deps_.clock->Now();
  t.cached_only = cached_only;
  t.deadline = t.submitted + spec.timeout;
  FERRY_ASSIGN_OR_RETURN(uint64_t dst_size, Destination(spec.dst, t, batch));
  FERRY_ASSIGN_OR_RETURN(ChunkPlan chunks, plan(t.src->size(), dst_size));
  t.plan = std::move(chunks);
  if (t.window != nullptr) {
    absl::Status inside = CheckWindowChunks(t, t.window->window().ranges(), t.window->window().id(), t.dst->id());
    if (!inside.ok()) {
      deps_.windows->Refuse(*t.dst, t.window->window().id(), inside);
      return inside;
    }
  }
  return t.dst_descriptor != nullptr ? RouteRemote(t) : absl::OkStatus();
}

absl::Status TransferRouter::CheckWindowChunks(const Transfer& t, const std::vector<ByteSpan>& ranges,
                                               uint64_t window_id, uint64_t region_id) {
  for (size_t i = 0; i < t.plan.size(); ++i) {
    const CopyChunk c = t.plan.chunk(i);
    if (!SpansCover(ranges, c.dst_offset, c.length)) {
      return absl::OutOfRangeError(absl::StrCat("destination range of chunk ", i, " [", c.dst_offset, ", +", c.length,
                                                ") is outside write window ", window_id, " of region ", region_id,
                                                "; nothing was written"));
    }
  }
  return absl::OkStatus();
}

absl::Status TransferRouter::CheckWriter(const WindowWriter& writer, const Transfer& t) const {
  if (writer.any() || t.session == nullptr) return absl::OkStatus();  // no writer named, or no write (a probe)
  if (writer.incarnation == deps_.incarnation) {
    absl::StatusOr<std::shared_ptr<Region>> r = deps_.regions->Lookup(writer.region_id);
    if (r.ok() && (*r)->owner_session() == t.session->id()) return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat("this write window is for the session owning region ",
                                                  writer.region_id, " on agent incarnation ", writer.incarnation,
                                                  "; this session is not it; nothing was written"));
}

absl::StatusOr<std::shared_ptr<Region>> TransferRouter::Source(const Session& session, uint64_t id,
                                                               BatchLookups* batch) const {
  if (batch != nullptr) {  // newest first: a layer's V half follows its K half
    for (auto r = batch->sources.rbegin(); r != batch->sources.rend(); ++r) {
      if ((*r)->id() == id) return *r;  // checked to be the session's when it was added
    }
  }
  if (id == 0) return absl::InvalidArgumentError("src_region_id must be a region id (>= 1), got 0");
  absl::StatusOr<std::shared_ptr<Region>> r = deps_.regions->Lookup(id);
  if (!r.ok()) return absl::NotFoundError(absl::StrCat("src_region_id ", id, " is not registered with this agent"));
  if ((*r)->owner_session() != session.id()) {
    return absl::PermissionDeniedError(absl::StrCat("src_region_id ", id,
                                                    " belongs to another session; a session may only write from "
                                                    "regions it registered"));
  }
  if (batch != nullptr && batch->sources.size() < BatchLookups::kMax) batch->sources.push_back(*r);
  return r;
}

absl::Status TransferRouter::CheckDestination(const std::shared_ptr<const v1::RegionDescriptor>& dst,
                                              absl::Time deadline) const {
  Transfer probe;
  probe.deadline = deadline;
  // A region in window mode is a queue's destination all the same: its entries name a
  // window (ring_layout.h, kFlagWindow).
  FERRY_RETURN_IF_ERROR(Destination(dst, probe, /*batch=*/nullptr, /*window_mode_ok=*/true).status());
  if (probe.dst_descriptor == nullptr) return absl::OkStatus();
  absl::Status remote = RouteRemote(probe);
  if (IsWindowModeError(remote)) {
    return absl::OkStatus();  // its agent answered: the peer is known, the region is there
  }
  return remote;
}

absl::Status TransferRouter::CheckNotifyPayload(bool notify, const std::string& payload) {
  if (payload.size() > kMaxNotifyPayloadBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("notify_payload is ", payload.size(), " bytes; at most ", kMaxNotifyPayloadBytes));
  }
  if (!notify && !payload.empty()) {
    return absl::InvalidArgumentError("notify_payload needs notify: nobody would receive it");
  }
  return absl::OkStatus();
}

namespace {

// A notified write whose receiver is on another agent.
bool NotifiesRemotely(const Transfer& t) {
  return t.notify && t.dst == nullptr && t.peer != nullptr && t.dst_descriptor != nullptr;
}

// Tells the remote receiver's agent that a notified write starts (NotifyRequest.begin),
// so that it can tell the receiver should this agent die before the write's own
// notification (agent/peers/inbound_writes.h). Asynchronous and best effort, like
// NotifyRemoteFailure; the write does not wait for it.
void AnnounceRemoteWrite(const TransferRouterDeps& deps, const std::shared_ptr<Transfer>& t) {
  if (!NotifiesRemotely(*t)) return;
  v1::NotifyRequest req = DeliverNotifyRequest(*t->dst_descriptor, deps.incarnation, v1::NOTIFICATION_KIND_WRITE, t->id,
                                               t->tag, /*bytes=*/0, t->notify_payload);
  req.set_deliver(false);
  req.set_begin(true);
  req.set_source_address(deps.advertise_address);
  const int64_t left_ms = absl::ToInt64Milliseconds(absl::Ceil(t->deadline - deps.clock->Now(), absl::Milliseconds(1)));
  req.set_timeout_ms(static_cast<uint32_t>(std::clamp<int64_t>(left_ms, 1, UINT32_MAX)));
  deps.announce_peer(t, std::move(req), [id = t->id](absl::Status s) {
    if (!s.ok()) {
      FERRY_LOG(DEBUG) << "transfer " << id << ": announcing it to the receiver's agent: " << s;
    }
  });
}

// Sends `req` carrying `status` to t's remote agent, best effort and asynchronous (an
// agent that cannot be reached cannot be told); `what` names it in the log.
void SendStatusNotify(const Transfer& t, v1::NotifyRequest req, const absl::Status& status, const char* what) {
  req.set_code(static_cast<int>(status.code()));
  req.set_message(std::string(status.message()));
  SendNotifyAsync(t.peer, std::move(req), absl::Now() + absl::Seconds(2), [id = t.id, what](absl::Status s) {
    if (!s.ok()) {
      FERRY_LOG(DEBUG) << "transfer " << id << ": " << what << ": " << s;
    }
  });
}

// Tells the remote receiver of a notified write that failed after it started, so that it
// does not wait for it (TransferManager::Finish does this for local receivers).
void NotifyRemoteFailure(const Transfer& t, uint64_t incarnation, const absl::Status& status) {
  if (!NotifiesRemotely(t)) return;
  SendStatusNotify(t,
                   DeliverNotifyRequest(*t.dst_descriptor, incarnation, v1::NOTIFICATION_KIND_WRITE, t.id, t.tag,
                                        /*bytes=*/0, t.notify_payload),
                   status, "telling the receiver it failed");
}

// Tells the owner of a remote region in window mode that a write through one of its
// windows was refused here (NOTIFICATION_KIND_WINDOW_REFUSED through its agent, which
// checks the window's token).
void TellRemoteRefusal(const Transfer& t, uint64_t incarnation, const absl::Status& why) {
  if (t.peer == nullptr || t.dst_descriptor == nullptr) return;
  SendStatusNotify(t,
                   DeliverNotifyRequest(*t.dst_descriptor, incarnation, v1::NOTIFICATION_KIND_WINDOW_REFUSED,
                                        /*transfer_id=*/0, t.dst_descriptor->window_id(), /*bytes=*/0, ""),
                   why, "telling a window's owner of a refused write");
}

// What a batch's parts share until the last of them lands: how many are still moving,
// the first error among them, and what ending the batch takes. Owned by the parts'
// callbacks together: the one whose PartDone returns true (the last) takes it and ends
// the batch.
//
//   if (end->PartDone(s)) std::unique_ptr<BatchEnd>(end)->End();
class BatchEnd {
 public:
  BatchEnd(std::shared_ptr<Transfer> t, size_t parts, const TransferRouterDeps& deps,
           std::shared_ptr<std::atomic<bool>> stopping)
      : t_(std::move(t)), deps_(deps), stopping_(std::move(stopping)), left_(parts) {}

  // Counts a part's end; true for the last.
  bool PartDone(const absl::Status& s) {
    absl::MutexLock lock(&mu_);
    if (!s.ok() && error_.ok()) error_ = s;
    return --left_ == 0;
  }

  // Every part ended. A local owner is notified by Finish; a remote one through its
  // agent first, so that the writer's success means "notified".
  void End() {
    absl::Status result;
    {
      absl::MutexLock lock(&mu_);
      result = error_;
    }
    TransferManager* manager = deps_.transfers;
    if (!result.ok() && !stopping_->load()) NotifyRemoteFailure(*t_, deps_.incarnation, result);
    if (!result.ok() || !t_->notify || t_->dst != nullptr) return manager->Finish(*t_, result);
    deps_.notify_peer(t_, [manager, t = t_](absl::Status notified) { manager->Finish(*t, notified); });
  }

 private:
  const std::shared_ptr<Transfer> t_;
  const TransferRouterDeps& deps_;  // the router's, which outlives its transfers
  const std::shared_ptr<std::atomic<bool>> stopping_;
  absl::Mutex mu_;
  size_t left_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

void TransferRouter::Flush() const {
  for (TransferExecutor* e : {deps_.local, deps_.gpu_local, deps_.fabric, deps_.staged}) {
    if (e != nullptr) e->Flush();
  }
}

void TransferRouter::Launch(std::shared_ptr<Transfer> t) const {
  TransferManager* manager = deps_.transfers;
  manager->Begin(*t);
  const uint64_t incarnation = deps_.incarnation;
  AnnounceRemoteWrite(deps_, t);
  if (t->parts.empty()) {
    TransferExecutor* executor = t->executor;
    executor->Submit(t, [manager, t, incarnation, stopping = stopping_](absl::Status s) {
      t->window.reset();  // its bytes are in: a Close waiting on it may return
      if (!s.ok() && !stopping->load()) NotifyRemoteFailure(*t, incarnation, s);
      manager->Finish(*t, s);
    });
    return;
  }
  // One BatchEnd for all parts: each part's callback holds a plain pointer to it, which
  // std::function keeps inline (callbacks that captured shared pointers were an
  // allocation per part, freed on another thread, on the queue poller's path).
  auto* end = new BatchEnd(t, t->parts.size(), deps_, stopping_);
  TransferExecutor::Submissions jobs;
  jobs.reserve(t->parts.size());
  TransferExecutor* shared = t->parts.front()->executor;
  for (const std::shared_ptr<Transfer>& part : t->parts) {
    part->id = t->id;
    if (part->executor != shared) shared = nullptr;
    // The batch (held by `end`) keeps each part alive until every part is done.
    jobs.emplace_back(part, [end, p = part.get()](absl::Status s) {
      p->window.reset();
      if (end->PartDone(s)) std::unique_ptr<BatchEnd>(end)->End();
    });
  }
  if (shared != nullptr) return shared->SubmitAll(std::move(jobs));
  for (auto& [part, done] : jobs) {  // parts on several paths
    TransferExecutor* executor = part->executor;
    executor->Submit(std::move(part), std::move(done));
  }
}

absl::Status TransferRouter::SendMessage(const std::shared_ptr<const v1::RegionDescriptor>& dst, uint64_t tag,
                                         const std::string& payload, absl::Time deadline, uint32_t sender_uid) const {
  if (payload.size() > kMaxNotifyPayloadBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("payload is ", payload.size(), " bytes; at most ", kMaxNotifyPayloadBytes));
  }
  Transfer probe;
  probe.deadline = deadline;
  absl::StatusOr<uint64_t> size = Destination(dst, probe, /*batch=*/nullptr, /*window_mode_ok=*/true);
  if (!size.ok()) return size.status();
  if (probe.dst != nullptr) {  // this agent's region: its token was checked
    v1::Notification n;
    n.set_region_id(probe.dst->id());
    n.set_tag(tag);
    n.set_source_incarnation(deps_.incarnation);
    n.set_payload(payload);
    n.set_kind(v1::NOTIFICATION_KIND_MESSAGE);
    return deps_.transfers->Notify(*probe.dst, n, TransferManager::SenderKey(deps_.incarnation, sender_uid));
  }
  absl::StatusOr<std::shared_ptr<PeerConnection>> peer =
      deps_.remote_targets->Resolve(*dst, deadline, PeerLookup::kMayConnect);
  if (!peer.ok()) return peer.status();
  v1::NotifyRequest req = DeliverNotifyRequest(*dst, deps_.incarnation, v1::NOTIFICATION_KIND_MESSAGE,
                                               /*transfer_id=*/0, tag, /*bytes=*/0, payload);
  req.set_source_uid(sender_uid);
  v1::NotifyResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(deadline));
  grpc::Status s = (*peer)->stub()->Notify(&ctx, req, &resp);
  if (s.ok()) return absl::OkStatus();
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE) (*peer)->MarkSuspect();
  return FromGrpcStatus(s, absl::StrCat("agent ", dst->agent_address(), ": "));
}

absl::StatusOr<uint64_t> TransferRouter::Destination(const std::shared_ptr<const v1::RegionDescriptor>& dst_ptr,
                                                     Transfer& t, BatchLookups* batch, bool window_mode_ok) const {
  const v1::RegionDescriptor& dst = *dst_ptr;
  if (batch != nullptr) {
    for (auto known = batch->local_dsts.rbegin(); known != batch->local_dsts.rend(); ++known) {
      const v1::RegionDescriptor& d = *known->descriptor;
      // The fields the checks below read, equal to those of a descriptor that passed them.
      // Both tokens are the writer's own, so comparing them in variable time tells it
      // nothing.
      if (&d == &dst ||
          (d.region_id() == dst.region_id() && d.agent_incarnation() == dst.agent_incarnation() &&
           d.version() == dst.version() && d.window_id() == dst.window_id() && d.token() == dst.token())) {
        RouteLocal(known->region, t);
        t.window = known->window;
        return known->region->size();
      }
    }
  }
  if (dst.version() != 1) {
    return absl::InvalidArgumentError(absl::StrCat("dst.version ", dst.version(), " is not supported (expected 1)"));
  }
  if (dst.region_id() == 0) return absl::InvalidArgumentError("dst.region_id must be >= 1, got 0");
  absl::StatusOr<Token> token = Token::FromBytes(dst.token(), "dst.token");
  if (!token.ok()) return token.status();

  if (IsLocal(dst)) {
    absl::StatusOr<std::shared_ptr<Region>> d = deps_.regions->Lookup(dst.region_id());
    if (!d.ok()) {
      return absl::NotFoundError(absl::StrCat("dst.region_id ", dst.region_id(),
                                              " is not registered (it was deregistered or its owner exited)"));
    }
    std::shared_ptr<WindowAdmission> window;
    if (dst.window_id() != 0) {
      FERRY_ASSIGN_OR_RETURN(WindowAdmission admitted, deps_.windows->Admit(dst.window_id(), *token, dst.region_id()));
      window = std::make_shared<WindowAdmission>(std::move(admitted));
      if (absl::Status w = CheckWriter(window->window().writer(), t); !w.ok()) {
        deps_.windows->Refuse(**d, dst.window_id(), w);
        return w;
      }
    } else {
      if (!(*d)->token().Equals(*token)) {
        return absl::PermissionDeniedError(absl::StrCat("dst.token does not match region ", dst.region_id()));
      }
      if ((*d)->write_windows() && !window_mode_ok) {
        absl::Status refused = WindowModeError(dst.region_id());
        deps_.windows->Refuse(**d, 0, refused);
        return refused;
      }
    }
    if (batch != nullptr) {  // the oldest goes: a batch through many windows names each region once per window
      if (batch->local_dsts.size() == BatchLookups::kMax) batch->local_dsts.erase(batch->local_dsts.begin());
      batch->local_dsts.push_back({dst_ptr, *d, window});
    }
    const uint64_t size = (*d)->size();
    RouteLocal(*std::move(d), t);
    t.window = std::move(window);
    return size;
  }
  if (dst.agent_address().empty() || dst.agent_address() == deps_.advertise_address) {
    return absl::NotFoundError(
        absl::StrCat("dst is a stale descriptor: it names agent incarnation ", dst.agent_incarnation(),
                     ", which no longer runs (the agent restarted); ask the region's owner for a new descriptor"));
  }
  if (deps_.remote_targets == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("dst lives on agent ", dst.agent_address(),
                                                      " but this agent runs without a fabric (--peer_address unset)"));
  }
  t.dst_descriptor = dst_ptr;
  return dst.size();
}

void TransferRouter::RouteLocal(std::shared_ptr<Region> d, Transfer& t) const {
  t.dst = std::move(d);
  t.path = v1::TRANSFER_PATH_LOCAL;
  const bool gpu = t.dst->kind() == MemoryKind::kCuda || (t.src != nullptr && t.src->kind() == MemoryKind::kCuda);
  t.executor = gpu ? deps_.gpu_local : deps_.local;
}

absl::Status TransferRouter::RouteRemote(Transfer& t) const {
  FERRY_RETURN_IF_ERROR(ResolveRemoteTarget(*deps_.remote_targets, t));
  const v1::RegionDescriptor& d = *t.dst_descriptor;
  if (const RemoteRegion& window = *t.remote_region; window.window_id != 0) {
    // The target's agent handed out keys that reach the window's extent only; the
    // ranges and the writer inside it are checked here, where the writer is known.
    absl::Status ok = CheckWriter(window.window_writer, t);
    if (ok.ok()) ok = CheckWindowChunks(t, window.window_ranges, window.window_id, d.region_id());
    if (!ok.ok()) {
      TellRemoteRefusal(t, deps_.incarnation, ok);
      return ok;
    }
  }
  const bool src_gpu = t.src != nullptr && t.src->kind() == MemoryKind::kCuda;
  // What the descriptor and source say; the region as its agent reports it decides.
  const bool staged_by_kind = deps_.stage_host_regions || d.kind() == v1::MEMORY_KIND_CUDA || src_gpu;
  const bool dst_staged = t.remote_region->staging.has_value();
  if (dst_staged && !staged_by_kind) {
    return absl::FailedPreconditionError(absl::StrCat(
        "dst region ", d.region_id(), " is ", v1::MemoryKind_Name(t.remote_region->kind),
        " memory its agent's NICs cannot reach, but the descriptor says host memory; use the descriptor its owner "
        "was given"));
  }
  if (t.src == nullptr) {  // a destination checked ahead of its writes: no source yet
    t.path = staged_by_kind ? v1::TRANSFER_PATH_STAGED : v1::TRANSFER_PATH_FABRIC;
    return absl::OkStatus();
  }
  const bool src_staged = t.src->nics().empty() || deps_.stage_host_regions;
  if (!src_staged && t.src->nics().size() != deps_.fabric_nics) {
    return absl::FailedPreconditionError(
        absl::StrCat("src_region_id ", t.src->id(), " is not registered with the fabric"));
  }
  if (!src_staged && !dst_staged) {  // the NICs reach both sides (GPU memory with FI_HMEM too)
    t.path = v1::TRANSFER_PATH_FABRIC;
    t.executor = deps_.fabric;
    return absl::OkStatus();
  }
  t.path = v1::TRANSFER_PATH_STAGED;
  t.executor = deps_.staged;
  t.stage_src = src_staged;
  return absl::OkStatus();
}

TransferBatch::TransferBatch(const TransferRouter& router, std::shared_ptr<Session> session, size_t parts,
                             ChunkLimits limits, bool cached_only)
    : router_(router), session_(std::move(session)), limits_(limits), cached_only_(cached_only), block_(parts) {
  FERRY_DCHECK(parts > 0) << "a batch of no parts";
  parts_.reserve(parts);
  lookups_.now = router_.deps_.clock->Now();
}

absl::Status TransferBatch::Add(const WriteSpec& spec, PlanChunks plan) {
  FERRY_DCHECK(parts_.size() < parts_.capacity()) << "more parts than the batch was made for";
  FERRY_DCHECK(!spec.notify) << "a part notifies with the whole batch";
  std::shared_ptr<Transfer> t = block_.part(parts_.size());
  absl::Status s = router_.PrepareInto(session_, spec, plan, cached_only_, &lookups_, *t);
  if (!s.ok()) return NextPartError(s);  // keeps a would-block payload
  chunks_ += t->plan.size();
  if (chunks_ > limits_.max_chunks) {
    return absl::ResourceExhaustedError(absl::StrCat("parts: more than ", limits_.max_chunks,
                                                     " chunks in all (--max_chunks_per_write); split the batch"));
  }
  parts_.push_back(std::move(t));
  return absl::OkStatus();
}

absl::Status TransferBatch::NextPartError(const absl::Status& s) const {
  if (parts_per_span_ == 0) return WithPrefix(s, absl::StrCat("parts[", parts_.size(), "]: "));
  return WithPrefix(s, absl::StrCat("window spans[", parts_.size() / parts_per_span_, "]: parts[",
                                    parts_.size() % parts_per_span_, "]: "));
}

absl::Status TransferBatch::CheckPartsDisjoint() const {
  if (parts_.size() < 2) return absl::OkStatus();
  struct Extent {
    std::tuple<bool, uint64_t, uint64_t> region;  // remote?, agent incarnation, region id
    DestinationExtent bytes;
    const ChunkPlan* plan;
  };
  // Per thread, as the queue poller prepares batch entries: no allocation per batch.
  thread_local std::vector<Extent> extents;
  extents.clear();
  for (const auto& part : parts_) {
    const bool remote = part->dst == nullptr;
    extents.push_back({{remote, remote ? part->dst_descriptor->agent_incarnation() : 0,
                        remote ? part->dst_descriptor->region_id() : part->dst->id()},
                       ExtentOf(part->plan),
                       &part->plan});
  }
  std::sort(extents.begin(), extents.end(), [](const Extent& a, const Extent& b) {
    return std::tie(a.region, a.bytes.begin) < std::tie(b.region, b.bytes.begin);
  });
  // Runs of parts into one region whose extents chain into each other, [first, i): the
  // chunks of a run of two or more are checked together.
  size_t first = 0;
  uint64_t run_end = extents[0].bytes.end;
  for (size_t i = 1; i <= extents.size(); ++i) {
    if (i < extents.size() && extents[i].region == extents[first].region && extents[i].bytes.begin < run_end) {
      run_end = std::max(run_end, extents[i].bytes.end);
      continue;
    }
    if (i - first > 1) {
      std::vector<const ChunkPlan*> run;
      for (size_t j = first; j < i; ++j) run.push_back(extents[j].plan);
      if (absl::Status s = CheckDisjointDestinations(run); !s.ok()) {
        return WithPrefix(s, absl::StrCat("parts: two parts write region ", std::get<2>(extents[first].region), ": "));
      }
    }
    if (i == extents.size()) break;
    first = i;
    run_end = extents[i].bytes.end;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Transfer>> TransferBatch::Join(const WriteSpec& whole) && {
  FERRY_DCHECK(!parts_.empty()) << "a batch of no parts";
  FERRY_RETURN_IF_ERROR(CheckPartsDisjoint());
  const Transfer& first = *parts_.front();
  auto t = std::make_shared<Transfer>();
  t->session = first.session;
  t->share = first.share;
  t->path = first.path;
  t->notify = whole.notify;
  t->tag = whole.tag;
  t->notify_payload = whole.notify_payload;
  t->submitted = first.submitted;
  t->deadline = first.deadline;
  // Where the notification goes: the first part's destination.
  t->dst = first.dst;
  t->dst_descriptor = first.dst_descriptor;
  t->peer = first.peer;
  t->remote_region = first.remote_region;
  for (const auto& part : parts_) t->plan.total_bytes += part->plan.total_bytes;
  t->parts = std::move(parts_);
  return t;
}

}  // namespace ferry
