// Shared memory and doorbells a client hands the agent (write-queue rings, notification
// inboxes), checked before the agent trusts them with anything.
//
//   absl::StatusOr<SharedMapping> m = SharedMapping::Map(std::move(ring_fd), bytes, "ring_fd", "a queue of 64");
//   if (absl::Status s = CheckEventFd(doorbell.get(), "doorbell_fd"); !s.ok()) return s;
//
// The mapping is of a memfd the agent has sealed against shrinking (sealed_file.h), so
// no later ftruncate by the client can make an access fault; its contents stay the
// client's to scribble on, so readers copy what they read and check it.
#ifndef FERRY_AGENT_QUEUE_SHARED_RING_H_
#define FERRY_AGENT_QUEUE_SHARED_RING_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "agent/session/session.h"

namespace ferry {

class SharedMapping {
 public:
  // Seals `fd` (a memfd made with MFD_ALLOW_SEALING) against shrinking, checks that it
  // holds at least `bytes` (what `what` needs) and maps that much shared.
  // INVALID_ARGUMENT names `field`.
  static absl::StatusOr<SharedMapping> Map(UniqueFd fd, size_t bytes, absl::string_view field, absl::string_view what);
  SharedMapping() = default;  // maps nothing
  SharedMapping(SharedMapping&& other) noexcept;
  SharedMapping& operator=(SharedMapping&& other) noexcept;
  ~SharedMapping();

  char* data() const { return static_cast<char*>(map_); }
  size_t size() const { return bytes_; }

 private:
  SharedMapping(UniqueFd fd, void* map, size_t bytes) : fd_(std::move(fd)), map_(map), bytes_(bytes) {}
  UniqueFd fd_;
  void* map_ = nullptr;
  size_t bytes_ = 0;
};

// INVALID_ARGUMENT naming `field` unless `fd` is an eventfd; makes it non-blocking.
//
// A doorbell is one open file shared with the client, which can clear O_NONBLOCK on it
// again and empty or fill its count at will; then read(2) or write(2) would block the
// agent thread that serves every pod. So the agent never reads a client's doorbell (the
// queue poller waits on them edge-triggered) and writes one only through RingDoorbell.
absl::Status CheckEventFd(int fd, absl::string_view field);

// Adds 1 to a client's doorbell, without blocking: sets O_NONBLOCK again if the client
// cleared it, and skips the write when the count has no room (the client has a wake-up
// waiting then). Left open: a client that refills the count and clears the flag again
// between those checks and the write (a window of a few hundred nanoseconds) can still
// make the write block; see SECURITY.md.
void RingDoorbell(int fd);

}  // namespace ferry

#endif  // FERRY_AGENT_QUEUE_SHARED_RING_H_
