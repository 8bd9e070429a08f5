#include "agent/engine/rail_worker.h"

#include <poll.h>
#include <sched.h>

#include <pthread.h>
#include <rdma/fi_errno.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "agent/common/check.h"
#include "agent/common/log.h"
#include "agent/common/thread_name.h"

namespace ferry {
namespace {
constexpr int kCqBatch = 64;
constexpr size_t kLatencyBatch = 256;  // ops between two op_duration updates while busy
// Post slots per block: more than a provider's usual transmit queue (rxm/tcp: 256), so
// one block serves a worker for good.
constexpr size_t kSlotBlock = 1024;

// The worker whose loop runs on this thread, if any.
thread_local const RailWorker* current_worker = nullptr;

// Errors after which the provider's connection to the peer is gone (its queued ops are
// flushed with FI_ECANCELED).
bool ConnectionLost(int err) {
  switch (err < 0 ? -err : err) {
    case FI_ENOTCONN:
    case FI_ECONNRESET:
    case FI_ECONNABORTED:
    case FI_ESHUTDOWN:
    case EPIPE:
    case FI_ECANCELED:
      return true;
    default:
      return false;
  }
}
}  // namespace

absl::Status ConnectionResetError(absl::string_view message) {
  absl::Status s = absl::UnavailableError(message);
  s.SetPayload(kConnectionResetPayload, absl::Cord());
  return s;
}

bool IsConnectionReset(const absl::Status& status) { return status.GetPayload(kConnectionResetPayload).has_value(); }

RailWorker::RailWorker(NicInterface* nic, Metrics* metrics, absl::Duration spin, std::vector<int> cpus,
                       absl::Duration stop_grace, const OpScheduler::Options& qos)
    : nic_(nic),
      spin_(spin),
      stop_grace_(stop_grace),
      cpus_(std::move(cpus)),
      tx_counter_(metrics->transfer_bytes("tx", "fabric", nic->name())),
      inflight_gauge_(metrics->ops_inflight(nic->name())),
      eagain_(metrics->fabric_eagain(nic->name())),
      errors_(metrics->fabric_errors(nic->name())),
      reconnects_(metrics->fabric_reconnects(nic->name())),
      scheduler_(qos, metrics, nic->name()),
      latency_bounds_(LatencyBuckets()) {
  for (int c = 0; c < kTrafficClasses; ++c) {
    op_duration_[c] = &metrics->op_duration(nic->name(), ClassName(static_cast<TrafficClass>(c)));
    latency_counts_[c].assign(latency_bounds_.size() + 1, 0);
  }
  event_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  FreeSlot();  // the first block, before any op needs it
}

RailWorker::~RailWorker() {
  Stop();
  if (event_fd_ >= 0) close(event_fd_);
}

void RailWorker::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void RailWorker::Stop() {
  if (!thread_.joinable()) return;
  stopping_.store(true, std::memory_order_release);
  Wake();
  thread_.join();
}

void RailWorker::Submit(absl::Span<const WriteOp> ops) {
  if (current_worker == this && !walking_queues_) {
    const absl::Time now = absl::Now();
    for (const WriteOp& op : ops) scheduler_.Enqueue(op, now);
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    incoming_.insert(incoming_.end(), ops.begin(), ops.end());
  }
  has_incoming_.store(true, std::memory_order_seq_cst);
  // A spinning worker sees has_incoming_ on its next turn; only a sleeping one needs
  // the eventfd (a syscall and a context switch per transfer otherwise).
  if (sleeping_.load(std::memory_order_seq_cst)) Wake();
}

void RailWorker::SetPollSource(PollSource* source) {
  absl::MutexLock lock(&mu_);
  if (!thread_.joinable() || loop_done_) {
    source_ = source;
    return;
  }
  next_source_ = source;
  source_change_ = true;
  has_incoming_.store(true, std::memory_order_seq_cst);
  Wake();
  // The worker takes it in TakeIncoming, or when its loop ends.
  mu_.Await(absl::Condition(
      +[](bool* pending) { return !*pending; }, &source_change_));
}

void RailWorker::Wake() {
  uint64_t one = 1;
  ssize_t ignored = write(event_fd_, &one, sizeof(one));
  (void)ignored;
}

RailWorker::PostedOp* RailWorker::FreeSlot() {
  if (free_slots_ == nullptr) {
    slot_blocks_.push_back(std::make_unique<PostedOp[]>(kSlotBlock));
    PostedOp* block = slot_blocks_.back().get();
    for (size_t i = 0; i < kSlotBlock; ++i) block[i].next_free = i + 1 < kSlotBlock ? &block[i + 1] : nullptr;
    free_slots_ = block;
  }
  return free_slots_;
}

bool RailWorker::TakeIncoming() {
  if (!has_incoming_.exchange(false, std::memory_order_acq_rel)) return false;
  {
    absl::MutexLock lock(&mu_);
    taken_.swap(incoming_);
    if (source_change_) {
      source_ = next_source_;
      source_change_ = false;
    }
  }
  const absl::Time now = absl::Now();
  for (const WriteOp& op : taken_) scheduler_.Enqueue(op, now);
  const bool took = !taken_.empty();
  taken_.clear();
  return took;
}

const RailWorker::Drop* RailWorker::LastDrop(fi_addr_t peer) const {
  for (const Drop& d : drops_) {
    if (d.peer == peer) return &d;
  }
  return nullptr;
}

void RailWorker::Fail(const WriteOp& op, int err, absl::string_view what) {
  errors_.Increment();
  const std::string message = absl::StrCat(nic_->name(), ": ", what);
  if (!ConnectionLost(err)) {
    Complete(op, absl::UnavailableError(message));
    return;
  }
  // The first error of a drop starts the hold; the rest (ops the provider flushes from
  // the same connection) fall inside it.
  const absl::Time now = absl::Now();
  auto d = std::find_if(drops_.begin(), drops_.end(), [&op](const Drop& x) { return x.peer == op.peer; });
  if (d == drops_.end() || now >= d->at + kReconnectHold) {
    FERRY_LOG(WARNING) << message << "; the connection to that peer is gone, reconnecting";
    reconnects_.Increment();
    if (d == drops_.end()) {
      drops_.push_back({op.peer, now});
    } else {
      d->at = now;
    }
  }
  Complete(op, ConnectionResetError(message));
}

// Posts queued ops in the scheduler's order until the provider pushes back.
bool RailWorker::PostPending() {
  const absl::Time now = absl::Now();
  // While a peer is held the CQ must be polled even with nothing else to do.
  holding_ = std::any_of(drops_.begin(), drops_.end(), [now](const Drop& d) { return now < d.at + kReconnectHold; });
  walking_queues_ = true;
  const bool progressed = scheduler_.Post(
      now,
      [&](fi_addr_t peer) {
        const Drop* drop = LastDrop(peer);
        return drop != nullptr && now < drop->at + kReconnectHold;
      },
      [&](const WriteOp& op, OpScheduler::Ticket ticket) { return PostOne(op, ticket, now); });
  walking_queues_ = false;
  inflight_pub_.store(inflight_, std::memory_order_relaxed);
  inflight_gauge_.Set(static_cast<double>(inflight_));
  return progressed;
}

OpScheduler::Outcome RailWorker::PostOne(const WriteOp& op, OpScheduler::Ticket ticket, absl::Time now) {
  if (op.state->finished() || op.state->stopped()) {  // deadline passed, failed or stopped: don't send the rest
    op.state->OpDone(absl::CancelledError("transfer already finished"));
    return OpScheduler::Outcome::kDropped;
  }
  const Drop* drop = LastDrop(op.peer);
  if (drop != nullptr && !op.message && op.keys_since < drop->at) {
    // Its keys predate the drop: they may be what broke the connection (a region
    // deregistered since). Posting them could break the new one as well.
    Complete(op, ConnectionResetError(absl::StrCat(nic_->name(),
                                                   ": the connection to the peer dropped after "
                                                   "the destination's keys were fetched")));
    return OpScheduler::Outcome::kDropped;
  }
  PostedOp* slot = FreeSlot();  // taken off the free list only if the post succeeds
  ssize_t rc = op.message
                   ? nic_->PostMessage(op.local, op.length, op.peer, &slot->context)
                   : nic_->PostWrite(op.local, op.length, op.desc, op.peer, op.remote_addr, op.key, &slot->context);
  if (rc == -FI_EAGAIN) {
    eagain_.Increment();
    return OpScheduler::Outcome::kFull;  // the op stays at the front; progress the CQ, then retry
  }
  if (rc != 0) {
    Fail(op, static_cast<int>(rc),
         absl::StrCat("posting a ", op.message ? "message" : "write", " failed: ", fi_strerror(static_cast<int>(-rc))));
    drop = LastDrop(op.peer);  // Fail may have added it
    if (drop != nullptr && absl::Now() < drop->at + kReconnectHold) {
      holding_ = true;
      return OpScheduler::Outcome::kPeerStopped;
    }
    return OpScheduler::Outcome::kDropped;
  }
  free_slots_ = slot->next_free;
  slot->op = op;
  slot->posted = now;
  slot->ticket = ticket;
  ++inflight_;
  return OpScheduler::Outcome::kPosted;
}

void RailWorker::Complete(const WriteOp& op, const absl::Status& status) {
  if (status.ok() && !op.message) {  // the counters are of data written
    tx_bytes_.fetch_add(op.length, std::memory_order_relaxed);
    tx_counter_.Increment(static_cast<double>(op.length));
  }
  op.state->OpDone(status);
}

void RailWorker::ObserveLatency(TrafficClass c, absl::Duration took) {
  const double seconds = absl::ToDoubleSeconds(took);
  const int i = ClassIndex(c);
  // The bucket prometheus-cpp's Observe would pick: the first bound >= the value.
  latency_counts_[i][std::lower_bound(latency_bounds_.begin(), latency_bounds_.end(), seconds) -
                     latency_bounds_.begin()] += 1;
  latency_sum_[i] += seconds;
  if (++latency_ops_ >= kLatencyBatch) FlushLatencies();
}

void RailWorker::FlushLatencies() {
  scheduler_.Flush();
  if (latency_ops_ == 0) return;
  for (int c = 0; c < kTrafficClasses; ++c) {
    op_duration_[c]->ObserveMultiple(latency_counts_[c], latency_sum_[c]);
    std::fill(latency_counts_[c].begin(), latency_counts_[c].end(), 0);
    latency_sum_[c] = 0;
  }
  latency_ops_ = 0;
}

bool RailWorker::ReadCompletions() {
  void* done[kCqBatch];
  const ssize_t n = nic_->ReadCompletions(done, kCqBatch);
  if (n > 0) {
    const absl::Time now = absl::Now();
    for (ssize_t i = 0; i < n; ++i) {
      FERRY_DCHECK(inflight_ > 0) << nic_->name() << ": a completion for an op that was not posted";
      --inflight_;
      PostedOp* slot = reinterpret_cast<PostedOp*>(done[i]);  // &slot->context, its first member
      const WriteOp op = slot->op;
      const absl::Time posted = slot->posted;
      scheduler_.Done(slot->ticket, op.length, /*ok=*/true, now);
      slot->next_free = free_slots_;
      free_slots_ = slot;
      ObserveLatency(slot->ticket.traffic_class, now - posted);
      Complete(op, absl::OkStatus());
    }
    return true;
  }
  if (n == -FI_EAVAIL) {
    NicInterface::ErrorCompletion err;
    if (nic_->ReadError(&err)) {
      auto* slot = reinterpret_cast<PostedOp*>(err.context);
      if (slot != nullptr) {
        FERRY_DCHECK(inflight_ > 0) << nic_->name() << ": an error completion for an op that was not posted";
        --inflight_;
        const WriteOp op = slot->op;
        scheduler_.Done(slot->ticket, op.length, /*ok=*/false, absl::Now());
        slot->next_free = free_slots_;
        free_slots_ = slot;
        Fail(op, err.err,
             absl::StrCat(op.message ? "message" : "write", " to peer failed: ", fi_strerror(err.err), " (", err.detail,
                          ")"));
      } else {
        errors_.Increment();
        FERRY_LOG(WARNING) << nic_->name() << ": " << fi_strerror(err.err) << " (" << err.detail << ")";
      }
    }
    return true;
  }
  return false;
}

bool RailWorker::Sleep(bool busy) {
  // Block until the CQ or the submit eventfd has something; fi_trywait makes sure no
  // completion is already waiting. Busy (ops in flight): short timeout as a safety net.
  const int timeout_ms = busy ? 1 : 100;
  int woken = 0;
  const int source_fd = source_ != nullptr ? source_->wait_fd() : -1;  // poll() skips fd -1
  if (nic_->wait_fd() >= 0 && nic_->TryWait()) {
    pollfd fds[3] = {{nic_->wait_fd(), POLLIN, 0}, {event_fd_, POLLIN, 0}, {source_fd, POLLIN, 0}};
    woken = poll(fds, 3, timeout_ms);
  } else if (nic_->wait_fd() < 0) {
    pollfd fds[2] = {{event_fd_, POLLIN, 0}, {source_fd, POLLIN, 0}};
    woken = poll(fds, 2, busy ? 0 : 1);  // no wait object: poll the CQ at least every ms
  } else {
    woken = 1;  // fi_trywait: something is already there
  }
  uint64_t drained;
  ssize_t ignored = read(event_fd_, &drained, sizeof(drained));
  (void)ignored;
  return woken > 0;
}

bool RailWorker::StopNow() {
  if (!stopping_.load(std::memory_order_acquire)) return false;
  {
    absl::MutexLock lock(&mu_);
    if (stop_deadline_ == absl::InfiniteFuture()) stop_deadline_ = absl::Now() + stop_grace_;
    const absl::Time now = absl::Now();
    for (const WriteOp& op : incoming_) scheduler_.Enqueue(op, now);
    incoming_.clear();
  }
  if (scheduler_.pending() == 0 && inflight_ == 0) return true;
  if (absl::Now() < stop_deadline_) return false;
  // Ops still queued after the grace period are failed; ops the provider still holds
  // are abandoned with the endpoint (their transfers were already finished by the
  // engine), and so are their states: the NIC may still read their source memory.
  walking_queues_ = true;
  scheduler_.DrainAll([&](const WriteOp& op) { Complete(op, absl::UnavailableError("the agent is shutting down")); });
  walking_queues_ = false;
  FERRY_LOG(WARNING) << nic_->name() << ": stopped with " << inflight_ << " writes still in flight";
  return true;
}

void RailWorker::Loop() {
  NameThisThread(absl::StrCat("ferry-", nic_->name()));  // "ferry-nic0"
  if (!cpus_.empty()) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int c : cpus_) CPU_SET(c, &set);
    pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
  }
  current_worker = this;
  absl::Time last_activity = absl::Now();
  for (;;) {
    // The source first: the writes it starts on this NIC are posted in the same turn.
    bool progressed = source_ != nullptr && source_->Poll();
    progressed |= TakeIncoming();
    progressed |= PostPending();
    progressed |= ReadCompletions();
    if (progressed) {
      last_activity = absl::Now();
      continue;
    }
    FlushLatencies();
    if (StopNow()) break;
    if (absl::Now() - last_activity < spin_) {
      // Spin, but give the core to any thread that is ready (the clients and the queue
      // poller often share it): twice the queue path's small-write rate on 2 cores.
      sched_yield();
      continue;
    }
    // Announce the sleep, then look once more: a Submit that saw sleeping_ == false
    // before the announcement did not ring the eventfd.
    sleeping_.store(true, std::memory_order_seq_cst);
    const bool may_sleep = source_ == nullptr || source_->PrepareToSleep();
    // A held peer needs the CQ polled (rxm replaces the connection only then).
    bool woken = !may_sleep || has_incoming_.load(std::memory_order_seq_cst) ||
                 Sleep(/*busy=*/inflight_ > 0 || scheduler_.pending() > 0 || holding_);
    sleeping_.store(false, std::memory_order_seq_cst);
    if (source_ != nullptr) source_->Woke();
    // A wake-up by the CQ's fd is activity too: incoming writes progress only while we poll.
    if (woken) last_activity = absl::Now();
  }
  // A SetPollSource waiting for this loop must not wait forever.
  absl::MutexLock lock(&mu_);
  loop_done_ = true;
  if (source_change_) source_ = next_source_;
  source_change_ = false;
}

}  // namespace ferry
