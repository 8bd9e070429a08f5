// demo_pod: a stand-in for a serving pod, used by tools/demo.sh.
//
//   demo_pod receive --socket=S --size=N --dir=D   registers N bytes, publishes its
//       RegionDescriptor in D/descriptor, and for every notification checksums the
//       bytes that landed (the first `bytes` of the region, or for the KV tag the
//       chunks listed in D/kv.chunks, in order), writes D/verify.<tag>, and clears the
//       region again.
//   demo_pod send --socket=S --dir=D --sizes=4096,... --api=queue|rpc
//       registers its own buffer, and for each size fills it with fresh random data and
//       writes it into the receiver's region: through the shared-memory write queue with
//       --window writes in flight (as a pod moving KV blocks would), or one Write RPC at
//       a time; the last write of a size notifies after all others landed. Waits for the
//       receiver's checksum and prints a table row.
//   demo_pod kv --socket=S --dir=D   KV-cache handoffs: 32 layers x 64 blocks (1k tokens
//       of a Llama-3-8B-shaped cache, 16-token bf16 blocks, K and V separate), scattered
//       at random over a 128-block pool on both sides, as one Write with a notification,
//       3 times; prints the median handoff time (submit to the receiver notified).
//
// The two processes share nothing but the serialized descriptor and the files in D.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/cpp/ferry_client.h"
#include "client/cpp/write_queue.h"

ABSL_FLAG(std::string, socket, "/run/ferry/ferry.sock", "the local agent's socket");
ABSL_FLAG(std::string, dir, "", "directory shared with the other demo pod");
ABSL_FLAG(uint64_t, size, 64 << 20, "receive: region size");
ABSL_FLAG(std::string, sizes, "4096,65536,1048576,16777216,67108864", "send: transfer sizes");
ABSL_FLAG(std::string, api, "queue", "send: queue (the write queue, --window in flight) or rpc (one Write at a time)");
ABSL_FLAG(int, window, 16, "send --api=queue: writes in flight");
ABSL_FLAG(int, count, 2000, "send --api=queue: writes per size, at most --row_mib MiB and at least 4");
ABSL_FLAG(uint64_t, row_mib, 256, "send --api=queue: most MiB moved per size");
ABSL_FLAG(int, iters, 5, "send --api=rpc: writes per size (timed)");
ABSL_FLAG(int, timeout_s, 120, "give up after this many seconds");

