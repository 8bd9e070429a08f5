// Assertions for invariants the code relies on, never for input: untrusted input (a
// request, a peer's message, a pod's queue) gets a status, not these.
//
//   FERRY_CHECK(device < device_count) << "transfer " << id;  // always: an impossible
//                                                             // state ends the agent
//   FERRY_DCHECK(remaining > 0) << "an op completed twice";   // debug builds only (the
//       // asan / ubsan / tsan configurations); in -c opt the condition is not evaluated
//
// A failed check logs the condition, the file and line and the streamed message at
// ERROR, then aborts: a core dump beats running on with a broken invariant.
#ifndef FERRY_AGENT_COMMON_CHECK_H_
#define FERRY_AGENT_COMMON_CHECK_H_

#include <sstream>

#include "absl/base/optimization.h"
#include "agent/common/log.h"

namespace ferry {

// The failure path of FERRY_CHECK: collects the message, logs it and aborts.
class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* condition);
  [[noreturn]] ~CheckFailure();
  std::ostream& stream() { return message_; }

 private:
  const char* file_;
  int line_;
  std::ostringstream message_;
};

}  // namespace ferry

#define FERRY_CHECK(condition)        \
  if (ABSL_PREDICT_TRUE(condition)) { \
  } else                              \
    ::ferry::CheckFailure(__FILE__, __LINE__, #condition).stream()

#ifdef NDEBUG
#define FERRY_DCHECK(condition) FERRY_CHECK(true || (condition))
#else
#define FERRY_DCHECK(condition) FERRY_CHECK(condition)
#endif

#endif  // FERRY_AGENT_COMMON_CHECK_H_
