// Conversion between absl::Status (used everywhere inside the agent) and grpc::Status
// (used only at the API edge).
#ifndef FERRY_AGENT_COMMON_GRPC_STATUS_H_
#define FERRY_AGENT_COMMON_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace ferry {

inline grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

inline absl::Status FromGrpcStatus(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

}  // namespace ferry

#endif  // FERRY_AGENT_COMMON_GRPC_STATUS_H_
