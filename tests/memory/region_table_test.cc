// RegionTable's bounds: per session, per pod (uid) and for the node, given back when
// regions go.
#include "agent/memory/region_table.h"

#include <catch2/catch.hpp>

#include "absl/strings/match.h"
#include "tests/testing/host_region.h"

namespace ferry {
namespace {

TEST_CASE("RegionTable holds a session, a uid and the node to their quotas, and gives room back") {
  RegionTable table;
  const RegionQuota quota{/*per_session=*/2, /*per_uid=*/3, /*total=*/4};
  uint64_t last_id = 0;
  auto add = [&](uint64_t session, uid_t uid) {
    last_id = table.NextId();
    return table.Insert(testing::MemfdRegion(last_id, 4096, session), uid, quota);
  };
  REQUIRE(add(/*session=*/1, /*uid=*/1000).ok());
  REQUIRE(add(1, 1000).ok());
  absl::Status s = add(1, 1000);
  CHECK(s.code() == absl::StatusCode::kResourceExhausted);
  CHECK(absl::StrContains(s.message(), "(--max_regions_per_session)"));
  REQUIRE(add(2, 1000).ok());
  const uint64_t first_of_session_2 = last_id;
  s = table.Admits(2, 1000, quota);  // the pod's third region, in another session
  CHECK(absl::StrContains(s.message(), "uid 1000 already has 3 regions over its sessions (--max_regions_per_uid)"));
  REQUIRE(add(3, 2000).ok());
  s = add(4, 3000);
  CHECK(absl::StrContains(s.message(), "(--max_regions)"));
  CHECK(table.size() == 4);

  CHECK(table.RemoveSession(1) == 2);  // the session's and its pod's room come back
  CHECK(table.Admits(2, 1000, quota).ok());
  REQUIRE(add(2, 1000).ok());
  CHECK(absl::StrContains(table.Admits(2, 1000, quota).message(), "--max_regions_per_session"));
  CHECK(table.Remove(first_of_session_2, /*session=*/3).code() == absl::StatusCode::kPermissionDenied);
  REQUIRE(table.Remove(first_of_session_2, /*session=*/2).ok());
  CHECK(table.Admits(5, 1000, quota).ok());
}

}  // namespace
}  // namespace ferry
