#include "agent/memory/region.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ferry {

const char* MemoryKindName(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kHost:
      return "host";
    case MemoryKind::kCuda:
      return "cuda";
  }
  return "unknown";
}

namespace {

class HostFdBacking : public MemoryBacking {
 public:
  HostFdBacking(void* map, size_t map_len, size_t delta, uint64_t size)
      : map_(map), map_len_(map_len), delta_(delta), size_(size) {}
  ~HostFdBacking() override { munmap(map_, map_len_); }
  MemoryKind kind() const override { return MemoryKind::kHost; }
  void* data() const override { return static_cast<uint8_t*>(map_) + delta_; }
  uint64_t size() const override { return size_; }

 private:
  void* map_;
  size_t map_len_;
  size_t delta_;
  uint64_t size_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<MemoryBacking>> MapHostFd(int fd, uint64_t offset, uint64_t size) {
  absl::Cleanup close_fd = [fd] { close(fd); };
  struct stat st;
  if (fstat(fd, &st) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("host.fd_handle: fstat failed: ", strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        "host.fd_handle: the fd is not a shared-memory file (memfd or /dev/shm); got a "
        "pipe, socket, directory or device");
  }
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  if (offset % page != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("host.offset must be a multiple of the page size (", page, "), got ", offset));
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (offset > file_size || size > file_size - offset) {
    return absl::OutOfRangeError(absl::StrCat("size + host.offset (", size, " + ", offset,
                                              ") exceeds the fd's size (", file_size, " bytes)"));
  }
  void* map = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(offset));
  if (map == MAP_FAILED) {
    return absl::InvalidArgumentError(
        absl::StrCat("host.fd_handle: mmap of ", size, " bytes failed: ", strerror(errno),
                     " (the fd must be opened read-write)"));
  }
  return std::unique_ptr<MemoryBacking>(new HostFdBacking(map, size, 0, size));
}

}  // namespace ferry
