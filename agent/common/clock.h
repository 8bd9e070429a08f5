// Clock: where the agent reads the time when it decides a deadline, so that a unit test
// can decide what "now" is.
//
//   const Clock* clock = Clock::Real();   // absl::Now()
//   t.deadline = clock->Now() + timeout;
//
// ManualClock (tests) stands still at the time it was given.
#ifndef FERRY_AGENT_COMMON_CLOCK_H_
#define FERRY_AGENT_COMMON_CLOCK_H_

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
  absl::Time Now() const override { return now_; }

 private:
  const absl::Time now_;
};

}  // namespace ferry

#endif  // FERRY_AGENT_COMMON_CLOCK_H_
