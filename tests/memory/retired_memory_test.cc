#include "agent/memory/retired_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

#include "agent/memory/region.h"

namespace ferry {
namespace {

// A page-aligned shared-memory file of `len` bytes filled with `fill`.
int SharedFile(size_t len, uint8_t fill) {
  int fd = memfd_create("retired_memory_test", MFD_ALLOW_SEALING);
  REQUIRE(fd >= 0);
  REQUIRE(ftruncate(fd, static_cast<off_t>(len)) == 0);
  std::vector<uint8_t> bytes(len, fill);
  REQUIRE(pwrite(fd, bytes.data(), len, 0) == static_cast<ssize_t>(len));
  return fd;
}

bool Mapped(void* addr, size_t len) { return msync(addr, len, MS_ASYNC) == 0; }  // ENOMEM: unmapped

TEST_CASE("DetachMapping: writes after it neither fault nor reach the file; the range stays mapped") {
  const size_t len = 4 * static_cast<size_t>(sysconf(_SC_PAGESIZE));
  int fd = SharedFile(len, 0xAB);
  auto* p = static_cast<uint8_t*>(mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  REQUIRE(p != MAP_FAILED);
  REQUIRE(p[len - 1] == 0xAB);

  REQUIRE(DetachMapping(p, len).ok());
  CHECK(p[0] == 0);      // fresh anonymous pages
  memset(p, 0xCD, len);  // a late write
  std::vector<uint8_t> file(len);
  REQUIRE(pread(fd, file.data(), len, 0) == static_cast<ssize_t>(len));
  CHECK(std::count(file.begin(), file.end(), 0xAB) == static_cast<long>(len));  // the owner's memory is untouched
  CHECK(Mapped(p, len));
  munmap(p, len);
  close(fd);
}

TEST_CASE("DetachMapping refuses a range it cannot map, with a message") {
  absl::Status s = DetachMapping(reinterpret_cast<void*>(uintptr_t{1}), 4096);  // not page-aligned
  CHECK(s.code() == absl::StatusCode::kInternal);
  CHECK(s.message().find("mmap") != absl::string_view::npos);
}

TEST_CASE("RetiredMemory releases each entry once, only after its grace") {
  absl::Time now = absl::UnixEpoch();
  RetiredMemory retired(absl::Seconds(60), [&now] { return now; });
  int released_a = 0, released_b = 0;
  retired.Add([&released_a] { ++released_a; });
  now += absl::Seconds(30);
  retired.Add([&released_b] { ++released_b; });
  CHECK(retired.Sweep() == 0);
  now += absl::Seconds(30);  // a is due, b is not
  CHECK(retired.Sweep() == 1);
  CHECK(released_a == 1);
  CHECK(released_b == 0);
  CHECK(retired.pending() == 1);
  now += absl::Seconds(31);
  int released_c = 0;
  retired.Add([&released_c] { ++released_c; });  // Add sweeps too
  CHECK(released_b == 1);
  CHECK(released_c == 0);
  CHECK(retired.Sweep() == 0);
  CHECK(released_a == 1);
}

TEST_CASE("RetiredMemory holds at most max_pending, releasing the oldest early") {
  absl::Time now = absl::UnixEpoch();
  RetiredMemory retired(
      absl::Seconds(60), [&now] { return now; }, /*max_pending=*/2);
  std::vector<int> released;
  for (int i = 0; i < 4; ++i) retired.Add([&released, i] { released.push_back(i); });
  CHECK(released == std::vector<int>{0, 1});
  CHECK(retired.pending() == 2);
  now += absl::Seconds(60);
  CHECK(retired.Sweep() == 2);
  CHECK(released == std::vector<int>{0, 1, 2, 3});
}

TEST_CASE("RetiredMemory's destructor releases what it still holds") {
  int released = 0;
  {
    RetiredMemory retired(absl::Hours(1));
    retired.Add([&released] { ++released; });
    retired.Add([&released] { ++released; });
  }
  CHECK(released == 2);
}

TEST_CASE("a region that goes detaches its host memory before anything is unmapped") {
  const size_t len = 2 * static_cast<size_t>(sysconf(_SC_PAGESIZE));
  int fd = SharedFile(len, 0x11);
  int keep = dup(fd);  // MapHostFd takes `fd`
  auto backing = MapHostFd(fd, 0, len);
  REQUIRE(backing.ok());
  auto* p = static_cast<uint8_t*>((*backing)->data());
  const size_t pending = RetiredMemory::Global().pending();
  { Region region(1, 1, Token::Random(), std::move(*backing)); }
  // The address range is still mapped (a late write would not fault) and held for the
  // grace, but no longer the owner's memory.
  REQUIRE(Mapped(p, len));
  CHECK(RetiredMemory::Global().pending() == pending + 1);
  p[0] = 0x22;
  uint8_t first = 0;
  REQUIRE(pread(keep, &first, 1, 0) == 1);
  CHECK(first == 0x11);
  close(keep);
}

}  // namespace
}  // namespace ferry
