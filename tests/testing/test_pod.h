// TestPod: a stand-in for a workload pod inside a test — a session with an agent and
// one registered host buffer.
//
//   TestPod p = MakePod(agent->socket(), 1 << 20, /*fill=*/0xAB);
//   p.client->Write(p.reg.region_id(), other.reg.region(), {{0, 0, 4096}});
#ifndef FERRY_TESTS_TESTING_TEST_POD_H_
#define FERRY_TESTS_TESTING_TEST_POD_H_

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "client/cpp/ferry_client.h"
#include "client/cpp/write_queue.h"
#include "tests/testing/agent_process.h"

namespace ferry::testing {

struct TestPod {
  std::unique_ptr<Client> client;
  std::unique_ptr<HostBuffer> buf;
  v1::RegisterMemoryResponse reg;
};

// A ferryd with default flags; REQUIREs that it started.
inline std::unique_ptr<AgentProcess> StartAgent() {
  auto a = AgentProcess::Start({});
  INFO(a.status().ToString());
  REQUIRE(a.ok());
  return std::move(*a);
}

// Connects, allocates `size` bytes filled with `fill`, registers them; REQUIREs success.
inline TestPod MakePod(const std::string& socket, uint64_t size, uint8_t fill = 0) {
  TestPod p;
  auto c = Client::Connect(socket);
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  p.client = std::move(*c);
  auto b = HostBuffer::Create(size);
  REQUIRE(b.ok());
  p.buf = std::make_unique<HostBuffer>(std::move(*b));
  memset(p.buf->data(), fill, size);
  auto r = p.client->RegisterHost(*p.buf);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  p.reg = *r;
  return p;
}

// A Write of [src_off, +len) of the pod's region to [dst_off, +len) of `dst`.
inline v1::WriteRequest ChunkWrite(const TestPod& src, const v1::RegionDescriptor& dst, uint64_t src_off,
                                   uint64_t dst_off, uint64_t len) {
  v1::WriteRequest req;
  req.set_src_region_id(src.reg.region_id());
  *req.mutable_dst() = dst;
  v1::Chunk* c = req.mutable_chunks()->add_chunks();
  c->set_src_offset(src_off);
  c->set_dst_offset(dst_off);
  c->set_length(len);
  return req;
}

// Writes all of `sender`'s region into `receiver`'s through a shared-memory write queue,
// in `block`-sized entries landing in reverse block order; REQUIREs that every entry
// completes OK and every block is in place. The last entry asks for a notification with
// `tag` when `notify_last`.
inline void QueueReversedBlocks(TestPod& sender, TestPod& receiver, uint64_t block, uint32_t entries,
                                bool notify_last = false, uint64_t tag = 0) {
  auto q = WriteQueue::Create(*sender.client, {receiver.reg.region()}, entries);
  INFO(q.status().ToString());
  REQUIRE(q.ok());
  const uint64_t n = sender.buf->size() / block;
  for (uint64_t i = 0; i < n; ++i) {
    WriteQueue::Entry e;
    e.src_region = sender.reg.region_id();
    e.src_offset = i * block;
    e.dst_offset = (n - 1 - i) * block;
    e.length = block;
    e.user_data = i;
    e.notify = notify_last && i == n - 1;
    e.tag = tag;
    REQUIRE((*q)->Post(e).ok());  // `entries` must hold them all
  }
  std::vector<WriteQueue::Completion> done;
  for (absl::Time end = absl::Now() + absl::Seconds(30); done.size() < n && absl::Now() < end;) {
    (*q)->Reap(&done, n, absl::Milliseconds(200));
  }
  REQUIRE(done.size() == n);
  for (const auto& c : done) {
    INFO(c.status.ToString());
    REQUIRE(c.status.ok());
  }
  for (uint64_t i = 0; i < n; ++i) {
    REQUIRE(memcmp(receiver.buf->data() + (n - 1 - i) * block, sender.buf->data() + i * block, block) == 0);
  }
}

// Fills [p, p + n) with a reproducible random pattern.
inline void FillRandom(uint8_t* p, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < n; i += 8) {
    uint64_t v = rng();
    memcpy(p + i, &v, std::min<size_t>(8, n - i));
  }
}

// The ids 0..n-1 in a reproducible random order (a paged write's scattered blocks).
template <typename Id = uint32_t>
std::vector<Id> ShuffledIds(size_t n, uint64_t seed) {
  std::vector<Id> ids(n);
  std::iota(ids.begin(), ids.end(), Id{0});
  std::shuffle(ids.begin(), ids.end(), std::mt19937_64(seed));
  return ids;
}

}  // namespace ferry::testing

#endif  // FERRY_TESTS_TESTING_TEST_POD_H_
