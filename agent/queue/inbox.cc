#include "agent/queue/inbox.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "agent/common/status_macros.h"
#include "agent/common/thread_name.h"

namespace ferry {

absl::StatusOr<std::unique_ptr<Inbox>> Inbox::Open(std::shared_ptr<Session> session, UniqueFd ring, UniqueFd doorbell,
                                                   uint32_t slots) {
  if (!inbox::ValidSlots(slots)) {
    return absl::InvalidArgumentError(
        absl::StrCat("slots must be a power of two in [", inbox::kMinSlots, ", ", inbox::kMaxSlots, "], got ", slots));
  }
  FERRY_RETURN_IF_ERROR(CheckDoorbellSocket(doorbell.get(), "doorbell_fd"));
  FERRY_ASSIGN_OR_RETURN(SharedMapping map, SharedMapping::Map(std::move(ring), inbox::InboxBytes(slots), "ring_fd",
                                                               absl::StrCat("an inbox of ", slots, " slots")));
  const auto* header = reinterpret_cast<const inbox::InboxHeader*>(map.data());
  if (header->magic != inbox::kInboxMagic || header->slots != slots) {
    return absl::InvalidArgumentError("ring_fd does not hold an initialised inbox header (magic, slots)");
  }
  if (header->head.value.load() != header->tail.value.load()) {
    return absl::InvalidArgumentError("a new inbox must start empty (head == tail)");
  }
  return std::unique_ptr<Inbox>(new Inbox(std::move(session), std::move(map), std::move(doorbell), slots));
}

Inbox::Inbox(std::shared_ptr<Session> session, SharedMapping map, UniqueFd doorbell, uint32_t slots)
    : session_(std::move(session)),
      map_(std::move(map)),
      doorbell_(std::move(doorbell)),
      slots_(slots),
      header_(reinterpret_cast<inbox::InboxHeader*>(map_.data())),
      tail_(header_->tail.value.load()) {}

Inbox::~Inbox() { session_->notifications().SetSink(nullptr); }

void Inbox::Attach(std::function<void()> on_backlog) {
  session_->notifications().SetSink([this](const v1::Notification& n) { return Write(n); }, std::move(on_backlog));
}

size_t Inbox::Drain() {
  EventQueue<v1::Notification>& queue = session_->notifications();
  size_t waiting = queue.DrainToSink(absl::ZeroDuration());
  if (waiting > 0) {
    header_->agent_waiting.store(1, std::memory_order_seq_cst);
    // Slots the client freed before it could see the flag rang nothing: look again.
    waiting = queue.DrainToSink(absl::ZeroDuration());
  }
  if (waiting == 0 && header_->agent_waiting.load(std::memory_order_relaxed) != 0) {
    header_->agent_waiting.store(0, std::memory_order_relaxed);
  }
  return waiting;
}

void Inbox::TakeRings() {
  char rings[256];
  ssize_t n;
  while ((n = recv(doorbell_.get(), rings, sizeof(rings), MSG_DONTWAIT)) == static_cast<ssize_t>(sizeof(rings))) {
  }
  // Closed (0) or broken: polling it would return at once, forever.
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) doorbell_closed_ = true;
}

bool Inbox::Write(const v1::Notification& n) {
  absl::MutexLock lock(&write_mu_);
  // The client's head is untrusted: one ahead of our tail (or more than a ring behind)
  // reads as "full", which stalls only this inbox.
  const uint32_t head = header_->head.value.load(std::memory_order_acquire);
  if (tail_ - head >= slots_) return false;
  constexpr size_t kRoom = inbox::kSlotBytes - sizeof(uint32_t);
  const v1::Notification* out = &n;
  v1::Notification shortened;
  size_t size = n.ByteSizeLong();
  if (size > kRoom) {  // only a long error message can do this: shorten it
    shortened = n;
    const size_t over = size - kRoom + 16;  // and room for a shorter length prefix
    shortened.mutable_message()->resize(n.message().size() > over ? n.message().size() - over : 0);
    out = &shortened;
    size = shortened.ByteSizeLong();
  }
  char* slot = map_.data() + inbox::kSlotsOffset + size_t{tail_ & (slots_ - 1)} * inbox::kSlotBytes;
  const uint32_t length = static_cast<uint32_t>(size);
  memcpy(slot, &length, sizeof(length));
  out->SerializeToArray(slot + sizeof(length), static_cast<int>(kRoom));
  ++tail_;
  header_->tail.value.store(tail_, std::memory_order_seq_cst);
  if (header_->client_waiting.value.load(std::memory_order_seq_cst) != 0) RingDoorbell(doorbell_.get());
  return true;
}

