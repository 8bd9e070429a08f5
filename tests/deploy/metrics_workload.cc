// metrics_workload: traffic that touches every metric family, for the Prometheus test.
//
//   metrics_workload --socket_a=A.sock --socket_b=B.sock --seconds=12
//
// Two pods on agent A, one on agent B. Each round: a cross-agent write with a
// notification, a paged cross-agent write without one, a node-local write, a
// registration and deregistration, and every few rounds two requests the agent must
// refuse (a wrong token, an out-of-bounds chunk). Exits non-zero if a request that
// should succeed fails, or one that should fail succeeds.
#include <cstdio>
#include <numeric>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/ferry_client.h"

ABSL_FLAG(std::string, socket_a, "", "agent A's socket");
ABSL_FLAG(std::string, socket_b, "", "agent B's socket");
ABSL_FLAG(int, seconds, 10, "how long to run");

namespace ferry {
namespace {

constexpr uint64_t kSize = 4 << 20;

struct Pod {
  std::unique_ptr<Client> client;
  HostRegion region;
};

absl::StatusOr<Pod> Open(const std::string& socket) {
  auto c = Client::Connect(socket);
  if (!c.ok()) return c.status();
  auto r = (*c)->AllocateHost(kSize);
  if (!r.ok()) return r.status();
  return Pod{std::move(*c), std::move(*r)};
}

absl::Status Expect(absl::StatusCode want, const absl::Status& got, const char* what) {
  if (got.code() == want) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(what, ": expected ", absl::StatusCodeToString(want), ", got ", got.ToString()));
}

absl::Status Round(int round, Pod& a1, Pod& a2, Pod& b) {
  const absl::Duration kWait = absl::Seconds(10);
  // Cross-agent, notified.
  auto r = a1.client->WriteAndWait(
      [&] {
        v1::WriteRequest req;
        req.set_src_region_id(a1.region.id());
        *req.mutable_dst() = b.region.descriptor();
        req.mutable_chunks()->add_chunks()->set_length(1 << 20);
        req.set_notify(true);
        req.set_tag(round);
        return req;
      }(),
      kWait);
  if (!r.ok()) return r.status();
  // Cross-agent, paged, not notified.
  std::vector<uint64_t> blocks(64);
  std::iota(blocks.begin(), blocks.end(), 0);
  auto id = a1.client->WriteBlocks(a1.region.id(), b.region.descriptor(), 4096, blocks, blocks);
  if (!id.ok()) return id.status();
  auto w = a1.client->Wait(*id, kWait);
  if (!w.ok()) return w.status();
  if (w->code() != 0) return ResultStatus(*w);
  // Node-local.
  id = a1.client->Write(a1.region.id(), a2.region.descriptor(), {{0, 0, 256 << 10}});
  if (!id.ok()) return id.status();
  w = a1.client->Wait(*id, kWait);
  if (!w.ok()) return w.status();
  if (w->code() != 0) return ResultStatus(*w);
  // Registration churn.
  auto extra = a2.client->AllocateHost(1 << 20);
  if (!extra.ok()) return extra.status();
  if (absl::Status s = a2.client->Deregister(extra->id()); !s.ok()) return s;
  // Requests the agent must refuse.
  if (round % 5 == 0) {
    v1::RegionDescriptor forged = b.region.descriptor();
    forged.set_token(std::string(16, '\x5a'));
    absl::Status s = Expect(absl::StatusCode::kPermissionDenied,
                            a1.client->Write(a1.region.id(), forged, {{0, 0, 64}}).status(), "forged token");
    if (!s.ok()) return s;
    s = Expect(absl::StatusCode::kOutOfRange,
               a1.client->Write(a1.region.id(), a2.region.descriptor(), {{0, kSize - 8, 64}}).status(),
               "out of bounds");
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

int Run() {
  auto a1 = Open(absl::GetFlag(FLAGS_socket_a));
  auto a2 = Open(absl::GetFlag(FLAGS_socket_a));
  auto b = Open(absl::GetFlag(FLAGS_socket_b));
  for (const auto* p : {&a1, &a2, &b}) {
    if (!p->ok()) {
      fprintf(stderr, "metrics_workload: %s\n", p->status().ToString().c_str());
      return 1;
    }
  }
  const absl::Time end = absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_seconds));
  int rounds = 0;
  while (absl::Now() < end) {
    absl::Status s = Round(rounds++, *a1, *a2, *b);
    if (!s.ok()) {
      fprintf(stderr, "metrics_workload: round %d: %s\n", rounds, s.ToString().c_str());
      return 1;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  printf("metrics_workload: %d rounds\n", rounds);
  return 0;
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ferry::Run();
}
