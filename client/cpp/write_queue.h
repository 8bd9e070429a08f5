// WriteQueue: many small writes to fixed destinations without an RPC per transfer.
//
// A shared-memory ring between this process and the agent (proto/ferry/wire/ring_layout.h):
// Post() writes an entry and rings a doorbell only when the agent sleeps; Reap() reads
// completions and sleeps on a doorbell only when there are none. Each entry is checked
// by the agent exactly like a Write; refusals come back as completions with a status.
//
//   absl::StatusOr<std::unique_ptr<ferry::WriteQueue>> q =
//       ferry::WriteQueue::Create(*client, {receiver_descriptor}, /*entries=*/256);
//   (*q)->Post({.src_region = region, .dst_index = 0, .length = 65536, .user_data = 1});
//   std::vector<ferry::WriteQueue::Completion> done;
//   (*q)->Reap(&done, /*max=*/16, absl::Seconds(1));
//   if (!done[0].status.ok()) ...
//
// Paged writes (KV-cache blocks) go through the queue's block table, shared memory the
// agent reads when it takes the entry: one mapping of N blocks, written once, serves
// one entry per layer.
//
//   auto q = ferry::WriteQueue::Create(*client, {consumer_layer0, consumer_layer1}, 64, 0,
//                                      ferry::v1::TRAFFIC_CLASS_UNSPECIFIED, /*table_ids=*/2 * n);
//   std::copy(src_ids, src_ids + n, (*q)->table());       // source block ids, then
//   std::copy(dst_ids, dst_ids + n, (*q)->table() + n);   // destination block ids
//   for (uint32_t l = 0; l < 2; ++l)
//     (*q)->PostPaged({.src_region = layer_region[l], .dst_index = l, .block_size = 32768,
//                      .table_index = 0, .blocks = n, .user_data = l});
//
// Or every layer as one transfer (one completion, one notification once all landed), as
// a WriteBatch without the RPC: PostBatch writes the parts and ids into the table.
//
//   std::vector<ferry::queue::TablePart> parts = {{layer_region[0], 0, 0, 0}, {layer_region[1], 0, 0, 1}};
//   (*q)->PostBatch(/*table_index=*/0, parts, src_ids, dst_ids, {.block_size = 32768, .user_data = 7,
//                                                               .notify = true, .tag = 42});
//
// And messages (no bytes written: a notification of kind MESSAGE with a payload, as
// Client::SendMessage) to a destination's owner, e.g. a KV consumer asking for blocks:
//
//   (*q)->PostMessage(/*table_index=*/0, /*dst_index=*/0, /*tag=*/7, "pull request 12");
//
// Not thread-safe: one thread posts and reaps (wrap it in a mutex to share it). At most
// `entries` writes are in flight; Post answers RESOURCE_EXHAUSTED until Reap frees room.
// Writes in flight together are not ordered against each other (completions come in any
// order, and on a GPU several may be one kernel launch): wait for a write's completion
// before posting another to the same destination bytes.
#ifndef FERRY_CLIENT_CPP_WRITE_QUEUE_H_
#define FERRY_CLIENT_CPP_WRITE_QUEUE_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/cpp/ferry_client.h"
#include "proto/ferry/wire/ring_layout.h"

namespace ferry {

class WriteQueue {
 public:
  struct Entry {
    uint64_t src_region = 0;
    uint32_t dst_index = 0;  // into the destinations given to Create
    uint64_t src_offset = 0;
    uint64_t dst_offset = 0;
    uint64_t length = 0;
    uint64_t user_data = 0;  // returned in the completion
    bool notify = false;
    uint64_t tag = 0;
  };
  // A paged write: block i copies block_size bytes from src_base + table()[table_index
  // + i] * block_size of the source region to dst_base + table()[table_index + blocks +
  // i] * block_size of the destination. Checked by the agent as a Write's PagedChunks.
  struct PagedEntry {
    uint64_t src_region = 0;
    uint32_t dst_index = 0;
    uint64_t src_base = 0;
    uint64_t dst_base = 0;
    uint64_t block_size = 0;
    uint32_t table_index = 0;  // the first source id; the destination ids follow the sources
    uint32_t blocks = 0;
    uint64_t user_data = 0;
    bool notify = false;
    uint64_t tag = 0;
  };
  // What a batch entry says besides its parts and ids (see PostBatch).
  struct BatchOptions {
    uint64_t block_size = 0;
    uint64_t user_data = 0;
    bool notify = false;  // the owner of parts[0]'s destination, once every part landed
    uint64_t tag = 0;
    std::string payload;  // with notify: up to 4 KiB handed to the owner with the notification
    // Every part writes through this write window of its destination's owner (a
    // descriptor from its OpenWriteWindow: only the window's id and token are used);
    // null: with the destinations' own tokens.
    const v1::RegionDescriptor* window = nullptr;
    // Or runs of the blocks through different windows (ring_layout.h, kFlagWindowSpans:
    // several requests in one write, each through its own): each (window descriptor,
    // count) takes the next `count` blocks, counts of at least 1 adding up to the ids'.
    std::vector<std::pair<const v1::RegionDescriptor*, uint32_t>> windows;
  };
  struct Completion {
    uint64_t user_data = 0;
    uint64_t transfer_id = 0;  // 0 when refused before starting; an opened window's id
    absl::Status status;
    uint64_t bytes = 0;
    // An opened window's token (PostOpenWindow, when status is OK): with its id, what the
    // writer's descriptors carry in place of the regions' own.
    std::array<uint8_t, 16> window_token{};
  };

