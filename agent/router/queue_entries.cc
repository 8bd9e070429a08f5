#include "agent/router/queue_entries.h"

#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "agent/common/poll_source.h"
#include "agent/common/status_macros.h"

namespace ferry {
namespace {

queue::CompletionEntry ToCompletion(uint64_t user_data, const v1::TransferResult& r) {
  queue::CompletionEntry c{};
  c.user_data = user_data;
  c.transfer_id = r.transfer_id();
  c.bytes = r.bytes();
  c.duration_ns = r.duration_ns();
  c.code = r.code();
  c.path = static_cast<uint32_t>(r.path());
  snprintf(c.message, sizeof(c.message), "%s", r.message().c_str());
  return c;
}

}  // namespace

bool QueueEntries::Handle(const std::shared_ptr<TransferQueue>& q, const queue::SubmitEntry& e, bool may_block) {
  auto refuse = [&](const absl::Status& s) {
    metrics_->errors("Queue", StatusCodeName(static_cast<int>(s.code()))).Increment();
    v1::TransferResult r;
    r.set_code(static_cast<int>(s.code()));
    r.set_message(std::string(s.message()));
    q->Complete(ToCompletion(e.user_data, r));
    return true;
  };
  if (shutting_down_.load()) return refuse(absl::UnavailableError("the agent is shutting down"));
  std::shared_ptr<Session> session = sessions_->FindById(q->session_id());
  if (session == nullptr) return refuse(absl::UnavailableError("the session ended"));
  if (e.flags & ~(queue::kFlagNotify | queue::kFlagPaged | queue::kFlagBatch | queue::kFlagMessage |
                  queue::kFlagWindow | queue::kFlagOpenWindow | queue::kFlagCloseWindow | queue::kFlagWindowSpans)) {
    return refuse(absl::InvalidArgumentError(absl::StrCat("flags 0x", absl::Hex(e.flags), " has unknown bits")));
  }
  if (e.flags & (queue::kFlagOpenWindow | queue::kFlagCloseWindow)) {
    if (e.flags != queue::kFlagOpenWindow && e.flags != queue::kFlagCloseWindow) {
      return refuse(absl::InvalidArgumentError(absl::StrCat(
          "flags 0x", absl::Hex(e.flags), ": a window's open (32) or close (64) entry takes no other flag")));
    }
    if (e.flags == queue::kFlagOpenWindow) {
      absl::StatusOr<queue::CompletionEntry> opened = OpenWindow(*q, e);
      if (!opened.ok()) return refuse(opened.status());
      q->Complete(*opened);
      return true;
    }
    absl::Status closed = CloseWindow(*q, e, may_block);
    if (IsWouldBlock(closed)) return false;
    if (!closed.ok()) return refuse(closed);
    q->Complete(ToCompletion(e.user_data, v1::TransferResult()));
    return true;
  }
  if ((e.flags & (queue::kFlagWindow | queue::kFlagWindowSpans)) && !(e.flags & queue::kFlagBatch)) {
    return refuse(absl::InvalidArgumentError(absl::StrCat(
        "flags 0x", absl::Hex(e.flags), ": a window (16) or window spans (128) are for batch entries (4) only")));
  }
  if ((e.flags & queue::kFlagWindow) && (e.flags & queue::kFlagWindowSpans)) {
    return refuse(absl::InvalidArgumentError(
        absl::StrCat("flags 0x", absl::Hex(e.flags), ": a window (16) and window spans (128) exclude each other")));
  }
  if (e.flags & queue::kFlagMessage) {
    if (e.flags != queue::kFlagMessage) {
      return refuse(absl::InvalidArgumentError(
          absl::StrCat("flags 0x", absl::Hex(e.flags), ": a message entry (8) takes no other flag")));
    }
    absl::Status sent = SendMessage(*q, e, may_block);
    if (IsWouldBlock(sent)) return false;
    if (!sent.ok()) return refuse(sent);
    q->Complete(ToCompletion(e.user_data, v1::TransferResult()));
    return true;
  }
  if (e.flags & (queue::kFlagPaged | queue::kFlagBatch)) {
    if (e.blocks > limits_.max_chunks) {
      return refuse(
          absl::ResourceExhaustedError(absl::StrCat("blocks: ", e.blocks, " exceed the limit of ", limits_.max_chunks,
                                                    " per write (--max_chunks_per_write); split the entry")));
    }
  } else if (e.table_index != 0 || e.blocks != 0) {
    return refuse(absl::InvalidArgumentError(
        "table_index and blocks are for paged and batch entries (flags & 6); set them to 0"));
  }
  absl::StatusOr<std::shared_ptr<Transfer>> t =
      (e.flags & queue::kFlagBatch) ? PrepareBatch(session, *q, e, may_block) : Prepare(session, *q, e, may_block);
  if (!t.ok() && IsWouldBlock(t.status())) return false;
  if (!t.ok()) return refuse(t.status());
  (*t)->id = transfers_->NextId();
  (*t)->on_result = [q, user_data = e.user_data](const v1::TransferResult& r) {
    q->Complete(ToCompletion(user_data, r));
  };
  router_->Launch(std::move(*t));
  return true;
}

absl::Status QueueEntries::SendMessage(const TransferQueue& q, const queue::SubmitEntry& e, bool may_block) const {
  if (e.src_region != 0 || e.dst_offset != 0 || e.length != 0 || e.blocks != 0) {
    return absl::InvalidArgumentError(
        "src_region, dst_offset, length and blocks of a message entry must be 0 (it writes no bytes)");
  }
  FERRY_RETURN_IF_ERROR(CheckDestination(q, e.dst_index, "dst_index"));
  if (e.src_offset > kMaxNotifyPayloadBytes) {  // checked before the copy: the length is the client's
    return absl::InvalidArgumentError(
        absl::StrCat("the message payload (src_offset) is ", e.src_offset, " bytes; at most ", kMaxNotifyPayloadBytes));
  }
  const std::shared_ptr<const v1::RegionDescriptor>& dst = q.destinations()[e.dst_index];
  // Another agent's region: an RPC to it, on the poller's own thread.
  if (!may_block && !router_->IsLocal(*dst)) return WouldBlockError("a message to another agent");
  thread_local std::string payload;
  FERRY_RETURN_IF_ERROR(q.CopyBytes(e.table_index, e.src_offset, &payload));
  return router_->SendMessage(dst, e.tag, payload, absl::Now() + absl::Milliseconds(q.timeout_ms()), q.owner_uid());
}

absl::StatusOr<queue::CompletionEntry> QueueEntries::OpenWindow(const TransferQueue& q,
                                                                const queue::SubmitEntry& e) const {
  if (windows_ == nullptr) return absl::FailedPreconditionError("this agent opens no write windows");
  if (e.src_region != 0 || e.src_offset != 0 || e.dst_offset != 0 || e.length != 0 || e.tag != 0 || e.blocks != 0) {
    return absl::InvalidArgumentError(
        "src_region, src_offset, dst_offset, length, tag and blocks of a window's open entry must be 0 (the "
        "window is in the table; its writer is the destination dst_index)");
  }
  FERRY_RETURN_IF_ERROR(CheckDestination(q, e.dst_index, "dst_index"));
  thread_local std::string words;
  FERRY_RETURN_IF_ERROR(q.CopyBytes(e.table_index, sizeof(queue::WindowOpen), &words));
  queue::WindowOpen head;
  memcpy(&head, words.data(), sizeof(head));
  if (head.timeout_ms == 0 || head.timeout_ms > window_limits_.max_timeout_ms) {
    return absl::InvalidArgumentError(absl::StrCat("timeout_ms must be 1..", window_limits_.max_timeout_ms,
                                                   " (--max_transfer_timeout_ms), got ", head.timeout_ms));
  }
  // Bounded before the copy: the counts are the client's.
  if (head.regions == 0 || head.regions > kMaxWindowRegions) {
    return absl::InvalidArgumentError(absl::StrCat("regions must be 1..", kMaxWindowRegions, ", got ", head.regions));
  }
  if (head.ranges == 0 || head.ranges > kMaxWindowRanges) {
    return absl::InvalidArgumentError(absl::StrCat("ranges must be 1..", kMaxWindowRanges, ", got ", head.ranges));
  }
  const uint64_t bytes = sizeof(head) + uint64_t{head.regions} * 8 + uint64_t{head.ranges} * 16;
  FERRY_RETURN_IF_ERROR(q.CopyBytes(e.table_index, bytes, &words));
  WindowSpec spec;
  spec.region_ids.resize(head.regions);
  memcpy(spec.region_ids.data(), words.data() + sizeof(head), head.regions * 8);
  spec.ranges.resize(head.ranges);
  const char* at = words.data() + sizeof(head) + head.regions * 8;
  for (ByteSpan& r : spec.ranges) {
    memcpy(&r.offset, at, 8);
    memcpy(&r.length, at + 8, 8);
    at += 16;
  }
  const v1::RegionDescriptor& writer = *q.destinations()[e.dst_index];
  spec.writer = {writer.agent_incarnation(), writer.region_id()};
  spec.timeout = absl::Milliseconds(head.timeout_ms);
  FERRY_ASSIGN_OR_RETURN(std::shared_ptr<const WriteWindow> w, windows_->Open(q.session_id(), spec));
  queue::CompletionEntry c{};
  c.user_data = e.user_data;
  c.transfer_id = w->id();
  const std::string token = w->token().bytes();
  memcpy(c.message, token.data(), token.size());
  return c;
}

absl::Status QueueEntries::CloseWindow(const TransferQueue& q, const queue::SubmitEntry& e, bool may_block) const {
  if (windows_ == nullptr) return absl::FailedPreconditionError("this agent opens no write windows");
  if (e.src_region != 0 || e.dst_offset != 0 || e.tag != 0 || e.dst_index != 0 || e.table_index != 0 || e.blocks != 0) {
    return absl::InvalidArgumentError(
        "src_region, dst_offset, tag, dst_index, table_index and blocks of a window's close entry must be 0 (the "
        "window id is src_offset, the wait in ms length)");
  }
  if (e.length > window_limits_.max_wait_ms) {
    return absl::InvalidArgumentError(absl::StrCat("length (the wait) must be 0..", window_limits_.max_wait_ms,
                                                   " ms (--max_wait_ms), got ", e.length));
  }
  if (!may_block) {
    // Most closes find nothing moving: done here. One that must wait goes to its pod's lane.
    absl::Status now = windows_->Close(e.src_offset, q.session_id(), absl::ZeroDuration());
    if (absl::IsDeadlineExceeded(now) && e.length > 0) return WouldBlockError("writes through the window still move");
    return now;
  }
  return windows_->Close(e.src_offset, q.session_id(), absl::Milliseconds(e.length));
}

absl::Status QueueEntries::CopyWindowSpans(const TransferQueue& q, const queue::SubmitEntry& e, uint32_t* table,
                                           std::vector<queue::WindowSpan>* spans) {
  spans->clear();
  thread_local std::string words;
  if (e.flags & queue::kFlagWindow) {  // one window for every block
    FERRY_RETURN_IF_ERROR(q.CopyBytes(*table, sizeof(queue::WindowRef), &words));
    queue::WindowSpan& span = spans->emplace_back();
    memcpy(&span.window, words.data(), sizeof(span.window));
    span.blocks = e.blocks;
    *table += queue::kWindowIds;
    return absl::OkStatus();
  }
  if (!(e.flags & queue::kFlagWindowSpans)) return absl::OkStatus();
  FERRY_RETURN_IF_ERROR(q.CopyBytes(*table, sizeof(queue::WindowSpans), &words));
  queue::WindowSpans head;
  memcpy(&head, words.data(), sizeof(head));
  if (head.spans < 1 || head.spans > queue::kMaxWindowSpans || head.reserved != 0) {  // before the copy: the client's
    return absl::InvalidArgumentError(absl::StrCat("window spans: spans must be 1..", queue::kMaxWindowSpans,
                                                   " and reserved 0, got ", head.spans, " and ", head.reserved));
  }
  FERRY_RETURN_IF_ERROR(
      q.CopyBytes(*table + queue::kWindowSpansIds, uint64_t{head.spans} * sizeof(queue::WindowSpan), &words));
  spans->resize(head.spans);
  memcpy(spans->data(), words.data(), words.size());
  uint64_t blocks = 0;
  for (size_t s = 0; s < spans->size(); ++s) {
    const queue::WindowSpan& span = (*spans)[s];
    if (span.blocks == 0 || span.reserved != 0 || span.window.window_id == 0) {
      return absl::InvalidArgumentError(absl::StrCat("window spans[", s, "]: window_id and blocks must be >= 1 and ",
                                                     "reserved 0, got ", span.window.window_id, ", ", span.blocks,
                                                     " and ", span.reserved));
    }
    blocks += span.blocks;
  }
  if (blocks != e.blocks) {
    return absl::InvalidArgumentError(
        absl::StrCat("window spans cover ", blocks, " blocks; the entry has ", e.blocks, " (they must add up)"));
  }
  *table += queue::kWindowSpansIds + head.spans * queue::kWindowSpanIds;
  return absl::OkStatus();
}

std::shared_ptr<const v1::RegionDescriptor> QueueEntries::ThroughWindow(const v1::RegionDescriptor& destination,
                                                                        const queue::WindowSpan& span) {
  auto d = std::make_shared<v1::RegionDescriptor>(destination);
  d->set_window_id(span.window.window_id);
  d->set_token(reinterpret_cast<const char*>(span.window.token), sizeof(span.window.token));
  return d;
}

WriteSpec QueueEntries::Spec(const TransferQueue& q, uint64_t src_region, uint32_t dst_index) const {
  WriteSpec spec;
  spec.src_region_id = src_region;
  spec.dst = q.destinations()[dst_index];
  spec.timeout = absl::Milliseconds(q.timeout_ms());
  spec.traffic_class = q.traffic_class();
  return spec;
}

absl::Status QueueEntries::CheckDestination(const TransferQueue& q, uint32_t dst_index, const char* field) {
  if (dst_index < q.destinations().size()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, " ", dst_index, " is not one of the queue's ", q.destinations().size(), " destinations"));
}

