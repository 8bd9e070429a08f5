// Shared memory and doorbells a client hands the agent (write-queue rings, notification
// inboxes), checked before the agent trusts them with anything.
//
//   absl::StatusOr<SharedMapping> m = SharedMapping::Map(std::move(ring_fd), bytes, "ring_fd", "a queue of 64");
//   if (absl::Status s = CheckEventFd(submit.get(), "submit_doorbell_fd"); !s.ok()) return s;  // the client rings
//   if (absl::Status s = CheckDoorbellSocket(done.get(), "complete_doorbell_fd"); !s.ok()) return s;  // we ring
//   RingDoorbell(done.get());
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

// A doorbell is one open file shared with the client, which can clear O_NONBLOCK on it
// at will and fill or empty whatever it holds; a read(2) or write(2) of it could then
// block the agent thread that serves every pod. So the agent never reads or writes a
// client's doorbell through the file's own flags:
//  - the client rings the agent (a queue's submissions) on an eventfd, which the agent
//    only waits on, edge-triggered (agent/queue/queue_poller.cc), never reads;
//  - the agent rings the client (completions, notifications) on a unix stream socket,
//    one end of the client's socketpair, with send(MSG_DONTWAIT): non-blocking per call,
//    whatever the flags of the shared file say, and no SIGPIPE once the client is gone.

// INVALID_ARGUMENT naming `field` unless `fd` is an eventfd; makes it non-blocking.
absl::Status CheckEventFd(int fd, absl::string_view field);

// INVALID_ARGUMENT naming `field` unless `fd` is a unix stream socket (the end of a
// socketpair that the agent rings).
absl::Status CheckDoorbellSocket(int fd, absl::string_view field);

// Rings a doorbell that CheckDoorbellSocket accepted: one byte, never blocking. A full
// socket buffer means the client has wake-ups waiting already; a closed peer, that
// nobody waits: either way nothing more to do.
void RingDoorbell(int fd);

}  // namespace ferry

#endif  // FERRY_AGENT_QUEUE_SHARED_RING_H_
