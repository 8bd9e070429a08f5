// SleepOnDoorbell: the client side's wait on an eventfd the agent rings (a write queue's
// completions, an inbox's notifications), shared by WriteQueue and Inbox.
#ifndef FERRY_CLIENT_CPP_DOORBELL_H_
#define FERRY_CLIENT_CPP_DOORBELL_H_

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ferry {

// Sleeps until `fd` rings or `deadline` passes (at most a second), then clears it. The
// caller has announced the wait and looked once more, so no ring is missed.
inline void SleepOnDoorbell(int fd, absl::Time deadline) {
  const int64_t left_ms = std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now()));
  pollfd p{fd, POLLIN, 0};
  poll(&p, 1, static_cast<int>(std::min<int64_t>(left_ms + 1, 1000)));
  uint64_t v;
  ssize_t ignored = read(fd, &v, sizeof(v));  // non-blocking
  (void)ignored;
}

}  // namespace ferry

#endif  // FERRY_CLIENT_CPP_DOORBELL_H_
