// write_windows_bench: what the receiving agent's window table costs a decode step that
// pulls N requests at once with write windows on (FerryConnector's write_windows): N
// windows opened, each over one request's blocks in every layer half of a KV cache
// (a Llama-3-8B-shaped cache: 32 layers as 64 regions, K and V halves, random distinct
// blocks per request, as vLLM hands them out), every part of each request's write
// admitted, then the N closed. The baseline in the same run is one request alone (N = 1):
// a step's cost per request should stay near it however many requests share the step.
//
//   bazel run -c opt //tools/bench:write_windows_bench -- [--rounds=20]
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "agent/memory/region_table.h"
#include "agent/memory/write_windows.h"

namespace ferry {
namespace {

constexpr uint64_t kSession = 1;
constexpr int kRegions = 64;           // 32 layers' K and V
constexpr uint64_t kBlocks = 4096;     // blocks per half
constexpr uint64_t kBlockBytes = 256;  // the table's cost is in ranges, not bytes

std::vector<ByteSpan> Ranges(const std::vector<uint64_t>& blocks) {
  std::vector<ByteSpan> out;
  for (int half = 0; half < 2; ++half) {
    for (uint64_t b : blocks) out.push_back({(half * kBlocks + b) * kBlockBytes, kBlockBytes});
  }
  return out;
}

// One step: `requests` windows of `blocks` blocks each opened, each admitted once per
// region (its write's parts), then closed. Returns microseconds for the step.
double Step(WriteWindows& windows, const std::vector<uint64_t>& region_ids, int requests, int blocks,
            std::mt19937_64& rng) {
  std::vector<uint64_t> ids(kBlocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<std::vector<ByteSpan>> ranges;
  for (int r = 0; r < requests; ++r) {
    std::vector<uint64_t> mine(ids.begin() + r * blocks, ids.begin() + (r + 1) * blocks);
    std::sort(mine.begin(), mine.end());
    ranges.push_back(Ranges(mine));
  }
  const absl::Time start = absl::Now();
  std::vector<std::shared_ptr<const WriteWindow>> open;
  for (int r = 0; r < requests; ++r) {
    auto w = windows.Open(kSession, {region_ids, ranges[r], {}, absl::Seconds(30)});
    if (!w.ok()) {
      fprintf(stderr, "Open: %s\n", std::string(w.status().message()).c_str());
      exit(1);
    }
    open.push_back(*w);
  }
  for (const auto& w : open) {
    for (uint64_t id : region_ids) {
      auto admitted = windows.Admit(w->id(), w->token(), id);
      if (!admitted.ok() || !admitted->window().Covers(w->ranges().front().offset, kBlockBytes)) {
        fprintf(stderr, "Admit failed\n");
        exit(1);
      }
    }
  }
  for (const auto& w : open) {
    if (!windows.Close(w->id(), kSession, absl::ZeroDuration()).ok()) exit(1);
  }
  return absl::ToDoubleMicroseconds(absl::Now() - start);
}

int Main(int argc, char** argv) {
  int rounds = 20;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--rounds=", 0) == 0) {
      rounds = std::max(1, atoi(a.c_str() + 9));
    } else {
      fprintf(stderr, "usage: write_windows_bench [--rounds=N]\n");
      return 2;
    }
  }
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);  // as ferryd runs (ferryd.cc)
  RegionTable regions;
  WriteWindows windows(&regions, nullptr);
  std::vector<uint64_t> region_ids;
  for (int i = 0; i < kRegions; ++i) {
    int fd = memfd_create("ferry-bench-region", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0 || ftruncate(fd, 2 * kBlocks * kBlockBytes) != 0) return 1;
    auto backing = MapHostFd(fd, 0, 2 * kBlocks * kBlockBytes);
    if (!backing.ok()) return 1;
    auto region = std::make_shared<Region>(regions.NextId(), kSession, Token::Random(), std::move(*backing));
    region->set_write_windows(true);
    region_ids.push_back(region->id());
    if (!regions.Insert(region).ok()) return 1;
  }
  std::mt19937_64 rng(1);
  printf("# write windows of one decode step: %d regions (K and V of 32 layers), %d rounds, medians\n", kRegions,
         rounds);
  printf("# %8s %8s %12s %14s %10s\n", "requests", "blocks", "step_us", "per_request_us", "vs_alone");
  for (int blocks : {16, 64}) {
    double alone = 0;
    for (int requests : {1, 16, 64}) {
      if (requests * blocks > static_cast<int>(kBlocks)) continue;
      std::vector<double> t;
      for (int r = 0; r < rounds; ++r) t.push_back(Step(windows, region_ids, requests, blocks, rng));
      std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
      const double step = t[t.size() / 2], per = step / requests;
      if (requests == 1) alone = per;
      printf("  %8d %8d %12.1f %14.2f %10.2f\n", requests, blocks, step, per, per / alone);
    }
  }
  return 0;
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) { return ferry::Main(argc, argv); }
