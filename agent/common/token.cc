#include "agent/common/token.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace ferry {
namespace {

void FillRandom(void* out, size_t len) {
  auto* p = static_cast<uint8_t*>(out);
  while (len > 0) {
    ssize_t n = getrandom(p, len, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      abort();  // No entropy source: an impossible state on Linux >= 3.17.
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
}

}  // namespace

Token Token::Random() {
  Token t;
  FillRandom(t.bytes_.data(), kSize);
  return t;
}

absl::StatusOr<Token> Token::FromBytes(absl::string_view bytes, absl::string_view field) {
  if (bytes.size() != kSize) {
    return absl::InvalidArgumentError(absl::StrCat(field, " must be exactly ", kSize, " bytes, got ", bytes.size()));
  }
  Token t;
  for (size_t i = 0; i < kSize; ++i) t.bytes_[i] = static_cast<uint8_t>(bytes[i]);
  return t;
}

absl::StatusOr<Token> Token::FromHex(absl::string_view hex, absl::string_view field) {
  if (hex.size() != 2 * kSize) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " must be ", 2 * kSize, " hex digits, got ", hex.size(), " characters"));
  }
  for (char c : hex) {
    bool ok = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
    if (!ok) return absl::InvalidArgumentError(absl::StrCat(field, " must be hex digits"));
  }
  return FromBytes(absl::HexStringToBytes(hex), field);
}

std::string Token::Hex() const {
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(bytes_.data()), kSize));
}

bool Token::Equals(const Token& other) const {
  uint8_t diff = 0;
  for (size_t i = 0; i < kSize; ++i) diff |= bytes_[i] ^ other.bytes_[i];
  return diff == 0;
}

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  uint8_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<uint8_t>(a[i] ^ b[i]);
  return diff == 0;
}

uint64_t RandomU64() {
  uint64_t v = 0;
  while (v == 0) FillRandom(&v, sizeof(v));
  return v;
}

}  // namespace ferry
