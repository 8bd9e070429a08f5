// TransferRouter: the one place a write is checked and its path decided, for Write RPCs
// and queue entries alike.
//
//   TransferRouter router(deps);
//   absl::StatusOr<std::shared_ptr<Transfer>> t = router.Prepare(session, spec, plan, /*cached_only=*/false);
//   if (!t.ok()) return t.status();        // nothing has moved; the message names the field
//   (*t)->id = transfers->NextId();
//   router.Launch(*t);                     // its executor moves the bytes; TransferManager ends it
//
// Paths (v1::TransferPath), decided once, from what the destination turns out to be:
//   LOCAL   the destination is this agent's region: memcpy (HostCopier), or the GPUs'
//           copy engines and kernel when either side is GPU memory (GpuCopier);
//   FABRIC  another agent's region that the NICs of both sides reach: one-sided RDMA
//           writes (FabricEngine);
//   STAGED  another agent's region, where either side is memory the NICs cannot reach
//           (GPU memory without FI_HMEM, or --stage_host_regions): through host staging
//           buffers (StagedExecutor).
// A remote destination is resolved here (the peer agent, the region as it reports it,
// bounds) and travels typed on the transfer (t->peer, t->remote_region); executors only
// move bytes.
#ifndef FERRY_AGENT_ROUTER_TRANSFER_ROUTER_H_
#define FERRY_AGENT_ROUTER_TRANSFER_ROUTER_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "agent/common/clock.h"
#include "agent/memory/region_table.h"
#include "agent/peers/peer_table.h"
#include "agent/peers/remote_targets.h"
#include "agent/session/session.h"
#include "agent/transfer/chunk_plan.h"
#include "agent/transfer/executor.h"
#include "agent/transfer/transfer.h"

namespace ferry {

// What a write asks for, whichever API it came through.
struct WriteSpec {
  uint64_t src_region_id = 0;
  std::shared_ptr<const v1::RegionDescriptor> dst;  // null: the request has none
  bool notify = false;
  uint64_t tag = 0;
  std::string notify_payload;  // only with notify; at most kMaxNotifyPayloadBytes
  absl::Duration timeout;      // until the transfer's deadline
  // UNSPECIFIED: the class the session's QoS rule gives by default.
  v1::TrafficClass traffic_class = v1::TRAFFIC_CLASS_UNSPECIFIED;
};

// Lays out the chunks once both regions' sizes are known.
using PlanChunks = absl::FunctionRef<absl::StatusOr<ChunkPlan>(uint64_t src_size, uint64_t dst_size)>;

struct TransferRouterDeps {
  uint64_t incarnation = 0;
  // Peer address written into descriptors; empty when the agent has no peer service.
  std::string advertise_address;
  RegionTable* regions = nullptr;
  WriteWindows* windows = nullptr;  // of this agent's regions in window mode
  TransferManager* transfers = nullptr;
  TransferExecutor* local = nullptr;      // host memory on both sides
  TransferExecutor* gpu_local = nullptr;  // GPU memory on either side; null without CUDA
  // Cross-node; all null when the agent runs without fabric/peers.
  RemoteTargets* remote_targets = nullptr;  // PeerTable
  size_t fabric_nics = 0;                   // every host region is registered on each
  TransferExecutor* fabric = nullptr;       // FabricEngine
  TransferExecutor* staged = nullptr;       // StagedExecutor
  // Tells a WriteBatch's remote owner (t->peer) that every part landed
  // (FabricEngine::NotifyPeer); set whenever `remote_targets` is.
  std::function<void(const std::shared_ptr<Transfer>&, std::function<void(absl::Status)>)> notify_peer;
  // Sends a notified write's begin (NotifyRequest.begin) to t->peer, best effort and
  // without blocking (FabricEngine::AnnounceToPeer); set whenever `remote_targets` is.
  std::function<void(const std::shared_ptr<Transfer>&, v1::NotifyRequest, std::function<void(absl::Status)>)>
      announce_peer;
  bool stage_host_regions = false;  // --stage_host_regions
  // Where a transfer's submission time, and so its deadline, is read.
  const Clock* clock = Clock::Real();
};

class TransferRouter {
 public:
  explicit TransferRouter(TransferRouterDeps deps) : deps_(std::move(deps)) {}