namespace {

uint64_t Checksum(const uint8_t* p, uint64_t n) {  // FNV-1a over 64-bit words
  uint64_t h = 1469598103934665603ull;
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    memcpy(&w, p + i, 8);
    h = (h ^ w) * 1099511628211ull;
  }
  for (; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// The KV handoff's shape: Llama-3-8B (32 layers, 8 KV heads, head dim 128, bf16), 16-token
// blocks, K and V of a layer in two halves of its tensor (FlashAttention's layout), all
// layers in one registered region of kKvPoolBlocks blocks per layer.
constexpr uint64_t kKvLayers = 32, kKvBlockBytes = 16 * 8 * 128 * 2, kKvPoolBlocks = 128, kKvRequestBlocks = 64;
constexpr uint64_t kKvLayerBytes = 2 * kKvPoolBlocks * kKvBlockBytes;
constexpr uint64_t kKvRegionBytes = kKvLayers * kKvLayerBytes;
constexpr int kKvTag = 1000;  // and up: one per handoff
constexpr int kKvHandoffs = 3;

// Checksum of `chunks` (offset, length) of `base`, in order.
uint64_t ChunksChecksum(const uint8_t* base, const std::vector<std::pair<uint64_t, uint64_t>>& chunks) {
  uint64_t h = 0;
  for (const auto& [off, len] : chunks) h = h * 31 + Checksum(base + off, len);
  return h;
}

void WriteFileAtomically(const std::string& path, const std::string& content) {
  { std::ofstream(path + ".tmp") << content; }
  rename((path + ".tmp").c_str(), path.c_str());
}

int Die(const std::string& what, const absl::Status& s) {
  fprintf(stderr, "demo_pod: %s: %s\n", what.c_str(), s.ToString().c_str());
  return 1;
}

int Receive() {
  const std::string dir = absl::GetFlag(FLAGS_dir);
  auto client = ferry::Client::Connect(absl::GetFlag(FLAGS_socket));
  if (!client.ok()) return Die("connect", client.status());
  auto buf = ferry::HostBuffer::Create(absl::GetFlag(FLAGS_size));
  if (!buf.ok()) return Die("allocate", buf.status());
  // Touched once, as a serving engine zeroes its KV cache at start: the rows measure
  // moving bytes, not the receiving node's first page faults.
  memset(buf->data(), 0, buf->size());
  auto reg = (*client)->RegisterHost(*buf);
  if (!reg.ok()) return Die("register", reg.status());

  auto ctx = (*client)->NewContext(absl::Seconds(absl::GetFlag(FLAGS_timeout_s)));
  auto stream = (*client)->stub()->WatchNotifications(ctx.get(), ferry::v1::WatchNotificationsRequest());
  // Publish the descriptor only once the notification stream is open.
  WriteFileAtomically(dir + "/descriptor", reg->region().SerializeAsString());
  ferry::v1::Notification n;
  while (stream->Read(&n)) {
    uint64_t crc;
    if (n.tag() >= kKvTag) {  // scattered blocks: the sender lists where they went
      std::vector<std::pair<uint64_t, uint64_t>> chunks;
      std::ifstream list(dir + "/kv.chunks");
      for (uint64_t off, len; list >> off >> len;) chunks.emplace_back(off, len);
      crc = ChunksChecksum(buf->data(), chunks);
      for (const auto& [off, len] : chunks) memset(buf->data() + off, 0, len);
    } else {
      crc = Checksum(buf->data(), n.bytes());
      memset(buf->data(), 0, n.bytes());  // the next size must bring its own bytes
    }
    WriteFileAtomically(absl::StrFormat("%s/verify.%d", dir, n.tag()), absl::StrFormat("%d %d\n", n.bytes(), crc));
  }
  return 0;
}

// A sending pod: its session, a registered buffer and the receiver's descriptor.
struct Sender {
  std::unique_ptr<ferry::Client> client;
  ferry::HostBuffer buf;
  uint64_t region = 0;
  ferry::v1::RegionDescriptor dst;
};

absl::StatusOr<Sender> Connect(uint64_t bytes) {
  auto client = ferry::Client::Connect(absl::GetFlag(FLAGS_socket));
  if (!client.ok()) return client.status();
  auto buf = ferry::HostBuffer::Create(bytes);
  if (!buf.ok()) return buf.status();
  auto reg = (*client)->RegisterHost(*buf);
  if (!reg.ok()) return reg.status();
  std::ifstream in(absl::GetFlag(FLAGS_dir) + "/descriptor");
  std::stringstream wire;
  wire << in.rdbuf();
  ferry::v1::RegionDescriptor dst;
  if (!dst.ParseFromString(wire.str())) return absl::InvalidArgumentError("the receiver's descriptor is unparsable");
  return Sender{std::move(*client), std::move(*buf), reg->region_id(), std::move(dst)};
}

std::string VerifyPath(int tag) { return absl::StrFormat("%s/verify.%d", absl::GetFlag(FLAGS_dir), tag); }

// Waits for the receiver's checksum of `tag`; true if it saw `bytes` bytes summing to `want`.
bool Verified(int tag, uint64_t bytes, uint64_t want) {
  const std::string verify = VerifyPath(tag);
  absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (access(verify.c_str(), R_OK) != 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(2));
  uint64_t got_bytes = 0, got = 0;
  std::ifstream(verify) >> got_bytes >> got;
  return got_bytes == bytes && got == want;
}

// `count` writes of `size` bytes through the write queue, `window` in flight; with
// `tag` != 0 the last one, posted once all others landed, notifies with it. Returns the
// seconds taken.
absl::StatusOr<double> QueueWrites(Sender& s, uint64_t size, int count, int tag) {
  const int window = std::max(1, absl::GetFlag(FLAGS_window));
  auto q = ferry::WriteQueue::Create(*s.client, {s.dst}, 2 * window, absl::GetFlag(FLAGS_timeout_s) * 1000);
  if (!q.ok()) return q.status();
  std::vector<ferry::WriteQueue::Completion> done;
  auto drain = [&](int until_inflight) -> absl::Status {
    while (static_cast<int>((*q)->inflight()) > until_inflight) {
      done.clear();
      if ((*q)->Reap(&done, 64, absl::Seconds(absl::GetFlag(FLAGS_timeout_s))) == 0) {
        return absl::DeadlineExceededError("no write completed in time");
      }
      for (const auto& c : done) {
        if (!c.status.ok()) return c.status;
      }
    }
    return absl::OkStatus();
  };
  ferry::WriteQueue::Entry e{.src_region = s.region, .length = size};
  absl::Time t0 = absl::Now();
  for (int i = 0; i < count; ++i) {
    const bool last = i == count - 1;
    if (absl::Status st = drain(last ? 0 : window - 1); !st.ok()) return st;
    e.notify = last && tag != 0;
    e.tag = tag;
    e.user_data = i;
    if (absl::Status st = (*q)->Post(e); !st.ok()) return st;
  }
  if (absl::Status st = drain(0); !st.ok()) return st;
  return absl::ToDoubleSeconds(absl::Now() - t0);
}

// One Write RPC at a time, `count` times; the last notifies. Returns the median seconds
// of one.
absl::StatusOr<double> RpcWrites(Sender& s, uint64_t size, int count, int tag) {
  std::vector<double> times;
  for (int i = 0; i < count; ++i) {
    ferry::v1::WriteRequest req;
    req.set_src_region_id(s.region);
    *req.mutable_dst() = s.dst;
    req.mutable_chunks()->add_chunks()->set_length(size);
    req.set_notify(i == count - 1);
    req.set_tag(tag);
    absl::Time t0 = absl::Now();
    auto r = s.client->WriteAndWait(req, absl::Seconds(absl::GetFlag(FLAGS_timeout_s)));
    if (!r.ok()) return r.status();
    if (absl::Status st = ferry::ResultStatus(*r); !st.ok()) return st;
    times.push_back(absl::ToDoubleSeconds(absl::Now() - t0));
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

void Fill(uint8_t* p, uint64_t n, std::mt19937_64& rng) {
  for (uint64_t off = 0; off < n; off += 8) {
    uint64_t v = rng();
    memcpy(p + off, &v, std::min<uint64_t>(8, n - off));
  }
}

int Send() {
  std::vector<uint64_t> sizes;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_sizes), ',')) {
    uint64_t v;
    if (!absl::SimpleAtoi(s, &v) || v == 0) return Die("--sizes", absl::InvalidArgumentError(std::string(s)));
    sizes.push_back(v);
  }
  const bool queue = absl::GetFlag(FLAGS_api) == "queue";
  if (!queue && absl::GetFlag(FLAGS_api) != "rpc") return Die("--api", absl::InvalidArgumentError("queue or rpc"));
  absl::StatusOr<Sender> s = Connect(*std::max_element(sizes.begin(), sizes.end()));
  if (!s.ok()) return Die("connect", s.status());

  printf("%12s %6s %12s %12s  %s\n", "size", "count", "time_us", "algbw_GBps", "checksum");
  std::mt19937_64 rng(absl::ToUnixNanos(absl::Now()));
  int failures = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const uint64_t size = sizes[i];
    Fill(s->buf.data(), size, rng);
    const uint64_t want = Checksum(s->buf.data(), size);
    const int tag = static_cast<int>(i + 1) + (queue ? 100 : 0);
    unlink(VerifyPath(tag).c_str());  // an earlier run's checksum of the same tag
    int count;
    double us;  // per write
    if (queue) {
      // As fi_write_bench counts and warms up, so that the two rows compare.
      count = static_cast<int>(std::max<uint64_t>(
          4, std::min<uint64_t>(absl::GetFlag(FLAGS_count), (absl::GetFlag(FLAGS_row_mib) << 20) / size)));
      const int warm_up =
          static_cast<int>(std::clamp<uint64_t>((64u << 20) / size, 1, 2 * absl::GetFlag(FLAGS_window)));
      if (absl::StatusOr<double> w = QueueWrites(*s, size, warm_up, 0); !w.ok()) return Die("warm-up", w.status());
      absl::StatusOr<double> t = QueueWrites(*s, size, count, tag);
      if (!t.ok()) return Die(absl::StrFormat("queued writes of %d bytes", size), t.status());
      us = *t * 1e6 / count;
    } else {
      count = std::max(1, absl::GetFlag(FLAGS_iters));
      absl::StatusOr<double> t = RpcWrites(*s, size, count, tag);
      if (!t.ok()) return Die(absl::StrFormat("write of %d bytes", size), t.status());
      us = *t * 1e6;
    }
    const bool ok = Verified(tag, size, want);  // the receiver checksums what landed, independently
    failures += ok ? 0 : 1;
    printf("%12llu %6d %12.1f %12.3f  %s\n", static_cast<unsigned long long>(size), count, us, size / us / 1e3,
           ok ? "verified" : "MISMATCH");
    fflush(stdout);
  }
  return failures == 0 ? 0 : 3;
}

