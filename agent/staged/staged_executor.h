// StagedExecutor: cross-node writes from or into memory the NICs cannot reach.
//
// Without FI_HMEM, GPU memory cannot be registered with the NICs, so a transfer is cut
// into stages that fit the staging buffers and each stage goes through host memory:
//
//   source GPU --cuMemcpy--> local staging --fi_write--> target staging --cuMemcpy--> GPU
//   (only when the source is GPU memory)                  (only when the target is)
//
// Stages are pipelined: each holds one slot of this worker's staging buffer and one of
// the target's (SlotPool, `stage_bytes` each) while it is copied out, written and then
// committed (peer CommitStaged, asynchronous, returning once the bytes are in the
// target's GPU), so stage k+1 is copied and written while stage k is committed. Every
// staged transfer from this agent into one region shares that region's target slots.
// A transfer completes only after its last stage is committed, then notifies. Deadlines
// hold throughout (the engine's watchdog, every RPC, every wait for a slot). The router
// (agent/router) decides which transfers come here and whether their source is staged
// (t->stage_src); the destination is staged when its agent reserved a staging buffer.
#ifndef FERRY_AGENT_STAGED_STAGED_EXECUTOR_H_
#define FERRY_AGENT_STAGED_STAGED_EXECUTOR_H_

#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "agent/common/slot_pool.h"
#include "agent/engine/fabric_engine.h"
#include "agent/staged/stage_copier.h"
#include "agent/transfer/executor.h"
#include "proto/ferry/cuda/cuda_driver.h"

namespace ferry {

struct StagedExecutorOptions {
  int workers = 2;
  uint64_t buffer_bytes = 32 << 20;  // local staging per worker
  uint64_t stage_bytes = 1 << 20;    // the largest stage: the pipeline's unit
};

class StagedExecutor : public TransferExecutor {
 public:
  // `cu` may be null (no GPU here: only host sources, staged targets).
  StagedExecutor(StagedExecutorOptions options, FabricEngine* engine, const CudaDriver* cu, StageCopier* copier);
  // Fails queued transfers (UNAVAILABLE), lets running ones end, joins the workers.
  ~StagedExecutor() override;

  void Submit(std::shared_ptr<Transfer> t, Done done) override;

 private:
  class StageTracker;
  struct CommitCall;
  // A worker's staging buffer and its slots, made on first need.
  struct LocalStaging {
    std::shared_ptr<Region> memory;
    std::shared_ptr<SlotPool> slots;
  };

  void Work();
  absl::Status Run(const std::shared_ptr<Transfer>& t, LocalStaging& local);
  // The slots one stage holds: this worker's staging buffer's (a GPU source copied out),
  // the target's (a staged target); either may be empty.
  struct StageSlots {
    SlotLease local, remote;
  };
  // One stage as the fabric writes it (`sub`: from the local slot or the source, into
  // the target's slot or region), what is copied into the local slot first (`gather`,
  // source offset -> slot offset), and for a staged target the commit that copies the
  // slot into the region.
  struct StagePlan {
    std::shared_ptr<Transfer> sub;
    std::vector<CopyChunk> gather;
    std::shared_ptr<CommitCall> commit;
  };
  StagePlan PlanStage(const Transfer& t, const std::vector<CopyChunk>& stage, const SlotLease& local,
                      const SlotLease& remote) const;
  // Starts one stage (chunks already cut to fit a slot): takes its slots, copies it out,
  // submits the write, whose completion commits it. Errors after the start reach
  // `tracker`; an error returned here means the stage never started.
  absl::Status StartStage(const std::shared_ptr<Transfer>& t, const std::vector<CopyChunk>& stage,
                          const LocalStaging& local, const std::shared_ptr<SlotPool>& remote_slots,
                          const std::shared_ptr<StageTracker>& tracker);
  // The target region's slots, shared by every transfer into it.
  std::shared_ptr<SlotPool> RemoteSlots(RemoteRegion& region) const;
  // A CommitStaged result as a status (UNAVAILABLE when the target lost the buffer).
  static absl::Status CommitStatus(const grpc::Status& rpc, PeerConnection& peer, const RemoteRegion& region);

  const StagedExecutorOptions options_;
  FabricEngine* engine_;
  const CudaDriver* cu_;
  StageCopier* copier_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<std::pair<std::shared_ptr<Transfer>, Done>> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> workers_;
};

}  // namespace ferry

#endif  // FERRY_AGENT_STAGED_STAGED_EXECUTOR_H_
