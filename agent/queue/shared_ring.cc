#include "agent/queue/shared_ring.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/common/sealed_file.h"
#include "agent/common/status_macros.h"

namespace ferry {

absl::StatusOr<SharedMapping> SharedMapping::Map(UniqueFd fd, size_t bytes, absl::string_view field,
                                                 absl::string_view what) {
  struct stat st;
  if (fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(field, " must be a memfd or regular file"));
  }
  // Sealed before its size is read: from here on it can only grow.
  FERRY_RETURN_IF_ERROR(SealAgainstShrinking(fd.get(), field));
  if (fstat(fd.get(), &st) != 0) return absl::InvalidArgumentError(absl::StrCat(field, ": fstat failed"));
  if (static_cast<uint64_t>(st.st_size) < bytes) {
    return absl::InvalidArgumentError(absl::StrCat(field, " holds ", st.st_size, " bytes; ", what, " needs ", bytes));
  }
  void* map = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (map == MAP_FAILED) {
    return absl::InvalidArgumentError(absl::StrCat(field, " cannot be mapped shared: ", strerror(errno)));
  }
  return SharedMapping(std::move(fd), map, bytes);
}

SharedMapping::SharedMapping(SharedMapping&& other) noexcept
    : fd_(std::move(other.fd_)), map_(std::exchange(other.map_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

SharedMapping& SharedMapping::operator=(SharedMapping&& other) noexcept {
  if (this != &other) {
    if (map_ != nullptr) munmap(map_, bytes_);
    fd_ = std::move(other.fd_);
    map_ = std::exchange(other.map_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

SharedMapping::~SharedMapping() {
  if (map_ != nullptr) munmap(map_, bytes_);
}

absl::Status CheckEventFd(int fd, absl::string_view field) {
  char link[64] = {0};
  const std::string path = absl::StrCat("/proc/self/fd/", fd);
  ssize_t n = readlink(path.c_str(), link, sizeof(link) - 1);
  if (n <= 0 || std::string(link, n) != "anon_inode:[eventfd]") {
    return absl::InvalidArgumentError(absl::StrCat(field, " must be an eventfd (eventfd(2)), got ",
                                                   n > 0 ? std::string(link, n) : "an unreadable fd"));
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  return absl::OkStatus();
}

absl::Status CheckDoorbellSocket(int fd, absl::string_view field) {
  int domain = 0, type = 0;
  socklen_t len = sizeof(domain);
  const bool is_socket = getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) == 0;
  len = sizeof(type);
  if (!is_socket || getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || domain != AF_UNIX || type != SOCK_STREAM) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " must be one end of a unix stream socketpair (socketpair(AF_UNIX, SOCK_STREAM)), got ",
                     is_socket ? "another kind of socket" : "no socket"));
  }
  return absl::OkStatus();
}

void RingDoorbell(int fd) {
  const char one = 1;
  ssize_t ignored = send(fd, &one, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
  (void)ignored;
}

}  // namespace ferry
