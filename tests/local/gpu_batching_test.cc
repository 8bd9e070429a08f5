// The GPU lane's batching policy on a CPU: which transfers go to the copy engines or the
// kernel, and which queued ones share a launch or an event, from their shapes alone.
#include "agent/local/gpu_batching.h"

#include <catch2/catch.hpp>
#include <memory>
#include <vector>

#include "tests/testing/host_region.h"

namespace ferry::gpu_batching {
namespace {

constexpr uint64_t kKiB = 1024, kMiB = 1024 * 1024;

// A transfer of `chunks` chunks, `bytes` in all, GPU `src` to GPU `dst` (-1: host).
CopyShape Shape(int src, int dst, uint64_t bytes, size_t chunks, const void* mapping = nullptr) {
  CopyShape s;
  s.src_device = src;
  s.dst_device = dst;
  s.bytes = bytes;
  s.chunks = chunks;
  s.mapping = mapping;
  s.reaches = src >= 0 && dst >= 0;
  return s;
}

TEST_CASE("The kernel moves many small chunks between GPUs it reaches; the copy engines everything else") {
  CHECK(ChooseMethod(Shape(0, 0, 64 * 16 * kKiB, 64)) == CopyMethod::kKernel);
  CHECK(ChooseMethod(Shape(0, 1, 64 * 16 * kKiB, 64)) == CopyMethod::kKernel);
  CHECK(ChooseMethod(Shape(0, 1, 16 * kKiB, 1)) == CopyMethod::kCopyEngine);         // one chunk
  CHECK(ChooseMethod(Shape(0, 1, 2 * 8 * kMiB, 2)) == CopyMethod::kCopyEngine);      // big chunks
  CHECK(ChooseMethod(Shape(-1, 0, 64 * 16 * kKiB, 64)) == CopyMethod::kCopyEngine);  // from host
  CHECK(ChooseMethod(Shape(0, -1, 64 * 16 * kKiB, 64)) == CopyMethod::kCopyEngine);  // to host
  CopyShape unreachable = Shape(0, 1, 64 * 16 * kKiB, 64);
  unreachable.reaches = false;  // an IPC mapping only the other context opened
  CHECK(ChooseMethod(unreachable) == CopyMethod::kCopyEngine);
}

TEST_CASE("A queue's burst of small writes shares one launch, up to the launch's bounds") {
  std::vector<CopyShape> burst(20, Shape(0, 0, 64 * kKiB, 1));
  CHECK(RunEnd(burst, 0) == 20);
  // A failed job ends the run; the next run starts after it.
  burst[7].ok = false;
  CHECK(RunEnd(burst, 0) == 7);
  CHECK(RunEnd(burst, 8) == 20);
  // More chunks than one launch takes.
  std::vector<CopyShape> many(3, Shape(0, 0, 8000 * 4 * kKiB, 8000));
  CHECK(RunEnd(many, 0) == 2);
  CHECK(RunEnd(many, 2) == 3);
}

TEST_CASE("To another GPU, unmapped writes share a launch only up to the peer burst") {
  std::vector<CopyShape> burst(8, Shape(0, 1, 512 * kKiB, 1));
  CHECK(RunEnd(burst, 0) == kPeerBurstBytes / (512 * kKiB));
  // Same-GPU and cross-GPU writes never share a launch.
  std::vector<CopyShape> mixed = {Shape(0, 0, 4 * kKiB, 1), Shape(0, 1, 4 * kKiB, 1)};
  CHECK(RunEnd(mixed, 0) == 1);
}

TEST_CASE("A batch's parts share a launch while they share one block mapping") {
  int mapping = 0, other = 0;
  // A KV handoff: 64 layer halves of 256 blocks of 16 KiB each, one mapping, to another GPU.
  std::vector<CopyShape> parts(64, Shape(0, 1, 256 * 16 * kKiB, 256, &mapping));
  CHECK(RunEnd(parts, 0) == 64);  // the peer-burst cap is for unmapped writes only
  parts[10].mapping = &other;
  CHECK(RunEnd(parts, 0) == 10);
  parts[10].mapping = nullptr;
  CHECK(RunEnd(parts, 0) == 10);
  // Past kLaunchBytes the launch ends.
  std::vector<CopyShape> big(3, Shape(0, 0, 100 * kMiB, 6400, &mapping));
  CHECK(RunEnd(big, 0) == 2);
}

TEST_CASE("Slices of one mapping (requests each through its own write window) have its shape's mapping") {
  auto whole = std::make_shared<PagedIds>();
  whole->block_size = 64;
  whole->src = whole->dst = {0, 1, 2};
  Transfer first, rest, alone;
  for (Transfer* t : {&first, &rest, &alone}) {
    t->src = testing::MemfdRegion(1, 4096);
    t->dst = testing::MemfdRegion(2, 4096);
  }
  first.plan.paged = SlicePagedIds(whole, 0, 1);
  rest.plan.paged = SlicePagedIds(whole, 1, 2);
  alone.plan.paged = whole;
  CHECK(ShapeOf(first, false).mapping == whole.get());
  CHECK(ShapeOf(rest, false).mapping == whole.get());
  CHECK(ShapeOf(alone, false).mapping == whole.get());
}

TEST_CASE("Big single-chunk writes to another GPU are copy calls, a burst of them under one event") {
  CHECK(PeerCopyCall(Shape(0, 1, kMiB, 1)));
  CHECK_FALSE(PeerCopyCall(Shape(0, 1, kMiB - 1, 1)));
  CHECK_FALSE(PeerCopyCall(Shape(0, 0, 4 * kMiB, 1)));  // same GPU: a launch
  CHECK_FALSE(PeerCopyCall(Shape(0, 1, 4 * kMiB, 2)));
  std::vector<CopyShape> calls(6, Shape(0, 1, kMiB, 1));
  CHECK(RunEnd(calls, 0) == 4);  // 4 MiB under one event
  CHECK(RunEnd(calls, 4) == 6);
  calls[1] = Shape(0, 1, 64 * kKiB, 1);  // a small write ends the burst
  CHECK(RunEnd(calls, 0) == 1);
}

TEST_CASE("What cannot share a launch goes alone") {
  std::vector<CopyShape> jobs = {Shape(-1, 0, 4 * kKiB, 1), Shape(-1, 0, 4 * kKiB, 1)};
  CHECK_FALSE(Batchable(jobs[0]));
  CHECK(RunEnd(jobs, 0) == 1);
  // Big copy-engine transfers between GPUs: one call chain each.
  std::vector<CopyShape> big = {Shape(0, 0, 2 * 8 * kMiB, 2), Shape(0, 0, 2 * 8 * kMiB, 2)};
  CHECK_FALSE(Batchable(big[0]));
  CHECK(RunEnd(big, 0) == 1);
}

}  // namespace
}  // namespace ferry::gpu_batching
