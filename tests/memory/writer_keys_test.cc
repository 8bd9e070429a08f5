// WriterKeys with a registrar that counts the keys it makes and those closed: each
// writing agent gets keys of its own, a fence closes one writer's and refuses it for a
// time, and the number of writers holding keys is bounded.
#include "agent/memory/writer_keys.h"

#include <catch2/catch.hpp>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/synchronization/notification.h"
#include "agent/memory/region.h"
#include "tests/testing/counting_registrar.h"
#include "tests/testing/host_region.h"

namespace ferry {
namespace {

uint64_t KeyOf(const absl::StatusOr<std::vector<NicRegistration>>& keys) {
  REQUIRE(keys.ok());
  REQUIRE(keys->size() == 1);
  return (*keys)[0].key;
}

TEST_CASE("each writer gets keys of its own, made once") {
  testing::CountingRegistrar registrar;
  std::shared_ptr<Region> region = testing::MemfdRegion(1, 4096);
  WriterKeys& writers = region->writers();
  const uint64_t a = KeyOf(writers.Keys(10, region->backing(), registrar));
  const uint64_t b = KeyOf(writers.Keys(20, region->backing(), registrar));
  CHECK(a != b);
  CHECK(KeyOf(writers.Keys(10, region->backing(), registrar)) == a);  // cached
  CHECK(registrar.made == 2);
  CHECK(writers.writers() == 2);
  absl::StatusOr<std::vector<NicRegistration>> nobody = writers.Keys(0, region->backing(), registrar);
  CHECK(nobody.status().code() == absl::StatusCode::kInvalidArgument);
  region.reset();  // the region goes: its writers' keys close with it
  CHECK(registrar.closed == 2);
}

TEST_CASE("a fence closes one writer's keys and refuses it until its time, saying why") {
  testing::CountingRegistrar registrar;
  std::shared_ptr<Region> region = testing::MemfdRegion(1, 4096);
  WriterKeys& writers = region->writers();
  KeyOf(writers.Keys(10, region->backing(), registrar));
  KeyOf(writers.Keys(20, region->backing(), registrar));
  writers.Fence(10, absl::Now() + absl::Hours(1), "its write 7 was declared lost");
  CHECK(registrar.closed == 1);  // closed before Fence returns: the NIC refuses its next operation
  for (absl::Status s : {writers.Admit(10), writers.Keys(10, region->backing(), registrar).status()}) {
    CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
    CHECK_THAT(std::string(s.message()), Catch::Contains("writes from agent incarnation 10 are refused for "));
    CHECK_THAT(std::string(s.message()), Catch::Contains("its write 7 was declared lost; nothing was written"));
  }
  CHECK(writers.Admit(20).ok());  // the other writer is untouched
  CHECK(registrar.made == 2);
  // A shorter fence does not shorten it; one past its time lets the writer open again.
  writers.Fence(10, absl::Now(), "shorter");
  CHECK_THAT(std::string(writers.Admit(10).message()), Catch::Contains("declared lost"));
  writers.Fence(30, absl::InfinitePast(), "already over");
  CHECK(writers.Admit(30).ok());
  CHECK(KeyOf(writers.Keys(30, region->backing(), registrar)) == 3);
  // A writer fenced before it ever opened the region.
  writers.Fence(40, absl::InfiniteFuture(), "its agent restarted");
  CHECK_THAT(std::string(writers.Admit(40).message()), Catch::Contains("refused for good: its agent restarted"));
}

TEST_CASE("at most kMaxWriters hold keys: a new writer closes the oldest one's") {
  testing::CountingRegistrar registrar;
  std::shared_ptr<Region> region = testing::MemfdRegion(1, 4096);
  WriterKeys& writers = region->writers();
  writers.Fence(999, absl::InfiniteFuture(), "fenced");  // fenced writers hold no keys and stay
  for (uint64_t w = 1; w <= WriterKeys::kMaxWriters; ++w) KeyOf(writers.Keys(w, region->backing(), registrar));
  CHECK(registrar.closed == 0);
  KeyOf(writers.Keys(WriterKeys::kMaxWriters + 1, region->backing(), registrar));
  CHECK(registrar.closed == 1);
  CHECK(writers.writers() == WriterKeys::kMaxWriters + 1);  // 256 with keys, and the fenced one
  CHECK(!writers.Admit(999).ok());
  // The writer whose keys closed opens again with new ones (as after any revoked key).
  CHECK(KeyOf(writers.Keys(1, region->backing(), registrar)) == WriterKeys::kMaxWriters + 2);
}

// Runs `during` inside each registration, as a slow NIC registration would give others
// time to.
struct HookedRegistrar : testing::CountingRegistrar {
  std::function<void()> during;
  absl::StatusOr<RegionRegistration> Register(const MemoryBacking& backing) override {
    if (during) std::exchange(during, nullptr)();
    return CountingRegistrar::Register(backing);
  }
};

TEST_CASE("a first open registers outside the lock: other writers go on, and a fence meanwhile wins") {
  HookedRegistrar registrar;
  std::shared_ptr<Region> region = testing::MemfdRegion(1, 4096);
  WriterKeys& writers = region->writers();
  const uint64_t a = KeyOf(writers.Keys(10, region->backing(), registrar));
  // While writer 20's keys are being made, writer 10 opens again and 20 is fenced.
  std::thread other;
  absl::Notification done;
  uint64_t a_again = 0;
  bool other_went_on = false;
  registrar.during = [&] {
    other = std::thread([&] {
      absl::StatusOr<std::vector<NicRegistration>> keys = writers.Keys(10, region->backing(), registrar);
      if (keys.ok() && keys->size() == 1) a_again = (*keys)[0].key;
      writers.Fence(20, absl::Now() + absl::Seconds(30), "its write 7 was declared lost");
      done.Notify();
    });
    other_went_on = done.WaitForNotificationWithTimeout(absl::Seconds(5));
  };
  absl::StatusOr<std::vector<NicRegistration>> b = writers.Keys(20, region->backing(), registrar);
  other.join();
  CHECK(other_went_on);  // not held up by writer 20's registration
  CHECK(a_again == a);
  CHECK(b.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(b.status().message()), Catch::Contains("its write 7 was declared lost"));
  CHECK(registrar.made == 2);
  CHECK(registrar.closed == 1);  // the keys made for writer 20 are not kept
}

}  // namespace
}  // namespace ferry
