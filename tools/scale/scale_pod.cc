// scale_pod: the pod on one agent of `tools/scale.sh` (tools/scale/scale.py runs one per
// agent, and a new one, with a new generation, each time it kills one).
//
//   scale_pod --socket=S --dir=D --agent=I --generation=G --agents=N --seconds=T
//
// It registers a region with one slot per writing agent (4 sub-slots each, used in
// turn), publishes the region's descriptor as D/desc/I.G (the harness removes it when
// it kills the pod), and until T seconds pass or SIGTERM: every --interval_ms writes a
// random 64 B..16 KiB block (its sequence number first) into its slot of another
// agent's pod, notified, with "writer seq length hash" as the payload, and waits for the
// result. A notification for its own region is checked: the bytes in the writer's
// sub-slot must hash to the payload's (unless a later write of that writer already
// replaced them). Everything is logged, one flushed line per event, so the logs survive
// a SIGKILL:
//   D/log/I.G.sent   <t_ms> sent <target> <seq> <code> <ms> [first] [why]   (code 0: done)
//   D/log/I.G.sent   <t_ms> hung <target> <seq>                        (no result in 15 s)
//   D/log/I.G.recv   <t_ms> <ok|corrupt|replaced|failed> <writer> <seq> [code]
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
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

ABSL_FLAG(std::string, socket, "", "the agent's socket");
ABSL_FLAG(std::string, dir, "", "the run's directory (desc/ and log/ in it)");
ABSL_FLAG(int, agent, 0, "this pod's agent index");
ABSL_FLAG(int, generation, 0, "this pod's generation on its agent");
ABSL_FLAG(int, agents, 64, "agents in the run (slots in the region)");
ABSL_FLAG(int, seconds, 60, "how long to write");
ABSL_FLAG(int, interval_ms, 250, "between writes");

