#include "agent/session/session_socket.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "agent/common/log.h"
#include "agent/common/status_macros.h"
#include "agent/common/thread_name.h"
#include "proto/ferry/wire/session_wire.h"

namespace ferry {

absl::Status ClaimSocketPath(const std::string& path) {
  sockaddr_un addr{};
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("socket path '", path, "' must be 1..", sizeof(addr.sun_path) - 1, " characters"));
  }
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) return absl::OkStatus();
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(path, " exists and is not a socket; refusing to replace it"));
  }
  // A socket file: a live agent, or the leftover of a crash?
  addr.sun_family = AF_UNIX;
  memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  bool live = false;
  for (int type : {SOCK_STREAM, SOCK_SEQPACKET}) {
    int probe = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
    if (probe < 0) continue;
    live = live || connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    close(probe);
  }
  if (live)
    return absl::FailedPreconditionError(absl::StrCat("another agent is listening on ", path, "; stop it first"));
  unlink(path.c_str());
  return absl::OkStatus();
}

absl::Status SetSocketPermissions(const std::string& path, mode_t mode, gid_t gid) {
  if (chmod(path.c_str(), mode) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("cannot set the mode of ", path, ": ", strerror(errno)));
  }
  if (gid == static_cast<gid_t>(-1) || chown(path.c_str(), static_cast<uid_t>(-1), gid) == 0) return absl::OkStatus();
  if (errno == EPERM) {
    // The usual cause in a container: capabilities dropped to IPC_LOCK (no CHOWN) and the
    // group not among the process's own.
    return absl::FailedPreconditionError(absl::StrCat(
        "--socket_group=", gid, ": cannot give ", path, " to group ", gid,
        " (EPERM): the agent is not in that group and lacks CAP_CHOWN. Run it with ", gid,
        " as a supplemental group (Kubernetes: the pod's securityContext.supplementalGroups, which the ferry chart "
        "sets from socketGroup), or leave --socket_group empty"));
  }
  return absl::FailedPreconditionError(absl::StrCat("cannot set the group of ", path, ": ", strerror(errno)));
}

absl::StatusOr<int> ListenUnix(const std::string& path, int type, mode_t mode, gid_t gid) {
  FERRY_RETURN_IF_ERROR(ClaimSocketPath(path));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  int fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket(): ", strerror(errno)));
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 128) != 0) {
    int err = errno;
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat("cannot listen on ", path, ": ", strerror(err)));
  }
  absl::Status perms = SetSocketPermissions(path, mode, gid);
  if (!perms.ok()) {
    close(fd);
    return perms;
  }
  return fd;
}

absl::Status SessionSocketServer::Start(const std::string& path, mode_t mode, gid_t gid) {
  FERRY_ASSIGN_OR_RETURN(int fd, ListenUnix(path, SOCK_SEQPACKET, mode, gid));
  listen_fd_ = fd;
  path_ = path;
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) return absl::InternalError(absl::StrCat("eventfd: ", strerror(errno)));
  thread_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

void SessionSocketServer::Stop() {
  if (!thread_.joinable()) return;
  uint64_t one = 1;
  ssize_t ignored = write(wake_fd_, &one, sizeof(one));
  (void)ignored;
  thread_.join();
  close(listen_fd_);
  close(wake_fd_);
  unlink(path_.c_str());
}

namespace {

struct Connection {
  int fd;
  uint64_t session_id;
};

bool SendFrame(int fd, SessionFrameType type, uint64_t a, uint64_t b, uint64_t c) {
  SessionFrame f{kSessionMagic, static_cast<uint32_t>(type), a, b, c};
  return send(fd, &f, sizeof(f), MSG_DONTWAIT | MSG_NOSIGNAL) == sizeof(f);
}

// Tells a client why it gets no session (REFUSED), best effort: the socket is closed next.
void SendRefusal(int fd, const absl::Status& why) {
  const std::string reason(why.message().substr(0, kMaxRefusalBytes));
  SessionFrame f{kSessionMagic, static_cast<uint32_t>(SessionFrameType::kRefused), static_cast<uint64_t>(why.code()),
                 reason.size(), 0};
  std::string packet(reinterpret_cast<const char*>(&f), sizeof(f));
  packet += reason;
  (void)!send(fd, packet.data(), packet.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
}

// Handles one readable connection. Returns false when the session must end.
bool ServeFrame(const Connection& conn, SessionRegistry* registry) {
  SessionFrame frame{};
  iovec iov{&frame, sizeof(frame)};
  alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n = recvmsg(conn.fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return true;

  std::vector<UniqueFd> fds;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        fds.emplace_back(fd);
      }
    }
  }
  if (n <= 0) return false;  // EOF or error: the client is gone
  if (n != sizeof(frame) || frame.magic != kSessionMagic ||
      frame.type != static_cast<uint32_t>(SessionFrameType::kAddFd)) {
    FERRY_LOG(WARNING) << "session " << conn.session_id << ": malformed frame; ending session";
    return false;
  }
  if (fds.empty() && (msg.msg_flags & MSG_CTRUNC)) {
    // The kernel could not give the agent the fd: the agent is at its fd limit. The
    // client's session is fine; it is told, and may try again.
    FERRY_LOG(WARNING) << "session " << conn.session_id << ": an ADD_FD's fd was lost: the agent is out of fds";
    return SendFrame(conn.fd, SessionFrameType::kFdAdded, frame.a, 0, ENFILE);
  }
  if (fds.size() != 1 || (msg.msg_flags & MSG_CTRUNC)) {
    FERRY_LOG(WARNING) << "session " << conn.session_id << ": ADD_FD needs exactly one fd, got " << fds.size()
                       << "; ending session";
    return false;
  }
  std::shared_ptr<Session> session = registry->FindById(conn.session_id);
  if (session == nullptr) return false;
  absl::StatusOr<uint64_t> handle = session->AddFd(std::move(fds[0]));
  return SendFrame(conn.fd, SessionFrameType::kFdAdded, frame.a, handle.ok() ? *handle : 0, handle.ok() ? 0 : EMFILE);
}

}  // namespace

