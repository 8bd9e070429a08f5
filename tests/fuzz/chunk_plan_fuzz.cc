// Fuzz target: Write requests from an untrusted pod, through BuildChunkPlan.
//
// Input: 16 bytes of region sizes (source, destination), then a serialized WriteRequest.
// Whatever the bytes, BuildChunkPlan must answer without crashing, and an accepted plan
// must keep its promises: every chunk inside both regions, no two destinations
// overlapping, total_bytes the sum of the lengths.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "agent/transfer/chunk_plan.h"
#include "proto/ferry/v1/ferry.pb.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 16) return 0;
  uint64_t src_size, dst_size;
  memcpy(&src_size, data, 8);
  memcpy(&dst_size, data + 8, 8);
  ferry::v1::WriteRequest req;
  if (!req.ParseFromArray(data + 16, static_cast<int>(size - 16))) return 0;
  absl::StatusOr<ferry::ChunkPlan> plan = ferry::BuildChunkPlan(req, src_size, dst_size, ferry::ChunkLimits{4096});
  if (!plan.ok()) {
    if (plan.status().message().empty()) abort();  // every refusal says why
    return 0;
  }
  uint64_t total = 0;
  std::vector<ferry::CopyChunk> chunks;  // both forms, as every executor reads them
  for (size_t i = 0; i < plan->size(); ++i) chunks.push_back(plan->chunk(i));
  for (const ferry::CopyChunk& c : chunks) {
    if (c.length == 0 || c.src_offset > src_size || c.length > src_size - c.src_offset || c.dst_offset > dst_size ||
        c.length > dst_size - c.dst_offset) {
      abort();
    }
    total += c.length;
  }
  if (total != plan->total_bytes) abort();
  std::sort(chunks.begin(), chunks.end(),
            [](const ferry::CopyChunk& a, const ferry::CopyChunk& b) { return a.dst_offset < b.dst_offset; });
  for (size_t i = 1; i < chunks.size(); ++i) {
    if (chunks[i].dst_offset < chunks[i - 1].dst_offset + chunks[i - 1].length) abort();
  }
  return 0;
}
