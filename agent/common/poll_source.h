// PollSource: work that another thread's polling loop runs between its own polls.
//
// The shared-memory transfer queues are served this way by the first NIC worker: the
// thread that posts the writes also takes the submissions, so a queued write reaches
// the NIC without waking a second thread (tools/bench/RESULTS.md has the figures).
//
//   for (;;) {                                // the driver's loop
//     bool busy = source->Poll() | own_work();
//     if (busy) continue;
//     if (source->PrepareToSleep()) poll({own_fd, source->wait_fd()}, timeout);
//     source->Woke();
//   }
//
// Every method is called from the driving thread only.
#ifndef FERRY_AGENT_COMMON_POLL_SOURCE_H_
#define FERRY_AGENT_COMMON_POLL_SOURCE_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ferry {

class PollSource {
 public:
  virtual ~PollSource() = default;
  // Takes and handles what is ready, without blocking; true if there was anything.
  virtual bool Poll() = 0;
  // The driver is about to block: producers must wake it from now on. False if work
  // arrived meanwhile (then the driver must not block). Woke() follows either way.
  virtual bool PrepareToSleep() = 0;
  virtual void Woke() = 0;
  // Readable (POLLIN) while there may be work.
  virtual int wait_fd() const = 0;
};

// Status payload: the operation would have had to wait on the network (a handshake, a
// region lookup on another agent) and the caller asked it not to. Retry where blocking
// is allowed.
inline constexpr char kWouldBlockPayload[] = "ferry.dev/would-block";

inline absl::Status WouldBlockError(absl::string_view message) {
  absl::Status s = absl::UnavailableError(message);
  s.SetPayload(kWouldBlockPayload, absl::Cord());
  return s;
}

inline bool IsWouldBlock(const absl::Status& s) { return s.GetPayload(kWouldBlockPayload).has_value(); }

}  // namespace ferry

#endif  // FERRY_AGENT_COMMON_POLL_SOURCE_H_
