#include "agent/common/status_prefix.h"

#include <catch2/catch.hpp>

#include "agent/common/poll_source.h"

namespace ferry {
namespace {

TEST_CASE("WithPrefix puts words before the message and keeps the code and every payload") {
  absl::Status would_block = WouldBlockError("a peer to handshake with");
  would_block.SetPayload("ferry.dev/other", absl::Cord("x"));
  absl::Status s = WithPrefix(would_block, "parts[3]: ");
  CHECK(s.code() == would_block.code());
  CHECK(s.message() == "parts[3]: a peer to handshake with");
  CHECK(IsWouldBlock(s));
  CHECK(s.GetPayload("ferry.dev/other") == absl::Cord("x"));
  CHECK(WithPrefix(absl::OkStatus(), "x: ").ok());
}

}  // namespace
}  // namespace ferry
