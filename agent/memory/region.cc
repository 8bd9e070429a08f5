#include "agent/memory/region.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "agent/common/log.h"
#include "agent/common/sealed_file.h"
#include "agent/common/status_macros.h"
#include "agent/memory/retired_memory.h"

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
  HostFdBacking(void* map, size_t len) : map_(map), len_(len) {}
  ~HostFdBacking() override {
    if (!retired_) munmap(map_, len_);
  }
  MemoryKind kind() const override { return MemoryKind::kHost; }
  void* data() const override { return map_; }
  uint64_t size() const override { return len_; }

  void Retire() override {
    absl::Status detached = DetachMapping(map_, len_);
    if (!detached.ok()) {
      // Nothing safe is left: unmapping risks a fault on a late write, keeping the
      // mapping lets it reach the client. Unmap (the old behaviour) and say so.
      FERRY_LOG(ERROR) << "region memory: " << detached.message() << "; unmapping it now instead";
      return;
    }
    retired_ = true;
    RetiredMemory::Global().Add([map = map_, len = len_] { munmap(map, len); });
  }

 private:
  void* const map_;
  const size_t len_;
  bool retired_ = false;
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
        "host.fd_handle: the fd is not a shared-memory file (a memfd); got a "
        "pipe, socket, directory or device");
  }
  // Sealed before its size is read: from here on it can only grow.
  FERRY_RETURN_IF_ERROR(SealAgainstShrinking(fd, "host.fd_handle"));
  if (fstat(fd, &st) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("host.fd_handle: fstat failed: ", strerror(errno)));
  }
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  if (offset % page != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("host.offset must be a multiple of the page size (", page, "), got ", offset));
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (offset > file_size || size > file_size - offset) {
    return absl::OutOfRangeError(
        absl::StrCat("size + host.offset (", size, " + ", offset, ") exceeds the fd's size (", file_size, " bytes)"));
  }
  // MAP_POPULATE: the page tables are filled here, once, not by a fault per page on the
  // first write that touches it (RDMA providers pin the pages at registration anyway).
  void* map = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, static_cast<off_t>(offset));
  if (map == MAP_FAILED && errno == ENOMEM) {
    return absl::ResourceExhaustedError(absl::StrCat("host.fd_handle: mmap of ", size,
                                                     " bytes failed: ", strerror(errno),
                                                     " (the agent is out of mappings, vm.max_map_count, or address "
                                                     "space: lower --max_regions or raise vm.max_map_count)"));
  }
  if (map == MAP_FAILED) {
    return absl::InvalidArgumentError(absl::StrCat("host.fd_handle: mmap of ", size, " bytes failed: ", strerror(errno),
                                                   " (the fd must be opened read-write)"));
  }
  return std::unique_ptr<MemoryBacking>(new HostFdBacking(map, size));
}

}  // namespace ferry