int Kv() {
  absl::StatusOr<Sender> s = Connect(kKvRegionBytes);
  if (!s.ok()) return Die("connect", s.status());
  if (s->dst.size() < kKvRegionBytes) {
    return Die("kv", absl::InvalidArgumentError(absl::StrFormat("the receiver's region holds %d bytes, the KV "
                                                                "cache needs %d",
                                                                s->dst.size(), kKvRegionBytes)));
  }
  std::mt19937_64 rng(absl::ToUnixNanos(absl::Now()));
  Fill(s->buf.data(), kKvRegionBytes, rng);
  // The request's blocks: kKvRequestBlocks distinct ids of the pool on each side.
  std::vector<uint64_t> src(kKvPoolBlocks), dst(kKvPoolBlocks);
  std::iota(src.begin(), src.end(), 0);
  std::iota(dst.begin(), dst.end(), 0);
  std::shuffle(src.begin(), src.end(), rng);
  std::shuffle(dst.begin(), dst.end(), rng);
  ferry::v1::WriteRequest req;
  req.set_src_region_id(s->region);
  *req.mutable_dst() = s->dst;
  req.set_notify(true);
  std::vector<std::pair<uint64_t, uint64_t>> src_chunks, dst_chunks;
  for (uint64_t layer = 0; layer < kKvLayers; ++layer) {
    for (uint64_t half = 0; half < 2; ++half) {  // K, then V
      const uint64_t base = layer * kKvLayerBytes + half * kKvPoolBlocks * kKvBlockBytes;
      for (uint64_t b = 0; b < kKvRequestBlocks; ++b) {
        auto* c = req.mutable_chunks()->add_chunks();
        c->set_src_offset(base + src[b] * kKvBlockBytes);
        c->set_dst_offset(base + dst[b] * kKvBlockBytes);
        c->set_length(kKvBlockBytes);
        src_chunks.emplace_back(c->src_offset(), kKvBlockBytes);
        dst_chunks.emplace_back(c->dst_offset(), kKvBlockBytes);
      }
    }
  }
  {
    std::ostringstream list;
    for (const auto& [off, len] : dst_chunks) list << off << " " << len << "\n";
    WriteFileAtomically(absl::GetFlag(FLAGS_dir) + "/kv.chunks", list.str());
  }
  const uint64_t bytes = kKvLayers * 2 * kKvRequestBlocks * kKvBlockBytes;
  const uint64_t want = ChunksChecksum(s->buf.data(), src_chunks);
  std::vector<double> times;
  bool ok = true;
  for (int h = 0; h < kKvHandoffs; ++h) {
    req.set_tag(kKvTag + h);
    unlink(VerifyPath(kKvTag + h).c_str());
    absl::Time t0 = absl::Now();
    auto r = s->client->WriteAndWait(req, absl::Seconds(absl::GetFlag(FLAGS_timeout_s)));
    times.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
    if (!r.ok()) return Die("kv write", r.status());
    if (absl::Status st = ferry::ResultStatus(*r); !st.ok()) return Die("kv write", st);
    ok = ok && Verified(kKvTag + h, bytes, want);  // the receiver clears the blocks again after checking
  }
  std::sort(times.begin(), times.end());
  const double us = times[times.size() / 2];
  printf("kv %llu %d %.1f %.3f %s %.1f %.1f\n", static_cast<unsigned long long>(bytes), req.chunks().chunks_size(), us,
         bytes / us / 1e3, ok ? "verified" : "MISMATCH", times.front(), times.back());
  return ok ? 0 : 3;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2 || absl::GetFlag(FLAGS_dir).empty()) {
    fprintf(stderr, "usage: demo_pod receive|send|kv --dir=D [--socket=S] ...\n");
    return 2;
  }
  std::string mode = args[1];
  if (mode == "receive") return Receive();
  if (mode == "send") return Send();
  if (mode == "kv") return Kv();
  fprintf(stderr, "demo_pod: unknown mode '%s'\n", mode.c_str());
  return 2;
}
