// PeerTable: what this agent knows about other agents it writes to.
//
//   absl::StatusOr<std::shared_ptr<PeerConnection>> peer = table.Resolve(descriptor, deadline, lookup);
//   absl::StatusOr<std::shared_ptr<RemoteRegion>> region = (*peer)->OpenRegion(descriptor, deadline, lookup);
//
// Peers are found from descriptors alone: the first transfer to an address performs
// the handshake (protocol version, incarnation, fabric address per NIC) and inserts the
// peer's NICs into every local NIC's address vector. A descriptor whose incarnation
// differs from the cached one makes the table handshake again: if the peer restarted,
// the old connection is retired (its in-flight transfers fail with UNAVAILABLE) and a
// descriptor from the dead incarnation is refused as stale.
#ifndef FERRY_AGENT_PEERS_PEER_TABLE_H_
#define FERRY_AGENT_PEERS_PEER_TABLE_H_

#include <rdma/fabric.h>

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/common/poll_source.h"
#include "agent/common/slot_pool.h"
#include "agent/common/token.h"
#include "agent/fabric/fabric_nic.h"
#include "agent/memory/write_windows.h"
#include "agent/peers/remote_targets.h"
#include "proto/ferry/v1/peer.grpc.pb.h"

namespace ferry {

inline constexpr uint32_t kPeerProtocolVersion = 1;

// A region on another agent, opened with its capability token.
struct RemoteRegion {
  uint64_t region_id = 0;
  uint64_t size = 0;
  Token token;
  v1::MemoryKind kind = v1::MEMORY_KIND_HOST;
  std::vector<v1::RemoteKey> keys;  // one per remote NIC; empty when staged
  absl::Time opened;                // when the keys were asked for (stale after a drop)
  // Set when the target's NICs cannot reach the region (GPU memory without FI_HMEM):
  // the target's staging buffer reserved for this agent.
  std::optional<v1::StagingBuffer> staging;
  // Its slots, shared by every staged transfer from this agent into the region; made by
  // the first one (the staged path picks the slot size).
  absl::Mutex staging_mu;
  std::shared_ptr<SlotPool> staging_slots ABSL_GUARDED_BY(staging_mu);
  // Opened through a write window (window_id != 0): the window's ranges (sorted, merged),
  // its writer, and when it closes at the latest. The keys reach the ranges' extent only.
  uint64_t window_id = 0;
  std::vector<ByteSpan> window_ranges;
  WindowWriter window_writer;
  absl::Time window_expires = absl::InfiniteFuture();
  // A staged region opened through several windows keeps one staging buffer for this
  // agent: the entries after the first use the first's slots.
  std::shared_ptr<RemoteRegion> staging_owner;
};

class PeerConnection {
 public:
  // `local_incarnation` and `local_address` name this agent in OpenRegion (the target
  // keeps one staging buffer per initiator agent).
  PeerConnection(std::string address, uint64_t incarnation, std::shared_ptr<grpc::Channel> channel,
                 std::vector<fi_addr_t> remote_nics_per_local, size_t remote_nic_count, size_t remote_latency_lanes,
                 bool fabric_messages, uint64_t local_incarnation, std::string local_address)
      : address_(std::move(address)),
        incarnation_(incarnation),
        channel_(std::move(channel)),
        stub_(v1::Peer::NewStub(channel_)),
        fi_addrs_(std::move(remote_nics_per_local)),
        remote_nic_count_(remote_nic_count),
        remote_latency_lanes_(remote_latency_lanes),
        fabric_messages_(fabric_messages),
        local_incarnation_(local_incarnation),
        local_address_(std::move(local_address)) {}

  const std::string& address() const { return address_; }
  uint64_t incarnation() const { return incarnation_; }
  v1::Peer::Stub* stub() const { return stub_.get(); }
  // Its endpoints: NICs, then (HandshakeResponse.latency_lanes) one latency lane per NIC.
  size_t remote_nic_count() const { return remote_nic_count_; }
  size_t remote_latency_lanes() const { return remote_latency_lanes_; }
  size_t remote_main_nics() const { return remote_nic_count_ - remote_latency_lanes_; }
  // fi_addr of remote NIC `remote` in local NIC `local`'s address vector.
  fi_addr_t fi_addr(size_t local, size_t remote) const { return fi_addrs_[local * remote_nic_count_ + remote]; }
  const std::vector<fi_addr_t>& fi_addrs() const { return fi_addrs_; }
  // The peer receives fabric messages (its notifications may go as one).
  bool fabric_messages() const { return fabric_messages_; }

