// The client side of the doorbells the agent rings (a write queue's completions, an
// inbox's notifications), shared by WriteQueue and Inbox:
//
//   int ours, agents;
//   if (absl::Status s = MakeDoorbell(&ours, &agents); !s.ok()) return s;
//   client.SendFd(agents); close(agents);   // the agent rings it with send(MSG_DONTWAIT)
//   ...
//   SleepOnDoorbell(ours, deadline);        // after announcing the wait and looking again
//
// A doorbell is a unix stream socketpair, not an eventfd: the agent's end is one open
// file with ours, and a socket is the one kind of file the agent can write without
// blocking whatever its flags say (agent/queue/shared_ring.h).
#ifndef FERRY_CLIENT_CPP_DOORBELL_H_
#define FERRY_CLIENT_CPP_DOORBELL_H_

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ferry {

// A non-blocking socketpair: `*ours` to wait on, `*agents` to send to the agent.
inline absl::Status MakeDoorbell(int* ours, int* agents) {
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds) != 0) {
    return absl::InternalError(absl::StrCat("creating a doorbell (socketpair): ", strerror(errno)));
  }
  *ours = fds[0];
  *agents = fds[1];
  return absl::OkStatus();
}

// Sleeps until `fd` rings or `deadline` passes (at most a second), then clears it. The
// caller has announced the wait and looked once more, so no ring is missed.
inline void SleepOnDoorbell(int fd, absl::Time deadline) {
  const int64_t left_ms = std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now()));
  pollfd p{fd, POLLIN, 0};
  poll(&p, 1, static_cast<int>(std::min<int64_t>(left_ms + 1, 1000)));
  char rings[256];
  ssize_t ignored = recv(fd, rings, sizeof(rings), MSG_DONTWAIT);  // each ring is a byte
  (void)ignored;
}

}  // namespace ferry

#endif  // FERRY_CLIENT_CPP_DOORBELL_H_
