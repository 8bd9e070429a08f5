// Inbox: the agent's side of a session's notification inbox (proto/ferry/wire/
// inbox_layout.h): a ring in the client's shared memory, so the client reads its
// notifications by polling memory. The thread that produces a notification (the one
// that saw a write complete, or took a message) writes it into the ring itself, so no
// agent thread wakes on the way; a pump thread moves those that had to wait in the
// session's queue while the ring was full.
//
//   absl::StatusOr<std::unique_ptr<Inbox>> in =
//       Inbox::Open(session, std::move(ring_fd), std::move(doorbell_fd), /*slots=*/64);
//   inboxes.Add(std::move(*in));   // pumps until the session ends or the agent stops
//
// A client that stops reading stalls only its own inbox: while the ring is full the
// pump waits, and later notifications wait in the session's queue (bounded; dropped and
// counted past its capacity, as for a stream nobody reads).
#ifndef FERRY_AGENT_QUEUE_INBOX_H_
#define FERRY_AGENT_QUEUE_INBOX_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "agent/queue/shared_ring.h"
#include "agent/session/session.h"
#include "proto/ferry/v1/ferry.pb.h"
#include "proto/ferry/wire/inbox_layout.h"

namespace ferry {

class Inbox {
 public:
  // Maps `ring` (InboxBytes(slots) bytes, sealed; its header initialised and empty),
  // keeps `doorbell` (a unix stream socket) and starts the pump. INVALID_ARGUMENT names the field.
  static absl::StatusOr<std::unique_ptr<Inbox>> Open(std::shared_ptr<Session> session, UniqueFd ring, UniqueFd doorbell,
                                                     uint32_t slots);
  // Detaches from the session's queue, stops the pump and joins it.
  ~Inbox();
  Inbox(const Inbox&) = delete;
  Inbox& operator=(const Inbox&) = delete;

  // Asks the pump to stop; it does within ~200 ms.
  void Stop() { stopping_.store(true); }
  // The pump has exited (its session ended, or Stop).
  bool done() const { return done_.load(); }
  uint64_t session_id() const { return session_->id(); }

 private:
  Inbox(std::shared_ptr<Session> session, SharedMapping map, UniqueFd doorbell, uint32_t slots);
  void Pump();
  // Writes `n` into the next slot; false while the ring is full. The session queue's
  // sink: called under its lock, by any thread.
  bool Write(const v1::Notification& n) ABSL_LOCKS_EXCLUDED(write_mu_);

  const std::shared_ptr<Session> session_;
  const SharedMapping map_;
  const UniqueFd doorbell_;
  const uint32_t slots_;
  inbox::InboxHeader* const header_;
  absl::Mutex write_mu_;
  uint32_t tail_ ABSL_GUARDED_BY(write_mu_);  // our own count of notifications written
  std::atomic<bool> stopping_{false};
  std::atomic<bool> done_{false};
  std::thread pump_;  // last: starts after every member above is initialised
};

// Every inbox of the agent: keeps them pumping, lets go of those whose session ended.
class Inboxes {
 public:
  // Stops every pump, then joins them (all within ~200 ms).
  ~Inboxes();
  void Add(std::unique_ptr<Inbox> inbox);
  // Stops and frees the inboxes of session `session_id` (its ring's mapping, doorbell and
  // pump thread) when the session ends, rather than when another inbox opens.
  void RemoveSession(uint64_t session_id);

 private:
  absl::Mutex mu_;
  std::vector<std::unique_ptr<Inbox>> inboxes_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry

#endif  // FERRY_AGENT_QUEUE_INBOX_H_
