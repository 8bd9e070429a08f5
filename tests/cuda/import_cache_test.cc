// ImportCache: one import per allocation, shared while regions hold it, redone after.
#include <catch2/catch.hpp>

#include <memory>
#include <string>

#include "agent/cuda/import_cache.h"

namespace ferry {
namespace {

struct FakeImport {
  explicit FakeImport(std::string k, int* live) : key(std::move(k)), live(live) { ++*live; }
  ~FakeImport() { --*live; }
  std::string key;
  int* live;
};

TEST_CASE("an allocation is imported once while a region holds it") {
  ImportCache<FakeImport> cache;
  int live = 0, imports = 0;
  auto import = [&](const std::string& key) {
    return [&, key]() -> absl::StatusOr<std::shared_ptr<FakeImport>> {
      ++imports;
      return std::make_shared<FakeImport>(key, &live);
    };
  };
  bool hit = true;
  auto a = cache.GetOrImport("a", import("a"), &hit);
  REQUIRE(a.ok());
  CHECK_FALSE(hit);
  auto a2 = cache.GetOrImport("a", import("a"), &hit);
  CHECK(hit);
  CHECK(a2->get() == a->get());
  CHECK(imports == 1);
  CHECK(cache.live() == 1);

  a->reset();
  a2->reset();  // the last region went: released, not kept by the cache
  CHECK(live == 0);
  CHECK(cache.live() == 0);
  auto again = cache.GetOrImport("a", import("a"), &hit);
  CHECK_FALSE(hit);
  CHECK(imports == 2);
}

TEST_CASE("failed imports are not cached; matching finds imports without keys") {
  ImportCache<FakeImport> cache;
  int live = 0;
  auto fail = []() -> absl::StatusOr<std::shared_ptr<FakeImport>> { return absl::InvalidArgumentError("bad handle"); };
  CHECK(cache.GetOrImport("x", fail).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(cache.live() == 0);

  auto make = [&](const char* k) {
    return [&, k]() -> absl::StatusOr<std::shared_ptr<FakeImport>> { return std::make_shared<FakeImport>(k, &live); };
  };
  auto same_key = [](const char* k) { return [k](const FakeImport& i) { return i.key == k; }; };
  bool hit = true;
  auto f1 = cache.MatchOrImport(same_key("f1"), make("f1"), &hit);
  CHECK_FALSE(hit);
  auto f2 = cache.MatchOrImport(same_key("f2"), make("f2"), &hit);
  CHECK_FALSE(hit);
  auto f1b = cache.MatchOrImport(same_key("f1"), make("f1"), &hit);
  CHECK(hit);
  CHECK(f1b->get() == f1->get());
  CHECK(cache.live() == 2);
}

TEST_CASE("released imports are swept as the cache grows") {
  ImportCache<FakeImport> cache;
  int live = 0;
  for (int i = 0; i < 1000; ++i) {
    auto imp = cache.GetOrImport(std::to_string(i), [&]() -> absl::StatusOr<std::shared_ptr<FakeImport>> {
      return std::make_shared<FakeImport>("", &live);
    });
    REQUIRE(imp.ok());  // dropped at once: nothing stays live
  }
  CHECK(live == 0);
  CHECK(cache.live() == 0);
}

}  // namespace
}  // namespace ferry
