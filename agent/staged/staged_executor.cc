#include "agent/staged/staged_executor.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "agent/common/status_macros.h"
#include "agent/common/thread_name.h"
#include "agent/staged/staging_memory.h"
#include "proto/ferry/v1/grpc_status.h"

namespace ferry {

// One stage's CommitStaged call: its context, request and response live until its
// callback ran.
struct StagedExecutor::CommitCall {
  grpc::ClientContext ctx;
  v1::CommitStagedRequest req;
  v1::CommitStagedResponse resp;
};

// Engine and RPC callbacks of one transfer in flight, arriving on other threads: how
// many are outstanding, and the first error.
class StagedExecutor::StageTracker {
 public:
  void Start() {
    absl::MutexLock lock(&mu_);
    ++outstanding_;
  }
  void Finish(absl::Status s) {
    absl::MutexLock lock(&mu_);
    if (!s.ok() && status_.ok()) status_ = std::move(s);
    --outstanding_;
  }
  absl::Status status() {
    absl::MutexLock lock(&mu_);
    return status_;
  }
  // Waits until every started stage finished; each ends by the transfer's deadline (the
  // engine's watchdog, the commit's RPC deadline), the slack only guards against a bug.
  absl::Status WaitAll(absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return outstanding_ == 0; };
    if (!mu_.AwaitWithDeadline(absl::Condition(&idle), deadline + absl::Seconds(10))) {
      return absl::InternalError("a staged write's stage or notification never completed");
    }
    return status_;
  }

 private:
  absl::Mutex mu_;
  int outstanding_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

StagedExecutor::StagedExecutor(StagedExecutorOptions options, FabricEngine* engine, const CudaDriver* cu,
                               StageCopier* copier)
    : options_(options), engine_(engine), cu_(cu), copier_(copier) {
  for (int i = 0; i < options_.workers; ++i) workers_.emplace_back([this] { Work(); });
}

StagedExecutor::~StagedExecutor() {
  std::deque<std::pair<std::shared_ptr<Transfer>, Done>> left;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    left.swap(queue_);
  }
  for (std::thread& w : workers_) w.join();
  for (auto& [t, done] : left) done(absl::UnavailableError("the agent is shutting down"));
}

void StagedExecutor::Submit(std::shared_ptr<Transfer> t, Done done) {
  absl::MutexLock lock(&mu_);
  queue_.emplace_back(std::move(t), std::move(done));
}

void StagedExecutor::Work() {
  NameThisThread("ferry-staged");
  LocalStaging local;
  for (;;) {
    std::pair<std::shared_ptr<Transfer>, Done> job;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    job.second(Run(job.first, local));
  }
}

std::shared_ptr<SlotPool> StagedExecutor::RemoteSlots(RemoteRegion& opened) const {
  RemoteRegion& region = opened.staging_owner != nullptr ? *opened.staging_owner : opened;
  absl::MutexLock lock(&region.staging_mu);
  if (region.staging_slots == nullptr) {
    region.staging_slots = std::make_shared<SlotPool>(region.staging->size(), options_.stage_bytes);
  }
  return region.staging_slots;
}

absl::Status StagedExecutor::Run(const std::shared_ptr<Transfer>& t, LocalStaging& local) {
  const std::shared_ptr<RemoteRegion> region = t->remote_region;
  const bool src_staged = t->stage_src;
  const bool dst_staged = region->staging.has_value();
  if (src_staged && local.memory == nullptr) {
    FERRY_ASSIGN_OR_RETURN(std::shared_ptr<Region> s, AllocateStagingRegion(options_.buffer_bytes, cu_, engine_));
    local.memory = std::move(s);
    local.slots = std::make_shared<SlotPool>(local.memory->size(), options_.stage_bytes);
  }
  const std::shared_ptr<SlotPool> remote_slots = dst_staged ? RemoteSlots(*region) : nullptr;
  uint64_t limit = UINT64_MAX;
  if (src_staged) limit = std::min(limit, local.slots->slot_bytes());
  if (dst_staged) limit = std::min(limit, remote_slots->slot_bytes());

  // Cut the chunks into stages of at most `limit` bytes and start each; a stage that
  // cannot start (no slot by the deadline, a failed copy) or an earlier stage's error
  // stops the loop. Stages already started always finish before Run returns: they
  // hold slots and write from this worker's buffer.
  const LocalStaging none;
  auto tracker = std::make_shared<StageTracker>();
  absl::Status started;
  std::vector<CopyChunk> stage;
  uint64_t stage_bytes = 0;
  auto start = [&] {
    started = StartStage(t, stage, src_staged ? local : none, remote_slots, tracker);
    stage.clear();
    stage_bytes = 0;
    return started.ok();
  };
  for (size_t i = 0; i < t->plan.size() && started.ok(); ++i) {
    const CopyChunk c = t->plan.chunk(i);
    for (uint64_t off = 0; off < c.length;) {
      const uint64_t n = std::min(c.length - off, limit - stage_bytes);
      stage.push_back({c.src_offset + off, c.dst_offset + off, n});
      stage_bytes += n;
      off += n;
      if (stage_bytes == limit && !start()) break;
    }
  }
  if (started.ok() && !stage.empty()) start();
  absl::Status finished = tracker->WaitAll(t->deadline);
  if (!started.ok()) return started;
  if (!finished.ok()) return finished;
  if (!t->notify) return absl::OkStatus();
  tracker->Start();
  engine_->NotifyDelivered(t, [tracker](absl::Status s) { tracker->Finish(std::move(s)); });
  return tracker->WaitAll(t->deadline);
}