absl::StatusOr<std::shared_ptr<Transfer>> QueueEntries::Prepare(const std::shared_ptr<Session>& session,
                                                                const TransferQueue& q, const queue::SubmitEntry& e,
                                                                bool may_block) const {
  FERRY_RETURN_IF_ERROR(CheckDestination(q, e.dst_index, "dst_index"));
  // A paged entry's ids, copied out of the block table before anything looks at them
  // (per thread: entries run on NIC workers and the poller at once).
  thread_local std::vector<uint64_t> src_ids, dst_ids;
  const bool paged = (e.flags & queue::kFlagPaged) != 0;
  if (paged) {
    FERRY_RETURN_IF_ERROR(q.CopyBlockIds(e.table_index, e.blocks, &src_ids, &dst_ids));
  }
  WriteSpec spec = Spec(q, e.src_region, e.dst_index);
  spec.notify = (e.flags & queue::kFlagNotify) != 0;
  spec.tag = e.tag;
  return router_->Prepare(
      session, spec,
      [&](uint64_t src_size, uint64_t dst_size) {
        if (!paged) return SingleChunkPlan({e.src_offset, e.dst_offset, e.length}, src_size, dst_size);
        return PagedPlan(BlockMapping{e.length, src_ids, dst_ids}, e.src_offset, e.dst_offset, src_size, dst_size,
                         limits_);
      },
      /*cached_only=*/!may_block);
}

