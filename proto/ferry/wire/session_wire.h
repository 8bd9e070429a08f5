// The session socket's wire format, shared by the agent and the clients.
//
// A SOCK_SEQPACKET unix socket; every message is one 32-byte frame, little-endian:
//   u32 magic ("FRY1" = 0x31595246), u32 type, u64 a, u64 b, u64 c.
//
//   agent -> client, once after accept:   HELLO     a = session id, b|c = 16-byte token
//     or, instead, when it will not open a session for this client:
//                                          REFUSED   a = absl::StatusCode, b = n, c = 0,
//                                                   then n (<= 480) bytes of the reason
//                                                   (UTF-8) in the same packet; then closes
//   client -> agent, with one SCM_RIGHTS fd: ADD_FD  a = request id (client's choice)
//   agent -> client:                       FD_ADDED  a = request id, b = fd handle (0 on
//                                                   failure), c = errno-style reason:
//                                                   EMFILE: the session holds
//                                                   --max_pending_fds unused fds; ENFILE:
//                                                   the agent is out of fds (try again)
//
// Anything else (bad magic, unknown type, an ADD_FD without exactly one fd) ends the
// session. The session ends when either side closes the connection.
#ifndef FERRY_PROTO_FERRY_WIRE_SESSION_WIRE_H_
#define FERRY_PROTO_FERRY_WIRE_SESSION_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace ferry {

constexpr uint32_t kSessionMagic = 0x31595246;  // "FRY1"

enum class SessionFrameType : uint32_t {
  kHello = 1,
  kAddFd = 2,
  kFdAdded = 3,
  kRefused = 4,
};
constexpr size_t kMaxRefusalBytes = 480;

struct SessionFrame {
  uint32_t magic;
  uint32_t type;
  uint64_t a;
  uint64_t b;
  uint64_t c;
};
static_assert(sizeof(SessionFrame) == 32, "wire frame is 32 bytes");

// Derives the session socket path from the gRPC socket path:
// "/run/ferry/ferry.sock" -> "/run/ferry/ferry.session.sock".
std::string SessionSocketPath(const std::string& grpc_socket);

}  // namespace ferry

#endif  // FERRY_PROTO_FERRY_WIRE_SESSION_WIRE_H_
