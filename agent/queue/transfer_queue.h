// TransferQueue: the agent's side of one shared-memory queue (see ring_layout.h).
//
//   absl::StatusOr<std::shared_ptr<TransferQueue>> q = TransferQueue::Open(id, session, std::move(ring),
//                                                                           std::move(submit_fd),
//                                                                           std::move(complete_fd), 256, dsts);
//   queue::SubmitEntry batch[64];
//   size_t n = (*q)->Take(batch, 64);        // the polling thread only
//   (*q)->Complete(completion);              // any thread, once per taken entry
//
// Take() hands out an entry only when its completion is sure to have a free slot, so a
// client that stops reaping completions stalls its own queue and nothing else.
#ifndef FERRY_AGENT_QUEUE_TRANSFER_QUEUE_H_
#define FERRY_AGENT_QUEUE_TRANSFER_QUEUE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "agent/queue/shared_ring.h"
#include "agent/session/session.h"
#include "proto/ferry/v1/ferry.pb.h"
#include "proto/ferry/wire/ring_layout.h"

namespace ferry {

class TransferQueue {
 public:
  // Seals `ring` against shrinking (agent/common/sealed_file.h: a memfd made with
  // MFD_ALLOW_SEALING), maps it (at least queue::RingBytes(entries, table_ids) bytes,
  // whose header the client initialised) and keeps the two doorbells (submit: an eventfd;
  // complete: a unix stream socket, shared_ring.h). INVALID_ARGUMENT names what is wrong.
  static absl::StatusOr<std::shared_ptr<TransferQueue>> Open(
      uint64_t id, uint64_t session_id, UniqueFd ring, UniqueFd submit_doorbell, UniqueFd complete_doorbell,
      uint32_t entries, uint32_t table_ids, std::vector<std::shared_ptr<const v1::RegionDescriptor>> destinations);
  TransferQueue(const TransferQueue&) = delete;
  TransferQueue& operator=(const TransferQueue&) = delete;

  uint64_t id() const { return id_; }
  uint64_t session_id() const { return session_id_; }
  // Shared with each entry's transfer, never copied per entry.
  const std::vector<std::shared_ptr<const v1::RegionDescriptor>>& destinations() const { return destinations_; }
  int submit_doorbell() const { return submit_doorbell_.get(); }
  // Deadline of each transfer (set once, before the queue is served).
  uint32_t timeout_ms() const { return timeout_ms_; }
  void set_timeout_ms(uint32_t ms) { timeout_ms_ = ms; }
  // The class of every entry (checked against the session's ceiling at CreateQueue).
  v1::TrafficClass traffic_class() const { return traffic_class_; }
  void set_traffic_class(v1::TrafficClass c) { traffic_class_ = c; }
  // The uid of the pod that created it (SO_PEERCRED): queues are budgeted per pod.
  uint32_t owner_uid() const { return owner_uid_; }
  void set_owner_uid(uint32_t uid) { owner_uid_ = uid; }

  // The polling thread only (a NIC worker, or the poller's own). Copies up to `max`
  // submitted entries out of shared memory. Returns 0 once the queue is broken (the
  // client wrote an impossible cursor).
  size_t Take(queue::SubmitEntry* out, size_t max);
  // The polling thread only: the doorbell protocol. While sleeping, the client rings the
  // submit doorbell after submitting; HasSubmissions() closes the race.
  void SetSleeping(bool sleeping);
  bool HasSubmissions() const;
  bool broken() const { return broken_; }

  // Any thread. Copies a paged entry's block ids out of the block table: `blocks`
  // source ids from table[index], then as many destination ids. OUT_OF_RANGE when they
  // are not all inside the table.
  absl::Status CopyBlockIds(uint32_t index, uint32_t blocks, std::vector<uint64_t>* src,
                            std::vector<uint64_t>* dst) const;
  // Any thread. Copies `parts` batch parts from table[index] (kPartIds ids each) into
  // `out`. OUT_OF_RANGE when they are not all inside the table.
  absl::Status CopyParts(uint32_t index, uint32_t parts, std::vector<queue::TablePart>* out) const;
  // Any thread. Copies `bytes` bytes from table[index] on into `out`. OUT_OF_RANGE when
  // they are not all inside the table.
  absl::Status CopyBytes(uint32_t index, uint64_t bytes, std::string* out) const;

  // Any thread. Writes one completion and wakes the client if it waits.
  void Complete(const queue::CompletionEntry& c);

 private:
  TransferQueue(uint64_t id, uint64_t session_id, uint32_t entries, uint32_t table_ids)
      : id_(id), session_id_(session_id), entries_(entries), table_ids_(table_ids) {}

  const uint64_t id_;
  const uint64_t session_id_;
  const uint32_t entries_;
  const uint32_t table_ids_;
  std::vector<std::shared_ptr<const v1::RegionDescriptor>> destinations_;
  uint32_t timeout_ms_ = 0;
  v1::TrafficClass traffic_class_ = v1::TRAFFIC_CLASS_UNSPECIFIED;
  uint32_t owner_uid_ = 0;
  UniqueFd submit_doorbell_, complete_doorbell_;
  SharedMapping map_;  // the ring, its header first
  queue::RingHeader* header_ = nullptr;
  const queue::SubmitEntry* sq_ = nullptr;
  queue::CompletionEntry* cq_ = nullptr;
  const uint32_t* table_ = nullptr;  // table_ids_ of them

  // Polling-thread state.
  uint32_t sq_head_ = 0;   // entries taken
  uint32_t accepted_ = 0;  // == sq_head_; completions owed in total
  uint32_t cq_seen_ = 0;   // the client's cq_head, as far as we believe it
  bool broken_ = false;

  absl::Mutex cq_mu_;
  std::atomic<uint32_t> cq_written_{0};
};

}  // namespace ferry

#endif  // FERRY_AGENT_QUEUE_TRANSFER_QUEUE_H_