  // Opens (or finds in the cache) the region a descriptor names; the token is checked
  // against the cached one in constant time. A direct region's keys cached from before
  // the last connection drop are fetched again (one of them may be what broke it).
  absl::StatusOr<std::shared_ptr<RemoteRegion>> OpenRegion(const v1::RegionDescriptor& d, absl::Time deadline,
                                                           PeerLookup lookup = PeerLookup::kMayConnect);
  // Drops the cached region (opened directly, or through `window_id`): the next transfer
  // opens it again. A staged region's slot pool is kept while stages still hold it, for
  // the re-opened region: the target answers this agent with the same staging buffer.
  void ForgetRegion(uint64_t region_id, uint64_t window_id = 0);
  size_t open_regions() const;
  // The fabric connection to this peer dropped (a write failed with a connection reset).
  void NoteConnectionDrop() {
    absl::MutexLock lock(&mu_);
    last_drop_ = absl::Now();
  }

  // A fabric error on the way to this peer: the next transfer re-handshakes.
  void MarkSuspect() { suspect_.store(true); }
  // Suspect, or its gRPC connection dropped (the peer process may have died): the next
  // transfer must handshake before trusting cached keys.
  bool NeedsHandshake() const {
    return suspect_.load() || channel_->GetState(/*try_to_connect=*/false) != GRPC_CHANNEL_READY;
  }
  void Confirm() { suspect_.store(false); }
  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }
  bool suspect() const { return suspect_.load(); }
  bool retired() const { return retired_.load(); }
  void Retire() { retired_.store(true); }
  // When a transfer last resolved it (PeerTable closes connections idle too long).
  void Touch(absl::Time now) { last_used_ns_.store(absl::ToUnixNanos(now), std::memory_order_relaxed); }
  absl::Time last_used() const { return absl::FromUnixNanos(last_used_ns_.load(std::memory_order_relaxed)); }

 private:
  const std::string address_;
  const uint64_t incarnation_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Peer::Stub> stub_;
  const std::vector<fi_addr_t> fi_addrs_;
  const size_t remote_nic_count_;
  const size_t remote_latency_lanes_;
  const bool fabric_messages_;
  const uint64_t local_incarnation_;
  const std::string local_address_;
  std::atomic<bool> suspect_{false};
  std::atomic<bool> retired_{false};
  std::atomic<int64_t> last_used_ns_{absl::ToUnixNanos(absl::Now())};
  mutable absl::Mutex mu_;
  // By (region id, window id); window entries go once their window is past its time.
  absl::flat_hash_map<std::pair<uint64_t, uint64_t>, std::shared_ptr<RemoteRegion>> regions_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::weak_ptr<RemoteRegion>> staging_owners_ ABSL_GUARDED_BY(mu_);  // by buffer id
  absl::Time last_drop_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // Slot pools of forgotten staged regions, by staging buffer id.
  absl::flat_hash_map<uint64_t, std::weak_ptr<SlotPool>> forgotten_slots_ ABSL_GUARDED_BY(mu_);
};

class PeerTable : public RemoteTargets {
 public:
  struct Self {
    uint64_t incarnation;
    std::string address;
    std::string provider;
    std::vector<std::string> fabric_addresses;
    size_t max_peers = 0;  // live connections at most (--max_peers); 0: no limit
  };
  // Called when a peer connection is retired (restart detected): fail its transfers.
  using OnRetire = std::function<void(const PeerConnection&)>;

  // `args` go to every peer channel (e.g. the TLS name to verify).
  PeerTable(Self self, std::vector<FabricNic*> nics, std::shared_ptr<grpc::ChannelCredentials> creds,
            grpc::ChannelArguments args, OnRetire on_retire)
      : self_(std::move(self)),
        nics_(std::move(nics)),
        creds_(std::move(creds)),
        args_(PeerChannelArgs(std::move(args))),
        on_retire_(std::move(on_retire)) {}
  ~PeerTable();

