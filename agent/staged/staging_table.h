// StagingTable: the target side of the staged path (a StagingProvider).
//
// Each initiator agent that opens a region the NICs cannot reach gets its own staging
// buffer for it (host memory registered with the NICs): one initiator caches one
// OpenRegion per region and shares the buffer's slots among its transfers, so writers
// from different agents never share a buffer. Opening again from the same incarnation
// (after a failed commit, say) answers with the same buffer; an open from a new
// incarnation at the same address (the initiator restarted) frees the old one's. A
// buffer otherwise lives while its region does (it is freed at the next Open after the
// region goes); at most `max_buffers` exist, and an Open beyond that is
// RESOURCE_EXHAUSTED. Buffers are bound to one region on purpose: a commit can only
// move bytes that were written for that region, by holders of its token.
//
//   StagingTable table(options, cu, registrar, copier);
//   absl::StatusOr<v1::StagingBuffer> b = table.Open(region, {incarnation, "10.0.0.2:7000"});
//   table.Commit(region, b->id(), chunks);   // bytes the initiator wrote into b -> region
#ifndef FERRY_AGENT_STAGED_STAGING_TABLE_H_
#define FERRY_AGENT_STAGED_STAGING_TABLE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "agent/peers/staging_provider.h"
#include "agent/staged/stage_copier.h"
#include "proto/ferry/cuda/cuda_driver.h"

namespace ferry {

struct StagingOptions {
  uint64_t buffer_bytes = 32 << 20;  // per buffer (smaller for smaller regions)
  size_t max_buffers = 64;
  bool stage_host_regions = false;               // --stage_host_regions
  std::function<void(size_t buffers)> on_count;  // after every change (a metric), may be null
};

class StagingTable : public StagingProvider {
 public:
  // `cu` may be null; `registrar` registers buffers with the NICs.
  StagingTable(StagingOptions options, const CudaDriver* cu, RegionRegistrar* registrar, StageCopier* copier)
      : options_(options), cu_(cu), registrar_(registrar), copier_(copier) {}

  bool NeedsStaging(const Region& region) const override;
  absl::StatusOr<v1::StagingBuffer> Open(const std::shared_ptr<Region>& region,
                                         const StagingInitiator& initiator) override;
  absl::Status Commit(const std::shared_ptr<Region>& region, uint64_t staging_id,
                      const google::protobuf::RepeatedPtrField<v1::Chunk>& chunks) override;

  size_t buffers() const;

 private:
  struct Entry {
    std::shared_ptr<Region> memory;  // the staging buffer
    std::weak_ptr<Region> target;
    uint64_t target_id = 0;
    StagingInitiator initiator;
  };
  static v1::StagingBuffer Describe(uint64_t id, const Region& memory);
  // Takes out the entries whose region is gone, and those `initiator`'s earlier
  // incarnations opened for `region_id`; returns (in `*found`) the id of the one this
  // incarnation has, if any.
  std::vector<std::shared_ptr<Region>> PruneLocked(uint64_t region_id, const StagingInitiator& initiator,
                                                   uint64_t* found) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Counted(size_t n) const;

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
