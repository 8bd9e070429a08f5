// CountingRegistrar: a RegionRegistrar for unit tests of what holds fabric keys. Each
// registration gets a new key (1, 2, ...) and an attachment whose destruction counts as
// the key closed, so a test sees exactly which keys were made and when they closed.
//
//   testing::CountingRegistrar registrar;
//   ... code under test registers and drops keys through &registrar ...
//   CHECK(registrar.made == 2);
//   CHECK(registrar.closed == 1);
//   CHECK(registrar.ranges[0].offset == 4096);  // RegisterRange's ranges, in order
#ifndef FERRY_TESTS_TESTING_COUNTING_REGISTRAR_H_
#define FERRY_TESTS_TESTING_COUNTING_REGISTRAR_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "agent/memory/registration.h"
#include "agent/memory/write_windows.h"  // ByteSpan

namespace ferry::testing {

class CountingRegistrar : public RegionRegistrar {
 public:
  absl::StatusOr<RegionRegistration> Register(const MemoryBacking&) override { return Key(); }
  absl::StatusOr<RegionRegistration> RegisterRange(const MemoryBacking&, uint64_t offset, uint64_t length) override {
    ranges.push_back({offset, length});
    return Key();
  }

  uint64_t made = 0;
  int closed = 0;
  std::vector<ByteSpan> ranges;

 private:
  struct Closed : TransportAttachment {
    explicit Closed(int* n) : n_(n) {}
    ~Closed() override { ++*n_; }
    int* n_;
  };
  RegionRegistration Key() {
    RegionRegistration reg;
    reg.nics.push_back({/*key=*/++made, /*remote_base=*/0, nullptr});
    reg.owner = std::make_unique<Closed>(&closed);
    return reg;
  }
};

}  // namespace ferry::testing

#endif  // FERRY_TESTS_TESTING_COUNTING_REGISTRAR_H_
