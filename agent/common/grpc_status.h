// Conversion between absl::Status (used everywhere inside the agent) and grpc::Status
// (used only at the API edge, and for the answers of other agents' peer API).
//
//   return ToGrpcStatus(status);                                      // a handler's reply
//   return FromGrpcStatus(rpc, absl::StrCat("agent ", address, ": "));  // a peer's answer
#ifndef FERRY_AGENT_COMMON_GRPC_STATUS_H_
#define FERRY_AGENT_COMMON_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace ferry {

inline grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

// The same code (gRPC's and absl's codes are one list), `prefix` before the message.
inline absl::Status FromGrpcStatus(const grpc::Status& s, absl::string_view prefix = "") {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), absl::StrCat(prefix, s.error_message()));
}

}  // namespace ferry

#endif  // FERRY_AGENT_COMMON_GRPC_STATUS_H_
