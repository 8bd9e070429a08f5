// QueueEntries: the shared-memory write queues' entries, checked and started like Write
// RPCs (through the TransferRouter), their results and refusals written to the queue's
// completion ring. The QueuePoller's handler:
//
//   QueueEntries entries(&router, sessions, transfers, metrics, ChunkLimits{max_chunks});
//   QueuePoller poller([&](auto& q, auto& e, bool may_block) { return entries.Handle(q, e, may_block); });
//
// Entries run on a NIC worker (may_block false) or on the poller's own thread.
#ifndef FERRY_AGENT_ROUTER_QUEUE_ENTRIES_H_
#define FERRY_AGENT_ROUTER_QUEUE_ENTRIES_H_

#include <atomic>
#include <memory>

#include "agent/memory/write_windows.h"
#include "agent/metrics/metrics.h"
#include "agent/queue/transfer_queue.h"
#include "agent/router/transfer_router.h"
#include "agent/session/session_registry.h"
#include "agent/transfer/chunk_plan.h"
#include "agent/transfer/transfer.h"

namespace ferry {

// What bounds a window opened or closed by a queue entry, as the RPCs are bounded.
struct WindowEntryLimits {
  uint32_t max_timeout_ms = 0;  // --max_transfer_timeout_ms
  uint32_t max_wait_ms = 0;     // --max_wait_ms
};

class QueueEntries {
 public:
  // `limits` bound a paged entry's blocks as a Write's chunks are bounded.
  QueueEntries(const TransferRouter* router, SessionRegistry* sessions, TransferManager* transfers, Metrics* metrics,
               ChunkLimits limits)
      : router_(router), sessions_(sessions), transfers_(transfers), metrics_(metrics), limits_(limits) {}

  // Where window entries (kFlagOpenWindow, kFlagCloseWindow) open and close windows;
  // without it they are refused. Set before the first queue is added.
  void set_windows(WriteWindows* windows, WindowEntryLimits limits) {
    windows_ = windows;
    window_limits_ = limits;
  }

  // Refuses every entry from now on (UNAVAILABLE: the agent is shutting down).
  void BeginShutdown() { shutting_down_.store(true); }

  // One entry of `q`: started, or refused through the completion ring; true either way.
  // With !may_block (on a NIC worker) it returns false, having done nothing, when the
  // destination's peer or region must first be looked up over the network.
  bool Handle(const std::shared_ptr<TransferQueue>& q, const queue::SubmitEntry& e, bool may_block);

 private:
  // The transfer of a contiguous or paged entry, and of a batch entry (its parts
  // joined); a would-block status when !may_block and a lookup must wait.
  absl::StatusOr<std::shared_ptr<Transfer>> Prepare(const std::shared_ptr<Session>& session, const TransferQueue& q,
                                                    const queue::SubmitEntry& e, bool may_block) const;
  absl::StatusOr<std::shared_ptr<Transfer>> PrepareBatch(const std::shared_ptr<Session>& session,
                                                         const TransferQueue& q, const queue::SubmitEntry& e,
                                                         bool may_block) const;
  // A message entry, delivered before it returns; a would-block status when !may_block
  // and the destination is on another agent (its delivery is an RPC).
  absl::Status SendMessage(const TransferQueue& q, const queue::SubmitEntry& e, bool may_block) const;
  // A window entry: opened (its completion names the window) or closed; a would-block
  // status when !may_block and the close must wait for writes still moving.
  absl::StatusOr<queue::CompletionEntry> OpenWindow(const TransferQueue& q, const queue::SubmitEntry& e) const;
  absl::Status CloseWindow(const TransferQueue& q, const queue::SubmitEntry& e, bool may_block) const;
  WriteSpec Spec(const TransferQueue& q, uint64_t src_region, uint32_t dst_index) const;
  // A batch entry's windows (kFlagWindow: one span of every block; kFlagWindowSpans: its
  // spans, checked), copied out of the table at *table, which is moved past them. None
  // without either flag.
  static absl::Status CopyWindowSpans(const TransferQueue& q, const queue::SubmitEntry& e, uint32_t* table,
                                      std::vector<queue::WindowSpan>* spans);
  // `destination` written through the span's window (its id and token in place of the region's).
  static std::shared_ptr<const v1::RegionDescriptor> ThroughWindow(const v1::RegionDescriptor& destination,
                                                                   const queue::WindowSpan& span);
  static absl::Status CheckDestination(const TransferQueue& q, uint32_t dst_index, const char* field);

  const TransferRouter* router_;
  SessionRegistry* sessions_;
  TransferManager* transfers_;
  Metrics* metrics_;
  const ChunkLimits limits_;
  WriteWindows* windows_ = nullptr;
  WindowEntryLimits window_limits_;
  std::atomic<bool> shutting_down_{false};
};

}  // namespace ferry

#endif  // FERRY_AGENT_ROUTER_QUEUE_ENTRIES_H_
