// How a GPU lane moves the transfers it takes from its queue: which device launches a
// transfer, copy engines or the gather/scatter kernel, and which queued transfers share
// one kernel launch or one completion event. Pure functions of each transfer's shape
// (CopyShape), so the policy is tested on a CPU; GpuLane applies it.
//
//   const CopyShape shape = ShapeOf(t, pull);        // once, when the transfer is queued
//   if (ChooseMethod(shape) == CopyMethod::kKernel) ...
//   for (size_t first = 0; first < n;) {            // shapes[i].ok: not failed already
//     const size_t last = RunEnd(shapes, first);     // [first, last) share a launch or an event
//     ...
//     first = last;
//   }
//
// The numbers below were measured on H100s (tools/bench/RESULTS.md): each says what it
// trades.
#ifndef FERRY_AGENT_LOCAL_GPU_BATCHING_H_
#define FERRY_AGENT_LOCAL_GPU_BATCHING_H_

#include <cstddef>
#include <cstdint>

#include "absl/types/span.h"
#include "agent/transfer/transfer.h"

namespace ferry::gpu_batching {

// Chunks at least this long on average go to the copy engines even GPU to GPU.
inline constexpr uint64_t kCopyEngineAverage = 4 << 20;
// GPU-to-GPU transfers queued together go in one launch of the copy kernel: a copy
// call costs ~4 us of the submitter's time on an H100 whatever its size (a 1 MiB copy
// takes less on the GPU), and a launch with its piece list 20-70 us, so one launch for
// a queue's burst of small writes, or for a batch's paged parts (a KV handoff's 64
// layer halves), keeps the GPU busy where a call each would not. Joined: transfers of
// at most kBatchBytes, and any the kernel moves; a launch takes at most
// kLaunchBytes of them (~0.2 ms of GPU time, so the GPU starts on a batch's first
// layers while the submitter builds the next launch) and kLaunchChunks chunks.
inline constexpr uint64_t kBatchBytes = 4 << 20;
inline constexpr uint64_t kLaunchBytes = 256 << 20;
inline constexpr size_t kLaunchChunks = 16384;
// Independent writes to another GPU (a queue's burst over NVLink, ~400 GB/s) share an
// event for at most kPeerBurstBytes (~10 us of copying): the burst's first writes are
// answered, and the pod posts more, while the GPU copies the rest. In one launch with
// one event the link idled from the burst's end until the refill arrived (2 x H100:
// 1 MiB writes 0.65 of raw, 4 MiB 0.75). On one GPU a burst is copied at HBM speed and
// a cap measured no different.
inline constexpr uint64_t kPeerBurstBytes = 4 << 20;
// Such writes of one chunk of at least kPeerCopyCallBytes are a copy call each (~4 us
// of the submitter's time, about a 1 MiB copy's over NVLink) rather than pieces of a
// launch: the copy engines move 1 MiB writes at the raw copy's rate where the
// kernel's launches left the link idle a fifth of the time (2 x H100, 1 MiB writes
// 0.92-1.06 of raw against 0.82-0.88, ten alternated rounds).
inline constexpr uint64_t kPeerCopyCallBytes = 1 << 20;

// What the policy looks at in one transfer.
struct CopyShape {
  int src_device = -1;  // -1: host memory
  int dst_device = -1;
  uint64_t bytes = 0;  // of every chunk
  size_t chunks = 0;
  // The block mapping of a paged plan (a batch's parts share one), or null; for a slice
  // of a mapping (a batch through several write windows), the mapping it is a slice of.
  // Compared, never read.
  const void* mapping = nullptr;
  // A kernel on the launching device (LaunchDevice) can dereference both regions.
  bool reaches = false;
  // Not failed before it reached the stream (its deadline passed while queued): it
  // ends any run.
  bool ok = true;
};

enum class CopyMethod { kCopyEngine, kKernel };

// The device whose lane moves `t`: the GPU side when the other is host memory; between
// two GPUs the source (the destination with `pull`, --gpu_kernel_pull), unless only the
// other one reaches both regions. -1 when neither side is GPU memory.
int LaunchDevice(const Transfer& t, bool pull);
CopyShape ShapeOf(const Transfer& t, bool pull);

// The kernel where one launch reaches both regions and the chunks are many and small;
// otherwise the copy engines, which reach any peer context.
CopyMethod ChooseMethod(const CopyShape& s);
// A write of one big chunk to another GPU: a copy call of its own in a burst of them.
bool PeerCopyCall(const CopyShape& s);
// Whether it may share a kernel launch with other queued transfers.
bool Batchable(const CopyShape& s);
// The end of the run of batchable transfers from `first` that one launch takes: at
// least jobs[first], then more while the launch stays within kLaunchBytes (to another
// GPU without a shared mapping: kPeerBurstBytes) and kLaunchChunks, all cross devices
// or none, and all share one block mapping (a batch's parts: the kernel's blocks form)
// or none has one (a launch of slices of one mapping lists their blocks: the kernel's
// blocks form takes one mapping).
size_t LaunchEnd(absl::Span<const CopyShape> jobs, size_t first);
// The end of the run from `first` that shares one completion event: a burst of peer
// copy calls of at most kPeerBurstBytes, a launch (LaunchEnd), or jobs[first] alone.
// jobs[first] must be ok.
size_t RunEnd(absl::Span<const CopyShape> jobs, size_t first);

}  // namespace ferry::gpu_batching

#endif  // FERRY_AGENT_LOCAL_GPU_BATCHING_H_
