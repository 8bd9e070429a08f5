// Conversion between absl::Status (used everywhere inside the agent and the C++ client)
// and grpc::Status (used only at the API edge: the agent's replies, other agents' answers
// to its peer API, the agent's answers to a client).
//
//   return ToGrpcStatus(status);                                      // a handler's reply
//   return FromGrpcStatus(rpc, absl::StrCat("agent ", address, ": "));  // a peer's answer
//
// The code and message cross as they are; the agent's own payloads (type URLs starting
// with kFerryPayloadPrefix, e.g. WindowModeError's) cross in the error's details, so an
// agent (or a client) can test a refusal by type. Other payloads stay behind.
#ifndef FERRY_PROTO_FERRY_V1_GRPC_STATUS_H_
#define FERRY_PROTO_FERRY_V1_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ferry {

inline constexpr char kFerryPayloadPrefix[] = "ferry.dev/";

grpc::Status ToGrpcStatus(const absl::Status& s);

// The same code (gRPC's and absl's codes are one list), `prefix` before the message.
absl::Status FromGrpcStatus(const grpc::Status& s, absl::string_view prefix = "");

}  // namespace ferry

#endif  // FERRY_PROTO_FERRY_V1_GRPC_STATUS_H_