Inboxes::Inboxes() : pump_([this] { Pump(); }) {}

Inboxes::~Inboxes() {
  {
    absl::MutexLock lock(&wake_mu_);
    stopping_ = true;
  }
  pump_.join();
  absl::MutexLock lock(&mu_);
  inboxes_.clear();
}

void Inboxes::NoteBacklog() {
  absl::MutexLock lock(&wake_mu_);
  backlog_ = true;
}

void Inboxes::Pump() {
  NameThisThread("ferry-inbox");
  absl::Duration wait = absl::Microseconds(50);
  bool waiting = false;                 // some inbox still had notifications its ring could not take
  std::vector<pollfd> doorbells;        // of the inboxes still waiting
  std::vector<Inbox*> waiting_inboxes;  // their inboxes, alike
  for (;;) {
    {
      absl::MutexLock lock(&wake_mu_);
      auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(wake_mu_) { return backlog_ || stopping_; };
      if (!waiting) wake_mu_.AwaitWithTimeout(absl::Condition(&woken), absl::Seconds(1));
      if (stopping_) break;
      backlog_ = false;
    }
    std::vector<std::shared_ptr<Inbox>> inboxes;
    {
      absl::MutexLock lock(&mu_);
      inboxes = inboxes_;
    }
    doorbells.clear();
    waiting_inboxes.clear();
    for (const std::shared_ptr<Inbox>& in : inboxes) {
      if (in->Drain() > 0) {
        doorbells.push_back(pollfd{in->doorbell(), POLLIN, 0});  // fd -1: ignored by ppoll
        waiting_inboxes.push_back(in.get());
      }
    }
    waiting = !doorbells.empty();
    if (waiting) {
      // Until a client that freed slots rings, or the look again: more patient each time
      // nobody rings (a client that is not reading, or one that does not ring).
      const timespec timeout = absl::ToTimespec(wait);
      if (ppoll(doorbells.data(), doorbells.size(), &timeout, nullptr) > 0) {
        for (size_t i = 0; i < doorbells.size(); ++i) {
          if (doorbells[i].revents != 0) waiting_inboxes[i]->TakeRings();
        }
        wait = absl::Microseconds(50);
      } else {
        wait = std::min(2 * wait, absl::Milliseconds(10));
      }
    } else {
      wait = absl::Microseconds(50);
    }
    inboxes.clear();  // an inbox removed meanwhile goes here, on this thread
  }
}

void Inboxes::RemoveSession(uint64_t session_id) {
  std::vector<std::shared_ptr<Inbox>> gone;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = inboxes_.begin(); it != inboxes_.end();) {
      if ((*it)->session_id() == session_id) {
        gone.push_back(std::move(*it));
        it = inboxes_.erase(it);
      } else {
        ++it;
      }
    }
  }
  gone.clear();  // freed outside the lock (or by the pump, if it holds one just now)
}

void Inboxes::Add(std::unique_ptr<Inbox> inbox) {
  std::shared_ptr<Inbox> in(std::move(inbox));
  in->Attach([this] { NoteBacklog(); });
  {
    absl::MutexLock lock(&mu_);
    // Those whose session ended have nothing more to take.
    inboxes_.erase(std::remove_if(inboxes_.begin(), inboxes_.end(), [](const auto& i) { return i->closed(); }),
                   inboxes_.end());
    inboxes_.push_back(std::move(in));
  }
  NoteBacklog();  // what arrived before the sink was attached
}

}  // namespace ferry