  // Checks a write from `session` (its source region, the destination's descriptor and
  // token, the chunk plan against both regions) and decides its path and executor.
  // Nothing moves. `cached_only`: see Transfer::cached_only. A batch's parts: TransferBatch.
  absl::StatusOr<std::shared_ptr<Transfer>> Prepare(const std::shared_ptr<Session>& session, const WriteSpec& spec,
                                                    PlanChunks plan, bool cached_only) const;
  // Checks a destination ahead of its writes (a queue's), warming the peer and region
  // caches so that writes to it need no RPC to another agent.
  absl::Status CheckDestination(const std::shared_ptr<const v1::RegionDescriptor>& dst, absl::Time deadline) const;
  // Starts a prepared transfer (or a TransferBatch's) whose id is set;
  // TransferManager::Finish ends it.
  void Launch(std::shared_ptr<Transfer> t) const;
  // After a burst of Launches on this thread (a queue's entries): lets each executor
  // start them here (TransferExecutor::Flush).
  void Flush() const;
  // The checks of a notification's payload (size, and only with notify).
  static absl::Status CheckNotifyPayload(bool notify, const std::string& payload);
  // From now on no RPC is started to tell a remote receiver that a write failed: the
  // agent is going away (its transfers fail as it stops), and calls it started now would
  // outlive it.
  void BeginShutdown() { stopping_->store(true); }

  // Delivers a message (no bytes written) from pod `sender_uid` to the owner of `dst`'s
  // region, on this agent or through its own agent, which checks the token. Returns once
  // that agent queued it.
  absl::Status SendMessage(const std::shared_ptr<const v1::RegionDescriptor>& dst, uint64_t tag,
                           const std::string& payload, absl::Time deadline, uint32_t sender_uid) const;
  // Whether `dst` names a region of this agent (so SendMessage to it makes no RPC).
  bool IsLocal(const v1::RegionDescriptor& dst) const { return dst.agent_incarnation() == deps_.incarnation; }

 private:
  friend class TransferBatch;
  // What the parts of one batch share, looked up for the first part that needs it.
  struct BatchLookups {
    // Regions remembered per side, newest first: a batch names its regions in order
    // (each layer's K and V halves one after the other), and a bound keeps a batch of
    // many regions from scanning long lists.
    static constexpr size_t kMax = 64;
    struct LocalDestination {
      std::shared_ptr<const v1::RegionDescriptor> descriptor;  // checked against ...
      std::shared_ptr<Region> region;                          // ... this agent's region
      std::shared_ptr<WindowAdmission> window;                 // through the descriptor's window
    };
    absl::Time now;                                // when the batch was submitted
    std::vector<std::shared_ptr<Region>> sources;  // the batch's session's
    std::vector<LocalDestination> local_dsts;
  };
  // Prepare's checks and routing into `t`; with `batch`, reusing (and adding to) what
  // the batch's earlier parts looked up.
  absl::Status PrepareInto(const std::shared_ptr<Session>& session, const WriteSpec& spec, PlanChunks plan,
                           bool cached_only, BatchLookups* batch, Transfer& t) const;
  // `session`'s source region `id`.
  absl::StatusOr<std::shared_ptr<Region>> Source(const Session& session, uint64_t id, BatchLookups* batch) const;
  // Fills t's destination from its descriptor: this agent's region (path LOCAL), or
  // another agent's (t.dst_descriptor). Returns the size the chunks are planned against.
  // `window_mode_ok`: for a message (which a region in window mode takes with its own
  // token) or a queue's destination, not a write.
  absl::StatusOr<uint64_t> Destination(const std::shared_ptr<const v1::RegionDescriptor>& dst, Transfer& t,
                                       BatchLookups* batch = nullptr, bool window_mode_ok = false) const;
  // Whether t's session is `writer` (a region of that session on that agent), when the
  // window is for one writer.
  absl::Status CheckWriter(const WindowWriter& writer, const Transfer& t) const;
  // Every chunk of t's plan inside `ranges` of the window `window_id` of region `region_id`.
  static absl::Status CheckWindowChunks(const Transfer& t, const std::vector<ByteSpan>& ranges, uint64_t window_id,
                                        uint64_t region_id);
  // t's node-local destination `d` (its token checked): path and executor.
  void RouteLocal(std::shared_ptr<Region> d, Transfer& t) const;
  // For a remote destination, once the plan is known: resolves it and picks FABRIC or STAGED.
  absl::Status RouteRemote(Transfer& t) const;

