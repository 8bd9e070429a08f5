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

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "agent/memory/region_table.h"
#include "agent/peers/peer_table.h"
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
  TransferManager* transfers = nullptr;
  TransferExecutor* local = nullptr;      // host memory on both sides
  TransferExecutor* gpu_local = nullptr;  // GPU memory on either side; null without CUDA
  // Cross-node; all null when the agent runs without fabric/peers.
  PeerTable* peers = nullptr;
  size_t fabric_nics = 0;              // every host region is registered on each
  TransferExecutor* fabric = nullptr;  // FabricEngine
  TransferExecutor* staged = nullptr;  // StagedExecutor
  // Tells a WriteBatch's remote owner (t->peer) that every part landed
  // (FabricEngine::NotifyPeer); set whenever `peers` is.
  std::function<void(const std::shared_ptr<Transfer>&, std::function<void(absl::Status)>)> notify_peer;
  // Sends a notified write's begin (NotifyRequest.begin) to t->peer, best effort and
  // without blocking (FabricEngine::AnnounceToPeer); set whenever `peers` is.
  std::function<void(const std::shared_ptr<Transfer>&, v1::NotifyRequest, std::function<void(absl::Status)>)>
      announce_peer;
  bool stage_host_regions = false;  // --stage_host_regions
};

class TransferRouter {
 public:
  explicit TransferRouter(TransferRouterDeps deps) : deps_(std::move(deps)) {}

  // Checks a write from `session` (its source region, the destination's descriptor and
  // token, the chunk plan against both regions) and decides its path and executor.
  // Nothing moves. `cached_only`: see Transfer::cached_only. `into`: a fresh Transfer to
  // fill (a batch's part, from a TransferBlock); null: a new one.
  absl::StatusOr<std::shared_ptr<Transfer>> Prepare(const std::shared_ptr<Session>& session, const WriteSpec& spec,
                                                    PlanChunks plan, bool cached_only,
                                                    std::shared_ptr<Transfer> into = nullptr) const;
  // Checks a destination ahead of its writes (a queue's), warming the peer and region
  // caches so that writes to it need no RPC to another agent.
  absl::Status CheckDestination(const std::shared_ptr<const v1::RegionDescriptor>& dst, absl::Time deadline) const;
  // One transfer of prepared parts (each from Prepare, notify off) that share its id,
  // result and deadline; with `whole.notify` the owner of parts[0]'s destination is
  // notified (tag, payload, every part's bytes) once every part has landed.
  // `whole.src_region_id` and `whole.dst` are ignored.
  std::shared_ptr<Transfer> Join(std::vector<std::shared_ptr<Transfer>> parts, const WriteSpec& whole) const;
  // Starts a prepared transfer (or a Join of parts) whose id is set;
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

  // Delivers a message (no bytes written) to the owner of `dst`'s region, on this agent
  // or through its own agent, which checks the token. Returns once that agent queued it.
  absl::Status SendMessage(const std::shared_ptr<const v1::RegionDescriptor>& dst, uint64_t tag,
                           const std::string& payload, absl::Time deadline) const;
  // Whether `dst` names a region of this agent (so SendMessage to it makes no RPC).
  bool IsLocal(const v1::RegionDescriptor& dst) const { return dst.agent_incarnation() == deps_.incarnation; }

 private:
  // Fills t's destination from its descriptor: this agent's region (path LOCAL), or
  // another agent's (t.dst_descriptor). Returns the size the chunks are planned against.
  absl::StatusOr<uint64_t> Destination(const std::shared_ptr<const v1::RegionDescriptor>& dst, Transfer& t) const;
  // For a remote destination, once the plan is known: resolves it and picks FABRIC or STAGED.
  absl::Status RouteRemote(Transfer& t) const;

  const TransferRouterDeps deps_;
  // Shared with the completion callbacks, which may run after the router is gone.
  const std::shared_ptr<std::atomic<bool>> stopping_ = std::make_shared<std::atomic<bool>>(false);
};

}  // namespace ferry

#endif  // FERRY_AGENT_ROUTER_TRANSFER_ROUTER_H_
