#include "agent/local/gpu_copier.h"

#include "absl/strings/str_cat.h"
#include "agent/common/check.h"
#include "agent/common/log.h"
#include "agent/local/gpu_batching.h"

namespace ferry {

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

int GpuCopier::LaunchDevice(const Transfer& t) const { return gpu_batching::LaunchDevice(t, pull_); }

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
  GpuLane* lanes[kMaxFlushedLanes];
  size_t n = 0;
  {
    absl::MutexLock lock(&mu_);
    for (const std::unique_ptr<GpuLane>& lane : lanes_) {
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

GpuLane* GpuCopier::LaneFor(int device) {
  absl::MutexLock lock(&mu_);
  if (lanes_.empty()) lanes_.resize(cu_->device_count);
  if (lanes_[device] == nullptr) {
    lanes_[device] = std::make_unique<GpuLane>(cu_, device, pull_, metrics_,
                                               [this](int d, const absl::Status& why) { Poisoned(d, why); });
  }
  return lanes_[device].get();
}

void GpuCopier::WarmUp(int device) {
  if (device >= 0 && device < cu_->device_count) LaneFor(device);
}

}  // namespace ferry
