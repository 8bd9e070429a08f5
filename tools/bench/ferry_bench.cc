// ferry_bench: the ferry side of tools/bench.sh.
//
//   ferry_bench receive --socket=S --dir=D --size=BYTES    registers, publishes descriptor
//   ferry_bench send --socket=S --dir=D --sizes=... --count=N --window=W --layout=contiguous|paged
//   ferry_bench latency --socket=S --dir=D --iters=K [--api=queue]   8-byte write p50/p99
//   ferry_bench blocks --socket=S --dir=D --blocks=10000 --block=4096 --iters=N   paged chunk rate, submit time
//   ferry_bench control --socket=S --dir=D --iters=K   the local API's 8-byte round trips (p50/p99)
//   ferry_bench stream --socket=S --dir=D --size=B --window=W --seconds=T [--traffic_class=C]
//                                                      W writes of B bytes in flight for T s: "stream bytes s GBps"
//   ferry_bench probe --socket=S --dir=D --size=B --seconds=T [--traffic_class=C]
//                                                      Write+Wait of B bytes, one at a time: "probe n p50_us p99_us"
//
// `send` keeps `window` transfers in flight (Write without waiting; completions from
// WatchCompletions) and prints "size count time_us algbw_GBps" lines. The paged layout
// moves each size as 4 KiB blocks scattered at random on both sides.
#include <sched.h>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <numeric>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/cpp/ferry_client.h"
#include "client/cpp/write_queue.h"

ABSL_FLAG(std::string, socket, "/run/ferry/ferry.sock", "agent socket");
ABSL_FLAG(std::string, dir, "/tmp", "shared directory");
ABSL_FLAG(uint64_t, size, 64 << 20, "receive: region size");
ABSL_FLAG(std::string, sizes, "4096,65536,1048576,16777216,67108864", "send: sizes");
ABSL_FLAG(int, count, 50, "send: transfers per size (capped at --row_bytes per size)");
ABSL_FLAG(uint64_t, row_bytes, 1ull << 30, "send: most bytes one size's row moves");
ABSL_FLAG(int, window, 16, "send: transfers in flight");
ABSL_FLAG(bool, notify, false, "send: each write notifies the receiver (payload \"ferry_bench\")");
ABSL_FLAG(std::string, layout, "contiguous", "send: contiguous or paged");
ABSL_FLAG(std::string, api, "rpc", "send: rpc (Write + WatchCompletions) or queue (WriteQueue, contiguous only)");
ABSL_FLAG(int, iters, 1000, "latency, blocks: iterations");
ABSL_FLAG(int, reap_min, 0,
          "send --api=queue: Reap waits for this many completions (0: 1 when Reap polls, window / 2 when it sleeps)");
ABSL_FLAG(int, reap_spin_us, -1,
          "--api=queue (send, latency): Reap polls the ring this long before it sleeps (-1: 1000 when this process "
          "may run on 2+ CPUs, as the raw sender polls its CQ; else 0, so as not to take the agent's core)");
ABSL_FLAG(double, seconds, 5, "stream, probe: how long");
ABSL_FLAG(std::string, traffic_class, "", "stream, probe: latency, bulk or background (empty: the pod's default)");
ABSL_FLAG(int, blocks, 10000, "blocks: block count");
ABSL_FLAG(int, block, 4096, "blocks: block size");
ABSL_FLAG(bool, varint_ids, false, "paged requests carry their block ids as varints, not packed (the form before)");

