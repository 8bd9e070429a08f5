#include "proto/ferry/wire/session_wire.h"

namespace ferry {

std::string SessionSocketPath(const std::string& grpc_socket) {
  constexpr char kSuffix[] = ".sock";
  constexpr size_t kLen = sizeof(kSuffix) - 1;
  std::string base = grpc_socket;
  if (base.size() >= kLen && base.compare(base.size() - kLen, kLen, kSuffix) == 0) base.resize(base.size() - kLen);
  return base + ".session.sock";
}

}  // namespace ferry
