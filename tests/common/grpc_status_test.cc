#include "proto/ferry/v1/grpc_status.h"

#include <catch2/catch.hpp>

namespace ferry {
namespace {

TEST_CASE("A status crosses the gRPC edge with its code and message, a peer's answer with the caller's prefix") {
  CHECK(ToGrpcStatus(absl::OkStatus()).ok());
  const grpc::Status out = ToGrpcStatus(absl::ResourceExhaustedError("--max_sessions"));
  CHECK(out.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK(out.error_message() == "--max_sessions");

  CHECK(FromGrpcStatus(grpc::Status::OK, "ignored: ").ok());
  const absl::Status in = FromGrpcStatus(grpc::Status(grpc::StatusCode::NOT_FOUND, "region 7"), "agent b: ");
  CHECK(absl::IsNotFound(in));
  CHECK(in.message() == "agent b: region 7");
  CHECK(FromGrpcStatus(out).message() == "--max_sessions");
}

TEST_CASE("The agent's own payloads cross with the error; others stay behind") {
  absl::Status s = absl::FailedPreconditionError("region 3 takes writes only through windows");
  s.SetPayload("ferry.dev/window-mode", absl::Cord());
  s.SetPayload("ferry.dev/detail", absl::Cord("bytes\0kept"));
  s.SetPayload("type.googleapis.com/other", absl::Cord("x"));
  const grpc::Status wire = ToGrpcStatus(s);
  CHECK(!wire.error_details().empty());
  const absl::Status back = FromGrpcStatus(wire, "agent b: ");
  CHECK(absl::IsFailedPrecondition(back));
  CHECK(back.message() == "agent b: region 3 takes writes only through windows");
  CHECK(back.GetPayload("ferry.dev/window-mode").has_value());
  CHECK(back.GetPayload("ferry.dev/detail") == absl::Cord("bytes\0kept"));
  CHECK(!back.GetPayload("type.googleapis.com/other").has_value());
  // Without payloads of ours, no details; details that do not parse are ignored.
  CHECK(ToGrpcStatus(absl::InternalError("x")).error_details().empty());
  CHECK(FromGrpcStatus(grpc::Status(grpc::StatusCode::INTERNAL, "x", "\xff\xff")).message() == "x");
}

}  // namespace
}  // namespace ferry
