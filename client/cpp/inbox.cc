#include "client/cpp/inbox.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/doorbell.h"

namespace ferry {

absl::StatusOr<std::unique_ptr<Inbox>> Inbox::Open(Client& client, uint32_t slots) {
  if (!inbox::ValidSlots(slots)) {
    return absl::InvalidArgumentError(
        absl::StrCat("slots must be a power of two in [", inbox::kMinSlots, ", ", inbox::kMaxSlots, "], got ", slots));
  }
  std::unique_ptr<Inbox> in(new Inbox());
  in->slots_ = slots;
  in->map_bytes_ = inbox::InboxBytes(slots);
  // MFD_ALLOW_SEALING: the agent seals what it maps against shrinking.
  in->ring_fd_ = memfd_create("ferry-inbox", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (in->ring_fd_ < 0 || ftruncate(in->ring_fd_, static_cast<off_t>(in->map_bytes_)) != 0) {
    return absl::InternalError(absl::StrCat("creating the inbox's memfd: ", strerror(errno)));
  }
  in->map_ = mmap(nullptr, in->map_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, in->ring_fd_, 0);
  if (in->map_ == MAP_FAILED) {
    in->map_ = nullptr;
    return absl::InternalError(absl::StrCat("mapping the inbox: ", strerror(errno)));
  }
  in->header_ = new (in->map_) inbox::InboxHeader{};  // zeroed cursors
  in->header_->magic = inbox::kInboxMagic;
  in->header_->slots = slots;

  v1::OpenInboxRequest req;
  int agents_doorbell_fd = -1;
  if (absl::Status s = MakeDoorbell(&in->doorbell_fd_, &agents_doorbell_fd); !s.ok()) return s;
  absl::StatusOr<uint64_t> ring = client.SendFd(in->ring_fd_);
  absl::StatusOr<uint64_t> doorbell = ring.ok() ? client.SendFd(agents_doorbell_fd) : ring;
  close(agents_doorbell_fd);  // the agent has its own copy
  if (!doorbell.ok()) return doorbell.status();
  req.set_ring_fd(*ring);
  req.set_doorbell_fd(*doorbell);
  req.set_slots(slots);
  v1::OpenInboxResponse resp;
  auto ctx = client.NewContext();
  absl::Status s = FromGrpcStatus(client.stub()->OpenInbox(ctx.get(), req, &resp));
  if (!s.ok()) return s;
  return in;
}

Inbox::~Inbox() {
  if (map_ != nullptr) munmap(map_, map_bytes_);
  for (int fd : {ring_fd_, doorbell_fd_}) {
    if (fd >= 0) close(fd);
  }
}

size_t Inbox::ready() const { return header_->tail.value.load(std::memory_order_acquire) - head_; }

absl::StatusOr<size_t> Inbox::Poll(std::vector<v1::Notification>* out, size_t max, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (ready() == 0 && absl::Now() < deadline) {
    // Announce the wait, then look again: a notification written before the
    // announcement rang no doorbell.
    header_->client_waiting.value.store(1, std::memory_order_seq_cst);
    if (header_->tail.value.load(std::memory_order_seq_cst) == head_) SleepOnDoorbell(doorbell_fd_, deadline);
    header_->client_waiting.value.store(0, std::memory_order_relaxed);
  }
  size_t n = 0;
  for (; n < max && ready() > 0; ++n, ++head_) {
    const char* slot =
        static_cast<const char*>(map_) + inbox::kSlotsOffset + size_t{head_ & (slots_ - 1)} * inbox::kSlotBytes;
    uint32_t size;
    memcpy(&size, slot, sizeof(size));
    v1::Notification note;
    if (size > inbox::kSlotBytes - sizeof(size) || !note.ParseFromArray(slot + sizeof(size), static_cast<int>(size))) {
      return absl::InternalError(absl::StrCat("inbox slot ", head_, " does not hold a notification"));
    }
    out->push_back(std::move(note));
  }
  if (n > 0) {
    header_->head.value.store(head_, std::memory_order_seq_cst);  // those slots are free again
    // Notifications wait in the agent for them: tell it now rather than at its next look.
    if (header_->agent_waiting.load(std::memory_order_seq_cst) != 0) {
      const char ring = 1;
      ssize_t ignored = send(doorbell_fd_, &ring, 1, MSG_DONTWAIT | MSG_NOSIGNAL);  // full: rung already
      (void)ignored;
    }
  }
  return n;
}

}  // namespace ferry
