// MemfdRegion: a Region over `size` zeroed bytes of a fresh memfd, the kind of memory a
// pod registers, mapped as the agent maps it (MapHostFd). REQUIREs success.
//
//   std::shared_ptr<Region> r = testing::MemfdRegion(/*id=*/1, 1 << 16);
#ifndef FERRY_TESTS_TESTING_HOST_REGION_H_
#define FERRY_TESTS_TESTING_HOST_REGION_H_

#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <memory>

#include "agent/memory/region.h"

namespace ferry::testing {

inline std::shared_ptr<Region> MemfdRegion(uint64_t id, uint64_t size, uint64_t owner_session = 1) {
  int fd = memfd_create("ferry-test-region", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  REQUIRE(fd >= 0);
  REQUIRE(ftruncate(fd, static_cast<off_t>(size)) == 0);
  auto backing = MapHostFd(fd, 0, size);  // takes fd
  REQUIRE(backing.ok());
  return std::make_shared<Region>(id, owner_session, Token::Random(), std::move(*backing));
}

}  // namespace ferry::testing

#endif  // FERRY_TESTS_TESTING_HOST_REGION_H_
