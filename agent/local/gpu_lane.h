// GpuLane: one device's copies, for GpuCopier.
//
//   GpuLane lane(cu, device, pull, metrics, on_poisoned);  // starts its two threads
//   lane.Push(transfer, done);   // done(OK) once the GPU has copied every byte
//   lane.SubmitHere();           // after a burst: put it on the stream from this thread
//
// The submitter thread puts transfers on the lane's stream as soon as they arrive (so
// the GPU never idles between transfers; small ones that arrived together in one
// launch, as gpu_batching.h decides) and hands them to the completer thread, which waits
// for transfers in order and answers them. A caller that hands over a burst and flushes
// (a queue's poller) puts it on the stream itself when the submitter is not at it. A
// transfer past its deadline is answered DEADLINE_EXCEEDED at once, but held until the
// GPU has finished with its regions.
#ifndef FERRY_AGENT_LOCAL_GPU_LANE_H_
#define FERRY_AGENT_LOCAL_GPU_LANE_H_

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/cuda/copy_kernel.h"
#include "agent/local/gpu_batching.h"
#include "agent/metrics/metrics.h"
#include "agent/transfer/executor.h"
#include "proto/ferry/cuda/cuda_driver.h"

namespace ferry {

class GpuLane {
 public:
  // Called on the completer thread when a copy failed with an error that poisons the
  // device's context (every later copy on it fails).
  using OnPoisoned = std::function<void(int device, const absl::Status& why)>;

  // `pull`: --gpu_kernel_pull (gpu_batching::LaunchDevice). Counts transfers by how they
  // were moved in `metrics` (ferry_gpu_transfers_total{device}).
  GpuLane(const CudaDriver* cu, int device, bool pull, Metrics* metrics, OnPoisoned on_poisoned);
  // Submits everything queued, waits for it, then joins both threads.
  ~GpuLane();
  GpuLane(const GpuLane&) = delete;
  GpuLane& operator=(const GpuLane&) = delete;

  // `t` must be for this device (gpu_batching::LaunchDevice).
  void Push(std::shared_ptr<Transfer> t, TransferExecutor::Done done);
  // Push for jobs[first, last), under one lock.
  void PushAll(TransferExecutor::Submissions& jobs, size_t first, size_t last);
  // Wakes the submitter to look for work for up to kExpectSpin.
  void Expect();
  // Puts what is queued on the stream from the calling thread (GpuCopier::Flush), unless
  // the submitter is at it: the submitter sleeps between a queue's bursts, and waking it
  // took 35-100 us, longer than the GPU takes to copy a burst of 1 MiB writes. The caller
  // spends the launches' host time (~5-25 us each; longer when an upload from pageable
  // memory waits for a staging buffer).
  void SubmitHere();

 private:
  struct Job {
    std::shared_ptr<Transfer> t;
    TransferExecutor::Done done;
    gpu_batching::CopyShape shape;  // computed when pushed
    absl::Status status;            // of putting it on the stream
    CUevent event = nullptr;        // recorded after its work; null if nothing was queued
    // A batch's jobs share one event; the last of them owns it (reuses or destroys it),
    // and is answered after the others.
    bool owns_event = true;
  };
  // Transfers on the stream and not yet answered; the submitter waits beyond this.
  static constexpr size_t kMaxInflight = 64;
  // The submitter takes up to this many queued transfers at once.
  static constexpr size_t kMaxTake = 32;
  // After putting work on the stream the submitter looks for more this long before
  // sleeping: waking a sleeping thread costs 10-100 us, the GPU time of several 1 MiB
  // copies. (A queue's bursts need no wake-up: the poller that took them puts them on
  // the stream, SubmitHere.)
  static constexpr absl::Duration kSpin = absl::Microseconds(20);
  // The completer polls a job's event this long before it sleeps (sleeps of 1 us growing
  // to 50 us): a queue's burst of 16 x 4 MiB is ~50 us of copying, and a check 30 us
  // late, as the growing sleeps left it, idled the GPU until the refill (one H100,
  // 4 MiB writes 0.95-1.00 of raw against 0.85-0.98 with 20 us, alternated rounds).
  static constexpr absl::Duration kCompleterSpin = absl::Microseconds(100);
  // Woken by Expect, the submitter looks for work this long: a batch of 64 parts is
  // planned in 0.05-0.1 ms.
  static constexpr absl::Duration kExpectSpin = absl::Microseconds(250);

