// FabricEngine: cross-node transfers over libfabric.
//
//   absl::StatusOr<std::unique_ptr<FabricEngine>> e = FabricEngine::Create(options, metrics);
//   (*e)->StartPeers(self_address, credentials, args);   // once the peer server is bound
//   // as RegionRegistrar: every new region is registered on every NIC
//   // as TransferExecutor: Submit() writes a transfer the router resolved (t->peer,
//   // t->remote_region) and sent down the fabric path
//
// A transfer becomes WriteOps: adjacent chunks are coalesced, large ones split at
// `max_op_bytes`, and the pieces striped round-robin over the NICs of the source's rail
// (a GPU's nearest NICs, or those of a host region's NUMA node; see agent/topology);
// local NIC i writes to remote NIC i mod R, so rail-aligned networks stay on their rail.
// Each NIC's RailWorker, pinned to its NIC's NUMA-local cores, posts and completes its ops.
// With latency lanes (FabricEngineOptions::latency_lanes) NIC i has a second endpoint,
// its lane, and a latency-class write to a peer with lanes goes from the lanes of its
// rail to the peer's lanes instead (local lane of NIC i to remote lane of NIC i mod R).
// Once every op reported delivery-complete, the target agent is told when the writer
// asked for a notification: by a fabric message carrying the NotifyRequest, from the
// first NIC of the rail, where both agents have messages (FabricNic::messages; the
// target says so in its handshake), else by the Notify RPC. Only once the message is in
// the target's receive buffer (or the RPC answered) does the writer see success. The
// message saves the RPC's round trip and its thread hand-offs: the target's NIC worker
// reads it from its own CQ and hands it to the receiver (PeerService::AcceptMessage).
// Remote CQ data (fi_writedata) would not do: 8 bytes hold no tag, id or payload, and
// pieces on other NICs may still be in flight when one NIC's last write lands.
// Transfers without a notification are reported to the target in the background, at
// most once a second per target region, so its receive counters stay complete
// (ReceiveReports). A watchdog thread enforces each transfer's deadline (TransferWatch);
// a peer restart fails its transfers with UNAVAILABLE. Calls to other agents that block
// (Notify RPCs, reports, a retried write's handshake) run on BlockingLanes, a lane per
// peer.
#ifndef FERRY_AGENT_ENGINE_FABRIC_ENGINE_H_
#define FERRY_AGENT_ENGINE_FABRIC_ENGINE_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/common/blocking_lanes.h"
#include "agent/engine/rail_worker.h"
#include "agent/engine/receive_reports.h"
#include "agent/engine/transfer_watch.h"
#include "agent/fabric/fabric_nic.h"
#include "agent/memory/region.h"
#include "agent/metrics/metrics.h"
#include "agent/peers/peer_table.h"
#include "agent/topology/rails.h"
#include "agent/transfer/executor.h"

namespace ferry {

struct FabricEngineOptions {
  std::string provider = "auto";
  std::vector<std::string> ifaces;
  uint64_t incarnation = 0;
  // Largest single write; larger chunks are split so they can stripe over NICs.
  uint64_t max_op_bytes = 1 << 20;
  size_t tx_size = 0;                                    // > 0 overrides the provider's queue depth
  bool hmem = true;                                      // use FI_HMEM for GPU memory where the provider has it
  absl::Duration worker_spin = absl::Microseconds(100);  // see RailWorker
  // Threads for the calls to other agents that block (Notify RPCs, receive reports, a
  // retried write's new handshake); one peer's calls hold at most one of them.
  int notify_threads = 2;
  // Receive notifications as fabric messages (and so send them, where the peer does
  // too); false: by the Notify RPC only (--fabric_messages).
  bool fabric_messages = true;
  // The node's topology (agent/topology): rails and worker pinning. Null: every region
  // stripes over every NIC, workers unpinned.
  std::shared_ptr<const Topology> topology;
  bool pin_workers = true;  // to the cores of each NIC's NUMA node
  size_t max_peers = 0;     // PeerTable::Self::max_peers
  // Connections to peers no transfer used for this long are closed (PeerTable::CloseIdle,
  // by the watchdog once a second); zero: never.
  absl::Duration peer_idle = absl::ZeroDuration();
  // How each NIC's worker shares it between pods and traffic classes.
  QosScheduling qos;
  // A latency lane per NIC (--fabric_latency_lane): a second endpoint on the same device
  // with its own domain, connection and worker. Latency-class writes to a peer that has
  // lanes too go through them, so no bulk bytes wait ahead of them in a connection, nor
  // a bulk post in their worker's turn (on tcp a post pushes bytes into the socket
  // inside the call); the NIC (on tcp the kernel) shares the wire between connections.
  // Regions are registered on the lanes as on any NIC. Only with qos.enabled.
  bool latency_lanes = false;
};

class FabricEngine : public TransferExecutor, public RegionRegistrar {
 public:
  static absl::StatusOr<std::unique_ptr<FabricEngine>> Create(const FabricEngineOptions& options, Metrics* metrics);
  ~FabricEngine() override;

