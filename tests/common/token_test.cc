#include "agent/common/token.h"

#include <catch2/catch.hpp>

namespace ferry {
namespace {

TEST_CASE("tokens round-trip through bytes and hex and compare by value") {
  Token a = Token::Random();
  Token b = Token::Random();
  CHECK(!a.Equals(b));
  auto from_bytes = Token::FromBytes(a.bytes(), "t");
  REQUIRE(from_bytes.ok());
  CHECK(from_bytes->Equals(a));
  auto from_hex = Token::FromHex(a.Hex(), "t");
  REQUIRE(from_hex.ok());
  CHECK(from_hex->Equals(a));
  CHECK(a.Hex().size() == 32);
}

TEST_CASE("malformed tokens are rejected with the field's name") {
  auto s = Token::FromBytes("short", "dst.token").status();
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(s.message()).find("dst.token") != std::string::npos);
  CHECK(!Token::FromHex(std::string(32, 'g'), "t").ok());
  CHECK(!Token::FromHex(std::string(31, 'a'), "t").ok());
  CHECK(ConstantTimeEquals("abc", "abc"));
  CHECK(!ConstantTimeEquals("abc", "abd"));
  CHECK(!ConstantTimeEquals("abc", "abcd"));
}

}  // namespace
}  // namespace ferry
