#include "agent/router/queue_entries.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "agent/common/poll_source.h"

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
  if (e.dst_index >= q->destinations().size()) {
    return refuse(absl::InvalidArgumentError(absl::StrCat("dst_index ", e.dst_index, " is not one of the queue's ",
                                                          q->destinations().size(), " destinations")));
  }
  if (e.flags & ~(queue::kFlagNotify | queue::kFlagPaged)) {
    return refuse(absl::InvalidArgumentError(absl::StrCat("flags 0x", absl::Hex(e.flags), " has unknown bits")));
  }
  // A paged entry's ids, copied out of the block table before anything looks at them
  // (per thread: entries run on NIC workers and the poller at once).
  thread_local std::vector<uint64_t> src_ids, dst_ids;
  const bool paged = (e.flags & queue::kFlagPaged) != 0;
  if (paged && e.blocks > limits_.max_chunks) {
    return refuse(
        absl::ResourceExhaustedError(absl::StrCat("blocks: ", e.blocks, " exceed the limit of ", limits_.max_chunks,
                                                  " per write (--max_chunks_per_write); split the entry")));
  }
  if (paged) {
    if (absl::Status s = q->CopyBlockIds(e.table_index, e.blocks, &src_ids, &dst_ids); !s.ok()) return refuse(s);
  } else if (e.table_index != 0 || e.blocks != 0) {
    return refuse(
        absl::InvalidArgumentError("table_index and blocks are for paged entries (flags & 2); set them to 0"));
  }
  WriteSpec spec;
  spec.src_region_id = e.src_region;
  spec.dst = q->destinations()[e.dst_index];
  spec.notify = (e.flags & queue::kFlagNotify) != 0;
  spec.tag = e.tag;
  spec.timeout = absl::Milliseconds(q->timeout_ms());
  spec.traffic_class = q->traffic_class();
  absl::StatusOr<std::shared_ptr<Transfer>> t = router_->Prepare(
      session, spec,
      [&](uint64_t src_size, uint64_t dst_size) {
        if (!paged) return SingleChunkPlan({e.src_offset, e.dst_offset, e.length}, src_size, dst_size);
        return PagedPlan(BlockMapping{e.length, src_ids, dst_ids}, e.src_offset, e.dst_offset, src_size, dst_size,
                         limits_);
      },
      /*cached_only=*/!may_block);
  if (!t.ok() && IsWouldBlock(t.status())) return false;
  if (!t.ok()) return refuse(t.status());
  (*t)->id = transfers_->NextId();
  (*t)->on_result = [q, user_data = e.user_data](const v1::TransferResult& r) {
    q->Complete(ToCompletion(user_data, r));
  };
  router_->Launch(std::move(*t));
  return true;
}

}  // namespace ferry