namespace {

int Fail(const absl::Status& s) {
  fprintf(stderr, "ferry_bench: %s\n", s.ToString().c_str());
  return 1;
}

ferry::v1::RegionDescriptor LoadDescriptor() {
  std::ifstream in(absl::GetFlag(FLAGS_dir) + "/descriptor", std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  ferry::v1::RegionDescriptor d;
  d.ParseFromString(ss.str());
  return d;
}

struct Sender {
  std::unique_ptr<ferry::Client> client;
  ferry::HostRegion src;
  uint64_t region = 0;
  ferry::v1::RegionDescriptor dst;
};

absl::StatusOr<Sender> Connect(uint64_t size) {
  auto c = ferry::Client::Connect(absl::GetFlag(FLAGS_socket));
  if (!c.ok()) return c.status();
  auto r = (*c)->AllocateHost(size);
  if (!r.ok()) return r.status();
  const uint64_t id = r->id();
  return Sender{std::move(*c), std::move(*r), id, LoadDescriptor()};
}

// A paged layout of `block`-byte blocks, its ids in the form --varint_ids says.
void SetPagedIds(uint64_t block, const std::vector<uint64_t>& src, const std::vector<uint64_t>& dst,
                 ferry::v1::PagedChunks* p) {
  p->set_block_size(block);
  if (!absl::GetFlag(FLAGS_varint_ids)) return ferry::SetBlockIds(src, dst, p);
  p->mutable_src_blocks()->Add(src.begin(), src.end());
  p->mutable_dst_blocks()->Add(dst.begin(), dst.end());
}

ferry::v1::WriteRequest Request(const Sender& s, uint64_t size, bool paged, std::mt19937_64& rng) {
  ferry::v1::WriteRequest req;
  req.set_src_region_id(s.region);
  *req.mutable_dst() = s.dst;
  if (absl::GetFlag(FLAGS_notify)) {
    req.set_notify(true);
    req.set_notify_payload("ferry_bench");
  }
  if (!paged) {
    req.mutable_chunks()->add_chunks()->set_length(size);
    return req;
  }
  const uint64_t block = 4096, n = std::max<uint64_t>(1, size / block);
  std::vector<uint64_t> src(s.src.buffer.size() / block), dst(s.dst.size() / block);
  std::iota(src.begin(), src.end(), 0);
  std::iota(dst.begin(), dst.end(), 0);
  std::shuffle(src.begin(), src.end(), rng);
  std::shuffle(dst.begin(), dst.end(), rng);
  src.resize(n);
  dst.resize(n);
  SetPagedIds(block, src, dst, req.mutable_paged());
  return req;
}

// Transfers in one size's row: --count, capped at --row_bytes (at least 4).
int RowCount(uint64_t size) {
  const uint64_t n = std::min<uint64_t>(absl::GetFlag(FLAGS_count), absl::GetFlag(FLAGS_row_bytes) / size);
  return static_cast<int>(std::max<uint64_t>(4, n));
}

// How long Reap polls before it sleeps (--reap_spin_us; -1 picks by the CPUs we may use).
absl::Duration ReapSpin() {
  int spin_us = absl::GetFlag(FLAGS_reap_spin_us);
  if (spin_us < 0) {
    cpu_set_t cpus;
    spin_us = sched_getaffinity(0, sizeof(cpus), &cpus) == 0 && CPU_COUNT(&cpus) >= 2 ? 1000 : 0;
  }
  return absl::Microseconds(spin_us);
}

// The shared-memory queue: `window` writes in flight, each reaped completion replaced;
// per size an untimed warm-up (2 * `window` writes or 64 MiB, whichever is less), as
// fi_write_bench does.
int SendQueue(Sender& s, const std::vector<uint64_t>& sizes, int window) {
  auto q = ferry::WriteQueue::Create(*s.client, {s.dst}, 256);
  if (!q.ok()) return Fail(q.status());
  std::vector<ferry::WriteQueue::Completion> done;
  const absl::Duration spin = ReapSpin();
  const int reap_min = absl::GetFlag(FLAGS_reap_min) > 0 ? absl::GetFlag(FLAGS_reap_min)
                       : spin > absl::ZeroDuration()     ? 1
                                                         : std::max(1, window / 2);
  auto run = [&](uint64_t size, int n) -> absl::Status {
    ferry::WriteQueue::Entry e;
    e.src_region = s.region;
    e.length = size;
    int posted = 0, completed = 0;
    while (completed < n) {
      while (posted < n && posted - completed < window) {
        e.user_data = posted++;
        if (absl::Status st = (*q)->Post(e); !st.ok()) return st;
      }
      done.clear();
      if ((*q)->Reap(&done, 64, absl::Seconds(60), std::min(reap_min, posted - completed), spin) == 0) {
        return absl::DeadlineExceededError("no completion in 60 s");
      }
      for (const auto& c : done) {
        if (!c.status.ok()) return c.status;
      }
      completed += static_cast<int>(done.size());
    }
    return absl::OkStatus();
  };
  for (uint64_t size : sizes) {
    const int n = RowCount(size);
    const int warm_up = static_cast<int>(std::clamp<uint64_t>((64u << 20) / size, 1, 2 * window));
    if (absl::Status st = run(size, warm_up); !st.ok()) return Fail(st);
    absl::Time t0 = absl::Now();
    if (absl::Status st = run(size, n); !st.ok()) return Fail(st);
    double us = absl::ToDoubleMicroseconds(absl::Now() - t0);
    printf("%llu %d %.1f %.3f\n", static_cast<unsigned long long>(size), n, us / n, size * n / us / 1e3);
    fflush(stdout);
  }
  return 0;
}

// Counts a session's completions from its WatchCompletions stream on a reader thread, so
// that a sender can keep a window of writes in flight (`send --api=rpc`, `stream`).
class CompletionWatcher {
 public:
  explicit CompletionWatcher(Sender& s)
      : ctx_(s.client->NewContext(absl::Hours(1))),
        stream_(s.client->stub()->WatchCompletions(ctx_.get(), ferry::v1::WatchCompletionsRequest())),
        reader_([this] {
          ferry::v1::TransferResult r;
          while (stream_->Read(&r)) {
            absl::MutexLock lock(&mu_);
            ++completed_;
            if (r.code() != 0) {
              ++failed_;
              fprintf(stderr, "transfer failed: %s\n", r.message().c_str());
            }
          }
        }) {}
  ~CompletionWatcher() {
    ctx_->TryCancel();
    reader_.join();
  }

  // Waits until at least `n` transfers completed, or `deadline`; returns the count then.
  int AwaitCompleted(int n, absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    auto reached = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return completed_ >= n; };
    mu_.AwaitWithDeadline(absl::Condition(&reached), deadline);
    return completed_;
  }
  int failed() {
    absl::MutexLock lock(&mu_);
    return failed_;
  }

 private:
  absl::Mutex mu_;
  int completed_ ABSL_GUARDED_BY(mu_) = 0;
  int failed_ ABSL_GUARDED_BY(mu_) = 0;
  std::unique_ptr<grpc::ClientContext> ctx_;
  std::unique_ptr<grpc::ClientReader<ferry::v1::TransferResult>> stream_;
  std::thread reader_;  // last: starts once the members it reads exist
};

int Send() {
  std::vector<uint64_t> sizes;
  for (absl::string_view v : absl::StrSplit(absl::GetFlag(FLAGS_sizes), ',')) {
    uint64_t x;
    if (absl::SimpleAtoi(v, &x)) sizes.push_back(x);
  }
  auto s = Connect(*std::max_element(sizes.begin(), sizes.end()));
  if (!s.ok()) return Fail(s.status());
  const bool paged = absl::GetFlag(FLAGS_layout) == "paged";
  const int window = absl::GetFlag(FLAGS_window);
  if (absl::GetFlag(FLAGS_api) == "queue") return SendQueue(*s, sizes, window);
  std::mt19937_64 rng(1);

  // Completions arrive on one stream; their count lets the sender keep `window` in flight.
  CompletionWatcher watcher(*s);
  // Warm up: connection, handshake, region open.
  if (auto w = s->client->WriteAndWait(Request(*s, 4096, false, rng), absl::Seconds(30)); !w.ok())
    return Fail(w.status());
  watcher.AwaitCompleted(1, absl::Now() + absl::Seconds(10));
  int base = 1;
  for (uint64_t size : sizes) {
    const int n = RowCount(size);
    std::vector<ferry::v1::WriteRequest> reqs;
    for (int i = 0; i < std::min(n, 8); ++i) reqs.push_back(Request(*s, size, paged, rng));
    absl::Time t0 = absl::Now();
    const absl::Time stuck = t0 + absl::Minutes(5);
    for (int i = 0; i < n; ++i) {
      if (watcher.AwaitCompleted(base + i - window + 1, stuck) < base + i - window + 1)
        return Fail(absl::DeadlineExceededError("stuck"));
      auto id = s->client->Write(reqs[i % reqs.size()]);
      if (!id.ok()) return Fail(id.status());
    }
    if (watcher.AwaitCompleted(base + n, stuck) < base + n) return Fail(absl::DeadlineExceededError("stuck"));
    double us = absl::ToDoubleMicroseconds(absl::Now() - t0);
    base += n;
    printf("%llu %d %.1f %.3f\n", static_cast<unsigned long long>(size), n, us / n, size * n / us / 1e3);
    fflush(stdout);
  }
  return watcher.failed() == 0 ? 0 : 3;
}

// Median and 99th percentile of `iters` calls of `op` (after 10 warm-up calls), in µs,
// printed as "<name> <p50> <p99>".
absl::Status Measure(const char* name, int iters, const std::function<absl::Status()>& op) {
  std::vector<double> us;
  for (int i = 0; i < iters + 10; ++i) {
    const absl::Time t0 = absl::Now();
    absl::Status st = op();
    if (!st.ok()) return absl::Status(st.code(), absl::StrCat(name, ": ", st.message()));
    if (i >= 10) us.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
  }
  std::sort(us.begin(), us.end());
  printf("%s %.1f %.1f\n", name, us[us.size() / 2], us[us.size() * 99 / 100]);
  fflush(stdout);
  return absl::OkStatus();
}

// One 8-byte write through `q` and its completion.
absl::Status QueueRoundTrip(ferry::WriteQueue& q, uint64_t region, uint64_t user_data, absl::Duration spin,
                            std::vector<ferry::WriteQueue::Completion>& done) {
  done.clear();
  if (absl::Status st = q.Post({region, 0, 0, 0, 8, user_data}); !st.ok()) return st;
  if (q.Reap(&done, 1, absl::Seconds(10), 1, spin) != 1) return absl::DeadlineExceededError("no completion");
  return done[0].status;
}

int Latency() {
  auto s = Connect(4096);
  if (!s.ok()) return Fail(s.status());
  std::mt19937_64 rng(1);
  const ferry::v1::WriteRequest req = Request(*s, 8, false, rng);
  const int iters = absl::GetFlag(FLAGS_iters);
  absl::Status st;
  if (absl::GetFlag(FLAGS_api) == "queue") {
    auto q = ferry::WriteQueue::Create(*s->client, {s->dst}, 8);
    if (!q.ok()) return Fail(q.status());
    std::vector<ferry::WriteQueue::Completion> done;
    const absl::Duration spin = ReapSpin();
    uint64_t n = 0;
    st = Measure("lat8", iters, [&] { return QueueRoundTrip(**q, s->region, n++, spin, done); });
  } else {
    st = Measure("lat8", iters, [&] { return s->client->WriteAndWait(req, absl::Seconds(10)).status(); });
  }
  return st.ok() ? 0 : Fail(st);
}

// The local API's round trips with 8-byte writes (tools/bench.sh control): GetStatus;
// Write + Wait into a region of this agent, into the receiver's (another agent), and
// the same with a notification; the write queue to the receiver.
int Control() {
  auto s = Connect(4096);
  if (!s.ok()) return Fail(s.status());
  auto here = s->client->AllocateHost(4096);
  if (!here.ok()) return Fail(here.status());
  const int iters = absl::GetFlag(FLAGS_iters);
  auto write_wait = [&](const ferry::v1::RegionDescriptor& dst, bool notify) {
    ferry::v1::WriteRequest req;
    req.set_src_region_id(s->region);
    *req.mutable_dst() = dst;
    req.mutable_chunks()->add_chunks()->set_length(8);
    req.set_notify(notify);
    return [&, req] { return s->client->WriteAndWait(req, absl::Seconds(10)).status(); };
  };
  auto q = ferry::WriteQueue::Create(*s->client, {s->dst}, 8);
  if (!q.ok()) return Fail(q.status());
  std::vector<ferry::WriteQueue::Completion> done;
  const absl::Duration spin = ReapSpin();
  uint64_t n = 0;
  auto queue_round_trip = [&] { return QueueRoundTrip(**q, s->region, n++, spin, done); };
  for (absl::Status st :
       {Measure("getstatus", iters, [&] { return s->client->GetStatus().status(); }),
        Measure("local", iters, write_wait(here->descriptor(), false)),
        Measure("remote", iters, write_wait(s->dst, false)), Measure("remote_notify", iters, write_wait(s->dst, true)),
        Measure("queue_remote", iters, queue_round_trip)}) {
    if (!st.ok()) return Fail(st);
  }
  return 0;
}

ferry::v1::TrafficClass ClassFlag() {
  const std::string c = absl::GetFlag(FLAGS_traffic_class);
  if (c == "latency") return ferry::v1::TRAFFIC_CLASS_LATENCY;
  if (c == "bulk") return ferry::v1::TRAFFIC_CLASS_BULK;
  if (c == "background") return ferry::v1::TRAFFIC_CLASS_BACKGROUND;
  return ferry::v1::TRAFFIC_CLASS_UNSPECIFIED;
}

// A write of `size` bytes from the start of the sender's region, in --traffic_class.
ferry::v1::WriteRequest TenantWrite(const Sender& s, uint64_t size) {
  ferry::v1::WriteRequest req;
  req.set_src_region_id(s.region);
  *req.mutable_dst() = s.dst;
  req.mutable_chunks()->add_chunks()->set_length(size);
  req.set_traffic_class(ClassFlag());
  return req;
}

// One tenant of `tools/bench.sh qos`: `window` writes of --size in flight for --seconds
// (Write + WatchCompletions, as `send`); prints the bytes completed and the rate.
int Stream() {
  const uint64_t size = absl::GetFlag(FLAGS_size);
  auto s = Connect(size);
  if (!s.ok()) return Fail(s.status());
  const ferry::v1::WriteRequest req = TenantWrite(*s, size);
  CompletionWatcher watcher(*s);
  const int window = absl::GetFlag(FLAGS_window);
  const absl::Time t0 = absl::Now(), end = t0 + absl::Seconds(absl::GetFlag(FLAGS_seconds));
  int posted = 0;
  while (absl::Now() < end) {
    if (watcher.AwaitCompleted(posted - window + 1, end) < posted - window + 1) break;
    auto id = s->client->Write(req);
    if (!id.ok()) return Fail(id.status());
    ++posted;
  }
  const int done_at_end = watcher.AwaitCompleted(0, end);  // what finished within the run's time
  watcher.AwaitCompleted(posted, absl::Now() + absl::Minutes(2));
  const double secs = absl::ToDoubleSeconds(end - t0);
  printf("stream %llu %.3f %.3f\n", static_cast<unsigned long long>(done_at_end * size), secs,
         done_at_end * size / secs / 1e9);
  return watcher.failed() == 0 ? 0 : 3;
}

// The other tenant of `tools/bench.sh qos`: Write + Wait of --size, one at a time, for
// --seconds; prints the count and the p50 / p99 round trip (all but the first write).
int Probe() {
  const uint64_t size = absl::GetFlag(FLAGS_size);
  auto s = Connect(size);
  if (!s.ok()) return Fail(s.status());
  const ferry::v1::WriteRequest req = TenantWrite(*s, size);
  std::vector<double> us;
  const absl::Time end = absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_seconds));
  for (int i = 0; absl::Now() < end; ++i) {
    const absl::Time t0 = absl::Now();
    auto r = s->client->WriteAndWait(req, absl::Seconds(30));
    if (!r.ok()) return Fail(r.status());
    if (r->code() != 0) return Fail(ferry::ResultStatus(*r));
    if (i > 0) us.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));  // the first opens the region
  }
  if (us.empty()) return Fail(absl::DeadlineExceededError("fewer than two writes finished in --seconds"));
  std::sort(us.begin(), us.end());
  printf("probe %zu %.1f %.1f\n", us.size(), us[us.size() / 2], us[us.size() * 99 / 100]);
  return 0;
}

