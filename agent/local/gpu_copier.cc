#include "agent/local/gpu_copier.h"

#include <sys/prctl.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "agent/common/check.h"
#include "agent/common/log.h"
#include "agent/common/status_macros.h"
#include "agent/common/thread_name.h"
#include "agent/cuda/copy_kernel.h"

namespace ferry {
namespace {

// Chunks at least this long on average go to the copy engines even GPU to GPU.
constexpr uint64_t kCopyEngineAverage = 4 << 20;

int DeviceOf(const Region& r) { return r.kind() == MemoryKind::kCuda ? r.device() : -1; }

// Whether a kernel on `device` can dereference both regions: its own memory, or a
// mapping that granted it access (a legacy IPC handle opened in its context too).
bool Reaches(const Transfer& t, int device) {
  return t.src->backing().AccessibleFrom(device) && t.dst->backing().AccessibleFrom(device);
}

}  // namespace

int GpuCopier::LaunchDevice(const Transfer& t) const {
  const int src = DeviceOf(*t.src), dst = DeviceOf(*t.dst);
  if (src < 0) return dst;  // host to GPU: the destination GPU's copy engines
  if (dst < 0) return src;
  // The preferred side (--gpu_kernel_pull), unless only the other one reaches both.
  const int first = pull_ ? dst : src, second = pull_ ? src : dst;
  return !Reaches(t, first) && Reaches(t, second) ? second : first;
}

GpuCopier::Method GpuCopier::Choose(const Transfer& t) const {
  // The kernel where one launch reaches both regions; otherwise the copy engines, which
  // reach any peer context.
  if (DeviceOf(*t.src) < 0 || DeviceOf(*t.dst) < 0) return Method::kCopyEngine;
  const size_t n = t.plan.size();
  if (Reaches(t, LaunchDevice(t)) && n >= 2 && t.plan.total_bytes / n < kCopyEngineAverage) return Method::kKernel;
  return Method::kCopyEngine;
}

// One device's copies. The submitter thread puts transfers on the lane's stream as soon
// as they arrive (so the GPU never idles between transfers; small ones that arrived
// together in one launch) and hands them to the completer thread, which waits for
// transfers in order and answers them. A caller that hands over a burst and flushes
// (a queue's poller) puts it on the stream itself when the submitter is not at it.
class GpuCopier::Lane {
 public:
  Lane(GpuCopier* owner, const CudaDriver* cu, int device)
      : owner_(owner),
        cu_(cu),
        device_(device),
        copy_engine_(owner->metrics_->gpu_transfers(absl::StrCat(device), "copy_engine")),
        kernel_launch_(owner->metrics_->gpu_transfers(absl::StrCat(device), "kernel")),
        kernel_batched_(owner->metrics_->gpu_transfers(absl::StrCat(device), "kernel_batched")),
        submitter_([this] { Submitter(); }),
        completer_([this] { Completer(); }) {}

  // Submits everything queued, waits for it, then joins both threads.
  ~Lane() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    submitter_.join();
    completer_.join();
  }

  void Push(std::shared_ptr<Transfer> t, Done done) {
    absl::MutexLock lock(&mu_);
    queue_.push_back(Job{std::move(t), std::move(done)});
    queued_.fetch_add(1, std::memory_order_release);
  }

  // Push for jobs[first, last), under one lock.
  void PushAll(Submissions& jobs, size_t first, size_t last) {
    absl::MutexLock lock(&mu_);
    for (size_t i = first; i < last; ++i) queue_.push_back(Job{std::move(jobs[i].first), std::move(jobs[i].second)});
    queued_.fetch_add(last - first, std::memory_order_release);
  }

  // Wakes the submitter to look for work for up to kExpectSpin.
  void Expect() {
    absl::MutexLock lock(&mu_);
    expected_ = true;
  }