namespace ferry {
namespace {

constexpr uint64_t kSub = 16 << 10;  // one write's most bytes
constexpr int kSubs = 4;

std::atomic<bool> stop{false};

uint64_t Hash(const uint8_t* p, size_t n) {  // FNV-1a
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

class Log {
 public:
  explicit Log(const std::string& path) : f_(fopen(path.c_str(), "a")) {}
  ~Log() {
    if (f_ != nullptr) fclose(f_);
  }
  bool ok() const { return f_ != nullptr; }
  void Line(const std::string& line) {
    absl::MutexLock lock(&mu_);
    fprintf(f_, "%lld %s\n", static_cast<long long>(NowMs()), line.c_str());
    fflush(f_);
  }

 private:
  absl::Mutex mu_;
  FILE* f_;
};

// The other agents' pods: the newest descriptor per agent in D/desc.
std::map<int, std::pair<std::string, v1::RegionDescriptor>> Targets(const std::string& dir, int me) {
  std::map<int, std::pair<std::string, v1::RegionDescriptor>> out;
  std::map<int, int> newest;
  DIR* d = opendir((dir + "/desc").c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    std::vector<std::string> parts = absl::StrSplit(e->d_name, '.');
    int agent, gen;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &agent) || !absl::SimpleAtoi(parts[1], &gen)) continue;
    if (agent == me || (newest.count(agent) && newest[agent] > gen)) continue;
    FILE* f = fopen((dir + "/desc/" + e->d_name).c_str(), "rb");
    if (f == nullptr) continue;  // removed meanwhile
    std::string bytes(4096, '\0');
    bytes.resize(fread(bytes.data(), 1, bytes.size(), f));
    fclose(f);
    v1::RegionDescriptor desc;
    if (!desc.ParseFromString(bytes)) continue;
    newest[agent] = gen;
    out[agent] = {e->d_name, desc};
  }
  closedir(d);
  return out;
}

// Checks the writes notified into `region` (this pod's), until the stream ends.
void Receive(Client& client, HostRegion& region, Log& log, grpc::ClientContext* ctx) {
  auto stream = client.stub()->WatchNotifications(ctx, v1::WatchNotificationsRequest());
  v1::Notification n;
  while (stream->Read(&n)) {
    if (n.kind() != v1::NOTIFICATION_KIND_WRITE) continue;
    std::vector<std::string> f = absl::StrSplit(n.payload(), ' ');
    int writer = 0;
    uint64_t seq = 0, len = 0, hash = 0;
    if (f.size() != 4 || !absl::SimpleAtoi(f[0].substr(0, f[0].find('.')), &writer) || !absl::SimpleAtoi(f[1], &seq) ||
        !absl::SimpleAtoi(f[2], &len) || !absl::SimpleHexAtoi(f[3], &hash) || writer < 0 ||
        writer >= absl::GetFlag(FLAGS_agents) || len > kSub || len < 8) {
      log.Line(absl::StrCat("garbage ", n.payload()));
      continue;
    }
    if (n.code() != 0) {
      log.Line(absl::StrCat("failed ", f[0], " ", seq, " ", n.code()));
      continue;
    }
    const uint8_t* p = region.buffer.data() + (writer * kSubs + seq % kSubs) * kSub;
    uint64_t there;
    memcpy(&there, p, 8);
    const char* verdict = there != seq ? "replaced" : Hash(p, len) == hash ? "ok" : "corrupt";
    log.Line(absl::StrCat(verdict, " ", f[0], " ", seq));
  }
}

int Main() {
  const std::string dir = absl::GetFlag(FLAGS_dir);
  const int me = absl::GetFlag(FLAGS_agent), agents = absl::GetFlag(FLAGS_agents);
  const std::string key = absl::StrCat(me, ".", absl::GetFlag(FLAGS_generation));
  Log sent(dir + "/log/" + key + ".sent"), recv(dir + "/log/" + key + ".recv");
  if (!sent.ok() || !recv.ok()) {
    fprintf(stderr, "scale_pod %s: cannot write its logs in %s/log\n", key.c_str(), dir.c_str());
    return 1;
  }
  auto client = Client::Connect(absl::GetFlag(FLAGS_socket));
  if (!client.ok()) {
    fprintf(stderr, "scale_pod %s: %s\n", key.c_str(), client.status().ToString().c_str());
    return 1;
  }
  const uint64_t src_offset = agents * kSubs * kSub;  // after the writers' slots
  auto region = (*client)->AllocateHost(src_offset + kSub);
  if (!region.ok()) {
    fprintf(stderr, "scale_pod %s: %s\n", key.c_str(), region.status().ToString().c_str());
    return 1;
  }
  auto ctx = (*client)->NewContext(absl::Hours(24));
  std::thread receiver([&] { Receive(**client, *region, recv, ctx.get()); });
  {  // Published once the receiver watches (rename: readers never see half a file).
    const std::string path = dir + "/desc/" + key, tmp = path + ".tmp";
    FILE* f = fopen(tmp.c_str(), "wb");
    const std::string bytes = region->descriptor().SerializeAsString();
    if (f == nullptr || fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size() || fclose(f) != 0 ||
        rename(tmp.c_str(), path.c_str()) != 0) {
      fprintf(stderr, "scale_pod %s: cannot publish its descriptor\n", key.c_str());
      return 1;
    }
  }

  std::mt19937_64 rng(std::random_device{}());
  uint8_t* src = region->buffer.data() + src_offset;
  std::set<std::string> met;  // target pods written to before
  std::map<int, std::pair<std::string, v1::RegionDescriptor>> targets;
  absl::Time refreshed = absl::InfinitePast();
  const absl::Time end = absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_seconds));
  for (uint64_t seq = 1; !stop.load() && absl::Now() < end; ++seq) {
    absl::SleepFor(
        absl::Milliseconds(absl::GetFlag(FLAGS_interval_ms) / 2 + rng() % (absl::GetFlag(FLAGS_interval_ms) + 1)));
    if (absl::Now() - refreshed > absl::Seconds(1)) {
      targets = Targets(dir, me);
      refreshed = absl::Now();
    }
    if (targets.empty()) continue;
    auto it = targets.begin();
    std::advance(it, rng() % targets.size());
    const auto& [target, desc] = it->second;
    const uint64_t len = 8 * (8 + rng() % (kSub / 8 - 7));
    memcpy(src, &seq, 8);
    for (uint64_t i = 8; i < len; i += 8) {
      const uint64_t v = rng();
      memcpy(src + i, &v, 8);
    }
    v1::WriteRequest req;
    req.set_src_region_id(region->id());
    *req.mutable_dst() = desc;
    auto* c = req.mutable_chunks()->add_chunks();
    c->set_src_offset(src_offset);
    c->set_dst_offset((me * kSubs + seq % kSubs) * kSub);
    c->set_length(len);
    req.set_notify(true);
    req.set_notify_payload(absl::StrCat(key, " ", seq, " ", len, " ", absl::Hex(Hash(src, len))));
    req.set_timeout_ms(5000);
    const absl::Time t0 = absl::Now();
    absl::StatusOr<uint64_t> id = (*client)->Write(req);
    absl::Status status;
    if (!id.ok()) {
      status = id.status();
    } else {
      absl::StatusOr<v1::TransferResult> r = (*client)->Wait(*id, absl::Seconds(15));
      if (!r.ok() && r.status().code() == absl::StatusCode::kDeadlineExceeded) {
        sent.Line(absl::StrCat("hung ", target, " ", seq));
        continue;
      }
      status = r.ok() ? ResultStatus(*r) : r.status();
    }
    const bool first = status.ok() && met.insert(target).second;
    std::string why(status.message().substr(0, 160));
    std::replace(why.begin(), why.end(), ' ', '_');
    sent.Line(absl::StrCat("sent ", target, " ", seq, " ", static_cast<int>(status.code()), " ",
                           absl::ToInt64Milliseconds(absl::Now() - t0), first ? " first" : "", " ", why));
  }
  // Let the last notifications in, then end.
  absl::SleepFor(absl::Seconds(2));
  ctx->TryCancel();
  receiver.join();
  return 0;
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  signal(SIGTERM, [](int) { ferry::stop.store(true); });
  return ferry::Main();
}
