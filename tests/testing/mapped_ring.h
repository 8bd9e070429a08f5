// MappedRing: a write queue's ring as a client makes it — a memfd of queue::RingBytes with
// its header's magic and entry count written — mapped here for the test that plays the
// client's side of a TransferQueue. Hand TakeFd() to TransferQueue::Open; the mapping
// stays until the MappedRing goes. REQUIREs success.
//
//   testing::MappedRing ring(/*entries=*/16, /*table_ids=*/1024);
//   TransferQueue::Open(id, session, ring.TakeFd(), ...);
//   ring.header()->sq_tail.value.store(...);
#ifndef FERRY_TESTS_TESTING_MAPPED_RING_H_
#define FERRY_TESTS_TESTING_MAPPED_RING_H_

#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstddef>
#include <cstdint>

#include "agent/session/session.h"
#include "proto/ferry/wire/ring_layout.h"

namespace ferry::testing {

class MappedRing {
 public:
  explicit MappedRing(uint32_t entries, uint32_t table_ids = 0) : bytes_(queue::RingBytes(entries, table_ids)) {
    fd_ = UniqueFd(memfd_create("ferry-test-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    REQUIRE(fd_.get() >= 0);
    REQUIRE(ftruncate(fd_.get(), static_cast<off_t>(bytes_)) == 0);
    void* map = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_.get(), 0);
    REQUIRE(map != MAP_FAILED);
    base_ = static_cast<uint8_t*>(map);
    header()->magic = queue::kRingMagic;
    header()->entries = entries;
  }
  ~MappedRing() { munmap(base_, bytes_); }
  MappedRing(const MappedRing&) = delete;
  MappedRing& operator=(const MappedRing&) = delete;

  UniqueFd TakeFd() { return std::move(fd_); }
  uint8_t* base() const { return base_; }
  queue::RingHeader* header() const { return reinterpret_cast<queue::RingHeader*>(base_); }

 private:
  size_t bytes_;
  UniqueFd fd_;
  uint8_t* base_ = nullptr;
};

}  // namespace ferry::testing

#endif  // FERRY_TESTS_TESTING_MAPPED_RING_H_
