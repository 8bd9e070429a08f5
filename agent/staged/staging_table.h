// StagingTable: the target side of the staged path (a StagingProvider).
//
// Each OpenRegion of a region the NICs cannot reach gets its own staging buffer (host
// memory registered with the NICs): one initiator agent caches one OpenRegion per
// region and uses it one transfer at a time, so writers never share a buffer. A buffer
// lives while its region does (it is freed at the next Open after the region goes); at
// most `max_buffers` exist, and an Open beyond that is RESOURCE_EXHAUSTED. Buffers are
// bound to one region on purpose: a commit can only move bytes that were written for
// that region, by holders of its token.
#ifndef FERRY_AGENT_STAGED_STAGING_TABLE_H_
#define FERRY_AGENT_STAGED_STAGING_TABLE_H_

#include <cstdint>
#include <map>
#include <memory>

#include "absl/synchronization/mutex.h"
#include "agent/cuda/cuda_driver.h"
#include "agent/peers/staging_provider.h"
#include "agent/staged/stage_copier.h"

namespace ferry {

struct StagingOptions {
  uint64_t buffer_bytes = 32 << 20;  // per buffer (smaller for smaller regions)
  size_t max_buffers = 64;
  bool stage_host_regions = false;   // --stage_host_regions
};

class StagingTable : public StagingProvider {
 public:
  // `cu` may be null; `registrar` registers buffers with the NICs.
  StagingTable(StagingOptions options, const CudaDriver* cu, RegionRegistrar* registrar, StageCopier* copier)
      : options_(options), cu_(cu), registrar_(registrar), copier_(copier) {}

  bool NeedsStaging(const Region& region) const override;
  absl::StatusOr<v1::StagingBuffer> Open(const std::shared_ptr<Region>& region) override;
  absl::Status Commit(const std::shared_ptr<Region>& region, uint64_t staging_id,
                      const google::protobuf::RepeatedPtrField<v1::Chunk>& chunks) override;

  size_t buffers() const;

 private:
  struct Entry {
    std::shared_ptr<Region> memory;  // the staging buffer
    std::weak_ptr<Region> target;
    uint64_t target_id = 0;
  };

  const StagingOptions options_;
  const CudaDriver* cu_;
  RegionRegistrar* registrar_;
  StageCopier* copier_;
  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Entry> entries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry

#endif  // FERRY_AGENT_STAGED_STAGING_TABLE_H_
