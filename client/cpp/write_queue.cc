#include "client/cpp/write_queue.h"

#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/doorbell.h"
#include "proto/ferry/wire/ring_shape.h"

namespace ferry {

absl::StatusOr<std::unique_ptr<WriteQueue>> WriteQueue::Create(Client& client,
                                                               const std::vector<v1::RegionDescriptor>& destinations,
                                                               uint32_t entries, uint32_t timeout_ms,
                                                               v1::TrafficClass traffic_class, uint32_t table_ids) {
  if (absl::Status shape = queue::CheckRingShape(entries, table_ids); !shape.ok()) return shape;
  std::unique_ptr<WriteQueue> q(new WriteQueue());
  q->entries_ = entries;
  q->table_ids_ = table_ids;
  q->map_bytes_ = queue::RingBytes(entries, table_ids);
  // MFD_ALLOW_SEALING: the agent seals what it maps against shrinking.
  q->ring_fd_ = memfd_create("ferry-write-queue", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  q->submit_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (q->ring_fd_ < 0 || q->submit_fd_ < 0 || ftruncate(q->ring_fd_, static_cast<off_t>(q->map_bytes_)) != 0) {
    return absl::InternalError(absl::StrCat("creating the queue's memfd and eventfd: ", strerror(errno)));
  }
  q->map_ = mmap(nullptr, q->map_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, q->ring_fd_, 0);
  if (q->map_ == MAP_FAILED) {
    q->map_ = nullptr;
    return absl::InternalError(absl::StrCat("mapping the queue: ", strerror(errno)));
  }
  auto* base = static_cast<char*>(q->map_);
  q->header_ = new (base) queue::RingHeader{};  // zeroed cursors
  q->header_->magic = queue::kRingMagic;
  q->header_->entries = entries;
  q->sq_ = reinterpret_cast<queue::SubmitEntry*>(base + queue::kSubmitOffset);
  q->cq_ = reinterpret_cast<const queue::CompletionEntry*>(base + queue::CompletionOffset(entries));
  q->table_ = table_ids > 0 ? reinterpret_cast<uint32_t*>(base + queue::TableOffset(entries)) : nullptr;

  v1::CreateQueueRequest req;
  int agents_complete_fd = -1;
  if (absl::Status s = MakeDoorbell(&q->complete_fd_, &agents_complete_fd); !s.ok()) return s;
  absl::StatusOr<uint64_t> ring = client.SendFd(q->ring_fd_);
  absl::StatusOr<uint64_t> submit = ring.ok() ? client.SendFd(q->submit_fd_) : ring;
  absl::StatusOr<uint64_t> complete = submit.ok() ? client.SendFd(agents_complete_fd) : submit;
  close(agents_complete_fd);  // the agent has its own copy
  if (!complete.ok()) return complete.status();
  req.set_ring_fd(*ring);
  req.set_submit_doorbell_fd(*submit);
  req.set_complete_doorbell_fd(*complete);
  req.set_entries(entries);
  req.set_table_ids(table_ids);
  req.set_traffic_class(traffic_class);
  req.set_timeout_ms(timeout_ms);
  for (const v1::RegionDescriptor& d : destinations) *req.add_destinations() = d;
  v1::CreateQueueResponse resp;
  auto ctx = client.NewContext();
  absl::Status s = FromGrpcStatus(client.stub()->CreateQueue(ctx.get(), req, &resp));
  if (!s.ok()) return s;
  q->id_ = resp.queue_id();
  return q;
}

WriteQueue::~WriteQueue() {
  if (map_ != nullptr) munmap(map_, map_bytes_);
  for (int fd : {ring_fd_, submit_fd_, complete_fd_}) {
    if (fd >= 0) close(fd);
  }
}

absl::Status WriteQueue::Post(const Entry& e) {
  return PostSlot({e.user_data, e.src_region, e.src_offset, e.dst_offset, e.length, e.tag, e.dst_index,
                   e.notify ? queue::kFlagNotify : 0, 0, 0});
}

absl::Status WriteQueue::PostPaged(const PagedEntry& e) {
  return PostSlot({e.user_data, e.src_region, e.src_base, e.dst_base, e.block_size, e.tag, e.dst_index,
                   queue::kFlagPaged | (e.notify ? queue::kFlagNotify : 0), e.table_index, e.blocks});
}

absl::Status WriteQueue::CheckTableRoom(const char* what, uint64_t table_index, uint64_t words) const {
  if (table_index + words > table_ids_) {
    return absl::InvalidArgumentError(absl::StrCat("the ", what, " needs ", words, " table ids from ", table_index,
                                                   "; the queue's table has ", table_ids_, " (Create's table_ids)"));
  }
  if (posted_ - reaped_ >= entries_) {  // before the table is touched: entries in flight may use it
    return absl::ResourceExhaustedError(
        absl::StrCat("the queue already has ", entries_, " writes in flight; Reap completions first"));
  }
  return absl::OkStatus();
}

namespace {

absl::Status WindowRefOf(const v1::RegionDescriptor& window, absl::string_view what, queue::WindowRef* ref) {
  if (window.window_id() == 0 || window.token().size() != sizeof(ref->token)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": a write window's descriptor (window_id set), from OpenWriteWindow"));
  }
  ref->window_id = window.window_id();
  memcpy(ref->token, window.token().data(), sizeof(ref->token));
  return absl::OkStatus();
}

// BatchOptions::windows as the table holds them, checked as the agent checks them.
absl::Status PackWindowSpans(const std::vector<std::pair<const v1::RegionDescriptor*, uint32_t>>& windows,
                             size_t blocks, size_t parts, std::vector<uint32_t>* out) {
  if (windows.size() > queue::kMaxWindowSpans || parts * windows.size() > queue::kMaxWindowSpanParts) {
    return absl::InvalidArgumentError(absl::StrCat("windows: at most ", queue::kMaxWindowSpans, ", and parts times ",
                                                   "windows at most ", queue::kMaxWindowSpanParts, "; got ",
                                                   windows.size(), " for ", parts, " parts"));
  }
  const queue::WindowSpans head{static_cast<uint32_t>(windows.size()), 0};
  out->resize(queue::kWindowSpansIds + windows.size() * queue::kWindowSpanIds);
  memcpy(out->data(), &head, sizeof(head));
  uint64_t covered = 0;
  for (size_t i = 0; i < windows.size(); ++i) {
    queue::WindowSpan span{};
    const std::string what = absl::StrCat("windows[", i, "]");
    if (windows[i].first == nullptr) return absl::InvalidArgumentError(absl::StrCat(what, ": no window"));
    if (absl::Status s = WindowRefOf(*windows[i].first, what, &span.window); !s.ok()) return s;
    if (windows[i].second == 0) return absl::InvalidArgumentError(absl::StrCat(what, ": a count of 0 blocks"));
    span.blocks = windows[i].second;
    covered += span.blocks;
    memcpy(out->data() + queue::kWindowSpansIds + i * queue::kWindowSpanIds, &span, sizeof(span));
  }
  if (covered != blocks) {
    return absl::InvalidArgumentError(
        absl::StrCat("windows cover ", covered, " blocks; the ids are ", blocks, " (they must add up)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteQueue::PostBatch(uint32_t table_index, absl::Span<const queue::TablePart> parts,
                                   absl::Span<const uint32_t> src_ids, absl::Span<const uint32_t> dst_ids,
                                   const BatchOptions& options) {
  if (parts.empty()) return absl::InvalidArgumentError("a batch needs at least one part");
  if (src_ids.size() != dst_ids.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(src_ids.size(), " source ids but ", dst_ids.size(), " destination ids; they must pair up"));
  }
  // What goes before the parts: a WindowRef, or a WindowSpans head and its spans.
  std::vector<uint32_t> windows;
  uint32_t window_flag = 0;
  if (options.window != nullptr && !options.windows.empty()) {
    return absl::InvalidArgumentError("give window or windows, not both");
  }
  if (options.window != nullptr) {
    queue::WindowRef ref{};
    if (absl::Status s = WindowRefOf(*options.window, "window", &ref); !s.ok()) return s;
    windows.resize(queue::kWindowIds);
    memcpy(windows.data(), &ref, sizeof(ref));
    window_flag = queue::kFlagWindow;
  } else if (!options.windows.empty()) {
    if (absl::Status s = PackWindowSpans(options.windows, src_ids.size(), parts.size(), &windows); !s.ok()) return s;
    window_flag = queue::kFlagWindowSpans;
  }
  const uint64_t payload_words = (options.payload.size() + sizeof(uint32_t) - 1) / sizeof(uint32_t);
  const uint64_t words =
      windows.size() + uint64_t{parts.size()} * queue::kPartIds + 2 * uint64_t{src_ids.size()} + payload_words;
  if (absl::Status s = CheckTableRoom("batch", table_index, words); !s.ok()) return s;
  uint32_t* at = table_ + table_index;
  if (!windows.empty()) memcpy(at, windows.data(), windows.size() * sizeof(uint32_t));  // data() may be null
  at += windows.size();
  memcpy(at, parts.data(), parts.size() * sizeof(queue::TablePart));
  at += parts.size() * queue::kPartIds;
  memcpy(at, src_ids.data(), src_ids.size() * sizeof(uint32_t));
  memcpy(at + src_ids.size(), dst_ids.data(), dst_ids.size() * sizeof(uint32_t));
  memcpy(at + 2 * src_ids.size(), options.payload.data(), options.payload.size());
  return PostSlot({options.user_data, 0, options.payload.size(), 0, options.block_size, options.tag,
                   static_cast<uint32_t>(parts.size()),
                   queue::kFlagBatch | (options.notify ? queue::kFlagNotify : 0) | window_flag, table_index,
                   static_cast<uint32_t>(src_ids.size())});
}

absl::Status WriteQueue::PostMessage(uint32_t table_index, uint32_t dst_index, uint64_t tag, absl::string_view payload,
                                     uint64_t user_data) {
  const uint64_t words = (payload.size() + sizeof(uint32_t) - 1) / sizeof(uint32_t);
  if (absl::Status s = CheckTableRoom("message", table_index, words); !s.ok()) return s;
  if (!payload.empty()) memcpy(table_ + table_index, payload.data(), payload.size());
  return PostSlot({user_data, 0, payload.size(), 0, 0, tag, dst_index, queue::kFlagMessage, table_index, 0});
}

absl::Status WriteQueue::PostOpenWindow(uint32_t table_index, uint32_t dst_index, absl::Span<const uint64_t> region_ids,
                                        absl::Span<const std::pair<uint64_t, uint64_t>> ranges, uint32_t timeout_ms,
                                        uint64_t user_data) {
  const uint64_t words = queue::kWindowOpenIds + 2 * uint64_t{region_ids.size()} + 4 * uint64_t{ranges.size()};
  if (absl::Status s = CheckTableRoom("window", table_index, words); !s.ok()) return s;
  queue::WindowOpen head{timeout_ms, static_cast<uint32_t>(region_ids.size()), static_cast<uint32_t>(ranges.size())};
  char* at = reinterpret_cast<char*>(table_ + table_index);
  memcpy(at, &head, sizeof(head));
  at += sizeof(head);
  if (!region_ids.empty()) memcpy(at, region_ids.data(), region_ids.size() * sizeof(uint64_t));
  at += region_ids.size() * sizeof(uint64_t);
  for (const auto& [offset, length] : ranges) {
    memcpy(at, &offset, sizeof(offset));
    memcpy(at + 8, &length, sizeof(length));
    at += 16;
  }
  return PostSlot({user_data, 0, 0, 0, 0, 0, dst_index, queue::kFlagOpenWindow, table_index, 0});
}

absl::Status WriteQueue::PostCloseWindow(uint64_t window_id, uint32_t wait_ms, uint64_t user_data) {
  return PostSlot({user_data, 0, window_id, 0, wait_ms, 0, 0, queue::kFlagCloseWindow, 0, 0});
}

absl::Status WriteQueue::PostSlot(const queue::SubmitEntry& entry) {
  if (posted_ - reaped_ >= entries_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the queue already has ", entries_, " writes in flight; Reap completions first"));
  }
  sq_[posted_ & (entries_ - 1)] = entry;
  ++posted_;
  header_->sq_tail.value.store(posted_, std::memory_order_seq_cst);
  if (header_->agent_sleeping.value.load(std::memory_order_seq_cst) != 0) {
    uint64_t one = 1;
    ssize_t ignored = write(submit_fd_, &one, sizeof(one));
    (void)ignored;
  }
  return absl::OkStatus();
}

size_t WriteQueue::Take(std::vector<Completion>* out, size_t max) {
  const uint32_t tail = header_->cq_tail.value.load(std::memory_order_acquire);
  size_t n = 0;
  for (; reaped_ != tail && n < max; ++n, ++reaped_) {
    const queue::CompletionEntry& c = cq_[reaped_ & (entries_ - 1)];
    Completion r;
    r.user_data = c.user_data;
    r.transfer_id = c.transfer_id;
    r.bytes = c.bytes;
    if (c.code != 0) {
      r.status = absl::Status(static_cast<absl::StatusCode>(c.code),
                              std::string(c.message, strnlen(c.message, sizeof(c.message))));
    } else {
      memcpy(r.window_token.data(), c.message, r.window_token.size());  // an open's; zeros otherwise
    }
    out->push_back(std::move(r));
  }
  if (n > 0) header_->cq_head.value.store(reaped_, std::memory_order_release);
  return n;
}

size_t WriteQueue::Reap(std::vector<Completion>* out, size_t max, absl::Duration timeout, size_t min,
                        absl::Duration spin) {
  const uint32_t want = static_cast<uint32_t>(std::max<size_t>(1, std::min<size_t>({min, max, inflight()})));
  const absl::Time now = absl::Now();
  const absl::Time deadline = now + timeout;
  const absl::Time spin_until = now + std::min(spin, timeout);
  for (;;) {
    if (header_->cq_tail.value.load(std::memory_order_acquire) - reaped_ >= want) return Take(out, max);
    if (spin > absl::ZeroDuration() && absl::Now() < spin_until) {
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
      continue;
    }
    // Announce the wait, then look again: a completion written before the announcement
    // would otherwise not ring the doorbell. The agent rings once `want` are unreaped.
    header_->client_waiting.value.store(want, std::memory_order_seq_cst);
    if (header_->cq_tail.value.load(std::memory_order_seq_cst) - reaped_ < want) {
      if (absl::Now() > deadline) {
        header_->client_waiting.value.store(0, std::memory_order_relaxed);
        return Take(out, max);
      }
      SleepOnDoorbell(complete_fd_, deadline);
    }
    header_->client_waiting.value.store(0, std::memory_order_relaxed);
  }
}

}  // namespace ferry
