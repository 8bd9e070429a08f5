// TransferExecutor: something that moves a validated transfer's bytes.
//
// Implementations: HostCopier (agent/local, node-local memcpy), GpuCopier (agent/local,
// node-local copies by the GPUs), FabricEngine (agent/engine, one-sided RDMA writes) and
// StagedExecutor (agent/staged, GPU memory through host staging buffers and the fabric).
// Tests may substitute an executor that injects faults; the API layer only sees this
// interface.
#ifndef FERRY_AGENT_TRANSFER_EXECUTOR_H_
#define FERRY_AGENT_TRANSFER_EXECUTOR_H_

#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "agent/transfer/transfer.h"

namespace ferry {

class TransferExecutor {
 public:
  using Done = std::function<void(absl::Status)>;
  virtual ~TransferExecutor() = default;
  // Synchronous checks before the transfer is accepted (e.g. resolving a remote region
  // and checking bounds against it). An error here is the Write call's own error, so
  // nothing has moved. May fill t.executor_context for Submit, and may hand the
  // transfer to another executor (t.executor, t.path) that suits it better once the
  // target is known (the staged path does, for GPU memory the NICs reach directly).
  virtual absl::Status Prepare(Transfer& t) { return absl::OkStatus(); }
  // Starts moving `t`'s bytes; calls `done` exactly once, from any thread, never from
  // inside Submit. Must respect t->deadline (DEADLINE_EXCEEDED, never a hang).
  virtual void Submit(std::shared_ptr<Transfer> t, Done done) = 0;
};

}  // namespace ferry

#endif  // FERRY_AGENT_TRANSFER_EXECUTOR_H_
