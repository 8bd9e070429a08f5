// WriteWindows as one component: what Open refuses, what a write through a window is
// admitted to, that Close waits for admitted writes (bounded; again when called again)
// and revokes fabric keys, and that a session's end and a deadline close windows.
#include "agent/memory/write_windows.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/testing/counting_registrar.h"
#include "tests/testing/host_region.h"

namespace ferry {
namespace {

constexpr uint64_t kSession = 1;

struct Fixture {
  Fixture()
      : windows(&regions, [this](const Region& r, uint64_t id, const absl::Status& why) {
          refusals.push_back(std::string(why.message()));
        }) {
    region = testing::MemfdRegion(regions.NextId(), 1 << 16, kSession);
    region->set_write_windows(true);
    REQUIRE(regions.Insert(region).ok());
    plain = testing::MemfdRegion(regions.NextId(), 1 << 16, kSession);
    REQUIRE(regions.Insert(plain).ok());
    windows.set_registrar(&registrar);
  }
  WindowSpec Spec(std::vector<ByteSpan> ranges, absl::Duration timeout = absl::Seconds(30)) const {
    return {{region->id()}, std::move(ranges), {}, timeout};
  }
  RegionTable regions;
  testing::CountingRegistrar registrar;
  std::vector<std::string> refusals;
  WriteWindows windows;
  std::shared_ptr<Region> region, plain;
};

TEST_CASE("Open refuses what no window can be, naming the field") {
  Fixture f;
  auto refused = [&](WindowSpec spec, absl::StatusCode code, const char* says) {
    absl::StatusOr<std::shared_ptr<const WriteWindow>> w = f.windows.Open(kSession, spec);
    REQUIRE(!w.ok());
    CHECK(w.status().code() == code);
    CHECK_THAT(std::string(w.status().message()), Catch::Contains(says));
  };
  refused(f.Spec({}), absl::StatusCode::kInvalidArgument, "ranges: give 1..");
  refused(f.Spec({{0, 0}}), absl::StatusCode::kInvalidArgument, "length must be >= 1");
  refused(f.Spec({{UINT64_MAX, 2}}), absl::StatusCode::kInvalidArgument, "overflow");
  refused(f.Spec({{0, 8192}, {4096, 4096}}), absl::StatusCode::kInvalidArgument, "overlaps");
  refused(f.Spec({{60000, 8192}}), absl::StatusCode::kOutOfRange, "past region");
  refused(f.Spec({{0, 1}}, absl::ZeroDuration()), absl::StatusCode::kInvalidArgument, "timeout_ms");
  refused({{f.plain->id()}, {{0, 1}}, {}, absl::Seconds(1)}, absl::StatusCode::kFailedPrecondition,
          "not registered with write_windows");
  refused({{f.region->id(), f.region->id()}, {{0, 1}}, {}, absl::Seconds(1)}, absl::StatusCode::kInvalidArgument,
          "twice");
  refused({{999}, {{0, 1}}, {}, absl::Seconds(1)}, absl::StatusCode::kNotFound, "region_ids[0]");
  CHECK(!f.windows.Open(/*session=*/2, f.Spec({{0, 1}})).ok());               // not the owner
  REQUIRE(f.windows.Open(kSession, f.Spec({{0, 4096}, {4096, 4096}})).ok());  // adjacent: one range
  refused(f.Spec({{8191, 2}}), absl::StatusCode::kFailedPrecondition, "in open write window");
}

TEST_CASE("Windows over several regions clash only where they share a region and bytes") {
  // A decode step's windows name the same layer regions, each other window compared once;
  // a window sharing one region of several must still be refused there.
  Fixture f;
  auto windowed = [&f] {
    auto r = testing::MemfdRegion(f.regions.NextId(), 1 << 16, kSession);
    r->set_write_windows(true);
    REQUIRE(f.regions.Insert(r).ok());
    return r->id();
  };
  const uint64_t a = f.region->id(), b = windowed(), c = windowed();
  auto open = [&f](std::vector<uint64_t> ids, uint64_t offset) {
    return f.windows.Open(kSession, {std::move(ids), {{offset, 4096}}, {}, absl::Seconds(30)});
  };
  for (int i = 0; i < 8; ++i) REQUIRE(open({a, b}, 4096 * i).ok());  // disjoint bytes: all open
  REQUIRE(open({c}, 0).ok());                                        // the same bytes, another region
  absl::StatusOr<std::shared_ptr<const WriteWindow>> clash = open({c, b}, 3 * 4096);
  REQUIRE(!clash.ok());
  CHECK_THAT(std::string(clash.status().message()), Catch::Contains(absl::StrCat("of region ", b)));
  CHECK(!open({c, a}, 0).ok());  // clashes in c (the window above) and in a
  CHECK(open({c}, 4096).ok());
}

TEST_CASE("A window covers its ranges only, and admits only its token and regions") {
  Fixture f;
  absl::StatusOr<std::shared_ptr<const WriteWindow>> w = f.windows.Open(kSession, f.Spec({{4096, 4096}, {0, 1024}}));
  REQUIRE(w.ok());
  CHECK((*w)->ranges().size() == 2);
  CHECK((*w)->Covers(4096, 4096));
  CHECK((*w)->Covers(0, 1024));
  CHECK(!(*w)->Covers(1024, 1));
  CHECK(!(*w)->Covers(4095, 2));
  CHECK(!(*w)->Covers(8191, 2));
  CHECK(f.windows.Admit((*w)->id(), (*w)->token(), f.region->id()).ok());
  CHECK(f.windows.Admit((*w)->id(), Token::Random(), f.region->id()).status().code() ==
        absl::StatusCode::kPermissionDenied);
  CHECK(f.windows.Admit((*w)->id(), (*w)->token(), f.plain->id()).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(f.windows.Admit(12345, (*w)->token(), f.region->id()).status().code() == absl::StatusCode::kNotFound);
  CHECK(f.refusals.empty());  // none of those held the window's token for its region
}

TEST_CASE("Close waits for admitted writes, bounded, and revokes the window's keys") {
  Fixture f;
  absl::StatusOr<std::shared_ptr<const WriteWindow>> w = f.windows.Open(kSession, f.Spec({{4096, 8192}}));
  REQUIRE(w.ok());
  const uint64_t id = (*w)->id();
  const Token token = (*w)->token();
  absl::StatusOr<std::vector<NicRegistration>> keys = f.windows.Keys(**w, *f.region);
  REQUIRE(keys.ok());
  REQUIRE(f.registrar.ranges.size() == 1);
  CHECK(f.registrar.ranges[0].offset == 4096);  // the extent, not the region
  CHECK(f.registrar.ranges[0].length == 8192);
  CHECK(f.windows.Keys(**w, *f.region).ok());
  CHECK(f.registrar.ranges.size() == 1);  // made once

  SECTION("a write still copying keeps Close waiting until it ends") {
    auto admitted = std::make_unique<WindowAdmission>(*f.windows.Admit(id, token, f.region->id()));
    std::thread writer([&] {
      absl::SleepFor(absl::Milliseconds(200));
      admitted.reset();
    });
    const absl::Time start = absl::Now();
    CHECK(f.windows.Close(id, kSession, absl::Seconds(10)).ok());
    CHECK(absl::Now() - start >= absl::Milliseconds(150));
    writer.join();
  }
  SECTION("a write another agent announced through it keeps Close waiting until its agent ends it") {
    std::atomic<size_t> announced{1};
    f.windows.set_announced([&](uint64_t window_id) { return window_id == id ? announced.load() : 0; });
    std::thread writer_agent([&] {
      absl::SleepFor(absl::Milliseconds(200));
      announced = 0;
    });
    const absl::Time start = absl::Now();
    CHECK(f.windows.Close(id, kSession, absl::Seconds(10)).ok());
    CHECK(absl::Now() - start >= absl::Milliseconds(150));
    writer_agent.join();
  }
  SECTION("past wait_ms Close says so, and the window stays closed") {
    auto admitted = std::make_unique<WindowAdmission>(*f.windows.Admit(id, token, f.region->id()));
    absl::Status s = f.windows.Close(id, kSession, absl::Milliseconds(20));
    CHECK(s.code() == absl::StatusCode::kDeadlineExceeded);
    CHECK_THAT(std::string(s.message()), Catch::Contains("1 writes through it were still copying"));
    // Closing it again waits again: for the write still copying, and no other session may.
    CHECK(f.windows.Close(id, kSession, absl::ZeroDuration()).code() == absl::StatusCode::kDeadlineExceeded);
    CHECK(f.windows.Close(id, kSession + 1, absl::ZeroDuration()).code() == absl::StatusCode::kNotFound);
    std::thread writer([&] {
      absl::SleepFor(absl::Milliseconds(200));
      admitted.reset();
    });
    CHECK(f.windows.Close(id, kSession, absl::Seconds(10)).ok());
    writer.join();
    CHECK(f.windows.Close(id, kSession, absl::ZeroDuration()).ok());
  }
  CHECK(f.registrar.closed == 1);
  absl::StatusOr<WindowAdmission> late = f.windows.Admit(id, token, f.region->id());
  CHECK(late.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(late.status().message()), Catch::Contains("closed by its owner"));
  REQUIRE(f.refusals.size() == 1);                          // told to the owner: the writer held the token
  CHECK(f.windows.Verify(id, token, f.region->id()).ok());  // its write's notification may still come
  CHECK(!f.windows.Keys(**w, *f.region).ok());
  CHECK(f.windows.Open(kSession, f.Spec({{4096, 4096}})).ok());  // the bytes are free again
}

TEST_CASE("A session's end and a deadline close its windows") {
  Fixture f;
  absl::StatusOr<std::shared_ptr<const WriteWindow>> a = f.windows.Open(kSession, f.Spec({{0, 4096}}));
  absl::StatusOr<std::shared_ptr<const WriteWindow>> b =
      f.windows.Open(kSession, f.Spec({{4096, 4096}}, absl::Milliseconds(50)));
  REQUIRE((a.ok() && b.ok()));
  REQUIRE(f.windows.Keys(**b, *f.region).ok());
  absl::SleepFor(absl::Milliseconds(100));
  CHECK(f.windows.Admit((*b)->id(), (*b)->token(), f.region->id()).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  const absl::Time deadline = absl::Now() + absl::Seconds(5);  // the sweeper revokes its keys
  while (f.registrar.closed == 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  CHECK(f.registrar.closed == 1);
  f.windows.CloseSession(kSession);
  CHECK(f.windows.open() == 0);
  CHECK(f.windows.Admit((*a)->id(), (*a)->token(), f.region->id()).status().code() ==
        absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace ferry