  // Where fabric messages from peers go (PeerService::AcceptMessage), on the NIC
  // workers' threads. Set before StartPeers; until then messages are dropped.
  void SetMessageHandler(std::function<void(absl::string_view)> handler) {
    absl::MutexLock lock(&handler_mu_);
    handler_ = std::move(handler);
  }
  // Enables outgoing transfers; `self_address` is this agent's peer address.
  void StartPeers(const std::string& self_address, std::shared_ptr<grpc::ChannelCredentials> creds,
                  grpc::ChannelArguments args = {});
  // Fails every transfer in flight with UNAVAILABLE and stops the workers (bounded).
  void Shutdown();
  // Runs `source` (the shared-memory queues) on the first NIC's worker thread; nullptr
  // detaches it (returns once the worker no longer touches it).
  void AttachPollSource(PollSource* source) { workers_.front()->SetPollSource(source); }

  void Submit(std::shared_ptr<Transfer> t, Done done) override;
  // GPU memory is registered with the NICs only when every NIC has FI_HMEM.
  absl::StatusOr<RegionRegistration> Register(const MemoryBacking& backing) override;
  absl::StatusOr<RegionRegistration> RegisterRange(const MemoryBacking& backing, uint64_t offset,
                                                   uint64_t length) override;

  // The peers this agent writes to (null before StartPeers): what the router resolves
  // remote destinations with.
  PeerTable* peers() const { return peers_.get(); }

  // The engine's primitives, which the staged path (agent/staged) drives stage by stage.
  // Writes `t` (a registered host source) to `keys` of `peer` at the chunks' dst
  // offsets. Never notifies; `done` as for Submit. `keys_since`: when the keys were
  // fetched (RemoteRegion::opened); after a connection drop older keys are not posted
  // (see RailWorker); InfiniteFuture opts out.
  void SubmitTo(std::shared_ptr<Transfer> t, std::shared_ptr<PeerConnection> peer,
                const std::vector<v1::RemoteKey>& keys, uint64_t region_id, absl::Time keys_since, Done done);
  // Notifies the destination's owner (t->peer) that all of `t` landed. Blocks for the RPC.
  void NotifyDelivered(const std::shared_ptr<Transfer>& t, Done done);
  // Tells `peer` that all of `t` landed (`nic_bytes`: what arrived through each of its
  // NICs, for its receive counters; may be empty): as a fabric message from local NIC
  // `nic` where both agents have them, else by the Notify RPC (on a notify thread).
  // `done` once the target has it; an error says the bytes landed regardless.
  void NotifyPeer(const std::shared_ptr<Transfer>& t, const std::shared_ptr<PeerConnection>& peer, size_t nic,
                  const std::vector<uint64_t>& nic_bytes, Done done);
  // Tells t->peer that the notified write `t` starts (`req`, a NotifyRequest with begin;
  // agent/peers/inbound_writes.h): as a fabric message where both agents have them, so
  // the receiving agent learns it on its NIC worker without an RPC's threads on either
  // side, else by an asynchronous Notify RPC. Never blocks; `done` only reports. The
  // message may arrive after the write's own notification (InboundWrites allows it).
  void AnnounceToPeer(const std::shared_ptr<Transfer>& t, v1::NotifyRequest req, Done done);

