// Transfer and TransferManager: one Write, from submission to its result.
//
//   auto t = std::make_shared<Transfer>();
//   t->id = manager.NextId(); ...                  // filled in by the API layer
//   manager.Begin(*t);                             // counts it in flight
//   executor->Submit(t, [&manager, t](absl::Status s) { manager.Finish(*t, s); });
//
// Finish() is the single place a transfer ends: it updates metrics, hands the result to
// the writer's session (Wait / WatchCompletions) and, for node-local destinations,
// notifies the destination region's owner.
#ifndef FERRY_AGENT_TRANSFER_TRANSFER_H_
#define FERRY_AGENT_TRANSFER_TRANSFER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "agent/memory/region.h"
#include "agent/memory/region_table.h"
#include "agent/memory/write_windows.h"
#include "agent/metrics/metrics.h"
#include "agent/qos/traffic_class.h"
#include "agent/session/session_registry.h"
#include "agent/transfer/chunk_plan.h"
#include "proto/ferry/v1/ferry.pb.h"

namespace ferry {

class TransferExecutor;
class PeerConnection;  // agent/peers
struct RemoteRegion;   // agent/peers

struct Transfer {
  uint64_t id = 0;
  std::shared_ptr<Session> session;  // the writer
  v1::TransferPath path = v1::TRANSFER_PATH_UNSPECIFIED;
  std::shared_ptr<Region> src;
  ChunkPlan plan;
  bool notify = false;
  uint64_t tag = 0;
  std::string notify_payload;  // with notify: handed to the destination's owner
  absl::Time submitted;
  absl::Time deadline;
  // The writer's share of the NICs: its pod (session) and rule, and the class this
  // transfer runs in (agent/qos); the NIC workers schedule its ops by it.
  TenantShare share;
  // Node-local destination (path LOCAL).
  std::shared_ptr<Region> dst;
  // Set when the write goes through a write window of this agent's region (`dst`): held
  // until the transfer goes, so that closing the window waits for its bytes.
  std::shared_ptr<WindowAdmission> window;
  // Remote destination (path FABRIC / STAGED); shared by all entries of a queue. The
  // router resolves it to the target's agent and the region as that agent reports it.
  std::shared_ptr<const v1::RegionDescriptor> dst_descriptor;
  std::shared_ptr<PeerConnection> peer;
  std::shared_ptr<RemoteRegion> remote_region;
  // Path STAGED: the source's bytes go through a host staging buffer (the NICs cannot
  // reach the source); otherwise only the destination is staged.
  bool stage_src = false;
  // Fabric NICs (indices) to stripe over; empty: those of the source region's placement.
  // The staged path sets the user region's here, as its source is a staging buffer.
  std::vector<int> rail;
  TransferExecutor* executor = nullptr;  // chosen with `path` by the router (agent/router)
  // Prepare must not wait on the network (it runs on a NIC worker): a destination not
  // in the peer caches fails with WouldBlockError (agent/common/poll_source.h).
  bool cached_only = false;
  // Where the result goes: when set (a shared-memory queue's completion ring) instead
  // of the session's Wait / WatchCompletions bookkeeping.
  std::function<void(const v1::TransferResult&)> on_result;
  // A batch (WriteBatch): the parts that move its bytes, each routed on its own; this
  // transfer moves none itself and ends, and notifies, once every part has.
  std::vector<std::shared_ptr<Transfer>> parts;
  // Set by TransferManager::Finish, which runs once per transfer (executors call `done`
  // exactly once): checked in debug builds.
  mutable std::atomic<bool> finished{false};

  // Whether the transfer should go on at `now`: DEADLINE_EXCEEDED past its deadline,
  // ABORTED once the writing pod's session ended (the pod died or disconnected: nobody
  // is left to learn the result, and its share of the NICs goes to the others). Executors
  // ask between chunks; the fabric engine's watchdog for its transfers in flight. `when`
  // ends the message's first clause: "", " while queued", " before it started".
  absl::Status Stopped(absl::Time now, absl::string_view when = "") const;
};

// Storage for a batch's parts, made and freed in one allocation: part(i) shares the
// block's count instead of having one of its own. A batch's parts are made on the
// thread that takes its entry and freed on the one that answers them; one allocation
// per part, each freed across threads, made the allocator's lock a cost of every part.
class TransferBlock {
 public:
  explicit TransferBlock(size_t n) : block_(new Transfer[n]) {}
  std::shared_ptr<Transfer> part(size_t i) const { return std::shared_ptr<Transfer>(block_, &block_[i]); }

 private:
  std::shared_ptr<Transfer[]> block_;
};

// The most bytes a Notification's payload may carry (WriteRequest.notify_payload,
// SendMessageRequest.payload); checked by the writer's agent and again by the receiver's.
inline constexpr size_t kMaxNotifyPayloadBytes = 4096;

const char* PathLabel(v1::TransferPath path);  // "local", "fabric", "staged"

class TransferManager {
 public:
  TransferManager(uint64_t incarnation, Metrics* metrics, SessionRegistry* sessions, RegionTable* regions);

  uint64_t NextId() { return next_id_.fetch_add(1); }
  void Begin(const Transfer& t) { inflight_.fetch_add(1); }
  void Finish(const Transfer& t, const absl::Status& status);

  // Delivers a notification to the owner of `region`. UNAVAILABLE when the owner's
  // session has ended, RESOURCE_EXHAUSTED when it is not reading its notifications and
  // its queue is full, or `sender`'s share of it (SenderKey; 0: a write's notification,
  // not counted against a sender). The notification is dropped and counted either way.
  absl::Status Notify(const Region& region, const v1::Notification& n, uint64_t sender = 0);
  // Who sent a message, for Notify: a pod (uid) on the agent of `incarnation`. Never 0.
  static uint64_t SenderKey(uint64_t incarnation, uint32_t uid);

  uint64_t inflight() const { return inflight_.load(); }
  uint64_t completed() const { return completed_.load(); }
  uint64_t failed() const { return failed_.load(); }
  // Notifications Notify dropped because their receiver's queue was full.
  uint64_t notifications_lost() const { return notifications_lost_.load(); }

 private:
  const uint64_t incarnation_;
  Metrics* metrics_;
  SessionRegistry* sessions_;
  RegionTable* regions_;
  // Each path's handles, looked up once: a label lookup per transfer costs more than
  // the rest of Finish (prometheus-cpp hashes the labels under a lock).
  struct PathMetrics {
    prometheus::Counter* ok = nullptr;
    prometheus::Histogram* duration = nullptr;
  };
  static constexpr int kPaths = v1::TRANSFER_PATH_STAGED + 1;
  PathMetrics path_metrics_[kPaths];         // indexed by v1::TransferPath; [0] unused
  prometheus::Counter* local_tx_ = nullptr;  // node-local bytes, both directions
  prometheus::Counter* local_rx_ = nullptr;
  std::atomic<uint64_t> next_id_{1};
  std::atomic<uint64_t> inflight_{0};
  std::atomic<uint64_t> completed_{0};
  std::atomic<uint64_t> failed_{0};
  std::atomic<uint64_t> notifications_lost_{0};
};

}  // namespace ferry

#endif  // FERRY_AGENT_TRANSFER_TRANSFER_H_