void SessionSocketServer::Loop() {
  NameThisThread("ferry-sessions");
  // epoll rather than poll: with hundreds of sessions a poll list rebuilt for every
  // event made opening a session cost milliseconds.
  const int epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd < 0) {
    FERRY_LOG(ERROR) << "session socket: epoll_create1: " << strerror(errno);
    return;
  }
  auto watch = [epoll_fd](int op, int fd, uint32_t events) {
    epoll_event ev{};
    ev.events = events;
    ev.data.fd = fd;
    return epoll_ctl(epoll_fd, op, fd, &ev) == 0;
  };
  watch(EPOLL_CTL_ADD, wake_fd_, EPOLLIN);
  watch(EPOLL_CTL_ADD, listen_fd_, EPOLLIN);
  absl::flat_hash_map<int, uint64_t> sessions;  // connection fd -> session id
  auto end_session = [&](int fd) {
    auto it = sessions.find(fd);
    registry_->Close(it->second);
    epoll_ctl(epoll_fd, EPOLL_CTL_DEL, fd, nullptr);
    close(fd);
    sessions.erase(it);
  };
  // At the fd limit accept() fails without taking the connection, which stays ready:
  // the listening socket is left alone for a while instead of spinning on it.
  absl::Time accept_paused_until = absl::InfinitePast();
  absl::Time last_accept_warning = absl::InfinitePast();
  bool stopping = false;
  while (!stopping) {
    int timeout_ms = -1;
    if (accept_paused_until != absl::InfinitePast()) {
      const absl::Time now = absl::Now();
      if (now >= accept_paused_until) {
        watch(EPOLL_CTL_MOD, listen_fd_, EPOLLIN);
        accept_paused_until = absl::InfinitePast();
      } else {
        timeout_ms = static_cast<int>(absl::ToInt64Milliseconds(accept_paused_until - now)) + 1;
      }
    }
    epoll_event events[64];
    const int ready = epoll_wait(epoll_fd, events, 64, timeout_ms);
    if (ready < 0) {
      if (errno == EINTR) continue;
      FERRY_LOG(ERROR) << "session socket epoll_wait: " << strerror(errno);
      break;
    }
    for (int i = 0; i < ready; ++i) {
      const int fd = events[i].data.fd;
      if (fd == wake_fd_) {
        stopping = true;  // Stop()
        break;
      }
      if (fd != listen_fd_) {
        auto it = sessions.find(fd);
        if (it == sessions.end()) continue;
        const bool keep = (events[i].events & EPOLLIN) ? ServeFrame(Connection{fd, it->second}, registry_) : false;
        if (!keep) end_session(fd);
        continue;
      }
      const int conn = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (conn < 0 && (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)) {
        if (absl::Now() - last_accept_warning > absl::Seconds(10)) {
          FERRY_LOG(WARNING) << "session socket: cannot accept (" << strerror(errno)
                             << "): the agent is out of fds or memory; new clients wait";
          last_accept_warning = absl::Now();
        }
        accept_paused_until = absl::Now() + absl::Milliseconds(100);
        watch(EPOLL_CTL_MOD, listen_fd_, 0);
        continue;
      }
      if (conn < 0) continue;
      absl::StatusOr<uint64_t> session = Open(conn);
      if (!session.ok()) {
        close(conn);
        continue;
      }
      if (!watch(EPOLL_CTL_ADD, conn, EPOLLIN)) {
        FERRY_LOG(WARNING) << "session " << *session << ": epoll_ctl: " << strerror(errno) << "; ending session";
        registry_->Close(*session);
        close(conn);
        continue;
      }
      sessions.emplace(conn, *session);
    }
  }
  while (!sessions.empty()) end_session(sessions.begin()->first);
  close(epoll_fd);
}

absl::StatusOr<uint64_t> SessionSocketServer::Open(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return absl::InternalError(absl::StrCat("SO_PEERCRED: ", strerror(errno)));
  }
  PeerCredentials creds{cred.pid, cred.uid, cred.gid};
  absl::Status admitted = admit_ ? admit_(creds) : absl::OkStatus();
  absl::StatusOr<std::shared_ptr<Session>> created =
      admitted.ok() ? registry_->Create(creds) : absl::StatusOr<std::shared_ptr<Session>>(admitted);
  if (!created.ok()) {
    FERRY_LOG(WARNING) << "refused session for pid " << cred.pid << " uid " << cred.uid << ": "
                       << created.status().message();
    SendRefusal(fd, created.status());
    return created.status();
  }
  std::shared_ptr<Session> session = std::move(*created);
  const auto& t = session->token().raw();
  uint64_t lo, hi;
  memcpy(&lo, t.data(), 8);
  memcpy(&hi, t.data() + 8, 8);
  if (!SendFrame(fd, SessionFrameType::kHello, session->id(), lo, hi)) {
    registry_->Close(session->id());
    return absl::UnavailableError("the client left before its HELLO");
  }
  FERRY_LOG(INFO) << "session " << session->id() << " opened by pid " << cred.pid << " uid " << cred.uid;
  return session->id();
}

}  // namespace ferry
