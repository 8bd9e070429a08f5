// TransferExecutor: something that moves a validated transfer's bytes.
//
// Implementations: HostCopier (agent/local, node-local memcpy), GpuCopier (agent/local,
// node-local copies by the GPUs), FabricEngine (agent/engine, one-sided RDMA writes) and
// StagedExecutor (agent/staged, GPU memory through host staging buffers and the fabric).
// The router (agent/router) picks a transfer's executor once, with its path, after every
// check; an executor only moves bytes. Tests may substitute one that injects faults.
#ifndef FERRY_AGENT_TRANSFER_EXECUTOR_H_
#define FERRY_AGENT_TRANSFER_EXECUTOR_H_

#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "agent/transfer/transfer.h"

namespace ferry {

class TransferExecutor {
 public:
  using Done = std::function<void(absl::Status)>;
  using Submissions = std::vector<std::pair<std::shared_ptr<Transfer>, Done>>;  // each a Submit's arguments
  virtual ~TransferExecutor() = default;
  // Starts moving `t`'s bytes; calls `done` exactly once, from any thread, possibly
  // before Submit returns (HostCopier copies small transfers inline): callers hold no
  // lock `done` may take. Must respect t->deadline (DEADLINE_EXCEEDED, never a hang).
  virtual void Submit(std::shared_ptr<Transfer> t, Done done) = 0;
  // Submit for each of `jobs` (a batch's parts), in order. An executor whose queue takes
  // a lock per transfer may take it once for all of them.
  virtual void SubmitAll(Submissions jobs) {
    for (auto& [t, done] : jobs) Submit(std::move(t), std::move(done));
  }
  // A hint that `t` will be submitted shortly (a batch's first part is planned while
  // the others are still being planned): an executor whose worker sleeps may wake it
  // now, so that the wake-up overlaps the planning. Needs no Submit to follow.
  virtual void Expect(const Transfer& t) { (void)t; }
  // The caller has handed over what it had together (a queue's burst, a batch's parts):
  // an executor whose worker may be asleep may start them on the calling thread now,
  // rather than wait for the worker to wake. Submit alone must suffice without it.
  virtual void Flush() {}
};

}  // namespace ferry

#endif  // FERRY_AGENT_TRANSFER_EXECUTOR_H_
