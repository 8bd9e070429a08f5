// StagedExecutor: cross-node writes from or into memory the NICs cannot reach.
//
// Without FI_HMEM, GPU memory cannot be registered with the NICs, so a transfer is cut
// into stages that fit the staging buffers and each stage goes through host memory:
//
//   source GPU --cuMemcpy--> local staging --fi_write--> target staging --cuMemcpy--> GPU
//   (only when the source is GPU memory)                  (only when the target is)
//
// A stage into a staged target is committed (peer CommitStaged, which returns once the
// bytes are in the target's GPU) before the next stage reuses the target's buffer, so a
// transfer completes only after its last byte is in the destination. Transfers into one
// target region from this agent take turns on its staging buffer; other transfers run
// on other workers. Deadlines hold throughout (the engine's watchdog, and every RPC).
#ifndef FERRY_AGENT_STAGED_STAGED_EXECUTOR_H_
#define FERRY_AGENT_STAGED_STAGED_EXECUTOR_H_

#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "agent/cuda/cuda_driver.h"
#include "agent/engine/fabric_engine.h"
#include "agent/staged/stage_copier.h"
#include "agent/transfer/executor.h"

namespace ferry {

struct StagedExecutorOptions {
  int workers = 2;
  uint64_t buffer_bytes = 32 << 20;  // local staging per worker
  bool stage_host_regions = false;   // also carry host sources through staging
};

class StagedExecutor : public TransferExecutor {
 public:
  // `cu` may be null (no GPU here: only host sources, staged targets).
  StagedExecutor(StagedExecutorOptions options, FabricEngine* engine, const CudaDriver* cu, StageCopier* copier);
  // Fails queued transfers (UNAVAILABLE), lets running ones end, joins the workers.
  ~StagedExecutor() override;

  absl::Status Prepare(Transfer& t) override;
  void Submit(std::shared_ptr<Transfer> t, Done done) override;

 private:
  void Work();
  // Whether bytes leave `src` through local staging (the NICs cannot reach it).
  bool SourceStaged(const Region& src) const;
  absl::Status Run(const std::shared_ptr<Transfer>& t, std::shared_ptr<Region>& staging);
  // One stage: [first, last) of `stage`'s chunks, already split to fit.
  absl::Status RunStage(const std::shared_ptr<Transfer>& t, const std::vector<CopyChunk>& stage,
                        std::shared_ptr<Region>& staging);

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
