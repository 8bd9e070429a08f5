#include "agent/common/event_queue.h"

#include <catch2/catch.hpp>
#include <thread>
#include <vector>

namespace ferry {
namespace {

TEST_CASE("EventQueue drops past its capacity and after Close, and counts what it dropped") {
  EventQueue<int> q(2);
  CHECK(q.Push(1));
  CHECK(q.Push(2));
  CHECK_FALSE(q.Push(3));
  CHECK(q.Pop(absl::ZeroDuration()) == 1);
  q.Close();
  CHECK_FALSE(q.Push(4));
  CHECK(q.Pop(absl::ZeroDuration()) == 2);  // what was queued before Close still comes out
  CHECK_FALSE(q.Pop(absl::ZeroDuration()).has_value());
  CHECK(q.dropped() == 2);
}

TEST_CASE("EventQueue with a byte bound drops what would pass it, and frees the bytes of what is taken") {
  EventQueue<std::string> q({/*events=*/100, /*bytes=*/10}, [](const std::string& e) { return e.size(); });
  CHECK(q.Push("abcd"));
  CHECK(q.Push("efgh"));
  CHECK_FALSE(q.Push("ijk"));  // 11 bytes
  CHECK(q.Push("ij"));         // exactly 10
  CHECK(q.Push(""));           // costs nothing by this cost function
  CHECK(q.Pop(absl::ZeroDuration()) == "abcd");
  CHECK(q.Push("klmn"));
  CHECK(q.dropped() == 1);
}

TEST_CASE("EventQueue keeps one sender's events to its share, so others still get in") {
  EventQueue<std::string> q({/*events=*/8, /*bytes=*/100, /*sender_events=*/3, /*sender_bytes=*/10},
                            [](const std::string& e) { return e.size(); });
  constexpr uint64_t kFlooder = 7, kOther = 8;
  CHECK(q.Push("a", kFlooder));
  CHECK(q.Push("b", kFlooder));
  CHECK(q.Push("c", kFlooder));
  CHECK_FALSE(q.Push("d", kFlooder));          // its 3 events
  CHECK(q.Push("x", kOther));                  // another sender's room is its own
  CHECK_FALSE(q.Push("0123456789a", kOther));  // past a sender's 10 bytes
  CHECK(q.Push("unshared", 0));                // sender 0: only the queue's bounds
  CHECK(q.Pop(absl::ZeroDuration()) == "a");
  CHECK(q.Push("d", kFlooder));  // taking one of its events gives its room back
  CHECK(q.dropped() == 2);
  for (int i = 0; i < 4; ++i) q.Pop(absl::ZeroDuration());
  CHECK(q.Pop(absl::ZeroDuration()) == "d");
  CHECK(q.Push("efgh", kFlooder));  // all of its events taken: a fresh share
}

TEST_CASE("EventQueue marks the next event it takes with how many it dropped before it") {
  // Events are (value, lost before it); a sink that refuses while full, then takes.
  using Event = std::pair<int, uint64_t>;
  EventQueue<Event> q(2, [](Event& e, uint64_t lost) { e.second = lost; });
  for (int i = 0; i < 5; ++i) q.Push({i, 0});  // 0 and 1 queued, 2..4 dropped
  CHECK(q.Pop(absl::ZeroDuration()) == Event{0, 0});
  CHECK(q.Push({5, 0}));  // the first taken after the drops
  CHECK(q.Push({6, 0}) == false);
  CHECK(q.Pop(absl::ZeroDuration()) == Event{1, 0});
  CHECK(q.Pop(absl::ZeroDuration()) == Event{5, 3});
  CHECK(q.Push({7, 0}));
  CHECK(q.Pop(absl::ZeroDuration()) == Event{7, 1});  // 6
  std::vector<Event> got;
  q.SetSink([&](const Event& e) {
    got.push_back(e);
    return true;
  });
  CHECK(q.Push({8, 0}));  // straight to the sink, nothing lost since 7
  CHECK(got == std::vector<Event>{{8, 0}});
  CHECK(q.dropped() == 4);
}

// A sink with room for `room` events at a time, like an inbox ring the client empties.
struct Ring {
  size_t room;
  std::vector<int> got;
  bool Take(int v) {
    if (got.size() >= room) return false;
    got.push_back(v);
    return true;
  }
};

TEST_CASE("EventQueue hands events to its sink on the producer's thread, in order, across a full sink") {
  EventQueue<int> q(16);
  Ring ring{3, {}};
  q.SetSink([&](const int& v) { return ring.Take(v); });
  for (int i = 0; i < 5; ++i) CHECK(q.Push(i));
  // 0-2 went straight to the sink; 3 and 4 wait for room.
  CHECK(ring.got == std::vector<int>{0, 1, 2});
  CHECK(q.DrainToSink(absl::ZeroDuration()) == 2);
  ring.room = 4;
  // Room again, but 3 and 4 still wait: a new event may not overtake them.
  CHECK(q.Push(5));
  CHECK(ring.got == std::vector<int>{0, 1, 2});
  CHECK(q.DrainToSink(absl::ZeroDuration()) == 2);  // 3 went; 4 and 5 wait
  ring.room = 100;
  CHECK(q.DrainToSink(absl::ZeroDuration()) == 0);
  CHECK(q.Push(6));  // nothing waits: straight to the sink again
  CHECK(ring.got == std::vector<int>{0, 1, 2, 3, 4, 5, 6});
  CHECK(q.dropped() == 0);
}

TEST_CASE("EventQueue never calls a detached sink, and keeps events for Pop without one") {
  EventQueue<int> q(16);
  Ring ring{100, {}};
  q.SetSink([&](const int& v) { return ring.Take(v); });
  CHECK(q.Push(1));
  q.SetSink(nullptr);
  CHECK(q.Push(2));
  CHECK(q.DrainToSink(absl::ZeroDuration()) == 1);
  CHECK(ring.got == std::vector<int>{1});
  CHECK(q.Pop(absl::ZeroDuration()) == 2);
}

TEST_CASE("EventQueue's sink sees every event of concurrent producers once, each producer's in order") {
  EventQueue<int> q(1 << 16);
  Ring ring{1 << 20, {}};  // called under the queue's lock: no lock of its own
  q.SetSink([&](const int& v) { return ring.Take(v); });
  constexpr int kProducers = 4, kEach = 5000;
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&q, p] {
      for (int i = 0; i < kEach; ++i) q.Push(p * kEach + i);
    });
  }
  for (std::thread& t : producers) t.join();
  REQUIRE(ring.got.size() == size_t{kProducers * kEach});
  std::vector<int> next(kProducers, 0);
  for (int v : ring.got) {
    const int p = v / kEach;
    REQUIRE(v % kEach == next[p]);
    ++next[p];
  }
}

TEST_CASE("EventQueue's DrainToSink waits for an event or Close, at most its timeout") {
  EventQueue<int> q(16);
  Ring ring{100, {}};
  const absl::Time start = absl::Now();
  CHECK(q.DrainToSink(absl::Milliseconds(20)) == 0);  // no sink, nothing: times out
  CHECK(absl::Now() - start >= absl::Milliseconds(20));
  CHECK(q.Push(7));  // no sink yet: it waits in the queue
  q.SetSink([&](const int& v) { return ring.Take(v); });
  CHECK(q.DrainToSink(absl::Seconds(10)) == 0);
  CHECK(ring.got == std::vector<int>{7});
  std::thread closer([&q] {
    absl::SleepFor(absl::Milliseconds(10));
    q.Close();
  });
  CHECK(q.DrainToSink(absl::Seconds(10)) == 0);  // woken by Close, not the timeout
  CHECK(q.closed());
  closer.join();
}

}  // namespace
}  // namespace ferry
