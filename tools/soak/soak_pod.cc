// soak_pod: random checksummed transfers among pods on several agents, for tools/soak.sh.
//
//   soak_pod --sockets=a.sock,b.sock,c.sock --seconds=600 --pods_per_agent=2
//
// Every pod owns a 4 MiB region split into one slot per writer, so each destination
// byte has a single expected writer and every write can be verified. Each round a pod
// fills its source slot with fresh random bytes, picks a random peer pod (same agent
// or another) and a random form — one Write RPC with a chunk list, a paged Write, or a
// shared-memory queue entry — waits for it, and compares the destination with the
// source. Prints "rounds N ok N failed N corrupt N" lines every 10 s and a final one;
// exits 1 on any corruption or failure.
#include <atomic>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/cpp/ferry_client.h"
#include "client/cpp/write_queue.h"

ABSL_FLAG(std::string, sockets, "", "comma-separated agent sockets");
ABSL_FLAG(int, seconds, 60, "how long to run");
ABSL_FLAG(int, pods_per_agent, 2, "pods (sessions) per agent");

namespace ferry {
namespace {

constexpr uint64_t kSlot = 64 << 10;

struct Pod {
  std::unique_ptr<Client> client;
  HostRegion region;
};

std::atomic<uint64_t> rounds{0}, ok{0}, failed{0}, corrupt{0};

void Run(std::vector<std::unique_ptr<Pod>>& pods, size_t me, absl::Time end) {
  std::mt19937_64 rng(me * 7919 + 1);
  Pod& p = *pods[me];
  const size_t n = pods.size();
  uint8_t* src = p.region.buffer.data() + n * kSlot;  // the slot after the per-writer slots
  std::vector<v1::RegionDescriptor> dsts;
  for (auto& q : pods) dsts.push_back(q->region.descriptor());
  auto queue = WriteQueue::Create(*p.client, dsts, 8);
  if (!queue.ok()) {
    fprintf(stderr, "pod %zu: %s\n", me, queue.status().ToString().c_str());
    ++failed;
    return;
  }
  std::vector<WriteQueue::Completion> done;
  while (absl::Now() < end) {
    const size_t to = rng() % n;
    const uint64_t len = 4096 * (1 + rng() % (kSlot / 4096));
    for (uint64_t i = 0; i < len; i += 8) {
      const uint64_t v = rng();
      memcpy(src + i, &v, 8);
    }
    const uint64_t dst_off = me * kSlot;  // my slot in every pod's region
    absl::Status s;
    switch (rng() % 3) {
      case 0: {
        auto r = p.client->WriteAndWait(
            [&] {
              v1::WriteRequest req;
              req.set_src_region_id(p.region.id());
              *req.mutable_dst() = dsts[to];
              auto* c = req.mutable_chunks()->add_chunks();
              c->set_src_offset(n * kSlot);
              c->set_dst_offset(dst_off);
              c->set_length(len);
              return req;
            }(),
            absl::Seconds(30));
        s = r.ok() ? ResultStatus(*r) : r.status();
        break;
      }
      case 1: {
        std::vector<uint64_t> blocks(len / 4096), dblocks(len / 4096);
        for (size_t b = 0; b < blocks.size(); ++b) {
          blocks[b] = n * kSlot / 4096 + b;
          dblocks[b] = dst_off / 4096 + b;
        }
        auto id = p.client->WriteBlocks(p.region.id(), dsts[to], 4096, blocks, dblocks);
        if (!id.ok()) {
          s = id.status();
          break;
        }
        auto r = p.client->Wait(*id, absl::Seconds(30));
        s = r.ok() ? ResultStatus(*r) : r.status();
        break;
      }
      default: {
        s = (*queue)->Post({p.region.id(), static_cast<uint32_t>(to), n * kSlot, dst_off, len, 1});
        if (!s.ok()) break;
        done.clear();
        if ((*queue)->Reap(&done, 1, absl::Seconds(30)) != 1) {
          s = absl::DeadlineExceededError("no queue completion in 30 s");
          break;
        }
        s = done[0].status;
      }
    }
    ++rounds;
    if (!s.ok()) {
      fprintf(stderr, "pod %zu -> %zu: %s\n", me, to, s.ToString().c_str());
      ++failed;
      continue;
    }
    if (memcmp(pods[to]->region.buffer.data() + dst_off, src, len) != 0) {
      fprintf(stderr, "pod %zu -> %zu: CORRUPT %llu bytes at %llu\n", me, to, static_cast<unsigned long long>(len),
              static_cast<unsigned long long>(dst_off));
      ++corrupt;
    } else {
      ++ok;
    }
  }
}

int Main() {
  std::vector<std::string> sockets = absl::StrSplit(absl::GetFlag(FLAGS_sockets), ',', absl::SkipEmpty());
  const int per_agent = absl::GetFlag(FLAGS_pods_per_agent);
  std::vector<std::unique_ptr<Pod>> pods;
  const size_t n = sockets.size() * per_agent;
  for (const std::string& sock : sockets) {
    for (int i = 0; i < per_agent; ++i) {
      auto c = Client::Connect(sock);
      if (!c.ok()) {
        fprintf(stderr, "soak_pod: %s\n", c.status().ToString().c_str());
        return 1;
      }
      auto r = (*c)->AllocateHost((n + 1) * kSlot);
      if (!r.ok()) {
        fprintf(stderr, "soak_pod: %s\n", r.status().ToString().c_str());
        return 1;
      }
      auto p = std::make_unique<Pod>(Pod{std::move(*c), std::move(*r)});
      pods.push_back(std::move(p));
    }
  }
  const absl::Time start = absl::Now(), end = start + absl::Seconds(absl::GetFlag(FLAGS_seconds));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < pods.size(); ++i) threads.emplace_back([&, i] { Run(pods, i, end); });
  while (absl::Now() < end) {
    absl::SleepFor(std::min(absl::Seconds(10), end - absl::Now()));
    printf("t=%4.0fs rounds %llu ok %llu failed %llu corrupt %llu\n", absl::ToDoubleSeconds(absl::Now() - start),
           static_cast<unsigned long long>(rounds.load()), static_cast<unsigned long long>(ok.load()),
           static_cast<unsigned long long>(failed.load()), static_cast<unsigned long long>(corrupt.load()));
    fflush(stdout);
  }
  for (auto& t : threads) t.join();
  printf("final rounds %llu ok %llu failed %llu corrupt %llu\n", static_cast<unsigned long long>(rounds.load()),
         static_cast<unsigned long long>(ok.load()), static_cast<unsigned long long>(failed.load()),
         static_cast<unsigned long long>(corrupt.load()));
  return failed.load() == 0 && corrupt.load() == 0 ? 0 : 1;
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ferry::Main();
}
