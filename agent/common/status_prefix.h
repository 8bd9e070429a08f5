// WithPrefix: a status with words put before its message — its code and every payload
// kept. Rebuilding it as absl::Status(s.code(), prefix + s.message()) would drop the
// payloads the agent tests for (kWouldBlockPayload, kConnectionResetPayload).
//
//   absl::StatusOr<UniqueFd> fd = session.TakeFd(handle);
//   if (!fd.ok()) return WithPrefix(fd.status(), "host.");   // "host.fd_handle 7 ..."
#ifndef FERRY_AGENT_COMMON_STATUS_PREFIX_H_
#define FERRY_AGENT_COMMON_STATUS_PREFIX_H_

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace ferry {

// `s` unchanged when OK.
inline absl::Status WithPrefix(const absl::Status& s, absl::string_view prefix) {
  if (s.ok()) return s;
  absl::Status out(s.code(), absl::StrCat(prefix, s.message()));
  s.ForEachPayload([&out](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  return out;
}

}  // namespace ferry

#endif  // FERRY_AGENT_COMMON_STATUS_PREFIX_H_
