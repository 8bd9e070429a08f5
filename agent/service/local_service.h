// LocalService: the ferry.v1.Agent gRPC API that workload pods call on the unix socket.
//
// This is the trust boundary: every request is validated here and answered with a
// gRPC status that names the offending field and the allowed range. Inside the agent,
// errors are absl::Status; they become grpc::Status only on the way out.
#ifndef FERRY_AGENT_SERVICE_LOCAL_SERVICE_H_
#define FERRY_AGENT_SERVICE_LOCAL_SERVICE_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "agent/config/config.h"
#include "agent/cuda/cuda_import.h"
#include "agent/memory/region_table.h"
#include "agent/metrics/metrics.h"
#include "agent/queue/queue_poller.h"
#include "agent/session/session_registry.h"
#include "agent/transfer/executor.h"
#include "agent/transfer/transfer.h"
#include "proto/ferry/v1/ferry.grpc.pb.h"

namespace ferry {

struct LocalServiceDeps {
  const AgentConfig* config = nullptr;
  uint64_t incarnation = 0;
  // Peer address written into descriptors; empty when the agent has no peer service.
  std::string advertise_address;
  Metrics* metrics = nullptr;
  RegionTable* regions = nullptr;
  SessionRegistry* sessions = nullptr;
  TransferManager* transfers = nullptr;
  TransferExecutor* local = nullptr;
  // GPU memory: importer and node-local copier; null on a node without a usable CUDA
  // driver, where `cuda_unavailable` says why.
  CudaMemory* cuda = nullptr;
  TransferExecutor* gpu_local = nullptr;
  std::function<void(int device)> gpu_warm_up;  // may be empty
  absl::Status cuda_unavailable;
  // Cross-node executor; null when the agent runs without fabric/peers.
  TransferExecutor* remote = nullptr;
  // Cross-node writes from or into memory the NICs cannot reach; null without fabric.
  TransferExecutor* staged = nullptr;
  bool stage_host_regions = false;
  // Attaches fabric registrations to new regions; null without fabric.
  RegionRegistrar* registrar = nullptr;
  // Serves shared-memory transfer queues; null disables CreateQueue.
  QueuePoller* queues = nullptr;
  // Adds fabric, NIC and peer details to GetStatus; may be null.
  std::function<void(v1::GetStatusResponse*)> fill_status;
  std::function<void(v1::GetTopologyResponse*)> fill_topology;
  // Where a new region's memory is (its GPU, or the registering client's NUMA node).
  std::function<Placement(const Session&, const MemoryBacking&)> place;
};

class LocalService final : public v1::Agent::Service {
 public:
  explicit LocalService(LocalServiceDeps deps);

  // Makes streaming RPCs return (within ~200 ms) so the server can shut down.
  void BeginShutdown() { shutting_down_.store(true); }

  grpc::Status RegisterMemory(grpc::ServerContext* ctx, const v1::RegisterMemoryRequest* req,
                              v1::RegisterMemoryResponse* resp) override;
  grpc::Status DeregisterMemory(grpc::ServerContext* ctx, const v1::DeregisterMemoryRequest* req,
                                v1::DeregisterMemoryResponse* resp) override;
  grpc::Status Write(grpc::ServerContext* ctx, const v1::WriteRequest* req, v1::WriteResponse* resp) override;
  grpc::Status Wait(grpc::ServerContext* ctx, const v1::WaitRequest* req, v1::WaitResponse* resp) override;
  grpc::Status CreateQueue(grpc::ServerContext* ctx, const v1::CreateQueueRequest* req,
                           v1::CreateQueueResponse* resp) override;
  grpc::Status WatchCompletions(grpc::ServerContext* ctx, const v1::WatchCompletionsRequest* req,
                                grpc::ServerWriter<v1::TransferResult>* writer) override;
  grpc::Status WatchNotifications(grpc::ServerContext* ctx, const v1::WatchNotificationsRequest* req,
                                  grpc::ServerWriter<v1::Notification>* writer) override;
  grpc::Status GetStatus(grpc::ServerContext* ctx, const v1::GetStatusRequest* req,
                         v1::GetStatusResponse* resp) override;
  grpc::Status GetTopology(grpc::ServerContext* ctx, const v1::GetTopologyRequest* req,
                           v1::GetTopologyResponse* resp) override;

  // The QueuePoller's handler: one queue entry, validated and started like a Write; its
  // result (or refusal) goes to the queue's completion ring. With !may_block (on a NIC
  // worker) it returns false, having done nothing, when the destination's peer or
  // region must first be looked up over the network.
  bool OnQueueEntry(const std::shared_ptr<TransferQueue>& q, const queue::SubmitEntry& e, bool may_block);

 private:
  absl::StatusOr<std::shared_ptr<Session>> SessionOf(grpc::ServerContext* ctx) const;
  absl::StatusOr<v1::RegisterMemoryResponse> DoRegister(Session& session, const v1::RegisterMemoryRequest& req);
  // Picks the path for `dst` (this agent's region, or another agent's) and fills t's
  // destination, path and executor. Returns the destination's size.
  absl::StatusOr<uint64_t> ResolveDestination(const std::shared_ptr<const v1::RegionDescriptor>& dst, Transfer& t);
  // What a write asks for, whichever API it came through.
  struct WriteSpec {
    uint64_t src_region_id = 0;
    std::shared_ptr<const v1::RegionDescriptor> dst;  // null: the request has none
    bool notify = false;
    uint64_t tag = 0;
    uint32_t timeout_ms = 0;  // 0: --transfer_timeout_ms
  };
  // Lays out the chunks once both regions' sizes are known.
  using PlanChunks = absl::FunctionRef<absl::StatusOr<ChunkPlan>(uint64_t src_size, uint64_t dst_size)>;
  // Validates a write and prepares it with its executor; nothing has moved yet.
  // `cached_only`: see Transfer::cached_only.
  absl::StatusOr<std::shared_ptr<Transfer>> PrepareWrite(const std::shared_ptr<Session>& session, const WriteSpec& spec,
                                                         PlanChunks plan, bool cached_only);
  absl::StatusOr<std::shared_ptr<Transfer>> PrepareWrite(const std::shared_ptr<Session>& session,
                                                         const v1::WriteRequest& req);
  // Starts a prepared transfer whose id is set.
  void Launch(std::shared_ptr<Transfer> t);
  absl::StatusOr<uint64_t> DoCreateQueue(const std::shared_ptr<Session>& session, const v1::CreateQueueRequest& req);
  // Counts errors by API and code, converts to grpc::Status.
  grpc::Status Reply(const char* api, const absl::Status& status);
  template <typename Event>
  grpc::Status Drain(grpc::ServerContext* ctx, const char* api, EventQueue<Event>& (Session::*queue)(),
                     grpc::ServerWriter<Event>* writer);

  LocalServiceDeps deps_;
  absl::Time started_;
  std::atomic<bool> shutting_down_{false};
  std::atomic<uint64_t> next_queue_id_{1};
};

}  // namespace ferry

#endif  // FERRY_AGENT_SERVICE_LOCAL_SERVICE_H_
