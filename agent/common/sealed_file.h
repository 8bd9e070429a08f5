// SealAgainstShrinking: makes a pod's shared-memory file safe for the agent to map.
//
//   if (absl::Status s = SealAgainstShrinking(fd, "host.fd_handle"); !s.ok()) return s;
//   fstat(fd, &st);   // the size read after this can only grow
//
// The agent maps memory a pod hands it (host regions, write-queue rings). If the pod
// could shrink the file afterwards, the agent's next access to the lost pages would
// fault (SIGBUS) and every pod on the node would lose its agent. F_SEAL_SHRINK, added
// here and never removed, rules that out; it needs a memfd created with
// MFD_ALLOW_SEALING (a /dev/shm file cannot be sealed). The file may still grow.
#ifndef FERRY_AGENT_COMMON_SEALED_FILE_H_
#define FERRY_AGENT_COMMON_SEALED_FILE_H_

#include <fcntl.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace ferry {

// INVALID_ARGUMENT naming `field` when `fd` cannot be sealed (already sealed is fine).
inline absl::Status SealAgainstShrinking(int fd, absl::string_view field) {
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) == 0) return absl::OkStatus();
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals >= 0 && (seals & F_SEAL_SHRINK) != 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field,
                   ": the fd cannot be sealed against shrinking; create it with memfd_create(..., MFD_ALLOW_SEALING) "
                   "(the agent adds F_SEAL_SHRINK: the memory may grow, never shrink)"));
}

}  // namespace ferry

#endif  // FERRY_AGENT_COMMON_SEALED_FILE_H_