StagedExecutor::StagePlan StagedExecutor::PlanStage(const Transfer& t, const std::vector<CopyChunk>& stage,
                                                    const SlotLease& local, const SlotLease& remote) const {
  // Staged sides are packed: the stage's chunks back to back from the slot's start.
  const uint64_t local_base = local.held() ? local.offset() : 0;
  const uint64_t remote_base = remote.held() ? remote.offset() : 0;
  StagePlan plan;
  plan.sub = std::make_shared<Transfer>();
  Transfer& sub = *plan.sub;
  sub.id = t.id;
  sub.session = t.session;
  sub.share = t.share;
  sub.path = v1::TRANSFER_PATH_STAGED;
  sub.src = t.src;
  sub.deadline = t.deadline;
  sub.dst_descriptor = t.dst_descriptor;
  sub.rail = engine_->RailFor(*t.src);  // the GPU's rail, not the staging buffer's
  if (remote.held()) {
    plan.commit = std::make_shared<CommitCall>();
    const v1::RegionDescriptor& d = *t.dst_descriptor;
    v1::CommitStagedRequest& req = plan.commit->req;
    req.set_target_incarnation(d.agent_incarnation());
    req.set_region_id(d.region_id());
    req.set_token(d.token());
    req.set_staging_id(t.remote_region->staging->id());
    req.set_window_id(d.window_id());
    plan.commit->ctx.set_deadline(absl::ToChronoTime(std::max(t.deadline, absl::Now() + absl::Milliseconds(100))));
  }
  uint64_t packed = 0;
  for (const CopyChunk& c : stage) {
    sub.plan.chunks.push_back({local.held() ? local_base + packed : c.src_offset,
                               remote.held() ? remote_base + packed : c.dst_offset, c.length});
    if (local.held()) plan.gather.push_back({c.src_offset, packed, c.length});
    if (plan.commit != nullptr) {
      v1::Chunk* out = plan.commit->req.add_chunks();
      out->set_src_offset(remote_base + packed);
      out->set_dst_offset(c.dst_offset);
      out->set_length(c.length);
    }
    packed += c.length;
  }
  sub.plan.total_bytes = packed;
  return plan;
}

absl::Status StagedExecutor::StartStage(const std::shared_ptr<Transfer>& t, const std::vector<CopyChunk>& stage,
                                        const LocalStaging& local, const std::shared_ptr<SlotPool>& remote_slots,
                                        const std::shared_ptr<StageTracker>& tracker) {
  const std::shared_ptr<PeerConnection> peer = t->peer;
  const std::shared_ptr<RemoteRegion> region = t->remote_region;
  FERRY_RETURN_IF_ERROR(tracker->status());  // an earlier stage failed
  FERRY_RETURN_IF_ERROR(t->Stopped(absl::Now()));

  // Slots: the target's first, then this worker's. A worker's own slots free as its
  // writes complete, which waits on nothing a worker holds, so there is no cycle. Until
  // the write is submitted, a return gives them back (the leases go).
  auto slots = std::make_shared<StageSlots>();
  if (remote_slots != nullptr) {
    FERRY_ASSIGN_OR_RETURN(slots->remote, SlotLease::Acquire(remote_slots, t->deadline));
  }
  if (local.slots != nullptr) {
    FERRY_ASSIGN_OR_RETURN(slots->local, SlotLease::Acquire(local.slots, t->deadline));
  }
  StagePlan plan = PlanStage(*t, stage, slots->local, slots->remote);
  if (slots->local.held()) {
    FERRY_RETURN_IF_ERROR(copier_->FromRegion(*t->src, local.memory->data() + slots->local.offset(), plan.gather));
    plan.sub->src = local.memory;
  }

  // From here the stage's callbacks hold its slots: this worker's until the write
  // completes, the target's until the commit does (or the write fails).
  tracker->Start();
  std::vector<v1::RemoteKey> keys = region->keys;
  if (plan.commit != nullptr) keys.assign(region->staging->keys().begin(), region->staging->keys().end());
  // Staged writes are left out of the stale-key guard (see RailWorker): their keys are
  // the target's staging buffer's, which stays registered while the region lives, and a
  // staged transfer is not written again after a drop (it fails UNAVAILABLE).
  engine_->SubmitTo(plan.sub, peer, keys, region->region_id, absl::InfiniteFuture(),
                    [slots, commit = plan.commit, tracker, peer, region](absl::Status s) {
                      slots->local.Release();
                      if (!s.ok() || commit == nullptr) {
                        slots->remote.Release();
                        tracker->Finish(std::move(s));
                        return;
                      }
                      // The call owns `commit` (context, request, response) until it ends.
                      peer->stub()->async()->CommitStaged(&commit->ctx, &commit->req, &commit->resp,
                                                          [commit, slots, tracker, peer, region](grpc::Status rpc) {
                                                            slots->remote.Release();
                                                            tracker->Finish(CommitStatus(rpc, *peer, *region));
                                                          });
                    });
  return absl::OkStatus();
}

absl::Status StagedExecutor::CommitStatus(const grpc::Status& rpc, PeerConnection& peer, const RemoteRegion& region) {
  absl::Status status = FromGrpcStatus(rpc, absl::StrCat("committing a stage on agent ", peer.address(), " failed: "));
  if (absl::IsUnavailable(status) || absl::IsNotFound(status)) {
    // The target restarted or dropped the buffer: the next transfer opens the region anew.
    peer.ForgetRegion(region.region_id, region.window_id);
    return absl::UnavailableError(status.message());
  }
  return status;
}

}  // namespace ferry
