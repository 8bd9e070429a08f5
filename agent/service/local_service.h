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
#include "agent/queue/inbox.h"
#include "agent/queue/queue_poller.h"
#include "agent/router/transfer_router.h"
#include "agent/session/session_registry.h"
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
  WriteWindows* windows = nullptr;
  SessionRegistry* sessions = nullptr;
  TransferManager* transfers = nullptr;
  // Checks writes and picks their path (agent/router).
  const TransferRouter* router = nullptr;
  // GPU memory: importer; null on a node without a usable CUDA driver, where
  // `cuda_unavailable` says why.
  CudaMemory* cuda = nullptr;
  std::function<void(int device)> gpu_warm_up;  // may be empty
  absl::Status cuda_unavailable;
  // Attaches fabric registrations to new regions; null without fabric.
  RegionRegistrar* registrar = nullptr;
  // Serves shared-memory transfer queues; null disables CreateQueue.
  QueuePoller* queues = nullptr;
  // Keeps notification inboxes pumping; null disables OpenInbox.
  Inboxes* inboxes = nullptr;
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
  grpc::Status WriteBatch(grpc::ServerContext* ctx, const v1::WriteBatchRequest* req, v1::WriteResponse* resp) override;
  grpc::Status Wait(grpc::ServerContext* ctx, const v1::WaitRequest* req, v1::WaitResponse* resp) override;
  grpc::Status CreateQueue(grpc::ServerContext* ctx, const v1::CreateQueueRequest* req,
                           v1::CreateQueueResponse* resp) override;
  grpc::Status OpenInbox(grpc::ServerContext* ctx, const v1::OpenInboxRequest* req,
                         v1::OpenInboxResponse* resp) override;
  grpc::Status WatchCompletions(grpc::ServerContext* ctx, const v1::WatchCompletionsRequest* req,
                                grpc::ServerWriter<v1::TransferResult>* writer) override;
  grpc::Status WatchNotifications(grpc::ServerContext* ctx, const v1::WatchNotificationsRequest* req,
                                  grpc::ServerWriter<v1::Notification>* writer) override;
  grpc::Status GetStatus(grpc::ServerContext* ctx, const v1::GetStatusRequest* req,
                         v1::GetStatusResponse* resp) override;
  grpc::Status GetTopology(grpc::ServerContext* ctx, const v1::GetTopologyRequest* req,
                           v1::GetTopologyResponse* resp) override;
  grpc::Status SendMessage(grpc::ServerContext* ctx, const v1::SendMessageRequest* req,
                           v1::SendMessageResponse* resp) override;
  grpc::Status OpenWriteWindow(grpc::ServerContext* ctx, const v1::OpenWriteWindowRequest* req,
                               v1::OpenWriteWindowResponse* resp) override;
  grpc::Status CloseWriteWindow(grpc::ServerContext* ctx, const v1::CloseWriteWindowRequest* req,
                                v1::CloseWriteWindowResponse* resp) override;

 private:
  absl::StatusOr<std::shared_ptr<Session>> SessionOf(grpc::ServerContext* ctx) const;
  absl::StatusOr<v1::RegisterMemoryResponse> DoRegister(Session& session, const v1::RegisterMemoryRequest& req);
  absl::StatusOr<v1::OpenWriteWindowResponse> DoOpenWindow(const Session& session,
                                                           const v1::OpenWriteWindowRequest& req);
  // The descriptor of `region` that pods write with (its own token, no window).
  v1::RegionDescriptor DescriptorOf(const Region& region) const;
  absl::StatusOr<std::shared_ptr<Transfer>> PrepareWrite(const std::shared_ptr<Session>& session,
                                                         const v1::WriteRequest& req);
  // Every part of a batch prepared (or the first part's error, named), joined into one.
  absl::StatusOr<std::shared_ptr<Transfer>> PrepareBatch(const std::shared_ptr<Session>& session,
                                                         const v1::WriteBatchRequest& req);
  // Gives a prepared transfer its id and starts it; the id, or why it cannot start.
  absl::StatusOr<uint64_t> Start(Session& session, std::shared_ptr<Transfer> t);
  // Answers a Write or WriteBatch that started transfer `id`: with its result if it
  // finishes within `wait_ms` (bounded as a Wait is).
  void Answer(const grpc::ServerContext& ctx, Session& session, uint64_t id, uint32_t wait_ms, v1::WriteResponse* resp);
  // How long a call may wait for a transfer: `wait_ms`, at most --max_wait_ms and what
  // is left of the call's deadline.
  absl::Duration WaitBudget(const grpc::ServerContext& ctx, uint32_t wait_ms) const;
  // A request's timeout_ms: --transfer_timeout_ms for 0; INVALID_ARGUMENT past
  // --max_transfer_timeout_ms.
  absl::StatusOr<uint32_t> TimeoutMs(uint32_t requested) const;
  absl::StatusOr<uint64_t> DoCreateQueue(const std::shared_ptr<Session>& session, const v1::CreateQueueRequest& req);
  absl::Status DoOpenInbox(const std::shared_ptr<Session>& session, const v1::OpenInboxRequest& req);
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
