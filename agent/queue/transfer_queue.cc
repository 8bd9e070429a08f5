#include "agent/queue/transfer_queue.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "agent/common/log.h"
#include "agent/common/status_macros.h"
#include "proto/ferry/wire/ring_shape.h"

namespace ferry {

absl::StatusOr<std::shared_ptr<TransferQueue>> TransferQueue::Open(
    uint64_t id, uint64_t session_id, UniqueFd ring, UniqueFd submit_doorbell, UniqueFd complete_doorbell,
    uint32_t entries, uint32_t table_ids, std::vector<std::shared_ptr<const v1::RegionDescriptor>> destinations) {
  FERRY_RETURN_IF_ERROR(queue::CheckRingShape(entries, table_ids));
  FERRY_RETURN_IF_ERROR(CheckEventFd(submit_doorbell.get(), "submit_doorbell_fd"));
  FERRY_RETURN_IF_ERROR(CheckDoorbellSocket(complete_doorbell.get(), "complete_doorbell_fd"));
  absl::StatusOr<SharedMapping> map =
      SharedMapping::Map(std::move(ring), queue::RingBytes(entries, table_ids), "ring_fd",
                         absl::StrCat("a queue of ", entries, " entries and ", table_ids, " table ids"));
  if (!map.ok()) return map.status();
  std::shared_ptr<TransferQueue> q(new TransferQueue(id, session_id, entries, table_ids));
  q->map_ = std::move(*map);
  char* base = q->map_.data();
  q->header_ = reinterpret_cast<queue::RingHeader*>(base);
  q->sq_ = reinterpret_cast<const queue::SubmitEntry*>(base + queue::kSubmitOffset);
  q->cq_ = reinterpret_cast<queue::CompletionEntry*>(base + queue::CompletionOffset(entries));
  q->table_ = reinterpret_cast<const uint32_t*>(base + queue::TableOffset(entries));
  if (q->header_->magic != queue::kRingMagic || q->header_->entries != entries) {
    return absl::InvalidArgumentError("ring_fd does not hold an initialised queue header (magic, entries)");
  }
  // Our cursors start where the client says the queue starts; from here on we keep our own.
  q->sq_head_ = q->header_->sq_head.value.load(std::memory_order_acquire);
  q->accepted_ = q->sq_head_;
  q->cq_seen_ = q->header_->cq_head.value.load(std::memory_order_acquire);
  q->cq_written_.store(q->header_->cq_tail.value.load(std::memory_order_acquire));
  if (q->sq_head_ != q->cq_seen_ || q->cq_seen_ != q->cq_written_.load()) {
    return absl::InvalidArgumentError("a new queue must start empty (sq_head == cq_head == cq_tail)");
  }
  q->submit_doorbell_ = std::move(submit_doorbell);
  q->complete_doorbell_ = std::move(complete_doorbell);
  q->destinations_ = std::move(destinations);
  return q;
}

size_t TransferQueue::Take(queue::SubmitEntry* out, size_t max) {
  if (broken_) return 0;
  const uint32_t tail = header_->sq_tail.value.load(std::memory_order_acquire);
  const uint32_t submitted = tail - sq_head_;
  if (submitted > entries_) {
    FERRY_LOG(WARNING) << "queue " << id_ << " of session " << session_id_ << ": impossible sq_tail; queue stopped";
    broken_ = true;
    return 0;
  }
  // The client's cq_head may only move forward, and not past what we wrote.
  const uint32_t written = cq_written_.load(std::memory_order_acquire);
  const uint32_t head = header_->cq_head.value.load(std::memory_order_acquire);
  if (head - cq_seen_ <= written - cq_seen_) cq_seen_ = head;
  const uint32_t budget = entries_ - (accepted_ - cq_seen_);  // free completion slots
  const size_t n = std::min<size_t>({submitted, budget, max});
  const uint32_t mask = entries_ - 1;
  for (size_t i = 0; i < n; ++i) {
    // Copy first: the client may change the slot while we look at it.
    memcpy(&out[i], &sq_[(sq_head_ + i) & mask], sizeof(queue::SubmitEntry));
  }
  sq_head_ += static_cast<uint32_t>(n);
  accepted_ += static_cast<uint32_t>(n);
  header_->sq_head.value.store(sq_head_, std::memory_order_release);
  return n;
}

absl::Status TransferQueue::CopyBlockIds(uint32_t index, uint32_t blocks, std::vector<uint64_t>* src,
                                         std::vector<uint64_t>* dst) const {
  if (blocks == 0) return absl::InvalidArgumentError("blocks: a paged entry needs at least one block");
  if (uint64_t{index} + 2 * uint64_t{blocks} > table_ids_) {
    return absl::OutOfRangeError(absl::StrCat("table ids [", index, ", ", index, "+2*", blocks,
                                              ") are outside the queue's block table of ", table_ids_,
                                              " ids (CreateQueue table_ids)"));
  }
  // Widened while copied out: the client may change the table while we look at it.
  src->assign(table_ + index, table_ + index + blocks);
  dst->assign(table_ + index + blocks, table_ + index + 2 * size_t{blocks});
  return absl::OkStatus();
}

absl::Status TransferQueue::CopyParts(uint32_t index, uint32_t parts, std::vector<queue::TablePart>* out) const {
  if (uint64_t{index} + uint64_t{parts} * queue::kPartIds > table_ids_) {
    return absl::OutOfRangeError(absl::StrCat("table ids [", index, ", ", index, "+", queue::kPartIds, "*", parts,
                                              ") of the batch's parts are outside the queue's block table of ",
                                              table_ids_, " ids (CreateQueue table_ids)"));
  }
  out->resize(parts);
  memcpy(out->data(), table_ + index, size_t{parts} * sizeof(queue::TablePart));
  return absl::OkStatus();
}

absl::Status TransferQueue::CopyBytes(uint32_t index, uint64_t bytes, std::string* out) const {
  if (uint64_t{index} * sizeof(uint32_t) + bytes > uint64_t{table_ids_} * sizeof(uint32_t)) {
    return absl::OutOfRangeError(absl::StrCat(bytes, " bytes from table id ", index,
                                              " are outside the queue's block table of ", table_ids_, " ids"));
  }
  out->assign(reinterpret_cast<const char*>(table_ + index), bytes);
  return absl::OkStatus();
}

void TransferQueue::SetSleeping(bool sleeping) {
  header_->agent_sleeping.value.store(sleeping ? 1 : 0, std::memory_order_seq_cst);
}

bool TransferQueue::HasSubmissions() const {
  return !broken_ && header_->sq_tail.value.load(std::memory_order_seq_cst) != sq_head_;
}

void TransferQueue::Complete(const queue::CompletionEntry& c) {
  uint32_t written;
  {
    absl::MutexLock lock(&cq_mu_);
    const uint32_t t = cq_written_.load(std::memory_order_relaxed);
    memcpy(&cq_[t & (entries_ - 1)], &c, sizeof(c));
    written = t + 1;
    header_->cq_tail.value.store(written, std::memory_order_release);
    cq_written_.store(written, std::memory_order_release);
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);
  // Client-written values: a wrong one costs that client a wake-up, nothing else.
  const uint32_t want = header_->client_waiting.value.load(std::memory_order_seq_cst);
  if (want != 0 && written - header_->cq_head.value.load(std::memory_order_seq_cst) >= want) {
    RingDoorbell(complete_doorbell_.get());
  }
}

}  // namespace ferry
