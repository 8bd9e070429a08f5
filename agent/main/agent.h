// Agent: one ferryd process — every component, wired, started and stopped in order.
//
//   absl::StatusOr<std::unique_ptr<Agent>> agent = Agent::Start(config);
//   ...                                      // serve until SIGTERM
//   (*agent)->Shutdown(absl::Seconds(5));    // drain, then stop; idempotent
#ifndef FERRY_AGENT_MAIN_AGENT_H_
#define FERRY_AGENT_MAIN_AGENT_H_

#include <atomic>
#include <memory>
#include <string>

#include <grpcpp/server.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "agent/config/config.h"
#include "agent/cuda/cuda_import.h"
#include "agent/engine/fabric_engine.h"
#include "agent/local/gpu_copier.h"
#include "agent/local/host_copier.h"
#include "agent/memory/region_table.h"
#include "agent/metrics/metrics.h"
#include "agent/peers/peer_service.h"
#include "agent/queue/inbox.h"
#include "agent/queue/queue_poller.h"
#include "agent/router/queue_entries.h"
#include "agent/router/transfer_router.h"
#include "agent/service/local_service.h"
#include "agent/session/session_registry.h"
#include "agent/session/session_socket.h"
#include "agent/staged/staged_executor.h"
#include "agent/staged/staging_table.h"
#include "agent/transfer/transfer.h"

namespace ferry {

class Agent {
 public:
  static absl::StatusOr<std::unique_ptr<Agent>> Start(const AgentConfig& config);
  ~Agent();

  // Stops taking writes, lets in-flight transfers finish for up to `grace`, then stops
  // every server, ends every session and removes the sockets.
  void Shutdown(absl::Duration grace);

  uint64_t incarnation() const { return incarnation_; }
  int metrics_port() const { return metrics_server_ ? metrics_server_->port() : 0; }
  std::string advertise_address() const { return advertise_address_; }

 private:
  explicit Agent(const AgentConfig& config);
  absl::Status Init();
  // Opens the NICs and serves the peer API; sets advertise_address_.
  absl::Status StartFabric();
  // The router, and the shared-memory queues' entries handed to it.
  // Replaces the topology's NICs with the ones in config_.claimed_devices.
  absl::Status UseClaimedNics(Topology& topology);
  void StartTransferPaths();
  // The local gRPC API (with health and reflection) and the session socket.
  absl::Status StartLocalApi();
  // OK when the agent takes work: initialised, not draining, socket in place, fabric up.
  absl::Status Readiness() const;

  AgentConfig config_;
  const uint64_t incarnation_;
  std::string advertise_address_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<RegionTable> regions_;
  std::unique_ptr<SessionRegistry> sessions_;
  std::unique_ptr<TransferManager> transfers_;
  std::unique_ptr<WriteWindows> windows_;  // before the router, services and engine use it
  std::unique_ptr<HostCopier> local_copier_;
  absl::Status cuda_status_;  // why GPU memory is unavailable, when it is
  std::unique_ptr<CudaMemory> cuda_memory_;
  std::shared_ptr<const Topology> topology_;  // never null once Init ran
  std::unique_ptr<GpuCopier> gpu_copier_;
  std::unique_ptr<FabricEngine> engine_;
  std::unique_ptr<InboundWrites> inbound_;  // notified writes other agents make into ours
  std::unique_ptr<PeerService> peer_service_;
  std::unique_ptr<grpc::Server> peer_server_;
  // The staged path; released in Shutdown, after the engine stops and before it goes.
  std::unique_ptr<StageCopier> stage_copier_;
  std::unique_ptr<StagingTable> staging_table_;
  std::unique_ptr<StagedExecutor> staged_;
  std::unique_ptr<TransferRouter> router_;
  std::unique_ptr<LocalService> local_service_;
  std::unique_ptr<QueueEntries> queue_entries_;
  std::unique_ptr<QueuePoller> queue_poller_;  // after queue_entries_: its handler
  std::unique_ptr<Inboxes> inboxes_;
  std::unique_ptr<grpc::Server> local_server_;
  std::unique_ptr<SessionSocketServer> session_server_;
  std::unique_ptr<MetricsServer> metrics_server_;
  bool shut_down_ = false;
  std::atomic<bool> serving_{false};
};

}  // namespace ferry

#endif  // FERRY_AGENT_MAIN_AGENT_H_
