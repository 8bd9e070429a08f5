// Conversion between absl::Status (used everywhere inside the agent) and grpc::Status
// (used only at the API edge, and for the answers of other agents' peer API).
//
//   return ToGrpcStatus(status);                                      // a handler's reply
//   return FromGrpcStatus(rpc, absl::StrCat("agent ", address, ": "));  // a peer's answer
//
// The code and message cross as they are; the agent's own payloads (type URLs starting
// with kFerryPayloadPrefix, e.g. WindowModeError's) cross in the error's details, so an
// agent can test another agent's refusal by type. Other payloads stay behind.
#ifndef FERRY_AGENT_COMMON_GRPC_STATUS_H_
#define FERRY_AGENT_COMMON_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ferry {

inline constexpr char kFerryPayloadPrefix[] = "ferry.dev/";

grpc::Status ToGrpcStatus(const absl::Status& s);

// The same code (gRPC's and absl's codes are one list), `prefix` before the message.
absl::Status FromGrpcStatus(const grpc::Status& s, absl::string_view prefix = "");

}  // namespace ferry

#endif  // FERRY_AGENT_COMMON_GRPC_STATUS_H_
