// Linux cpulist strings ("0-3,8-11", as in sysfs and /proc/<pid>/status).
//
//   absl::StatusOr<std::vector<int>> cpus = ParseCpuList("0-3,8");   // {0,1,2,3,8}
//   std::string s = FormatCpuList({0, 1, 2, 3, 8});                   // "0-3,8"
#ifndef FERRY_AGENT_TOPOLOGY_CPU_LIST_H_
#define FERRY_AGENT_TOPOLOGY_CPU_LIST_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ferry {

// Sorted, without duplicates. An empty string is an empty set. Refuses malformed ranges
// and CPUs past 65535 (sysfs is trusted, but a fake tree in a test may not be right).
absl::StatusOr<std::vector<int>> ParseCpuList(absl::string_view list);
// The inverse: ranges of consecutive CPUs joined by commas.
std::string FormatCpuList(const std::vector<int>& cpus);

// The CPUs a process may run on (Cpus_allowed_list in /proc/<pid>/status; pid 0 is this
// process). Empty when unknown: the process is gone, or lives in a PID namespace this
// one cannot see (SO_PEERCRED then reports pid 0).
std::vector<int> ProcessCpus(pid_t pid);

}  // namespace ferry

#endif  // FERRY_AGENT_TOPOLOGY_CPU_LIST_H_
