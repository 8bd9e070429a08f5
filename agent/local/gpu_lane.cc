#include "agent/local/gpu_lane.h"

#include <sys/prctl.h>
#include <time.h>

#include <algorithm>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "agent/common/log.h"
#include "agent/common/status_macros.h"
#include "agent/common/thread_name.h"

namespace ferry {

using gpu_batching::CopyMethod;

GpuLane::GpuLane(const CudaDriver* cu, int device, bool pull, Metrics* metrics, OnPoisoned on_poisoned)
    : cu_(cu),
      device_(device),
      pull_(pull),
      on_poisoned_(std::move(on_poisoned)),
      copy_engine_(metrics->gpu_transfers(absl::StrCat(device), "copy_engine")),
      kernel_launch_(metrics->gpu_transfers(absl::StrCat(device), "kernel")),
      kernel_batched_(metrics->gpu_transfers(absl::StrCat(device), "kernel_batched")),
      submitter_([this] { Submitter(); }),
      completer_([this] { Completer(); }) {}

GpuLane::~GpuLane() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  submitter_.join();
  completer_.join();
}

void GpuLane::Push(std::shared_ptr<Transfer> t, TransferExecutor::Done done) {
  const gpu_batching::CopyShape shape = gpu_batching::ShapeOf(*t, pull_);
  absl::MutexLock lock(&mu_);
  queue_.push_back(Job{std::move(t), std::move(done), shape});
  queued_.fetch_add(1, std::memory_order_release);
}

void GpuLane::PushAll(TransferExecutor::Submissions& jobs, size_t first, size_t last) {
  // Shapes first, outside the lock the submitter thread takes the queue under.
  absl::InlinedVector<gpu_batching::CopyShape, 64> shapes;
  shapes.reserve(last - first);
  for (size_t i = first; i < last; ++i) shapes.push_back(gpu_batching::ShapeOf(*jobs[i].first, pull_));
  absl::MutexLock lock(&mu_);
  for (size_t i = first; i < last; ++i) {
    queue_.push_back(Job{std::move(jobs[i].first), std::move(jobs[i].second), shapes[i - first]});
  }
  queued_.fetch_add(last - first, std::memory_order_release);
}

void GpuLane::Expect() {
  absl::MutexLock lock(&mu_);
  expected_ = true;
}

void GpuLane::SubmitHere() {
  if (queued_.load(std::memory_order_acquire) == 0 || !set_up_.load(std::memory_order_acquire)) return;
  if (!submit_mu_.TryLock()) return;
  if (UseDevice(*cu_, device_).ok()) {
    jobs_.clear();
    if (TakeJobs(jobs_)) SubmitJobs(jobs_, absl::OkStatus());
  }
  submit_mu_.Unlock();
}

absl::Status GpuLane::Setup() {
  FERRY_RETURN_IF_ERROR(UseDevice(*cu_, device_));
  absl::StatusOr<int> peers = EnablePeerAccess(*cu_, device_);
  if (!peers.ok()) return peers.status();
  FERRY_RETURN_IF_CU_ERROR(cu_, cu_->cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  FERRY_RETURN_IF_CU_ERROR(cu_, cu_->cuModuleLoadData(&module_, kCopyPiecesPtx), "loading the copy kernel");
  FERRY_RETURN_IF_CU_ERROR(cu_, cu_->cuModuleGetFunction(&kernel_, module_, kCopyPiecesKernel), "cuModuleGetFunction");
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

absl::Status GpuLane::Enqueue(const Job& j) {
  const Transfer& t = *j.t;
  const CUdeviceptr src = reinterpret_cast<CUdeviceptr>(t.src->data());
  const CUdeviceptr dst = reinterpret_cast<CUdeviceptr>(t.dst->data());
  if (gpu_batching::ChooseMethod(j.shape) == CopyMethod::kCopyEngine) {
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

absl::Status GpuLane::EnqueueBatch(std::vector<Job>& jobs, size_t first, size_t last) {
  kernel_batched_.Increment(static_cast<double>(last - first));
  launch_.clear();
  for (size_t i = first; i < last; ++i) launch_.push_back(jobs[i].t.get());
  return LaunchKernel();
}

absl::Status GpuLane::LaunchKernel() {
  const std::shared_ptr<const PagedIds>& ids = launch_.front()->plan.paged;
  const bool one_mapping =  // not so for slices of one (a batch through several write windows)
      ids != nullptr &&
      std::all_of(launch_.begin(), launch_.end(), [&](const Transfer* t) { return t->plan.paged == ids; });
  if (one_mapping && CopyKernelArgs::BlocksFit(launch_.size(), ids->src.size(), ids->block_size)) {
    return LaunchBlocks(*ids);
  }
  pieces_.clear();
  for (const Transfer* t : launch_) AppendPieces(*t);
  const uint32_t count = static_cast<uint32_t>(pieces_.size());
  return Launch(pieces_.data(), pieces_.size() * sizeof(CopyPiece),
                [count](CUdeviceptr list) { return CopyKernelArgs::Pieces(list, count); });
}

absl::Status GpuLane::LaunchBlocks(const PagedIds& ids) {
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

void GpuLane::AppendPieces(const Transfer& t) {
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

absl::Status GpuLane::Launch(const void* host, size_t bytes, absl::FunctionRef<CopyKernelArgs(CUdeviceptr)> args) {
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

void GpuLane::RecordEvent(std::vector<Job>& jobs, size_t first, size_t last) {
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

bool GpuLane::TakeJobs(std::vector<Job>& jobs) {
  absl::MutexLock lock(&mu_);
  while (!queue_.empty() && jobs.size() < kMaxTake && inflight_.size() + jobs.size() < kMaxInflight) {
    jobs.push_back(std::move(queue_.front()));
    queue_.pop_front();
  }
  queued_.fetch_sub(jobs.size(), std::memory_order_relaxed);
  return !jobs.empty();
}

void GpuLane::SubmitJobs(std::vector<Job>& jobs, const absl::Status& setup) {
  shapes_.clear();
  for (Job& j : jobs) {
    j.status = setup.ok() ? j.t->Stopped(absl::Now(), " while queued") : setup;
    shapes_.push_back(j.shape);
    shapes_.back().ok = j.status.ok();
  }
  for (size_t first = 0; first < jobs.size();) {
    if (!jobs[first].status.ok()) {  // not put on the stream: answered as it is
      ++first;
      continue;
    }
    const size_t last = gpu_batching::RunEnd(shapes_, first);
    if (gpu_batching::PeerCopyCall(jobs[first].shape)) {
      for (size_t i = first; i < last; ++i) jobs[i].status = Enqueue(jobs[i]);
    } else {
      const absl::Status put = last - first == 1 ? Enqueue(jobs[first]) : EnqueueBatch(jobs, first, last);
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

void GpuLane::Submitter() {
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

CUresult GpuLane::Wait(Job& j, bool* answered) {
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

void GpuLane::Completer() {
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
        on_poisoned_(device_, failed);
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
}  // namespace ferry
