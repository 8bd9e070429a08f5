// Clock: where the agent reads the time when it decides a deadline, so that a unit test
// can decide what "now" is.
//
//   const Clock* clock = Clock::Real();   // absl::Now()
//   t.deadline = clock->Now() + timeout;
//
// ManualClock (tests) stands still until told to move.
#ifndef FERRY_AGENT_COMMON_CLOCK_H_
#define FERRY_AGENT_COMMON_CLOCK_H_

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ferry {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
  // The process's clock (absl::Now); lives forever.
  static const Clock* Real();
};

class ManualClock : public Clock {
 public:
  explicit ManualClock(absl::Time now) : now_(now) {}
  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry

#endif  // FERRY_AGENT_COMMON_CLOCK_H_