absl::StatusOr<std::shared_ptr<Transfer>> QueueEntries::PrepareBatch(const std::shared_ptr<Session>& session,
                                                                     const TransferQueue& q,
                                                                     const queue::SubmitEntry& e,
                                                                     bool may_block) const {
  const uint32_t n = e.dst_index;  // a batch entry's part count
  if (n < 1 || n > queue::kMaxBatchParts) {
    return absl::InvalidArgumentError(
        absl::StrCat("a batch entry has 1..", queue::kMaxBatchParts, " parts (its dst_index), got ", n));
  }
  if (e.src_region != 0 || e.dst_offset != 0) {
    return absl::InvalidArgumentError("src_region and dst_offset of a batch entry must be 0 (each part names its own)");
  }
  uint32_t table = e.table_index;
  thread_local std::vector<queue::WindowSpan> spans;  // none: each destination as the queue holds it
  FERRY_RETURN_IF_ERROR(CopyWindowSpans(q, e, &table, &spans));
  if (!spans.empty() && uint64_t{n} * spans.size() > queue::kMaxWindowSpanParts) {
    return absl::InvalidArgumentError(absl::StrCat("a batch entry's parts times its window spans are at most ",
                                                   queue::kMaxWindowSpanParts, ", got ", n, " x ", spans.size()));
  }
  thread_local std::vector<queue::TablePart> parts;
  thread_local std::vector<uint64_t> src_ids, dst_ids;
  FERRY_RETURN_IF_ERROR(q.CopyParts(table, n, &parts));
  FERRY_RETURN_IF_ERROR(q.CopyBlockIds(table + n * queue::kPartIds, e.blocks, &src_ids, &dst_ids));
  WriteSpec whole;
  whole.notify = (e.flags & queue::kFlagNotify) != 0;
  whole.tag = e.tag;
  if (e.src_offset > kMaxNotifyPayloadBytes) {  // checked before the copy: the length is the client's
    return absl::InvalidArgumentError(absl::StrCat("the notification payload (src_offset) is ", e.src_offset,
                                                   " bytes; at most ", kMaxNotifyPayloadBytes));
  }
  // No index here wraps: each copy checked the ids before it against the table's size.
  FERRY_RETURN_IF_ERROR(q.CopyBytes(table + n * queue::kPartIds + 2 * e.blocks, e.src_offset, &whole.notify_payload));
  FERRY_RETURN_IF_ERROR(TransferRouter::CheckNotifyPayload(whole.notify, whole.notify_payload));
  // The ids are checked once for every part; each part's plan then only checks that they
  // fit its regions.
  absl::StatusOr<std::shared_ptr<const PagedIds>> ids =
      CheckPagedIds(BlockMapping{e.length, src_ids, dst_ids}, limits_);
  if (!ids.ok()) return ids.status();
  // A plan per span and part, span by span: a span's parts share its slice of the mapping
  // and its window's destinations (the GPU copier launches the slices of one write together).
  const size_t runs = std::max<size_t>(1, spans.size());
  thread_local std::vector<std::shared_ptr<const v1::RegionDescriptor>> through_window;
  TransferBatch batch(*router_, session, n * runs, limits_, /*cached_only=*/!may_block);
  if (spans.size() > 1) batch.NamePartsPerSpan(n);
  size_t first_block = 0;
  for (size_t s = 0; s < runs; ++s) {
    std::shared_ptr<const PagedIds> slice = *ids;
    if (!spans.empty()) {
      if (spans.size() > 1) slice = SlicePagedIds(*ids, first_block, spans[s].blocks);
      first_block += spans[s].blocks;
      through_window.assign(q.destinations().size(), nullptr);  // made at the first part that names one
    }
    for (uint32_t i = 0; i < n; ++i) {
      const queue::TablePart& part = parts[i];
      if (part.reserved != 0) {
        return batch.NextPartError(absl::InvalidArgumentError(
            absl::StrCat("reserved is ", part.reserved, "; it must be 0 (a field of a later version of the ABI?)")));
      }
      if (absl::Status c = CheckDestination(q, part.dst_index, "dst_index"); !c.ok()) return batch.NextPartError(c);
      WriteSpec spec = Spec(q, part.src_region, part.dst_index);
      if (!spans.empty()) {
        std::shared_ptr<const v1::RegionDescriptor>& d = through_window[part.dst_index];
        if (d == nullptr) d = ThroughWindow(*spec.dst, spans[s]);
        spec.dst = d;
      }
      absl::Status added = batch.Add(spec, [&](uint64_t src_size, uint64_t dst_size) {
        return PagedPlan(slice, part.src_base, part.dst_base, src_size, dst_size);
      });
      if (!added.ok()) return added;
      if (s == 0 && i == 0 && n * runs > 1) batch.last().executor->Expect(batch.last());
    }
  }
  return std::move(batch).Join(whole);
}

}  // namespace ferry
