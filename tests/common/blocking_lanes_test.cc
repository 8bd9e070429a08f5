#include "agent/common/blocking_lanes.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ferry {
namespace {

TEST_CASE("BlockingLanes: a lane blocked in its work does not delay another lane's") {
  BlockingLanes lanes(/*max_threads=*/4, "test-lanes");
  absl::Notification release_a, b_ran;
  lanes.Post(/*key=*/1, [&] { release_a.WaitForNotificationWithTimeout(absl::Seconds(30)); });
  lanes.Post(/*key=*/1, [] {});  // behind the blocked item, in its own lane
  lanes.Post(/*key=*/2, [&] { b_ran.Notify(); });
  CHECK(b_ran.WaitForNotificationWithTimeout(absl::Seconds(10)));
  // Lane 2's item counts as finished just after it notifies; lane 1's two still wait.
  for (int i = 0; i < 1000 && lanes.pending() != 2; ++i) absl::SleepFor(absl::Milliseconds(10));
  CHECK(lanes.pending() == 2);
  release_a.Notify();
  lanes.Stop();
  CHECK(lanes.pending() == 0);
}

TEST_CASE("BlockingLanes: a lane's work runs in order, one item at a time") {
  BlockingLanes lanes(/*max_threads=*/4, "test-lanes");
  std::vector<int> order[3];
  std::atomic<int> running[3] = {};
  std::atomic<bool> overlapped{false};
  for (int i = 0; i < 300; ++i) {
    const int key = i % 3;
    lanes.Post(key, [&, key, i] {
      if (running[key].fetch_add(1) != 0) overlapped = true;
      order[key].push_back(i);  // only this lane's one running item touches it
      running[key].fetch_sub(1);
    });
  }
  lanes.Stop();  // runs everything posted
  CHECK_FALSE(overlapped.load());
  for (int key = 0; key < 3; ++key) {
    REQUIRE(order[key].size() == 100);
    for (int j = 0; j < 100; ++j) CHECK(order[key][j] == 3 * j + key);
  }
}

TEST_CASE("BlockingLanes: with every thread blocked, other lanes wait; after Stop, Post runs inline") {
  BlockingLanes lanes(/*max_threads=*/1, "test-lanes");
  absl::Notification release, other_ran;
  lanes.Post(1, [&] { release.WaitForNotificationWithTimeout(absl::Seconds(30)); });
  lanes.Post(2, [&] { other_ran.Notify(); });
  CHECK_FALSE(other_ran.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
  release.Notify();
  CHECK(other_ran.WaitForNotificationWithTimeout(absl::Seconds(10)));
  lanes.Stop();
  bool ran = false;
  lanes.Post(3, [&] { ran = true; });
  CHECK(ran);
}

}  // namespace
}  // namespace ferry