int Blocks() {
  const uint64_t block = absl::GetFlag(FLAGS_block), n = absl::GetFlag(FLAGS_blocks);
  auto s = Connect(block * n);
  if (!s.ok()) return Fail(s.status());
  std::mt19937_64 rng(2);
  std::vector<uint64_t> src(n), dst(n);
  std::iota(src.begin(), src.end(), 0);
  std::iota(dst.begin(), dst.end(), 0);
  std::shuffle(src.begin(), src.end(), rng);
  std::shuffle(dst.begin(), dst.end(), rng);
  std::vector<double> times, submits;
  for (int i = 0; i <= absl::GetFlag(FLAGS_iters); ++i) {  // the first opens the region
    absl::Time t0 = absl::Now();
    ferry::v1::WriteRequest req;  // built in the loop, as a pod builds each request
    req.set_src_region_id(s->region);
    *req.mutable_dst() = s->dst;
    SetPagedIds(block, src, dst, req.mutable_paged());
    auto id = s->client->Write(req);
    if (!id.ok()) return Fail(id.status());
    absl::Time submitted = absl::Now();
    auto r = s->client->Wait(*id, absl::Seconds(60));
    if (!r.ok() || r->code() != 0) return Fail(r.ok() ? ferry::ResultStatus(*r) : r.status());
    if (i == 0) continue;
    times.push_back(absl::ToDoubleSeconds(absl::Now() - t0));
    submits.push_back(absl::ToDoubleSeconds(submitted - t0));
  }
  std::sort(times.begin(), times.end());
  std::sort(submits.begin(), submits.end());
  double t = times[times.size() / 2];
  printf("blocks %llu %llu %.1f %.0f %.3f %.1f\n", static_cast<unsigned long long>(n),
         static_cast<unsigned long long>(block), t * 1e6, n / t, n * block / t / 1e9,
         submits[submits.size() / 2] * 1e6);
  return 0;
}

int Receive() {
  auto c = ferry::Client::Connect(absl::GetFlag(FLAGS_socket));
  if (!c.ok()) return Fail(c.status());
  auto r = (*c)->AllocateHost(absl::GetFlag(FLAGS_size));
  if (!r.ok()) return Fail(r.status());
  const std::string path = absl::GetFlag(FLAGS_dir) + "/descriptor";
  { std::ofstream(path + ".tmp", std::ios::binary) << r->descriptor().SerializeAsString(); }
  rename((path + ".tmp").c_str(), path.c_str());
  absl::SleepFor(absl::Minutes(30));  // until killed
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2) {
    fprintf(stderr, "usage: ferry_bench receive|send|latency|blocks|control|stream|probe [flags]\n");
    return 2;
  }
  std::string mode = args[1];
  if (mode == "receive") return Receive();
  if (mode == "send") return Send();
  if (mode == "latency") return Latency();
  if (mode == "blocks") return Blocks();
  if (mode == "control") return Control();
  if (mode == "stream") return Stream();
  if (mode == "probe") return Probe();
  return 2;
}
