// Inbox: the agent's side of a session's notification inbox (proto/ferry/wire/
// inbox_layout.h): a ring in the client's shared memory, so the client reads its
// notifications by polling memory. The thread that produces a notification (the one
// that saw a write complete, or took a message) writes it into the ring itself, so no
// agent thread wakes on the way; one pump thread for all inboxes (Inboxes) moves those
// that had to wait in the session's queue while a ring was full.
//
//   absl::StatusOr<std::unique_ptr<Inbox>> in =
//       Inbox::Open(session, std::move(ring_fd), std::move(doorbell_fd), /*slots=*/64);
//   inboxes.Add(std::move(*in));   // fed until its session ends or the agent stops
//
// A client that stops reading stalls only its own inbox: while the ring is full the
// pump retries it, and later notifications wait in the session's queue (bounded;
// dropped and counted past its bounds, as for a stream nobody reads).
#ifndef FERRY_AGENT_QUEUE_INBOX_H_
#define FERRY_AGENT_QUEUE_INBOX_H_

#include <cstdint>
#include <functional>
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
  // Maps `ring` (InboxBytes(slots) bytes, sealed; its header initialised and empty) and
  // keeps `doorbell` (a unix stream socket). INVALID_ARGUMENT names the field.
  static absl::StatusOr<std::unique_ptr<Inbox>> Open(std::shared_ptr<Session> session, UniqueFd ring, UniqueFd doorbell,
                                                     uint32_t slots);
  // Detaches from the session's queue.
  ~Inbox();
  Inbox(const Inbox&) = delete;
  Inbox& operator=(const Inbox&) = delete;

  // Becomes the session queue's sink; `on_backlog` runs when a notification has to wait
  // there (the ring was full).
  void Attach(std::function<void()> on_backlog);
  // Moves what waits in the session's queue into the ring, as far as it has room.
  // Returns how many still wait; while any do, the header asks the client to ring the
  // doorbell when it frees slots.
  size_t Drain();
  // The agent's end of the doorbell, readable once the client freed slots and rang; -1
  // once the client closed its end (it rings no more).
  int doorbell() const { return doorbell_closed_ ? -1 : doorbell_.get(); }
  // Reads the rings that arrived (each a byte) so that the next poll sleeps again, or
  // learns that the client closed its end. The pump's alone, like doorbell().
  void TakeRings();
  // The session ended: nothing more will come.
  bool closed() const { return session_->notifications().closed(); }
  uint64_t session_id() const { return session_->id(); }

 private:
  Inbox(std::shared_ptr<Session> session, SharedMapping map, UniqueFd doorbell, uint32_t slots);
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
  bool doorbell_closed_ = false;              // the pump's: TakeRings saw the client's end closed
};

// Every inbox of the agent, and the one thread that feeds those whose ring was full:
// woken when a notification has to wait, it sleeps on the waiting inboxes' doorbells,
// which their clients ring as they free slots, and looks again anyway after 50 us to
// 10 ms (more patiently the longer their clients take: a client that does not ring).
// It sleeps when none waits. So the agent has one such thread however many inboxes
// pods open.
class Inboxes {
 public:
  Inboxes();
  // Stops the pump and frees every inbox.
  ~Inboxes();
  void Add(std::unique_ptr<Inbox> inbox);
  // Frees the inboxes of session `session_id` (ring mapping, doorbell) when the session
  // ends, rather than when another inbox opens.
  void RemoveSession(uint64_t session_id);

 private:
  void Pump();
  void NoteBacklog();

  absl::Mutex mu_;
  std::vector<std::shared_ptr<Inbox>> inboxes_ ABSL_GUARDED_BY(mu_);
  // Never held while calling into an inbox or a queue: NoteBacklog runs under a queue's lock.
  absl::Mutex wake_mu_;
  bool backlog_ ABSL_GUARDED_BY(wake_mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(wake_mu_) = false;
  std::thread pump_;  // last: starts after every member above is initialised
};

}  // namespace ferry

#endif  // FERRY_AGENT_QUEUE_INBOX_H_