  std::vector<FabricNic*> nics() const;
  // Each NIC's device in the topology (nullptr: none, e.g. loopback), the rails built
  // from them, and the NICs a region's bytes go over.
  const std::vector<const NicDevice*>& nic_devices() const { return nic_devices_; }
  const RailPlan& rails() const { return rails_; }
  const std::vector<int>& RailFor(const Region& r) const { return rails_.NicsFor(r.placement()); }
  // NICs, then their latency lanes (nics()[main_nics() + i] is NIC i's lane), if any.
  size_t main_nics() const { return main_nics_; }
  const std::vector<int>& worker_cpus(size_t nic) const { return workers_[nic]->cpus(); }
  const std::string& provider() const { return nics_.front()->provider(); }
  void FillStatus(v1::GetStatusResponse* resp) const;

 private:
  FabricEngine(const FabricEngineOptions& options, Metrics* metrics) : options_(options), metrics_(metrics) {}
  void Watchdog();
  // Runs `call`, which may block on agent `peer`, on peer_calls_.
  void CallPeer(const PeerConnection& peer, std::function<void()> call);
  void FailTransfersTo(const PeerConnection& peer);
  void OnMessage(absl::string_view bytes);
  // The NotifyRequest that delivers `t`'s notification.
  v1::NotifyRequest DeliveredRequest(const Transfer& t, const std::vector<uint64_t>& nic_bytes) const;
  // Whether `t` goes through the latency lanes: a latency-class write, with traffic
  // classes on, where this agent and `peer` both have lanes.
  bool UsesLanes(const Transfer& t, const PeerConnection& peer) const;
  // The endpoint local NIC `nic` (a NIC or a lane) writes to on `peer`: its NIC i mod
  // R, or that NIC's lane from a lane.
  size_t RemoteNic(size_t nic, const PeerConnection& peer) const;
  // Whether `req` goes to `peer` as a fabric message from local NIC `nic`: both agents
  // take messages and it fits one. Otherwise it goes by the Notify RPC.
  bool ByMessage(const PeerConnection& peer, size_t nic, const v1::NotifyRequest& req) const;
  // NotifyPeer's two ways: by RPC (blocks for it), or as a message from local NIC `nic`
  // (also AnnounceToPeer's); `done` gets the message's own outcome.
  void SendNotify(const std::shared_ptr<Transfer>& t, const v1::NotifyRequest& req, Done done);
  void SendNotifyMessage(const std::shared_ptr<Transfer>& t, const std::shared_ptr<PeerConnection>& peer, size_t nic,
                         const v1::NotifyRequest& req, Done done);

  // Sends what receive_reports_ added up since the last call, on peer_calls_.
  void SendReceiveReports();

  const FabricEngineOptions options_;
  uint64_t max_op_bytes_ = 0;  // the largest op: the option, capped by every NIC's max_msg_size
  Metrics* metrics_;
  std::vector<std::unique_ptr<FabricNic>> nics_;  // NICs, then their lanes
  size_t main_nics_ = 0;
  std::vector<std::unique_ptr<RailWorker>> workers_;
  std::shared_ptr<const Topology> topology_;
  std::vector<const NicDevice*> nic_devices_;
  RailPlan rails_;
  std::unique_ptr<PeerTable> peers_;
  std::atomic<PeerTable*> peers_for_watchdog_{nullptr};  // peers_, once StartPeers made it
  // Whether GPU memory is registered with the NICs: true when every NIC has FI_HMEM,
  // false after the first GPU registration a provider refused.
  std::atomic<bool> gpu_direct_{false};

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  TransferWatch watch_;  // every transfer with ops posted, to its deadline
  absl::Mutex handler_mu_;
  std::function<void(absl::string_view)> handler_ ABSL_GUARDED_BY(handler_mu_);
  // Un-notified writes' bytes per target region, reported by the watchdog once a second.
  ReceiveReports receive_reports_{options_.incarnation};
  // Calls to other agents that block, in a lane per peer: a peer that stopped answering
  // holds up its own calls only (Shutdown stops it: what was posted runs first). Bounded
  // without a cap of its own: a transfer has at most one call queued at a time (its
  // notification, or its one retry), transfers are capped (--max_inflight_transfers), and
  // reports come at most once a second per target region.
  BlockingLanes peer_calls_{static_cast<size_t>(std::max(options_.notify_threads, 1)), "ferry-notify"};
  std::thread watchdog_;
};

}  // namespace ferry

#endif  // FERRY_AGENT_ENGINE_FABRIC_ENGINE_H_