  // Puts what is queued on the stream from the calling thread (GpuCopier::Flush), unless
  // the submitter is at it: the submitter sleeps between a queue's bursts, and waking it
  // took 35-100 us, longer than the GPU takes to copy a burst of 1 MiB writes. The caller
  // spends the launches' host time (~5-25 us each; longer when an upload from pageable
  // memory waits for a staging buffer).
  void SubmitHere() {
    if (queued_.load(std::memory_order_acquire) == 0 || !set_up_.load(std::memory_order_acquire)) return;
    if (!submit_mu_.TryLock()) return;
    if (UseDevice(*cu_, device_).ok()) {
      jobs_.clear();
      if (TakeJobs(jobs_)) SubmitJobs(jobs_, absl::OkStatus());
    }
    submit_mu_.Unlock();
  }

 private:
  struct Job {
    std::shared_ptr<Transfer> t;
    Done done;
    absl::Status status;      // of putting it on the stream
    CUevent event = nullptr;  // recorded after its work; null if nothing was queued
    // A batch's jobs share one event; the last of them owns it (reuses or destroys it),
    // and is answered after the others.
    bool owns_event = true;
  };
  // Transfers on the stream and not yet answered; the submitter waits beyond this.
  static constexpr size_t kMaxInflight = 64;
  // The submitter takes up to this many queued transfers at once.
  static constexpr size_t kMaxTake = 32;
  // GPU-to-GPU transfers queued together go in one launch of the copy kernel: a copy
  // call costs ~4 us of the submitter's time on an H100 whatever its size (a 1 MiB copy
  // takes less on the GPU), and a launch with its piece list 20-70 us, so one launch for
  // a queue's burst of small writes, or for a batch's paged parts (a KV handoff's 64
  // layer halves), keeps the GPU busy where a call each would not. Joined: transfers of
  // at most kBatchBytes, and any the kernel moves; a launch takes at most
  // kLaunchBytes of them (~0.2 ms of GPU time, so the GPU starts on a batch's first
  // layers while the submitter builds the next launch) and kLaunchChunks chunks.
  static constexpr uint64_t kBatchBytes = 4 << 20;
  static constexpr uint64_t kLaunchBytes = 256 << 20;
  // Independent writes to another GPU (a queue's burst over NVLink, ~400 GB/s) share an
  // event for at most kPeerBurstBytes (~10 us of copying): the burst's first writes are
  // answered, and the pod posts more, while the GPU copies the rest. In one launch with
  // one event the link idled from the burst's end until the refill arrived (2 x H100:
  // 1 MiB writes 0.65 of raw, 4 MiB 0.75). On one GPU a burst is copied at HBM speed and
  // a cap measured no different (tools/bench/RESULTS.md).
  static constexpr uint64_t kPeerBurstBytes = 4 << 20;
  // Such writes of one chunk of at least kPeerCopyCallBytes are a copy call each (~4 us
  // of the submitter's time, about a 1 MiB copy's over NVLink) rather than pieces of a
  // launch: the copy engines move 1 MiB writes at the raw copy's rate where the
  // kernel's launches left the link idle a fifth of the time (2 x H100, 1 MiB writes
  // 0.92-1.06 of raw against 0.82-0.88, ten alternated rounds).
  static constexpr uint64_t kPeerCopyCallBytes = 1 << 20;
  static constexpr size_t kLaunchChunks = 16384;
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

