// Token: a 128-bit random capability.
//
//   Token t = Token::Random();
//   std::string wire = t.bytes();                  // 16 bytes, for protos
//   absl::StatusOr<Token> back = Token::FromBytes(wire, "dst.token");
//   if (back.ok() && back->Equals(t)) { ... }      // constant-time comparison
//
// Tokens are secrets: never log them, never use them as metric labels. Hex() exists for
// the session metadata header only.
#ifndef FERRY_AGENT_COMMON_TOKEN_H_
#define FERRY_AGENT_COMMON_TOKEN_H_

#include <array>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ferry {

class Token {
 public:
  static constexpr size_t kSize = 16;

  Token() { bytes_.fill(0); }

  // 128 bits from the kernel's CSPRNG (getrandom).
  static Token Random();
  // Parses exactly kSize bytes; `field` names the request field in the error message.
  static absl::StatusOr<Token> FromBytes(absl::string_view bytes, absl::string_view field);
  // Parses exactly 2 * kSize lowercase or uppercase hex digits.
  static absl::StatusOr<Token> FromHex(absl::string_view hex, absl::string_view field);

  std::string bytes() const { return std::string(bytes_.begin(), bytes_.end()); }
  std::string Hex() const;
  const std::array<uint8_t, kSize>& raw() const { return bytes_; }

  // Constant time in the token contents.
  bool Equals(const Token& other) const;

 private:
  std::array<uint8_t, kSize> bytes_;
};

// Constant-time equality of two byte strings of the same length (false otherwise).
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

// Random nonzero 64-bit value from the kernel's CSPRNG (agent incarnations, ids).
uint64_t RandomU64();

}  // namespace ferry

#endif  // FERRY_AGENT_COMMON_TOKEN_H_
