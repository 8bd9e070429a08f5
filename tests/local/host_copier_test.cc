// HostCopier: node-local copies between real shared-memory regions, on its own threads.
#include "agent/local/host_copier.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "tests/testing/host_region.h"

namespace ferry {
namespace {

using testing::MemfdRegion;

void Fill(Region& r, uint32_t seed) {
  std::mt19937 rng(seed);
  for (uint64_t i = 0; i < r.size(); ++i) r.data()[i] = static_cast<uint8_t>(rng());
}

std::shared_ptr<Transfer> MakeTransfer(uint64_t id, std::shared_ptr<Region> src, std::shared_ptr<Region> dst,
                                       std::vector<CopyChunk> chunks, absl::Duration deadline = absl::Seconds(10)) {
  auto t = std::make_shared<Transfer>();
  t->id = id;
  t->src = std::move(src);
  t->dst = std::move(dst);
  for (const CopyChunk& c : chunks) t->plan.total_bytes += c.length;
  t->plan.chunks = std::move(chunks);
  t->submitted = absl::Now();
  t->deadline = t->submitted + deadline;
  return t;
}

// Collects the statuses of submitted transfers; every wait is bounded.
class Results {
 public:
  TransferExecutor::Done Callback() {
    return [this](absl::Status s) {
      absl::MutexLock lock(&mu_);
      statuses_.push_back(std::move(s));
    };
  }
  std::vector<absl::Status> Await(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return statuses_.size() >= n; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(30));
    return statuses_;
  }

 private:
  absl::Mutex mu_;
  std::vector<absl::Status> statuses_ ABSL_GUARDED_BY(mu_);
};

TEST_CASE("every chunk of a plan lands byte for byte, and nothing else is touched") {
  auto src = MemfdRegion(1, 1 << 16);
  auto dst = MemfdRegion(2, 1 << 16);
  Fill(*src, 1);
  std::vector<CopyChunk> chunks = {{0, 4096, 100}, {8192, 0, 4096}, {60000, 30000, 5536}};
  Results results;
  {
    HostCopier copier(2);
    copier.Submit(MakeTransfer(7, src, dst, chunks), results.Callback());
    std::vector<absl::Status> done = results.Await(1);
    REQUIRE(done.size() == 1);
    CHECK(done[0].ok());
  }
  std::vector<uint8_t> want(dst->size(), 0);
  for (const CopyChunk& c : chunks) memcpy(want.data() + c.dst_offset, src->data() + c.src_offset, c.length);
  CHECK(memcmp(dst->data(), want.data(), want.size()) == 0);
}

TEST_CASE("a transfer past its deadline fails with DEADLINE_EXCEEDED") {
  auto src = MemfdRegion(1, 1 << 16);
  auto dst = MemfdRegion(2, 1 << 16);
  Results results;
  HostCopier copier(1);
  copier.Submit(MakeTransfer(1, src, dst, {{0, 0, 64}}, absl::ZeroDuration() - absl::Seconds(1)), results.Callback());
  std::vector<absl::Status> done = results.Await(1);
  REQUIRE(done.size() == 1);
  CHECK(absl::IsDeadlineExceeded(done[0]));
  CHECK(dst->data()[0] == 0);
}

// A pod may keep several writes to the same bytes in flight (the Python queue test posts
// eight 8-byte writes to offset 0). The outcome is the pod's business, as with two RDMA
// writes; the agent must finish them all and stay clean under TSan, which sees the
// copier threads' memcpy (CI's tsan configuration runs this test).
TEST_CASE("overlapping transfers on several copier threads all complete") {
  auto dst = MemfdRegion(100, 1 << 20);
  std::vector<std::shared_ptr<Region>> sources;
  for (int i = 0; i < 4; ++i) {
    sources.push_back(MemfdRegion(i + 1, 1 << 20));
    memset(sources.back()->data(), 'a' + i, sources.back()->size());
  }
  constexpr int kTransfers = 64;
  Results results;
  {
    HostCopier copier(4);
    for (int i = 0; i < kTransfers; ++i) {
      copier.Submit(MakeTransfer(i, sources[i % sources.size()], dst, {{0, 0, 1 << 20}}), results.Callback());
    }
    std::vector<absl::Status> done = results.Await(kTransfers);
    REQUIRE(done.size() == kTransfers);
    for (const absl::Status& s : done) CHECK(s.ok());
  }
  // Every byte came from some source: nothing torn below a byte, nothing invented.
  for (uint64_t i = 0; i < dst->size(); i += 4093) {
    CHECK((dst->data()[i] >= 'a' && dst->data()[i] < 'a' + static_cast<int>(sources.size())));
  }
}

}  // namespace
}  // namespace ferry
