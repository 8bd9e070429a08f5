#include "agent/common/grpc_status.h"

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

}  // namespace
}  // namespace ferry
