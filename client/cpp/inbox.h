// Inbox: this session's notifications through shared memory, read by polling instead of
// a WatchNotifications stream (proto/ferry/wire/inbox_layout.h).
//
//   absl::StatusOr<std::unique_ptr<ferry::Inbox>> in = ferry::Inbox::Open(*client, /*slots=*/64);
//   std::vector<ferry::v1::Notification> got;
//   (*in)->Poll(&got, /*max=*/16, absl::ZeroDuration());   // what arrived; never blocks
//   (*in)->Poll(&got, 16, absl::Milliseconds(5));          // or waits up to 5 ms for one
//
// One inbox per session, for the session's life; the agent refuses one while a
// WatchNotifications stream is open, and a stream once there is an inbox. Not
// thread-safe: one thread polls.
#ifndef FERRY_CLIENT_CPP_INBOX_H_
#define FERRY_CLIENT_CPP_INBOX_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/cpp/ferry_client.h"
#include "proto/ferry/wire/inbox_layout.h"

namespace ferry {

class Inbox {
 public:
  // `slots`: a power of two in [8, 4096]; unread notifications beyond it wait in the agent.
  static absl::StatusOr<std::unique_ptr<Inbox>> Open(Client& client, uint32_t slots = 64);
  ~Inbox();
  Inbox(const Inbox&) = delete;
  Inbox& operator=(const Inbox&) = delete;

  // Appends up to `max` notifications to `out`, waiting up to `timeout` for the first
  // when there is none. Returns how many it appended. INTERNAL if the agent wrote a slot
  // that does not parse (never expected).
  absl::StatusOr<size_t> Poll(std::vector<v1::Notification>* out, size_t max, absl::Duration timeout);

 private:
  Inbox() = default;
  size_t ready() const;

  int ring_fd_ = -1, doorbell_fd_ = -1;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  uint32_t slots_ = 0;
  inbox::InboxHeader* header_ = nullptr;
  uint32_t head_ = 0;
};

}  // namespace ferry

#endif  // FERRY_CLIENT_CPP_INBOX_H_