  absl::Status Setup() {
    FERRY_RETURN_IF_ERROR(UseDevice(*cu_, device_));
    absl::StatusOr<int> peers = EnablePeerAccess(*cu_, device_);
    if (!peers.ok()) return peers.status();
    FERRY_RETURN_IF_CU_ERROR(cu_, cu_->cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    FERRY_RETURN_IF_CU_ERROR(cu_, cu_->cuModuleLoadData(&module_, kCopyPiecesPtx), "loading the copy kernel");
    FERRY_RETURN_IF_CU_ERROR(cu_, cu_->cuModuleGetFunction(&kernel_, module_, kCopyPiecesKernel),
                             "cuModuleGetFunction");
    CUdevice dev;
    FERRY_RETURN_IF_CU_ERROR(cu_, cu_->cuDeviceGet(&dev, device_), "cuDeviceGet");
    int sms = 0, per_sm = 0;
    FERRY_RETURN_IF_CU_ERROR(cu_, cu_->cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev),
                             "cuDeviceGetAttribute");
    FERRY_RETURN_IF_CU_ERROR(cu_,
                             cu_->cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel_, kCopyPiecesThreads, 0),
                             "cuOccupancyMaxActiveBlocksPerMultiprocessor");
    // Exactly as many CTAs as fit at once: the grid-stride loop then has no second
    // wave waiting for the first.
    resident_ctas_ = static_cast<unsigned>(std::max(1, sms * per_sm));
    FERRY_LOG(INFO) << "gpu copier: device " << device_ << ", " << sms << " SMs x " << per_sm << " CTAs, " << *peers
                    << " peers reachable";
    return absl::OkStatus();
  }

  // Puts `t`'s copies on the stream.
  absl::Status Enqueue(const Transfer& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(submit_mu_) {
    const CUdeviceptr src = reinterpret_cast<CUdeviceptr>(t.src->data());
    const CUdeviceptr dst = reinterpret_cast<CUdeviceptr>(t.dst->data());
    if (owner_->Choose(t) == Method::kCopyEngine) {
      copy_engine_.Increment();
      for (size_t i = 0; i < t.plan.size(); ++i) {
        const CopyChunk c = t.plan.chunk(i);
        FERRY_RETURN_IF_CU_ERROR(cu_, cu_->cuMemcpyAsync(dst + c.dst_offset, src + c.src_offset, c.length, stream_),
                                 "cuMemcpyAsync");
      }
      return absl::OkStatus();
    }
    kernel_launch_.Increment();
    launch_.assign(1, &t);
    return LaunchKernel();
  }

  static bool CrossesDevices(const Transfer& t) { return DeviceOf(*t.src) != DeviceOf(*t.dst); }

  // Whether `t` is a copy call in a burst of them (kPeerCopyCallBytes).
  static bool PeerCopyCall(const Transfer& t) {
    return DeviceOf(*t.src) >= 0 && DeviceOf(*t.dst) >= 0 && CrossesDevices(t) && t.plan.size() == 1 &&
           t.plan.total_bytes >= kPeerCopyCallBytes;
  }

  // The end of the run of jobs from `first` that share one event: a burst of peer copy
  // calls of at most kPeerBurstBytes (at least jobs[first]), a launch (LaunchEnd), or
  // jobs[first] alone.
  size_t RunEnd(const std::vector<Job>& jobs, size_t first) const {
    if (!PeerCopyCall(*jobs[first].t)) return Batchable(*jobs[first].t) ? LaunchEnd(jobs, first) : first + 1;
    uint64_t bytes = jobs[first].t->plan.total_bytes;
    size_t last = first + 1;
    for (; last < jobs.size() && jobs[last].status.ok() && PeerCopyCall(*jobs[last].t) &&
           bytes + jobs[last].t->plan.total_bytes <= kPeerBurstBytes;
         ++last) {
      bytes += jobs[last].t->plan.total_bytes;
    }
    return last;
  }

  // Whether `t` may share a kernel launch with other queued transfers.
  bool Batchable(const Transfer& t) const {
    return DeviceOf(*t.src) >= 0 && DeviceOf(*t.dst) >= 0 && Reaches(t, device_) &&
           (t.plan.total_bytes <= kBatchBytes || owner_->Choose(t) == Method::kKernel);
  }

  // The end of the run of batchable jobs from `first` that one launch takes: at least
  // jobs[first], then more while the launch stays within kLaunchBytes and kLaunchChunks
  // and its jobs either all share one block mapping (a batch's parts: the blocks form)
  // or none has one.
  size_t LaunchEnd(const std::vector<Job>& jobs, size_t first) const {
    const PagedIds* mapping = jobs[first].t->plan.paged.get();
    const uint64_t max_bytes = mapping == nullptr && CrossesDevices(*jobs[first].t) ? kPeerBurstBytes : kLaunchBytes;
    uint64_t bytes = jobs[first].t->plan.total_bytes;
    size_t chunks = jobs[first].t->plan.size(), last = first + 1;
    for (; last < jobs.size() && jobs[last].status.ok() && Batchable(*jobs[last].t) &&
           jobs[last].t->plan.paged.get() == mapping && CrossesDevices(*jobs[last].t) == CrossesDevices(*jobs[first].t);
         ++last) {
      bytes += jobs[last].t->plan.total_bytes;
      chunks += jobs[last].t->plan.size();
      if (bytes > max_bytes || chunks > kLaunchChunks) break;
    }
    return last;
  }

  // Puts the transfers jobs[first, last) on the stream in one kernel launch.
  absl::Status EnqueueBatch(std::vector<Job>& jobs, size_t first, size_t last)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(submit_mu_) {
    kernel_batched_.Increment(static_cast<double>(last - first));
    launch_.clear();
    for (size_t i = first; i < last; ++i) launch_.push_back(jobs[i].t.get());
    return LaunchKernel();
  }

  // One launch of the copy kernel for the transfers in launch_: in the blocks form when
  // they apply one block mapping (one paged write, or a batch's parts: LaunchEnd keeps a
  // launch's transfers to one mapping or none), else over a list of every piece.
  absl::Status LaunchKernel() ABSL_EXCLUSIVE_LOCKS_REQUIRED(submit_mu_) {
    const std::shared_ptr<const PagedIds>& ids = launch_.front()->plan.paged;
    if (ids != nullptr && CopyKernelArgs::BlocksFit(launch_.size(), ids->src.size(), ids->block_size)) {
      return LaunchBlocks(*ids);
    }
    pieces_.clear();
    for (const Transfer* t : launch_) AppendPieces(*t);
    const uint32_t count = static_cast<uint32_t>(pieces_.size());
    return Launch(pieces_.data(), pieces_.size() * sizeof(CopyPiece),
                  [count](CUdeviceptr list) { return CopyKernelArgs::Pieces(list, count); });
  }

  // The blocks form: each transfer's base addresses (CopyBlockPart), then each block's
  // offsets (CopyBlockOffsets), in one upload; the kernel expands them.
  absl::Status LaunchBlocks(const PagedIds& ids) ABSL_EXCLUSIVE_LOCKS_REQUIRED(submit_mu_) {
    const size_t parts = launch_.size(), n = ids.src.size();
    const uint64_t bs = ids.block_size;
    words_.resize(2 * (parts + n));
    uint64_t* w = words_.data();
    for (const Transfer* t : launch_) {
      *w++ = reinterpret_cast<CUdeviceptr>(t->src->backing().DataOn(device_)) + t->plan.src_base;
      *w++ = reinterpret_cast<CUdeviceptr>(t->dst->backing().DataOn(device_)) + t->plan.dst_base;
    }
    for (size_t i = 0; i < n; ++i) {
      *w++ = ids.src[i] * bs;
      *w++ = ids.dst[i] * bs;
    }
    return Launch(words_.data(), words_.size() * sizeof(uint64_t), [&](CUdeviceptr list) {
      return CopyKernelArgs::Blocks(list, static_cast<uint32_t>(parts), list + parts * sizeof(CopyBlockPart),
                                    static_cast<uint32_t>(n), bs);
    });
  }

  // Appends t's pieces to pieces_. Sized first and filled field by field: a push_back of
  // a braced temporary goes through the stack and stalls on store forwarding (it was
  // most of a 16,384-block plan's time in the chunk planner).
  void AppendPieces(const Transfer& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(submit_mu_) {
    const CUdeviceptr src = reinterpret_cast<CUdeviceptr>(t.src->backing().DataOn(device_));
    const CUdeviceptr dst = reinterpret_cast<CUdeviceptr>(t.dst->backing().DataOn(device_));
    const size_t first = pieces_.size();
    size_t n = first;
    for (size_t i = 0; i < t.plan.size(); ++i) n += (t.plan.chunk(i).length + kCopyPieceBytes - 1) / kCopyPieceBytes;
    pieces_.resize(n);
    CopyPiece* out = pieces_.data() + first;
    for (size_t i = 0; i < t.plan.size(); ++i) {
      const CopyChunk c = t.plan.chunk(i);
      for (uint64_t off = 0; off < c.length; off += kCopyPieceBytes, ++out) {
        out->src = src + c.src_offset + off;
        out->dst = dst + c.dst_offset + off;
        out->length = std::min(kCopyPieceBytes, c.length - off);
      }
    }
  }

  // Uploads `bytes` from `host` and launches the kernel with the arguments `args` makes
  // for the upload's device address. Stream-ordered: allocated, filled, read by the
  // kernel and freed in stream order; the copy from pageable memory is staged before
  // cuMemcpyHtoDAsync returns.
  absl::Status Launch(const void* host, size_t bytes, absl::FunctionRef<CopyKernelArgs(CUdeviceptr)> args)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(submit_mu_) {
    CUdeviceptr list = 0;
    FERRY_RETURN_IF_CU_ERROR(cu_, cu_->cuMemAllocAsync(&list, bytes, stream_), "cuMemAllocAsync");
    absl::Status s = cu_->Check(cu_->cuMemcpyHtoDAsync(list, host, bytes, stream_), "cuMemcpyHtoDAsync");
    if (s.ok()) {
      CopyKernelArgs a = args(list);
      const unsigned ctas = std::min<unsigned>(a.count, resident_ctas_);
      s = cu_->Check(
          cu_->cuLaunchKernel(kernel_, ctas, 1, 1, kCopyPiecesThreads, 1, 1, 0, stream_, a.params().data(), nullptr),
          "launching the copy kernel");
    }
    cu_->cuMemFreeAsync(list, stream_);
    return s;
  }

  // Records one event after the work of jobs[first, last), shared by them; the last one
  // owns it. Events are reused: creating one per copy costs as much as the copy's launch.
  void RecordEvent(std::vector<Job>& jobs, size_t first, size_t last) {
    CUevent event = nullptr;
    {
      absl::MutexLock lock(&mu_);
      if (!spare_events_.empty()) {
        event = spare_events_.back();
        spare_events_.pop_back();
      }
    }
    absl::Status recorded = event != nullptr
                                ? absl::OkStatus()
                                : cu_->Check(cu_->cuEventCreate(&event, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    if (recorded.ok()) recorded = cu_->Check(cu_->cuEventRecord(event, stream_), "cuEventRecord");
    if (!recorded.ok()) {
      if (event != nullptr) cu_->cuEventDestroy(event);
      cu_->cuStreamSynchronize(stream_);
      for (size_t i = first; i < last; ++i) {
        if (jobs[i].status.ok()) jobs[i].status = recorded;
      }
      return;
    }
    for (size_t i = first; i < last; ++i) {
      jobs[i].event = event;
      jobs[i].owns_event = i + 1 == last;
    }
  }

  // Moves up to kMaxTake queued jobs into `jobs` (as many as kMaxInflight leaves room
  // for). Under submit_mu_, so that jobs reach the stream and inflight_ in one order.
  bool TakeJobs(std::vector<Job>& jobs) ABSL_EXCLUSIVE_LOCKS_REQUIRED(submit_mu_) {
    absl::MutexLock lock(&mu_);
    while (!queue_.empty() && jobs.size() < kMaxTake && inflight_.size() + jobs.size() < kMaxInflight) {
      jobs.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    queued_.fetch_sub(jobs.size(), std::memory_order_relaxed);
    return !jobs.empty();
  }

  // Puts `jobs` on the stream and hands them to the completer: runs of batchable
  // transfers in one launch, bursts of peer copy calls under one event, any other
  // transfer in a call of its own. `setup`: the lane's; jobs fail with it.
  void SubmitJobs(std::vector<Job>& jobs, const absl::Status& setup) ABSL_EXCLUSIVE_LOCKS_REQUIRED(submit_mu_) {
    for (Job& j : jobs) j.status = setup.ok() ? j.t->Stopped(absl::Now(), " while queued") : setup;
    for (size_t first = 0; first < jobs.size();) {
      if (!jobs[first].status.ok()) {  // not put on the stream: answered as it is
        ++first;
        continue;
      }
      const size_t last = RunEnd(jobs, first);
      if (PeerCopyCall(*jobs[first].t)) {
        for (size_t i = first; i < last; ++i) jobs[i].status = Enqueue(*jobs[i].t);
      } else {
        const absl::Status put = last - first == 1 ? Enqueue(*jobs[first].t) : EnqueueBatch(jobs, first, last);
        for (size_t i = first; i < last; ++i) jobs[i].status = put;
      }
      // Even after a failed enqueue, part of the work may be on the stream: the
      // completer waits for it before the regions can go.
      RecordEvent(jobs, first, last);
      first = last;
    }
    absl::MutexLock lock(&mu_);
    for (Job& j : jobs) inflight_.push_back(std::move(j));
  }

  void Submitter() {
    NameThisThread(absl::StrCat("ferry-gpu", device_, "-sub"));
    absl::Status setup = Setup();
    if (!setup.ok()) {
      FERRY_LOG(ERROR) << "gpu copier: device " << device_ << ": " << setup;
    }
    set_up_.store(setup.ok(), std::memory_order_release);
    absl::Duration spin = kSpin;
    for (;;) {
      for (const absl::Time until = absl::Now() + spin;
           queued_.load(std::memory_order_acquire) == 0 && absl::Now() < until;) {
      }
      spin = kSpin;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return (stopping_ || !queue_.empty() || expected_) && inflight_.size() < kMaxInflight;
        };
        mu_.Await(absl::Condition(&ready));
        if (expected_ && queue_.empty() && !stopping_) {  // work is on its way: spin for it
          expected_ = false;
          spin = kExpectSpin;
          continue;
        }
        expected_ = false;
        if (queue_.empty()) break;  // stopping and drained
      }
      absl::MutexLock submitting(&submit_mu_);
      jobs_.clear();
      if (TakeJobs(jobs_)) SubmitJobs(jobs_, setup);  // else SubmitHere took them first
    }
    // After any SubmitHere under way has handed its jobs to the completer (no job is
    // pushed once stopping_ is set: the lane's users are gone).
    absl::MutexLock submitting(&submit_mu_);
    absl::MutexLock lock(&mu_);
    submitter_done_ = true;
  }

  // Waits for `j`'s event, polling: kCompleterSpin without sleeping, then sleeps of 1 us growing
  // to 50 us. Answers DEADLINE_EXCEEDED when the deadline passes but keeps waiting: the
  // transfer (and its regions) must outlive the GPU's use of them.
  CUresult Wait(Job& j, bool* answered) {
    int64_t sleep_ns = 0;
    const absl::Time spin_until = absl::Now() + kCompleterSpin;
    for (;;) {
      CUresult r = cu_->cuEventQuery(j.event);
      if (r != CUDA_ERROR_NOT_READY) return r;
      const absl::Time now = absl::Now();
      if (!*answered && now > j.t->deadline) {
        *answered = true;
        j.done(absl::DeadlineExceededError(absl::StrCat("transfer ", j.t->id, " passed its deadline")));
      }
      if (now < spin_until) continue;
      if (sleep_ns > 0) {
        timespec ts{0, sleep_ns};
        nanosleep(&ts, nullptr);
      }
      sleep_ns = std::min<int64_t>(sleep_ns == 0 ? 1000 : sleep_ns * 2, 50000);
    }
  }

  void Completer() {
    NameThisThread(absl::StrCat("ferry-gpu", device_, "-done"));
    // Wait() polls with sleeps from 1 us: the default 50 us timer slack would stretch
    // each into >= 50 us and cap small copies at one answer per 50 us.
    prctl(PR_SET_TIMERSLACK, 1000UL);
    const bool have_context = UseDevice(*cu_, device_).ok();
    // A batch's jobs share one event, the owner last: once the first of them has seen it
    // complete (or fail), the others are answered without asking the driver again.
    CUevent seen = nullptr;
    CUresult seen_result = CUDA_SUCCESS;
    for (;;) {
      Job j;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return submitter_done_ || !inflight_.empty(); };
        mu_.Await(absl::Condition(&ready));
        if (inflight_.empty()) break;  // the submitter finished and everything is answered
        j = std::move(inflight_.front());
      }
      bool answered = false;
      CUevent reusable = nullptr;
      absl::Status s = j.status;
      if (j.event != nullptr && have_context) {
        const CUresult r = j.event == seen ? seen_result : Wait(j, &answered);
        seen = j.owns_event ? nullptr : j.event;  // the owner reuses or destroys it
        seen_result = r;
        if (r == CUDA_SUCCESS) {
          if (j.owns_event) reusable = j.event;
        } else {
          if (j.owns_event) cu_->cuEventDestroy(j.event);
          absl::Status failed = cu_->Check(r, "the GPU copy");
          owner_->Poisoned(device_, failed);
          if (s.ok()) s = failed;
        }
      }
      if (!answered) j.done(s);
      absl::MutexLock lock(&mu_);
      if (reusable != nullptr) spare_events_.push_back(reusable);
      inflight_.pop_front();  // after done(): the submitter may not run far ahead
    }
    if (have_context) {
      absl::MutexLock lock(&mu_);  // the submitter is done: the spares are all back
      for (CUevent e : spare_events_) cu_->cuEventDestroy(e);
      spare_events_.clear();
      if (module_ != nullptr) cu_->cuModuleUnload(module_);
      if (stream_ != nullptr) cu_->cuStreamDestroy(stream_);
    }
  }

  GpuCopier* const owner_;
  const CudaDriver* const cu_;
  const int device_;
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
  // caller), with what it reuses: the jobs it takes, the transfers of one launch, and
  // what it uploads.
  absl::Mutex submit_mu_ ABSL_ACQUIRED_BEFORE(mu_);
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

GpuCopier::GpuCopier(const CudaDriver* cu, bool pull, Metrics* metrics) : cu_(cu), pull_(pull), metrics_(metrics) {}

absl::Status GpuCopier::health() const {
  absl::MutexLock lock(&health_mu_);
  return health_;
}

void GpuCopier::Poisoned(int device, const absl::Status& why) {
  FERRY_LOG(ERROR) << "gpu copier: device " << device << " failed a copy (" << why.message()
                   << "); CUDA errors of this kind are sticky: the agent needs a restart";
  absl::MutexLock lock(&health_mu_);
  if (health_.ok()) {
    health_ = absl::InternalError(absl::StrCat("GPU ", device, " failed a copy: ", why.message()));
  }
}

GpuCopier::~GpuCopier() {
  absl::MutexLock lock(&mu_);
  lanes_.clear();
}

int GpuCopier::CheckedLaunchDevice(const Transfer& t) const {
  const int device = LaunchDevice(t);
  // The service routes only transfers with a GPU region here; anything else is a bug.
  FERRY_CHECK(device >= 0 && device < cu_->device_count)
      << "GpuCopier got transfer " << t.id << " without a GPU region";
  return device;
}

void GpuCopier::Submit(std::shared_ptr<Transfer> t, Done done) {
  LaneFor(CheckedLaunchDevice(*t))->Push(std::move(t), std::move(done));
}

void GpuCopier::SubmitAll(Submissions jobs) {
  // Runs of parts on one device (a batch's parts usually all are), each pushed at once.
  for (size_t first = 0; first < jobs.size();) {
    const int device = CheckedLaunchDevice(*jobs[first].first);
    size_t last = first + 1;
    while (last < jobs.size() && LaunchDevice(*jobs[last].first) == device) ++last;
    LaneFor(device)->PushAll(jobs, first, last);
    first = last;
  }
}

void GpuCopier::Flush() {
  Lane* lanes[kMaxFlushedLanes];
  size_t n = 0;
  {
    absl::MutexLock lock(&mu_);
    for (const std::unique_ptr<Lane>& lane : lanes_) {
      if (lane != nullptr && n < kMaxFlushedLanes) lanes[n++] = lane.get();
    }
  }
  // Lanes live as long as the copier, and its users (the flushing thread) stop first.
  for (size_t i = 0; i < n; ++i) lanes[i]->SubmitHere();
}

void GpuCopier::Expect(const Transfer& t) {
  const int device = LaunchDevice(t);
  if (device >= 0 && device < cu_->device_count) LaneFor(device)->Expect();
}

GpuCopier::Lane* GpuCopier::LaneFor(int device) {
  absl::MutexLock lock(&mu_);
  if (lanes_.empty()) lanes_.resize(cu_->device_count);
  if (lanes_[device] == nullptr) lanes_[device] = std::make_unique<Lane>(this, cu_, device);
  return lanes_[device].get();
}

void GpuCopier::WarmUp(int device) {
  if (device >= 0 && device < cu_->device_count) LaneFor(device);
}

}  // namespace ferry
