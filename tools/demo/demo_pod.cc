// demo_pod: a stand-in for a serving pod, used by tools/demo.sh.
//
//   demo_pod receive --socket=S --size=N --dir=D   registers N bytes, publishes its
//       RegionDescriptor in D/descriptor, and for every notification checksums the
//       bytes that landed, writes D/verify.<tag>, and clears the region again.
//   demo_pod send --socket=S --dir=D --sizes=4096,... --iters=K
//       registers its own buffer, and for each size fills it with fresh random data,
//       writes it K times into the receiver's region (the last write notifies), waits for
//       the receiver's checksum and prints a table row.
//
// The two processes share nothing but the serialized descriptor and the checksum files.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
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

ABSL_FLAG(std::string, socket, "/run/ferry/ferry.sock", "the local agent's socket");
ABSL_FLAG(std::string, dir, "", "directory shared with the other demo pod");
ABSL_FLAG(uint64_t, size, 64 << 20, "receive: region size");
ABSL_FLAG(std::string, sizes, "4096,65536,1048576,16777216,67108864", "send: transfer sizes");
ABSL_FLAG(int, iters, 5, "send: writes per size (timed)");
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
  auto reg = (*client)->RegisterHost(*buf);
  if (!reg.ok()) return Die("register", reg.status());

  auto ctx = (*client)->NewContext(absl::Seconds(absl::GetFlag(FLAGS_timeout_s)));
  auto stream = (*client)->stub()->WatchNotifications(ctx.get(), ferry::v1::WatchNotificationsRequest());
  // Publish the descriptor only once the notification stream is open.
  WriteFileAtomically(dir + "/descriptor", reg->region().SerializeAsString());
  ferry::v1::Notification n;
  while (stream->Read(&n)) {
    uint64_t crc = Checksum(buf->data(), n.bytes());
    memset(buf->data(), 0, n.bytes());  // the next size must bring its own bytes
    WriteFileAtomically(absl::StrFormat("%s/verify.%d", dir, n.tag()), absl::StrFormat("%d %d\n", n.bytes(), crc));
  }
  return 0;
}

int Send() {
  const std::string dir = absl::GetFlag(FLAGS_dir);
  std::vector<uint64_t> sizes;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_sizes), ',')) {
    uint64_t v;
    if (!absl::SimpleAtoi(s, &v) || v == 0) return Die("--sizes", absl::InvalidArgumentError(std::string(s)));
    sizes.push_back(v);
  }
  const uint64_t max_size = *std::max_element(sizes.begin(), sizes.end());
  auto client = ferry::Client::Connect(absl::GetFlag(FLAGS_socket));
  if (!client.ok()) return Die("connect", client.status());
  auto buf = ferry::HostBuffer::Create(max_size);
  if (!buf.ok()) return Die("allocate", buf.status());
  auto reg = (*client)->RegisterHost(*buf);
  if (!reg.ok()) return Die("register", reg.status());

  std::ifstream in(dir + "/descriptor");
  std::stringstream wire;
  wire << in.rdbuf();
  ferry::v1::RegionDescriptor dst;
  if (!dst.ParseFromString(wire.str())) return Die("descriptor", absl::InvalidArgumentError("unparsable"));

  printf("%12s %6s %12s %12s %10s  %s\n", "size", "count", "time_us", "algbw_GBps", "path", "checksum");
  const int iters = std::max(1, absl::GetFlag(FLAGS_iters));
  std::mt19937_64 rng(absl::ToUnixNanos(absl::Now()));
  int failures = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const uint64_t size = sizes[i];
    for (uint64_t off = 0; off < size; off += 8) {
      uint64_t v = rng();
      memcpy(buf->data() + off, &v, std::min<uint64_t>(8, size - off));
    }
    const uint64_t want = Checksum(buf->data(), size);
    std::vector<double> times;
    std::string path;
    for (int it = 0; it < iters; ++it) {
      ferry::v1::WriteRequest req;
      req.set_src_region_id(reg->region_id());
      *req.mutable_dst() = dst;
      auto* c = req.mutable_chunks()->add_chunks();
      c->set_length(size);
      req.set_notify(it == iters - 1);
      req.set_tag(i + 1);
      absl::Time t0 = absl::Now();
      auto r = (*client)->WriteAndWait(req, absl::Seconds(absl::GetFlag(FLAGS_timeout_s)));
      if (!r.ok()) return Die(absl::StrFormat("write of %d bytes", size), r.status());
      times.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
      path = r->path() == ferry::v1::TRANSFER_PATH_LOCAL ? "local" : "fabric";
    }
    std::sort(times.begin(), times.end());
    const double median_us = times[times.size() / 2];
    // The receiver checksums what landed, independently.
    std::string verify = absl::StrFormat("%s/verify.%d", dir, i + 1);
    absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (access(verify.c_str(), R_OK) != 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(2));
    uint64_t got_bytes = 0, got = 0;
    std::ifstream(verify) >> got_bytes >> got;
    bool ok = got_bytes == size && got == want;
    failures += ok ? 0 : 1;
    printf("%12llu %6d %12.1f %12.3f %10s  %s\n", static_cast<unsigned long long>(size), iters, median_us,
           size / median_us / 1e3, path.c_str(), ok ? "verified" : "MISMATCH");
    fflush(stdout);
  }
  return failures == 0 ? 0 : 3;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2 || absl::GetFlag(FLAGS_dir).empty()) {
    fprintf(stderr, "usage: demo_pod receive|send --dir=D [--socket=S] ...\n");
    return 2;
  }
  std::string mode = args[1];
  if (mode == "receive") return Receive();
  if (mode == "send") return Send();
  fprintf(stderr, "demo_pod: unknown mode '%s'\n", mode.c_str());
  return 2;
}
