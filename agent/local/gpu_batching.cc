#include "agent/local/gpu_batching.h"

namespace ferry::gpu_batching {
namespace {

int DeviceOf(const Region& r) { return r.kind() == MemoryKind::kCuda ? r.device() : -1; }

// Whether a kernel on `device` can dereference both regions: its own memory, or a
// mapping that granted it access (a legacy IPC handle opened in its context too).
bool Reaches(const Transfer& t, int device) {
  return t.src->backing().AccessibleFrom(device) && t.dst->backing().AccessibleFrom(device);
}

bool BothGpus(const CopyShape& s) { return s.src_device >= 0 && s.dst_device >= 0; }
bool CrossesDevices(const CopyShape& s) { return s.src_device != s.dst_device; }

}  // namespace

int LaunchDevice(const Transfer& t, bool pull) {
  const int src = DeviceOf(*t.src), dst = DeviceOf(*t.dst);
  if (src < 0) return dst;  // host to GPU: the destination GPU's copy engines
  if (dst < 0) return src;
  const int first = pull ? dst : src, second = pull ? src : dst;
  return !Reaches(t, first) && Reaches(t, second) ? second : first;
}

CopyShape ShapeOf(const Transfer& t, bool pull) {
  CopyShape s;
  s.src_device = DeviceOf(*t.src);
  s.dst_device = DeviceOf(*t.dst);
  s.bytes = t.plan.total_bytes;
  s.chunks = t.plan.size();
  const PagedIds* ids = t.plan.paged.get();
  s.mapping = ids != nullptr && ids->whole != nullptr ? ids->whole.get() : ids;
  s.reaches = Reaches(t, LaunchDevice(t, pull));
  return s;
}

CopyMethod ChooseMethod(const CopyShape& s) {
  if (BothGpus(s) && s.reaches && s.chunks >= 2 && s.bytes / s.chunks < kCopyEngineAverage) return CopyMethod::kKernel;
  return CopyMethod::kCopyEngine;
}

bool PeerCopyCall(const CopyShape& s) {
  return BothGpus(s) && CrossesDevices(s) && s.chunks == 1 && s.bytes >= kPeerCopyCallBytes;
}

bool Batchable(const CopyShape& s) {
  return BothGpus(s) && s.reaches && (s.bytes <= kBatchBytes || ChooseMethod(s) == CopyMethod::kKernel);
}

size_t LaunchEnd(absl::Span<const CopyShape> jobs, size_t first) {
  const CopyShape& head = jobs[first];
  const uint64_t max_bytes = head.mapping == nullptr && CrossesDevices(head) ? kPeerBurstBytes : kLaunchBytes;
  uint64_t bytes = head.bytes;
  size_t chunks = head.chunks, last = first + 1;
  for (; last < jobs.size() && jobs[last].ok && Batchable(jobs[last]) && jobs[last].mapping == head.mapping &&
         CrossesDevices(jobs[last]) == CrossesDevices(head);
       ++last) {
    bytes += jobs[last].bytes;
    chunks += jobs[last].chunks;
    if (bytes > max_bytes || chunks > kLaunchChunks) break;
  }
  return last;
}

size_t RunEnd(absl::Span<const CopyShape> jobs, size_t first) {
  if (!PeerCopyCall(jobs[first])) return Batchable(jobs[first]) ? LaunchEnd(jobs, first) : first + 1;
  uint64_t bytes = jobs[first].bytes;
  size_t last = first + 1;
  for (; last < jobs.size() && jobs[last].ok && PeerCopyCall(jobs[last]) && bytes + jobs[last].bytes <= kPeerBurstBytes;
       ++last) {
    bytes += jobs[last].bytes;
  }
  return last;
}

}  // namespace ferry::gpu_batching
