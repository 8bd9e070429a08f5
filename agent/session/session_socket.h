// SessionSocketServer: accepts session connections, receives fds, and ends sessions
// when their connection closes.
//
//   SessionSocketServer server(&registry, admit);
//   absl::Status s = server.Start("/run/ferry/ferry.session.sock", 0660, group);
//   ...
//   server.Stop();   // closes every connection, which closes every session
//
// One thread waits on the listening socket and every connection (epoll); nothing it
// does blocks (frames are fixed-size, sends are MSG_DONTWAIT).
#ifndef FERRY_AGENT_SESSION_SESSION_SOCKET_H_
#define FERRY_AGENT_SESSION_SESSION_SOCKET_H_

#include <sys/types.h>

#include <functional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "agent/session/session_registry.h"

namespace ferry {

// Makes `path` free for a new listening socket: removes a stale socket file left by a
// crashed agent; refuses when a live agent still listens there, or when the file is not
// a socket.
absl::Status ClaimSocketPath(const std::string& path);
absl::Status SetSocketPermissions(const std::string& path, mode_t mode, gid_t gid);

// Creates a unix socket of `type` bound at `path` with file mode `mode` (and group
// `gid` unless -1), after ClaimSocketPath.
absl::StatusOr<int> ListenUnix(const std::string& path, int type, mode_t mode, gid_t gid);

class SessionSocketServer {
 public:
  // Decides whether a peer may open a session (e.g. a UID allow-list).
  using Admit = std::function<absl::Status(const PeerCredentials&)>;

  SessionSocketServer(SessionRegistry* registry, Admit admit) : registry_(registry), admit_(std::move(admit)) {}
  ~SessionSocketServer() { Stop(); }

  absl::Status Start(const std::string& path, mode_t mode, gid_t gid);
  void Stop();

 private:
  void Loop();
  // A session for the accepted connection `fd` (admitted, created, told its HELLO);
  // on failure the client was told why where it could be, and `fd` is the caller's.
  absl::StatusOr<uint64_t> Open(int fd);

  SessionRegistry* registry_;
  Admit admit_;
  std::string path_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: Stop() wakes the loop
  std::thread thread_;
};

}  // namespace ferry

#endif  // FERRY_AGENT_SESSION_SESSION_SOCKET_H_