  // The connection for the agent a descriptor names, handshaking when needed.
  // NOT_FOUND when the descriptor's incarnation is not the peer's current one (stale),
  // UNAVAILABLE when the peer cannot be reached.
  absl::StatusOr<std::shared_ptr<PeerConnection>> Resolve(const v1::RegionDescriptor& d, absl::Time deadline,
                                                          PeerLookup lookup) override;
  // PeerConnection::OpenRegion.
  absl::StatusOr<std::shared_ptr<RemoteRegion>> OpenRegion(const std::shared_ptr<PeerConnection>& peer,
                                                           const v1::RegionDescriptor& d, absl::Time deadline,
                                                           PeerLookup lookup) override {
    return peer->OpenRegion(d, deadline, lookup);
  }

  struct PeerInfo {
    std::string address;
    uint64_t incarnation;
    std::string state;
    size_t open_regions;
  };
  std::vector<PeerInfo> List() const;

  // For ferry_peers{state}: live connections (connected or suspect), connections retired
  // since start (peer restarted or became unreachable), and retired ones still held
  // (draining: ops or transfers to them not yet ended). Releases those that have ended.
  struct StateCounts {
    size_t connected = 0, suspect = 0, retired = 0, draining = 0, idle_closed = 0;
  };
  StateCounts Count();

  // Closes the connections no transfer has used for `idle` and none holds now: their
  // gRPC channel, address-vector entries (and with them the provider's connections) and
  // region caches. The next transfer to such a peer handshakes again. Returns how many.
  size_t CloseIdle(absl::Time now, absl::Duration idle);

  // The incarnation of the agent at `address` (Peer.Ping), through its connection's
  // channel if there is one, else a channel kept for pings (the agents writing into this
  // one's regions: agent/peers/inbound_writes.h).
  absl::StatusOr<uint64_t> Ping(const std::string& address, absl::Duration timeout);

 private:
  // `args` plus what every peer channel needs: its own subchannel (a restarted peer's new
  // channel does not inherit the old one's reconnect backoff) and a short backoff (a peer
  // that comes back is reached within a second, not gRPC's default of up to two minutes).
  static grpc::ChannelArguments PeerChannelArgs(grpc::ChannelArguments args);

  absl::StatusOr<v1::HandshakeResponse> Handshake(grpc::Channel& channel, const std::string& address,
                                                  absl::Time deadline);
  absl::StatusOr<std::shared_ptr<PeerConnection>> Connect(const std::string& address,
                                                          std::shared_ptr<grpc::Channel> channel,
                                                          const v1::HandshakeResponse& resp);
  void RetireLocked(const std::shared_ptr<PeerConnection>& peer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes its address-vector entries if nothing but the table holds it; else false.
  bool ReleaseIfUnheldLocked(const std::shared_ptr<PeerConnection>& peer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Lets go of retired connections nothing refers to any more (no op, transfer or cache
  // holds them): their address-vector entries, region and key caches and staging slots.
  void ReleaseRetiredLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One Resolve call is done with the address's handshake entry; the last drops it.
  void ForgetHandshakeLocked(const std::string& address) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Self self_;
  const std::vector<FabricNic*> nics_;
  std::shared_ptr<grpc::ChannelCredentials> creds_;
  const grpc::ChannelArguments args_;
  OnRetire on_retire_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<PeerConnection>> peers_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<PeerConnection>> retired_ ABSL_GUARDED_BY(mu_);  // not yet released
  size_t retired_total_ ABSL_GUARDED_BY(mu_) = 0;
  size_t idle_closed_total_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, std::shared_ptr<grpc::Channel>> ping_channels_ ABSL_GUARDED_BY(mu_);
  // Handshakes in progress, one at a time per address: a slow or dead peer holds up only
  // the transfers to it, not first contacts with every other agent. `callers` counts the
  // Resolve calls that took the entry (under mu_), so the last one out drops it.
  struct Handshaking {
    absl::Mutex mu;
    int callers = 0;  // guarded by the table's mu_
  };
  absl::flat_hash_map<std::string, std::shared_ptr<Handshaking>> handshaking_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry

#endif  // FERRY_AGENT_PEERS_PEER_TABLE_H_
