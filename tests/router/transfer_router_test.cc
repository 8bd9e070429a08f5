// TransferRouter as one component: every check a write meets before a byte moves, and
// the path it is given, with this agent's regions in a RegionTable, another agent's
// behind a RemoteTargets of the test's own, executors that only say who they are, and a
// clock that stands still. No process, socket or NIC.
#include "agent/router/transfer_router.h"

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "agent/common/clock.h"
#include "tests/testing/host_region.h"

namespace ferry {
namespace {

constexpr uint64_t kIncarnation = 0x1111;
constexpr uint64_t kRemoteIncarnation = 0x2222;

class NamedExecutor : public TransferExecutor {
 public:
  void Submit(std::shared_ptr<Transfer>, Done done) override { done(absl::OkStatus()); }
};

// Another agent's regions, as its OpenRegion would report them, without the RPCs.
class FakeRemoteTargets : public RemoteTargets {
 public:
  absl::StatusOr<std::shared_ptr<PeerConnection>> Resolve(const v1::RegionDescriptor& d, absl::Time,
                                                          PeerLookup lookup) override {
    ++resolves;
    if (d.agent_incarnation() != kRemoteIncarnation) return absl::NotFoundError("stale descriptor");
    if (lookup == PeerLookup::kCachedOnly && !cached) return WouldBlockError("not connected yet");
    return std::shared_ptr<PeerConnection>();  // the router only carries it to executors
  }
  absl::StatusOr<std::shared_ptr<RemoteRegion>> OpenRegion(const std::shared_ptr<PeerConnection>&,
                                                           const v1::RegionDescriptor& d, absl::Time,
                                                           PeerLookup) override {
    auto it = regions.find(d.region_id());
    if (it == regions.end()) return absl::NotFoundError("dst.region_id is not registered");
    return it->second;
  }
  std::shared_ptr<RemoteRegion> Add(uint64_t id, uint64_t size, bool staged) {
    auto r = std::make_shared<RemoteRegion>();
    r->region_id = id;
    r->size = size;
    if (staged) r->staging.emplace();
    regions[id] = r;
    return r;
  }
  absl::flat_hash_map<uint64_t, std::shared_ptr<RemoteRegion>> regions;
  int resolves = 0;
  bool cached = true;
};

struct Fixture {
  Fixture() : windows(&regions, nullptr) {
    session = *sessions.Create({1, 1000, 1000});
    other = *sessions.Create({2, 1001, 1001});
    src = Add(session->id(), 1 << 16);
    dst = Add(other->id(), 1 << 16);
    TransferRouterDeps deps;
    deps.incarnation = kIncarnation;
    deps.advertise_address = "10.0.0.1:7000";
    deps.regions = &regions;
    deps.windows = &windows;
    deps.local = &host;
    deps.gpu_local = &gpu;
    deps.remote_targets = &remote;
    deps.fabric = &fabric;
    deps.staged = &staged;
    deps.clock = &clock;
    router = std::make_unique<TransferRouter>(std::move(deps));
  }
  std::shared_ptr<Region> Add(uint64_t owner, uint64_t size) {
    std::shared_ptr<Region> r = testing::MemfdRegion(regions.NextId(), size, owner);
    REQUIRE(regions.Insert(r).ok());
    return r;
  }
  std::shared_ptr<const v1::RegionDescriptor> Local(const Region& r) const {
    auto d = std::make_shared<v1::RegionDescriptor>();
    d->set_version(1);
    d->set_agent_address("10.0.0.1:7000");
    d->set_agent_incarnation(kIncarnation);
    d->set_region_id(r.id());
    d->set_token(r.token().bytes());
    d->set_size(r.size());
    return d;
  }
  std::shared_ptr<const v1::RegionDescriptor> Remote(uint64_t region_id, uint64_t size,
                                                     v1::MemoryKind kind = v1::MEMORY_KIND_HOST) const {
    auto d = std::make_shared<v1::RegionDescriptor>();
    d->set_version(1);
    d->set_agent_address("10.0.0.2:7000");
    d->set_agent_incarnation(kRemoteIncarnation);
    d->set_region_id(region_id);
    d->set_token(std::string(16, 'k'));
    d->set_size(size);
    d->set_kind(kind);
    return d;
  }
  WriteSpec Spec(std::shared_ptr<const v1::RegionDescriptor> to, uint64_t from = 0) const {
    WriteSpec spec;
    spec.src_region_id = from != 0 ? from : src->id();
    spec.dst = std::move(to);
    spec.timeout = absl::Seconds(5);
    return spec;
  }
  // One chunk [0, length) to [dst_offset, +length).
  absl::StatusOr<std::shared_ptr<Transfer>> Write(const WriteSpec& spec, uint64_t dst_offset = 0,
                                                  uint64_t length = 4096) {
    return router->Prepare(
        session, spec,
        [&](uint64_t src_size, uint64_t dst_size) {
          return SingleChunkPlan({0, dst_offset, length}, src_size, dst_size);
        },
        /*cached_only=*/false);
  }