  const TransferRouterDeps deps_;
  // Shared with the completion callbacks, which may run after the router is gone.
  const std::shared_ptr<std::atomic<bool>> stopping_ = std::make_shared<std::atomic<bool>>(false);
};

// The parts of one batch (a WriteBatch, a queue's batch entry), each prepared as
// TransferRouter::Prepare prepares a write, then joined into one transfer whose parts
// share its id, result and deadline:
//
//   TransferBatch batch(router, session, n, limits, /*cached_only=*/false);
//   for (size_t i = 0; i < n; ++i) {
//     if (absl::Status s = batch.Add(spec[i], plan[i]); !s.ok()) return s;  // "parts[i]: ..."
//   }
//   absl::StatusOr<std::shared_ptr<Transfer>> t = std::move(batch).Join(whole);  // then Launch it
//
// What the parts share is looked up once: the time they start, and each region they
// name (a batch over L layers names each layer's two regions in two parts, K and V).
// A lookup per part took the region table's lock and bounced each region's count
// between the thread preparing parts and the one freeing them. The parts live in one
// allocation (TransferBlock). One thread, one batch.
class TransferBatch {
 public:
  // `parts`: how many Add will be called for (at least 1); `limits`: the most chunks
  // of all parts together.
  TransferBatch(const TransferRouter& router, std::shared_ptr<Session> session, size_t parts, ChunkLimits limits,
                bool cached_only);
  // Prepares the next part (`spec.notify` must be off: the whole batch notifies). A
  // refusal names the part ("parts[i]: ..."), except a would-block status (see
  // Transfer::cached_only), which is returned as it is.
  absl::Status Add(const WriteSpec& spec, PlanChunks plan);
  // `s` as a refusal of the part Add would prepare next ("parts[i]: ..."), for checks
  // its caller makes first.
  absl::Status NextPartError(const absl::Status& s) const;
  // For a batch that adds its `per_span` parts once per window span (ring_layout.h,
  // kFlagWindowSpans): refusals name "window spans[s]: parts[i]: ...".
  void NamePartsPerSpan(size_t per_span) { parts_per_span_ = per_span; }
  // The part last added.
  Transfer& last() { return *parts_.back(); }
  // One transfer of every part added; with `whole.notify` the owner of the first
  // part's destination is notified (tag, payload, every part's bytes) once every part
  // has landed. `whole.src_region_id` and `whole.dst` are ignored. INVALID_ARGUMENT if
  // two parts write overlapping bytes of one region (which would land in either order).
  absl::StatusOr<std::shared_ptr<Transfer>> Join(const WriteSpec& whole) &&;

 private:
  // Parts into one region compared by extent, and by chunk where extents meet: a KV
  // batch's parts each fill another region (or far apart halves of one), so the common
  // case sorts one extent per part.
  absl::Status CheckPartsDisjoint() const;

  const TransferRouter& router_;
  const std::shared_ptr<Session> session_;
  const ChunkLimits limits_;
  const bool cached_only_;
  const TransferBlock block_;
  std::vector<std::shared_ptr<Transfer>> parts_;
  uint64_t chunks_ = 0;
  size_t parts_per_span_ = 0;
  TransferRouter::BatchLookups lookups_;
};

}  // namespace ferry

#endif  // FERRY_AGENT_ROUTER_TRANSFER_ROUTER_H_
