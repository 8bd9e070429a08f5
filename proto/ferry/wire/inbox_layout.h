// The notification inbox: a session's notifications through shared memory instead of a
// WatchNotifications stream, for a client that polls (a serving engine's step loop)
// and should not pay a gRPC read and a thread wake-up per notification.
//
//   Client                                    Agent (the thread with the notification)
//   OpenInbox(ring memfd, doorbell)  ──────►  takes each notification of the session, and
//                                             writes it at slots[tail % n]: a uint32
//                                             length, then a ferry.v1.Notification
//   reads slots[head % n]            ◄──────  tail.store(tail + 1)
//   head.store(head + 1)                      (doorbell only if client_waiting)
//   (doorbell only if agent_waiting) ──────►  a full ring's waiting notifications move in
//
// The memory is the client's (a sealed memfd), so the agent trusts none of it: it keeps
// its own tail, reads the client's head only to know how many slots are free, and waits
// (holding the session's later notifications in its queue) while the ring is full.
// Cursors are free-running uint32 counters, one writer each, on their own cache lines.
#ifndef FERRY_PROTO_FERRY_WIRE_INBOX_LAYOUT_H_
#define FERRY_PROTO_FERRY_WIRE_INBOX_LAYOUT_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "proto/ferry/wire/ring_layout.h"

namespace ferry::inbox {

inline constexpr uint32_t kInboxMagic = 0x31494246;  // "FBI1"
inline constexpr uint32_t kMinSlots = 8;
inline constexpr uint32_t kMaxSlots = 4096;
// A slot: the uint32 length of the serialized Notification, then its bytes. A
// notification's payload is at most 4 KiB; the agent shortens its error message, never
// the payload, to make it fit.
inline constexpr size_t kSlotBytes = 8192;

using Cursor = queue::Cursor;  // one writer each, on its own cache line

struct InboxHeader {
  uint32_t magic;  // kInboxMagic, written by the client before OpenInbox
  uint32_t slots;  // power of two in [kMinSlots, kMaxSlots]
  // agent: 1 while notifications wait for free slots. A client that frees slots (moves
  // head) while it reads 1 writes a byte to the doorbell, so that they move in at once;
  // one that does not (from before this field) has them moved in at the agent's next
  // look, within 10 ms.
  std::atomic<uint32_t> agent_waiting;
  Cursor tail;            // agent: notifications written
  Cursor head;            // client: notifications read (their slots may be reused)
  Cursor client_waiting;  // client: 1 while blocked on the doorbell, else 0
};

inline constexpr size_t kSlotsOffset = 256;
static_assert(sizeof(InboxHeader) <= kSlotsOffset, "ABI");
inline size_t InboxBytes(uint32_t slots) { return kSlotsOffset + size_t{slots} * kSlotBytes; }
inline bool ValidSlots(uint32_t n) { return n >= kMinSlots && n <= kMaxSlots && (n & (n - 1)) == 0; }

}  // namespace ferry::inbox

#endif  // FERRY_PROTO_FERRY_WIRE_INBOX_LAYOUT_H_
