// PeerTable as one component: the connections it keeps to other agents, against Peer
// services of the test's own (in-process gRPC servers on loopback, port 0) that answer
// handshakes as the test says. No NIC: the table has none, so no address vector is
// touched. What it shows: a connection reused and handshaken once however many callers
// race, a restarted peer's old connection retired and its descriptors refused as stale,
// an unreachable peer retired at once, --max_peers, idle close of unheld connections,
// retired connections released once nothing holds them, and handshake refusals that say
// what differs.
#include "agent/peers/peer_table.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "agent/common/poll_source.h"

namespace ferry {
namespace {

constexpr char kProvider[] = "tcp;ofi_rxm";

// Another agent's Peer service, as far as PeerTable asks it: Handshake and Ping.
class FakePeer final : public v1::Peer::Service {
 public:
  explicit FakePeer(uint64_t incarnation) : incarnation_(incarnation) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
    REQUIRE(server_ != nullptr);
    address_ = absl::StrCat("127.0.0.1:", port);
  }
  ~FakePeer() override { Stop(); }

  grpc::Status Handshake(grpc::ServerContext*, const v1::HandshakeRequest* req, v1::HandshakeResponse* resp) override {
    ++handshakes;
    if (req->provider() != kProvider) return grpc::Status(grpc::StatusCode::INTERNAL, "unexpected provider");
    resp->set_protocol_version(protocol_version.load());
    resp->set_incarnation(incarnation_.load());
    resp->set_agent_address(address_);
    resp->set_provider(provider);
    for (int i = 0; i < fabric_addresses; ++i) resp->add_fabric_addresses(absl::StrCat("nic", i));
    // A slow handshake widens the window in which concurrent callers race.
    absl::SleepFor(handshake_delay);
    return grpc::Status::OK;
  }
  grpc::Status Ping(grpc::ServerContext*, const v1::PingRequest*, v1::PingResponse* resp) override {
    resp->set_incarnation(incarnation_.load());
    return grpc::Status::OK;
  }

  // The agent restarted: same address, a new incarnation.
  void Restart(uint64_t incarnation) { incarnation_.store(incarnation); }
  void Stop() {
    if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
    server_.reset();
  }
  const std::string& address() const { return address_; }
  uint64_t incarnation() const { return incarnation_.load(); }

  std::atomic<int> handshakes{0};
  std::atomic<uint32_t> protocol_version{kPeerProtocolVersion};
  std::string provider = kProvider;
  int fabric_addresses = 1;
  absl::Duration handshake_delay = absl::ZeroDuration();

 private:
  std::atomic<uint64_t> incarnation_;
  std::string address_;
  std::unique_ptr<grpc::Server> server_;
};

struct Fixture {
  explicit Fixture(size_t max_peers = 0)
      : table({/*incarnation=*/0x5e1f, "127.0.0.1:1", kProvider, {"self"}, max_peers}, /*nics=*/{},
              grpc::InsecureChannelCredentials(), grpc::ChannelArguments(),
              [this](const PeerConnection& p) { retired.push_back(p.incarnation()); }) {}

  static v1::RegionDescriptor To(const FakePeer& peer, uint64_t incarnation) {
    v1::RegionDescriptor d;
    d.set_version(1);
    d.set_agent_address(peer.address());
    d.set_agent_incarnation(incarnation);
    d.set_region_id(1);
    return d;
  }
  absl::StatusOr<std::shared_ptr<PeerConnection>> Resolve(const FakePeer& peer, uint64_t incarnation,
                                                          PeerLookup lookup = PeerLookup::kMayConnect) {
    return table.Resolve(To(peer, incarnation), absl::Now() + absl::Seconds(5), lookup);
  }

