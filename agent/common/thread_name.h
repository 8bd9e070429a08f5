// NameThisThread: the name `top -H`, `perf` and `gdb` show for one of the agent's threads.
//
//   worker_ = std::thread([this] {
//     NameThisThread("ferry-nic");
//     Loop();
//   });
//
// Linux keeps 15 bytes of a thread's name: a longer one is cut there. Without a name a
// thread keeps its creator's: the GPU lanes, started from a gRPC handler, showed up in a
// profile as "grpcpp_sync_ser", which is what gRPC calls its own threads.
#ifndef FERRY_AGENT_COMMON_THREAD_NAME_H_
#define FERRY_AGENT_COMMON_THREAD_NAME_H_

#include <sys/prctl.h>

#include "absl/strings/string_view.h"

namespace ferry {

inline void NameThisThread(absl::string_view name) {
  char cut[16] = {};
  name.copy(cut, sizeof(cut) - 1);
  prctl(PR_SET_NAME, cut);
}

}  // namespace ferry

#endif  // FERRY_AGENT_COMMON_THREAD_NAME_H_
