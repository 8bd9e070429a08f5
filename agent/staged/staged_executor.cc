#include "agent/staged/staged_executor.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "agent/staged/staging_memory.h"

namespace ferry {
namespace {

// Engine callbacks arrive on other threads; this waits for one, bounded.
class Completion {
 public:
  TransferExecutor::Done callback() {
    return [this](absl::Status s) {
      status_ = std::move(s);
      done_.Notify();
    };
  }
  // The engine's watchdog ends every transfer by its deadline; the slack only guards
  // against a bug turning into a hang.
  absl::Status Wait(absl::Time deadline) {
    if (!done_.WaitForNotificationWithDeadline(deadline + absl::Seconds(10))) {
      return absl::InternalError("a staged write's stage never completed");
    }
    return status_;
  }

 private:
  absl::Notification done_;
  absl::Status status_;
};

}  // namespace

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

bool StagedExecutor::SourceStaged(const Region& src) const {
  return src.kind() == MemoryKind::kCuda || options_.stage_host_regions;
}

absl::Status StagedExecutor::Prepare(Transfer& t) {
  absl::Status s = engine_->ResolveTarget(t);
  if (!s.ok()) return s;
  if (t.src == nullptr) return absl::OkStatus();  // a queue's destination, checked without a source
  const bool src_staged = SourceStaged(*t.src);
  if (!src_staged && t.src->nics().size() != engine_->nics().size()) {
    return absl::FailedPreconditionError(absl::StrCat("src_region_id ", t.src->id(), " is not registered with the fabric"));
  }
  return absl::OkStatus();
}

void StagedExecutor::Submit(std::shared_ptr<Transfer> t, Done done) {
  absl::MutexLock lock(&mu_);
  queue_.emplace_back(std::move(t), std::move(done));
}

void StagedExecutor::Work() {
  std::shared_ptr<Region> staging;  // this worker's local staging, made on first need
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
    job.second(Run(job.first, staging));
  }
}

absl::Status StagedExecutor::Run(const std::shared_ptr<Transfer>& t, std::shared_ptr<Region>& staging) {
  const std::shared_ptr<RemoteRegion> region = FabricEngine::TargetRegion(*t);
  const bool src_staged = SourceStaged(*t->src);
  const bool dst_staged = region->staging.has_value();
  if (src_staged && staging == nullptr) {
    absl::StatusOr<std::shared_ptr<Region>> s = AllocateStagingRegion(options_.buffer_bytes, cu_, engine_);
    if (!s.ok()) return s.status();
    staging = std::move(*s);
  }
  uint64_t limit = UINT64_MAX;
  if (src_staged) limit = std::min(limit, staging->size());
  if (dst_staged) limit = std::min(limit, region->staging->size());
  // One transfer at a time uses the target's staging buffer.
  std::optional<absl::MutexLock> turn;
  if (dst_staged) turn.emplace(&region->staging_mu);

  std::vector<CopyChunk> stage;
  uint64_t stage_bytes = 0;
  for (const CopyChunk& c : t->plan.chunks) {
    for (uint64_t off = 0; off < c.length;) {
      const uint64_t n = std::min(c.length - off, limit - stage_bytes);
      stage.push_back({c.src_offset + off, c.dst_offset + off, n});
      stage_bytes += n;
      off += n;
      if (stage_bytes == limit) {
        absl::Status s = RunStage(t, stage, staging);
        if (!s.ok()) return s;
        stage.clear();
        stage_bytes = 0;
      }
    }
  }
  if (!stage.empty()) {
    absl::Status s = RunStage(t, stage, staging);
    if (!s.ok()) return s;
  }
  if (!t->notify) return absl::OkStatus();
  Completion notified;
  engine_->NotifyDelivered(t, notified.callback());
  return notified.Wait(t->deadline);
}

absl::Status StagedExecutor::RunStage(const std::shared_ptr<Transfer>& t, const std::vector<CopyChunk>& stage,
                                      std::shared_ptr<Region>& staging) {
  const std::shared_ptr<PeerConnection> peer = FabricEngine::TargetPeer(*t);
  const std::shared_ptr<RemoteRegion> region = FabricEngine::TargetRegion(*t);
  const bool src_staged = SourceStaged(*t->src);
  const bool dst_staged = region->staging.has_value();
  if (absl::Now() > t->deadline) {
    return absl::DeadlineExceededError(absl::StrCat("transfer ", t->id, " passed its deadline"));
  }

  // Staged sides are packed: the stage's chunks back to back from offset 0.
  auto sub = std::make_shared<Transfer>();
  sub->id = t->id;
  sub->session = t->session;
  sub->path = v1::TRANSFER_PATH_STAGED;
  sub->src = t->src;
  sub->deadline = t->deadline;
  sub->dst_descriptor = t->dst_descriptor;
  sub->rail = engine_->RailFor(*t->src);  // the GPU's rail, not the staging buffer's
  std::vector<CopyChunk> gather, commit;
  uint64_t packed = 0;
  for (const CopyChunk& c : stage) {
    sub->plan.chunks.push_back({src_staged ? packed : c.src_offset, dst_staged ? packed : c.dst_offset, c.length});
    if (src_staged) gather.push_back({c.src_offset, packed, c.length});
    if (dst_staged) commit.push_back({packed, c.dst_offset, c.length});
    packed += c.length;
  }
  sub->plan.total_bytes = packed;
  if (src_staged) {
    absl::Status s = copier_->FromRegion(*t->src, staging->data(), gather);
    if (!s.ok()) return s;
    sub->src = staging;
  }

  std::vector<v1::RemoteKey> keys = region->keys;
  if (dst_staged) keys.assign(region->staging->keys().begin(), region->staging->keys().end());
  Completion written;
  engine_->SubmitTo(sub, peer, keys, region->region_id, written.callback());
  absl::Status s = written.Wait(t->deadline);
  if (!s.ok() || !dst_staged) return s;

  const v1::RegionDescriptor& d = t->dst_descriptor;
  v1::CommitStagedRequest req;
  req.set_target_incarnation(d.agent_incarnation());
  req.set_region_id(d.region_id());
  req.set_token(d.token());
  req.set_staging_id(region->staging->id());
  for (const CopyChunk& c : commit) {
    v1::Chunk* out = req.add_chunks();
    out->set_src_offset(c.src_offset);
    out->set_dst_offset(c.dst_offset);
    out->set_length(c.length);
  }
  v1::CommitStagedResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(std::max(t->deadline, absl::Now() + absl::Milliseconds(100))));
  grpc::Status rpc = peer->stub()->CommitStaged(&ctx, req, &resp);
  if (rpc.ok()) return absl::OkStatus();
  auto code = static_cast<absl::StatusCode>(rpc.error_code());
  if (code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kNotFound) {
    // The target restarted or dropped the buffer: the next transfer opens the region anew.
    peer->ForgetRegion(region->region_id);
    code = absl::StatusCode::kUnavailable;
  }
  return absl::Status(code, absl::StrCat("committing a stage on agent ", d.agent_address(), " failed: ",
                                         rpc.error_message()));
}

}  // namespace ferry