  std::vector<uint64_t> retired;  // incarnations, as the table retires them
  PeerTable table;
};

TEST_CASE("A peer is handshaken once, and its connection reused while it answers as itself") {
  FakePeer peer(7);
  Fixture f;
  absl::StatusOr<std::shared_ptr<PeerConnection>> first = f.Resolve(peer, 7);
  REQUIRE(first.ok());
  CHECK((*first)->incarnation() == 7);
  CHECK((*first)->remote_nic_count() == 1);
  absl::StatusOr<std::shared_ptr<PeerConnection>> again = f.Resolve(peer, 7, PeerLookup::kCachedOnly);
  REQUIRE(again.ok());
  CHECK(again->get() == first->get());
  CHECK(peer.handshakes == 1);
  PeerTable::StateCounts counts = f.table.Count();
  CHECK(counts.connected == 1);
  CHECK(counts.retired == 0);
}

TEST_CASE("Callers racing to a new peer share one handshake") {
  FakePeer peer(7);
  peer.handshake_delay = absl::Milliseconds(100);
  Fixture f;
  std::vector<std::thread> callers;
  std::atomic<int> ok{0};
  for (int i = 0; i < 8; ++i) {
    callers.emplace_back([&] { ok += f.Resolve(peer, 7).ok() ? 1 : 0; });
  }
  for (std::thread& t : callers) t.join();
  CHECK(ok == 8);
  CHECK(peer.handshakes == 1);
}

TEST_CASE("A lookup that must not block is refused as would-block where it needs a handshake") {
  FakePeer peer(7);
  Fixture f;
  absl::StatusOr<std::shared_ptr<PeerConnection>> p = f.Resolve(peer, 7, PeerLookup::kCachedOnly);
  REQUIRE(!p.ok());
  CHECK(IsWouldBlock(p.status()));
  CHECK(peer.handshakes == 0);
}

TEST_CASE("A restarted peer: its old connection is retired, and descriptors of the old incarnation are stale") {
  FakePeer peer(7);
  Fixture f;
  absl::StatusOr<std::shared_ptr<PeerConnection>> old = f.Resolve(peer, 7);
  REQUIRE(old.ok());

  peer.Restart(8);
  absl::StatusOr<std::shared_ptr<PeerConnection>> fresh = f.Resolve(peer, 8);
  REQUIRE(fresh.ok());
  CHECK((*fresh)->incarnation() == 8);
  CHECK((*old)->retired());
  CHECK(f.retired == std::vector<uint64_t>{7});

  absl::StatusOr<std::shared_ptr<PeerConnection>> stale = f.Resolve(peer, 7);
  REQUIRE(!stale.ok());
  CHECK(stale.status().code() == absl::StatusCode::kNotFound);
  CHECK_THAT(std::string(stale.status().message()),
             Catch::Contains("stale descriptor") && Catch::Contains("now runs incarnation 8"));
  CHECK(f.retired.size() == 1);  // asking again with a stale descriptor retires nothing more

  // The retired connection is held here (as an op in flight would hold it): draining
  // until let go, then released.
  CHECK(f.table.Count().draining == 1);
  old->reset();
  PeerTable::StateCounts counts = f.table.Count();
  CHECK(counts.draining == 0);
  CHECK(counts.retired == 1);
  CHECK(counts.connected == 1);
}

TEST_CASE("A peer that stops answering is retired at its next use, so its transfers fail now") {
  auto peer = std::make_unique<FakePeer>(7);
  Fixture f;
  FakePeer* p = peer.get();
  const v1::RegionDescriptor d = Fixture::To(*p, 7);
  absl::StatusOr<std::shared_ptr<PeerConnection>> conn = f.Resolve(*p, 7);
  REQUIRE(conn.ok());
  peer->Stop();
  // The channel notices the server is gone within a reconnect attempt; bounded wait.
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (!(*conn)->NeedsHandshake() && absl::Now() < until) absl::SleepFor(absl::Milliseconds(10));
  REQUIRE((*conn)->NeedsHandshake());

  absl::StatusOr<std::shared_ptr<PeerConnection>> again =
      f.table.Resolve(d, absl::Now() + absl::Seconds(2), PeerLookup::kMayConnect);
  REQUIRE(!again.ok());
  CHECK(again.status().code() == absl::StatusCode::kUnavailable);
  CHECK_THAT(std::string(again.status().message()), Catch::Contains(d.agent_address()));
  CHECK((*conn)->retired());
  CHECK(f.retired == std::vector<uint64_t>{7});
  CHECK(f.table.List().empty());
}

TEST_CASE("--max_peers bounds live connections; a known peer's restart still connects") {
  FakePeer a(1), b(2);
  Fixture f(/*max_peers=*/1);
  REQUIRE(f.Resolve(a, 1).ok());
  absl::StatusOr<std::shared_ptr<PeerConnection>> refused = f.Resolve(b, 2);
  REQUIRE(!refused.ok());
  CHECK(refused.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(std::string(refused.status().message()), Catch::Contains("--max_peers") && Catch::Contains(b.address()));

  a.Restart(3);
  CHECK(f.Resolve(a, 3).ok());
  // Once the first is closed as idle, there is room for the second.
  CHECK(f.table.CloseIdle(absl::Now() + absl::Hours(1), absl::Minutes(1)) == 1);
  CHECK(f.Resolve(b, 2).ok());
}

TEST_CASE("Idle close takes only connections nothing holds, and the next use handshakes again") {
  FakePeer peer(7);
  Fixture f;
  absl::StatusOr<std::shared_ptr<PeerConnection>> held = f.Resolve(peer, 7);
  REQUIRE(held.ok());
  const absl::Time later = absl::Now() + absl::Hours(1);
  CHECK(f.table.CloseIdle(absl::Now(), absl::Minutes(1)) == 0);  // used just now
  CHECK(f.table.CloseIdle(later, absl::Minutes(1)) == 0);        // held (a transfer in flight)
  held->reset();
  CHECK(f.table.CloseIdle(later, absl::Minutes(1)) == 1);
  CHECK(f.table.List().empty());
  CHECK(f.table.Count().idle_closed == 1);

  REQUIRE(f.Resolve(peer, 7).ok());
  CHECK(peer.handshakes == 2);
}

TEST_CASE("A handshake with an agent that differs says in what") {
  Fixture f;
  SECTION("another peer protocol") {
    FakePeer peer(7);
    peer.protocol_version = kPeerProtocolVersion + 1;
    absl::StatusOr<std::shared_ptr<PeerConnection>> p = f.Resolve(peer, 7);
    REQUIRE(!p.ok());
    CHECK(p.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK_THAT(std::string(p.status().message()), Catch::Contains("speaks peer protocol"));
  }
  SECTION("another fabric provider") {
    FakePeer peer(7);
    peer.provider = "verbs;ofi_rxm";
    absl::StatusOr<std::shared_ptr<PeerConnection>> p = f.Resolve(peer, 7);
    REQUIRE(!p.ok());
    CHECK(p.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK_THAT(std::string(p.status().message()), Catch::Contains("uses fabric provider verbs;ofi_rxm"));
  }
  SECTION("no fabric NICs") {
    FakePeer peer(7);
    peer.fabric_addresses = 0;
    absl::StatusOr<std::shared_ptr<PeerConnection>> p = f.Resolve(peer, 7);
    REQUIRE(!p.ok());
    CHECK_THAT(std::string(p.status().message()), Catch::Contains("has no fabric NICs"));
  }
  CHECK(f.table.List().empty());
}

TEST_CASE("Ping answers the agent's incarnation, connected or not") {
  FakePeer peer(7);
  Fixture f;
  absl::StatusOr<uint64_t> inc = f.table.Ping(peer.address(), absl::Seconds(5));
  REQUIRE(inc.ok());
  CHECK(*inc == 7);
  REQUIRE(f.Resolve(peer, 7).ok());
  peer.Restart(9);
  inc = f.table.Ping(peer.address(), absl::Seconds(5));
  REQUIRE(inc.ok());
  CHECK(*inc == 9);
}

}  // namespace
}  // namespace ferry