  absl::Status Setup();
  // Puts the job's copies on the stream: copy calls, or a kernel launch of its own.
  absl::Status Enqueue(const Job& j) ABSL_EXCLUSIVE_LOCKS_REQUIRED(submit_mu_);
  // Puts the transfers jobs[first, last) on the stream in one kernel launch.
  absl::Status EnqueueBatch(std::vector<Job>& jobs, size_t first, size_t last)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(submit_mu_);
  // One launch of the copy kernel for the transfers in launch_: in the blocks form when
  // they apply one block mapping (one paged write, or a batch's parts: LaunchEnd keeps a
  // launch's transfers to one mapping or none), else over a list of every piece.
  absl::Status LaunchKernel() ABSL_EXCLUSIVE_LOCKS_REQUIRED(submit_mu_);
  // The blocks form: each transfer's base addresses (CopyBlockPart), then each block's
  // offsets (CopyBlockOffsets), in one upload; the kernel expands them.
  absl::Status LaunchBlocks(const PagedIds& ids) ABSL_EXCLUSIVE_LOCKS_REQUIRED(submit_mu_);
  // Appends t's pieces to pieces_. Sized first and filled field by field: a push_back of
  // a braced temporary goes through the stack and stalls on store forwarding (it was
  // most of a 16,384-block plan's time in the chunk planner).
  void AppendPieces(const Transfer& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(submit_mu_);
  // Uploads `bytes` from `host` and launches the kernel with the arguments `args` makes
  // for the upload's device address. Stream-ordered: allocated, filled, read by the
  // kernel and freed in stream order; the copy from pageable memory is staged before
  // cuMemcpyHtoDAsync returns.
  absl::Status Launch(const void* host, size_t bytes, absl::FunctionRef<CopyKernelArgs(CUdeviceptr)> args)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(submit_mu_);
  // Records one event after the work of jobs[first, last), shared by them; the last one
  // owns it. Events are reused: creating one per copy costs as much as the copy's launch.
  void RecordEvent(std::vector<Job>& jobs, size_t first, size_t last);
  // Moves up to kMaxTake queued jobs into `jobs` (as many as kMaxInflight leaves room
  // for). Under submit_mu_, so that jobs reach the stream and inflight_ in one order.
  bool TakeJobs(std::vector<Job>& jobs) ABSL_EXCLUSIVE_LOCKS_REQUIRED(submit_mu_);
  // Puts `jobs` on the stream and hands them to the completer: runs of batchable
  // transfers in one launch, bursts of peer copy calls under one event, any other
  // transfer in a call of its own (gpu_batching::RunEnd). `setup`: the lane's; jobs fail
  // with it.
  void SubmitJobs(std::vector<Job>& jobs, const absl::Status& setup) ABSL_EXCLUSIVE_LOCKS_REQUIRED(submit_mu_);
  void Submitter();
  // Waits for `j`'s event, polling: kCompleterSpin without sleeping, then sleeps of 1 us
  // growing to 50 us. Answers DEADLINE_EXCEEDED when the deadline passes but keeps
  // waiting: the transfer (and its regions) must outlive the GPU's use of them.
  CUresult Wait(Job& j, bool* answered);
  void Completer();

  const CudaDriver* const cu_;
  const int device_;
  const bool pull_;
  const OnPoisoned on_poisoned_;
  // ferry_gpu_transfers_total by method: a call each, a kernel launch each, a launch shared.
  prometheus::Counter& copy_engine_;
  prometheus::Counter& kernel_launch_;
  prometheus::Counter& kernel_batched_;
  // Set by the submitter in Setup before any job reaches the completer.
  CUstream stream_ = nullptr;
  CUmodule module_ = nullptr;
  CUfunction kernel_ = nullptr;
  unsigned resident_ctas_ = 1;
  std::atomic<bool> set_up_{false};  // Setup succeeded: SubmitHere may use the stream

  // Held by whichever thread puts jobs on the stream (the submitter, or SubmitHere's
  // caller), with what it reuses: the jobs it takes, their shapes, the transfers of one
  // launch, and what it uploads.
  absl::Mutex submit_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::vector<gpu_batching::CopyShape> shapes_ ABSL_GUARDED_BY(submit_mu_);
  std::vector<const Transfer*> launch_ ABSL_GUARDED_BY(submit_mu_);
  std::vector<CopyPiece> pieces_ ABSL_GUARDED_BY(submit_mu_);
  std::vector<uint64_t> words_ ABSL_GUARDED_BY(submit_mu_);
  std::vector<Job> jobs_ ABSL_GUARDED_BY(submit_mu_);

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool submitter_done_ ABSL_GUARDED_BY(mu_) = false;
  bool expected_ ABSL_GUARDED_BY(mu_) = false;  // Expect() since the submitter last looked
  std::deque<Job> queue_ ABSL_GUARDED_BY(mu_);
  std::atomic<size_t> queued_{0};  // queue_.size(), for the submitter's spin without mu_
  std::deque<Job> inflight_ ABSL_GUARDED_BY(mu_);
  std::vector<CUevent> spare_events_ ABSL_GUARDED_BY(mu_);  // recorded and completed before
  std::thread submitter_;                                   // last: they start after every member above is initialized
  std::thread completer_;
};

}  // namespace ferry

#endif  // FERRY_AGENT_LOCAL_GPU_LANE_H_
