#include "agent/common/ring_queue.h"

#include <catch2/catch.hpp>
#include <deque>
#include <memory>
#include <random>

namespace ferry {
namespace {

TEST_CASE("RingQueue keeps first-in-first-out order across wrap-around and growth, like std::deque") {
  RingQueue<int> ring;
  std::deque<int> model;
  std::mt19937 rng(7);
  int next = 0;
  for (int step = 0; step < 100000; ++step) {
    if (model.empty() || rng() % 3 != 0) {
      ring.push_back(next);
      model.push_back(next++);
    } else {
      REQUIRE(ring.front() == model.front());
      ring.pop_front();
      model.pop_front();
    }
    REQUIRE(ring.size() == model.size());
  }
  std::vector<int> seen;
  ring.ForEach([&](int v) { seen.push_back(v); });
  CHECK(seen == std::vector<int>(model.begin(), model.end()));
}

TEST_CASE("RingQueue keeps its capacity once drained, and drops what a popped element holds") {
  RingQueue<std::shared_ptr<int>> ring;
  auto held = std::make_shared<int>(1);
  for (int i = 0; i < 100; ++i) ring.push_back(held);
  const size_t capacity = ring.capacity();
  CHECK(capacity >= 100);
  CHECK(held.use_count() == 101);
  while (!ring.empty()) ring.pop_front();
  CHECK(held.use_count() == 1);
  for (int i = 0; i < 100; ++i) ring.push_back(held);
  CHECK(ring.capacity() == capacity);  // no allocation the second time
  ring.clear();
  CHECK(ring.empty());
  CHECK(held.use_count() == 1);
}

}  // namespace
}  // namespace ferry
