// GpuCopier: node-local transfers that touch GPU memory, done by the GPUs themselves.
//
//   GpuCopier copier(cu);
//   copier.Submit(transfer, done);   // done(OK) once every byte is in the destination
//
// Both regions are mapped in the agent (imported IPC / fd handles, or host memory), so
// no NIC and no bounce buffer is involved:
//  - a single chunk, big chunks, or any chunk touching host memory: the copy engines
//    (cuMemcpyAsync per chunk; GPU to GPU runs over NVLink with peer access);
//  - many GPU-to-GPU chunks (paged KV blocks): one launch of the gather/scatter kernel
//    (agent/cuda/copy_kernel.h), which reads scattered source blocks and writes
//    scattered destination blocks in a single pass, on the source GPU (or the
//    destination GPU with `pull`, or whichever of the two can reach both regions). A
//    paged write goes in the kernel's blocks form: the block offsets once, and the
//    kernel expands them, so the agent builds no list of every block;
//  - GPU-to-GPU transfers queued at the same time (a write queue's burst of small
//    writes, a batch's paged parts): one launch of that kernel for up to 256 MiB of them
//    (a batch's parts in the blocks form: their bases, and the mapping they share once);
//    to another GPU, launches of at most 4 MiB, and writes of one chunk of 1 MiB or more
//    a copy call each, answered 4 MiB at a time so that the pod refills while the rest
//    is copied.
// One lane per device (a stream, a thread that puts transfers on it as they arrive, or
// the caller itself when it flushes a burst, and one that answers them in order). A
// transfer past its deadline is answered DEADLINE_EXCEEDED at once, but its regions are
// held until the GPU has finished with them: nothing a pod frees can be written afterwards.
#ifndef FERRY_AGENT_LOCAL_GPU_COPIER_H_
#define FERRY_AGENT_LOCAL_GPU_COPIER_H_

#include <memory>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "agent/local/gpu_lane.h"
#include "agent/metrics/metrics.h"
#include "agent/transfer/executor.h"
#include "proto/ferry/cuda/cuda_driver.h"

namespace ferry {

class GpuCopier : public TransferExecutor {
 public:
  // `pull`: run the gather/scatter kernel on the destination GPU (remote reads)
  // instead of the source GPU (remote writes). Counts transfers by how they were moved
  // in `metrics` (ferry_gpu_transfers_total).
  GpuCopier(const CudaDriver* cu, bool pull, Metrics* metrics);
  // Finishes every queued transfer, then joins the lanes.
  ~GpuCopier() override;

  void Submit(std::shared_ptr<Transfer> t, Done done) override;
  // A batch's parts onto their lanes' queues, one lock per lane: the lane's submitter
  // and completer take the same lock for every transfer they handle.
  void SubmitAll(Submissions jobs) override;
  // Wakes the lane that will take `t`: waking a sleeping thread costs 10-100 us
  // (more on a VM-based host), about what planning a batch's other parts takes.
  void Expect(const Transfer& t) override;
  // Puts the transfers queued on each lane on its stream from the calling thread,
  // unless the lane's submitter is already at it (a queue's burst then needs no
  // wake-up of the submitter).
  void Flush() override;

  // Sets up `device`'s lane now (context, peer access, stream, kernel JIT: ~100 ms once)
  // rather than inside the first transfer. Called when GPU memory is registered.
  void WarmUp(int device);

  // Not OK once a GPU reported an error that poisons its context for good (an illegal
  // address, say): every later copy on it fails, so the agent stops being ready and
  // should be restarted. Says which device and what happened.
  absl::Status health() const;

 private:
  GpuLane* LaneFor(int device);
  static constexpr size_t kMaxFlushedLanes = 64;  // devices Flush looks at
  // The device whose lane moves `t` (gpu_batching::LaunchDevice).
  int LaunchDevice(const Transfer& t) const;
  // LaunchDevice of a transfer the router sent here, which has a GPU region.
  int CheckedLaunchDevice(const Transfer& t) const;
  void Poisoned(int device, const absl::Status& why);

  const CudaDriver* cu_;
  const bool pull_;
  Metrics* const metrics_;
  mutable absl::Mutex health_mu_;
  absl::Status health_ ABSL_GUARDED_BY(health_mu_);
  absl::Mutex mu_;
  std::vector<std::unique_ptr<GpuLane>> lanes_ ABSL_GUARDED_BY(mu_);  // by device, created on first use
};

}  // namespace ferry

#endif  // FERRY_AGENT_LOCAL_GPU_COPIER_H_
