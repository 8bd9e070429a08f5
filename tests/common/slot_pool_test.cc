#include "agent/common/slot_pool.h"

#include <catch2/catch.hpp>
#include <set>
#include <thread>

#include "absl/time/clock.h"

namespace ferry {
namespace {

TEST_CASE("a slot pool cuts its buffer into whole slots, at least one") {
  SlotPool pool(32 << 20, 1 << 20);
  CHECK(pool.slots() == 32);
  CHECK(pool.slot_bytes() == (1 << 20));
  CHECK(pool.offset(3) == (3 << 20));
  SlotPool small(256 << 10, 1 << 20);  // smaller than one stage: one slot of all of it
  CHECK(small.slots() == 1);
  CHECK(small.slot_bytes() == (256 << 10));
  SlotPool odd(5000, 2048);  // the tail that fits no slot is not used
  CHECK(odd.slots() == 2);
}

TEST_CASE("slots are lent once each; a full pool waits until a release or its deadline") {
  SlotPool pool(4096 * 3, 4096);
  std::set<int> lent;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<int> s = pool.Acquire(absl::Now() + absl::Seconds(1));
    REQUIRE(s.ok());
    lent.insert(*s);
  }
  CHECK(lent == std::set<int>{0, 1, 2});

  const absl::Time start = absl::Now();
  absl::StatusOr<int> none = pool.Acquire(start + absl::Milliseconds(50));
  CHECK(none.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(absl::Now() - start >= absl::Milliseconds(50));

  std::thread releaser([&] {
    absl::SleepFor(absl::Milliseconds(20));
    pool.Release(1);
  });
  absl::StatusOr<int> again = pool.Acquire(absl::Now() + absl::Seconds(10));
  releaser.join();
  REQUIRE(again.ok());
  CHECK(*again == 1);
}

TEST_CASE("a slot lease gives its slot back when it goes, once, however it goes") {
  auto pool = std::make_shared<SlotPool>(4096 * 2, 4096);
  const absl::Time soon = absl::Now() + absl::Milliseconds(50);
  {
    absl::StatusOr<SlotLease> a = SlotLease::Acquire(pool, soon);
    absl::StatusOr<SlotLease> b = SlotLease::Acquire(pool, soon);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    CHECK(a->offset() != b->offset());
    CHECK(!SlotLease::Acquire(pool, soon).ok());  // both lent
    SlotLease moved = std::move(*a);              // the slot moves with it, once
    CHECK(moved.held());
    CHECK(!a->held());
    b->Release();
    b->Release();  // again: nothing
    absl::StatusOr<SlotLease> c = SlotLease::Acquire(pool, soon);
    REQUIRE(c.ok());
    CHECK(!SlotLease::Acquire(pool, soon).ok());
  }  // `moved` and `c` give theirs back here
  absl::StatusOr<SlotLease> d = SlotLease::Acquire(pool, soon);
  absl::StatusOr<SlotLease> e = SlotLease::Acquire(pool, soon);
  CHECK(d.ok());
  CHECK(e.ok());
}

}  // namespace
}  // namespace ferry