  SessionRegistry sessions{{}, nullptr};
  RegionTable regions;
  WriteWindows windows;
  NamedExecutor host, gpu, fabric, staged;
  FakeRemoteTargets remote;
  ManualClock clock{absl::FromUnixSeconds(1'000'000)};
  std::shared_ptr<Session> session, other;
  std::shared_ptr<Region> src, dst;
  std::unique_ptr<TransferRouter> router;
};

void CheckRefused(const absl::StatusOr<std::shared_ptr<Transfer>>& t, absl::StatusCode code, const char* says) {
  REQUIRE(!t.ok());
  CHECK(t.status().code() == code);
  CHECK_THAT(std::string(t.status().message()), Catch::Contains(says));
}

TEST_CASE("A write into this agent's region takes the local path, with its deadline from the clock") {
  Fixture f;
  absl::StatusOr<std::shared_ptr<Transfer>> t = f.Write(f.Spec(f.Local(*f.dst)), 8192);
  REQUIRE(t.ok());
  CHECK((*t)->path == v1::TRANSFER_PATH_LOCAL);
  CHECK((*t)->executor == &f.host);
  CHECK((*t)->dst == f.dst);
  CHECK((*t)->dst_descriptor == nullptr);
  CHECK((*t)->plan.total_bytes == 4096);
  CHECK((*t)->submitted == f.clock.Now());
  CHECK((*t)->deadline == f.clock.Now() + absl::Seconds(5));
  CHECK(f.remote.resolves == 0);
}

TEST_CASE("Each check names what to fix, and nothing is routed") {
  Fixture f;
  const auto to = f.Local(*f.dst);
  CheckRefused(f.Write(f.Spec(to, /*from=*/999)), absl::StatusCode::kNotFound, "src_region_id 999 is not registered");
  std::shared_ptr<Region> theirs = f.Add(f.other->id(), 4096);
  CheckRefused(f.Write(f.Spec(to, theirs->id())), absl::StatusCode::kPermissionDenied, "belongs to another session");
  CheckRefused(f.Write(f.Spec(nullptr)), absl::StatusCode::kInvalidArgument, "dst: the destination");
  auto bad = std::make_shared<v1::RegionDescriptor>(*to);
  bad->set_version(2);
  CheckRefused(f.Write(f.Spec(bad)), absl::StatusCode::kInvalidArgument, "dst.version 2");
  bad = std::make_shared<v1::RegionDescriptor>(*to);
  bad->set_token(std::string(16, 'x'));
  CheckRefused(f.Write(f.Spec(bad)), absl::StatusCode::kPermissionDenied, "dst.token does not match");
  bad->set_token("short");
  CheckRefused(f.Write(f.Spec(bad)), absl::StatusCode::kInvalidArgument, "dst.token");
  bad = std::make_shared<v1::RegionDescriptor>(*to);
  bad->set_region_id(12345);
  CheckRefused(f.Write(f.Spec(bad)), absl::StatusCode::kNotFound, "dst.region_id 12345 is not registered");
  bad = std::make_shared<v1::RegionDescriptor>(*to);
  bad->set_agent_incarnation(7);  // this agent's address, another incarnation: it restarted
  CheckRefused(f.Write(f.Spec(bad)), absl::StatusCode::kNotFound, "stale descriptor");
  CheckRefused(f.Write(f.Spec(to), /*dst_offset=*/(1 << 16) - 100), absl::StatusCode::kOutOfRange,
               "destination range of chunk 0");
  WriteSpec payload = f.Spec(to);
  payload.notify_payload = "x";
  CheckRefused(f.Write(payload), absl::StatusCode::kInvalidArgument, "notify_payload needs notify");
  CHECK(f.remote.resolves == 0);
}

TEST_CASE("A region in window mode refuses its own descriptor for writes, and says so by type") {
  Fixture f;
  f.dst->set_write_windows(true);
  absl::StatusOr<std::shared_ptr<Transfer>> t = f.Write(f.Spec(f.Local(*f.dst)));
  CheckRefused(t, absl::StatusCode::kFailedPrecondition, "only through write windows");
  CHECK(IsWindowModeError(t.status()));
  // A queue may name it all the same: its entries write through windows.
  CHECK(f.router->CheckDestination(f.Local(*f.dst), f.clock.Now() + absl::Seconds(1)).ok());
}

TEST_CASE("Another agent's region: fabric when the NICs reach both sides, staged otherwise") {
  Fixture f;
  f.remote.Add(7, 1 << 20, /*staged=*/false);
  f.remote.Add(8, 1 << 20, /*staged=*/true);
  // The source is registered with no NIC: staged, whatever the destination.
  absl::StatusOr<std::shared_ptr<Transfer>> t = f.Write(f.Spec(f.Remote(7, 1 << 20)));
  REQUIRE(t.ok());
  CHECK((*t)->path == v1::TRANSFER_PATH_STAGED);
  CHECK((*t)->executor == &f.staged);
  CHECK((*t)->stage_src);
  // With the source on every NIC (one here) and a destination they reach: fabric.
  RegionRegistration reg;
  reg.nics.push_back({/*key=*/1, /*remote_base=*/0, nullptr});
  f.src->set_registration(std::move(reg));
  TransferRouterDeps deps;
  deps.incarnation = kIncarnation;
  deps.advertise_address = "10.0.0.1:7000";
  deps.regions = &f.regions;
  deps.windows = &f.windows;
  deps.local = &f.host;
  deps.remote_targets = &f.remote;
  deps.fabric_nics = 1;
  deps.fabric = &f.fabric;
  deps.staged = &f.staged;
  deps.clock = &f.clock;
  f.router = std::make_unique<TransferRouter>(std::move(deps));
  t = f.Write(f.Spec(f.Remote(7, 1 << 20)));
  REQUIRE(t.ok());
  CHECK((*t)->path == v1::TRANSFER_PATH_FABRIC);
  CHECK((*t)->executor == &f.fabric);
  // GPU memory the other agent's NICs cannot reach: staged.
  t = f.Write(f.Spec(f.Remote(8, 1 << 20, v1::MEMORY_KIND_CUDA)));
  REQUIRE(t.ok());
  CHECK((*t)->path == v1::TRANSFER_PATH_STAGED);
  CHECK(!(*t)->stage_src);
  // A descriptor claiming host memory for a region its agent must stage is refused.
  CheckRefused(f.Write(f.Spec(f.Remote(8, 1 << 20))), absl::StatusCode::kFailedPrecondition,
               "use the descriptor its owner was given");
  // Bounds are the region's as its own agent reports them, not the descriptor's claim.
  CheckRefused(f.Write(f.Spec(f.Remote(7, 1 << 30)), /*dst_offset=*/1 << 20), absl::StatusCode::kOutOfRange,
               "outside region 7 (1048576 bytes on its agent)");
}

TEST_CASE("A remote window's ranges and writer are checked before any byte moves") {
  Fixture f;
  std::shared_ptr<RemoteRegion> r = f.remote.Add(9, 1 << 20, /*staged=*/false);
  r->window_id = 42;
  r->window_ranges = {{0, 8192}};
  auto through = std::make_shared<v1::RegionDescriptor>(*f.Remote(9, 1 << 20));
  through->set_window_id(42);
  CHECK(f.Write(f.Spec(through), 4096).ok());
  CheckRefused(f.Write(f.Spec(through), 8192), absl::StatusCode::kOutOfRange, "outside write window 42 of region 9");
  r->window_writer = WindowWriter{kIncarnation, f.dst->id()};  // another session's region
  CheckRefused(f.Write(f.Spec(through)), absl::StatusCode::kPermissionDenied, "this session is not it");
  r->window_writer = WindowWriter{kIncarnation, f.src->id()};
  CHECK(f.Write(f.Spec(through)).ok());
}

TEST_CASE("A write that must not block fails with would-block where it would need an RPC") {
  Fixture f;
  f.remote.Add(7, 1 << 20, /*staged=*/false);
  f.remote.cached = false;
  absl::StatusOr<std::shared_ptr<Transfer>> t = f.router->Prepare(
      f.session, f.Spec(f.Remote(7, 1 << 20)),
      [](uint64_t src_size, uint64_t dst_size) {
        return SingleChunkPlan({0, 0, 64}, src_size, dst_size);
      },
      /*cached_only=*/true);
  REQUIRE(!t.ok());
  CHECK(IsWouldBlock(t.status()));
}

TEST_CASE("A batch names the part it refuses and refuses parts that overlap in one region") {
  Fixture f;
  std::shared_ptr<Region> second = f.Add(f.other->id(), 1 << 16);
  const auto a = f.Local(*f.dst), b = f.Local(*second);
  auto batch = [&](std::vector<std::pair<std::shared_ptr<const v1::RegionDescriptor>, uint64_t>> parts)
      -> absl::StatusOr<std::shared_ptr<Transfer>> {
    TransferBatch tb(*f.router, f.session, parts.size(), ChunkLimits{}, /*cached_only=*/false);
    for (const auto& [to, offset] : parts) {
      const uint64_t at = offset;
      absl::Status s = tb.Add(f.Spec(to), [&](uint64_t src_size, uint64_t dst_size) {
        return SingleChunkPlan({0, at, 4096}, src_size, dst_size);
      });
      if (!s.ok()) return s;
    }
    WriteSpec whole;
    whole.notify = true;
    return std::move(tb).Join(whole);
  };
  absl::StatusOr<std::shared_ptr<Transfer>> t = batch({{a, 0}, {b, 0}, {a, 4096}});
  REQUIRE(t.ok());
  CHECK((*t)->parts.size() == 3);
  CHECK((*t)->plan.total_bytes == 3 * 4096);
  CHECK((*t)->notify);
  CHECK((*t)->dst == f.dst);  // notified: the first part's owner
  CHECK((*t)->deadline == f.clock.Now() + absl::Seconds(5));
  CheckRefused(batch({{a, 0}, {b, (1 << 16) - 1}}), absl::StatusCode::kOutOfRange, "parts[1]: destination range");
  CheckRefused(batch({{a, 0}, {b, 0}, {a, 2048}}), absl::StatusCode::kInvalidArgument, "parts: two parts write region");
}

}  // namespace
}  // namespace ferry