  // `timeout_ms`: deadline of each write; 0 means the agent's --transfer_timeout_ms.
  // `traffic_class`: of every write (UNSPECIFIED: the pod's default; see ferry.proto).
  // `table_ids`: the size of the block table for paged entries (0: none).
  static absl::StatusOr<std::unique_ptr<WriteQueue>> Create(
      Client& client, const std::vector<v1::RegionDescriptor>& destinations, uint32_t entries = 256,
      uint32_t timeout_ms = 0, v1::TrafficClass traffic_class = v1::TRAFFIC_CLASS_UNSPECIFIED, uint32_t table_ids = 0);
  ~WriteQueue();
  WriteQueue(const WriteQueue&) = delete;
  WriteQueue& operator=(const WriteQueue&) = delete;

  absl::Status Post(const Entry& e);
  absl::Status PostPaged(const PagedEntry& e);
  // One block mapping over several regions as one transfer (ring_layout.h, kFlagBatch):
  // writes `parts`, then `src_ids` and `dst_ids`, then the payload, into the table at
  // `table_index`, and posts the entry. Those table ids must stay as they are until it completes.
  // INVALID_ARGUMENT when they do not fit in the table or the id lists differ in length.
  absl::Status PostBatch(uint32_t table_index, absl::Span<const queue::TablePart> parts,
                         absl::Span<const uint32_t> src_ids, absl::Span<const uint32_t> dst_ids,
                         const BatchOptions& options);
  // A message to the owner of destination `dst_index` (ring_layout.h, kFlagMessage; as
  // Client::SendMessage, without the RPC): writes `payload` (at most 4 KiB) into the table
  // at `table_index`, where it must stay until the entry completes (once the message was
  // queued for its owner). INVALID_ARGUMENT when it does not fit in the table.
  absl::Status PostMessage(uint32_t table_index, uint32_t dst_index, uint64_t tag, absl::string_view payload,
                           uint64_t user_data = 0);
  // Client::OpenWriteWindow without the RPC (ring_layout.h, kFlagOpenWindow): a window
  // over `ranges` ({offset, length}) of each of this session's regions `region_ids`, for
  // the owner of destination `dst_index` alone, for `timeout_ms`. Writes it into the table
  // at `table_index` (4 + 2 per region + 4 per range ids), where it must stay until the
  // entry completes; the completion carries the window's id (transfer_id) and token.
  absl::Status PostOpenWindow(uint32_t table_index, uint32_t dst_index, absl::Span<const uint64_t> region_ids,
                              absl::Span<const std::pair<uint64_t, uint64_t>> ranges, uint32_t timeout_ms,
                              uint64_t user_data = 0);
  // Client::CloseWriteWindow without the RPC (kFlagCloseWindow): completes once nothing
  // can land through window `window_id` any more, or DEADLINE_EXCEEDED after `wait_ms`.
  absl::Status PostCloseWindow(uint64_t window_id, uint32_t wait_ms, uint64_t user_data = 0);
  // The block table: table_ids() uint32 ids in memory shared with the agent. Ids that
  // entries in flight name must stay as they were until those entries complete.
  uint32_t* table() { return table_; }
  uint32_t table_ids() const { return table_ids_; }
  // Appends up to `max` completions to `out`; waits up to `timeout` until at least
  // `min` are ready (never for more than inflight() or `max`), and after the timeout
  // takes what there is. Returns how many it appended. A `min` above 1 lets a sender
  // that keeps many writes in flight sleep once per batch instead of once per write
  // (its core is shared with the agent's threads more often than not). With `spin`,
  // it polls the ring that long before it sleeps: for a thread with a core of its own,
  // which the agent then need not wake (a syscall and an interrupt per batch).
  size_t Reap(std::vector<Completion>* out, size_t max, absl::Duration timeout, size_t min = 1,
              absl::Duration spin = absl::ZeroDuration());
  uint32_t inflight() const { return posted_ - reaped_; }
  uint64_t id() const { return id_; }

 private:
  WriteQueue() = default;
  size_t Take(std::vector<Completion>* out, size_t max);
  absl::Status PostSlot(const queue::SubmitEntry& entry);
  // That `words` table ids from `table_index` fit in the table and that a slot is free
  // (checked before the table is written: entries in flight may still use it).
  absl::Status CheckTableRoom(const char* what, uint64_t table_index, uint64_t words) const;

  uint64_t id_ = 0;
  uint32_t entries_ = 0;
  int ring_fd_ = -1, submit_fd_ = -1, complete_fd_ = -1;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  queue::RingHeader* header_ = nullptr;
  queue::SubmitEntry* sq_ = nullptr;
  const queue::CompletionEntry* cq_ = nullptr;
  uint32_t* table_ = nullptr;
  uint32_t table_ids_ = 0;
  uint32_t posted_ = 0, reaped_ = 0;
};

}  // namespace ferry

#endif  // FERRY_CLIENT_CPP_WRITE_QUEUE_H_
