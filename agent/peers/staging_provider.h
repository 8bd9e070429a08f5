// StagingProvider: the target side of the staged path, as the peer service sees it.
//
// Regions the NICs cannot reach (GPU memory when the provider has no FI_HMEM) are
// written in stages: the initiator writes a stage into a host staging buffer the target
// registered with its NICs, then asks the target to commit it into the region. The
// implementation lives in agent/staged; the peer service only routes to it.
#ifndef FERRY_AGENT_PEERS_STAGING_PROVIDER_H_
#define FERRY_AGENT_PEERS_STAGING_PROVIDER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "agent/memory/region.h"
#include "proto/ferry/v1/peer.pb.h"

namespace ferry {

// The agent that opens a staged region (from OpenRegionRequest).
struct StagingInitiator {
  uint64_t incarnation = 0;  // 0: unknown (an older agent)
  std::string address;
};

class StagingProvider {
 public:
  virtual ~StagingProvider() = default;
  // Whether peers must reach `region` through staging.
  virtual bool NeedsStaging(const Region& region) const = 0;
  // Reserves a staging buffer for one initiator's writes into `region`, or answers with
  // the one that initiator (same incarnation) already has; it lives while the region
  // does, or until that initiator's address opens the region with a new incarnation.
  virtual absl::StatusOr<v1::StagingBuffer> Open(const std::shared_ptr<Region>& region,
                                                 const StagingInitiator& initiator) = 0;
  // Copies `chunks` (src_offset in the buffer, dst_offset in the region) from staging
  // buffer `staging_id` into `region`; returns once the bytes are there. Bounds are
  // checked here: the request comes from a peer.
  virtual absl::Status Commit(const std::shared_ptr<Region>& region, uint64_t staging_id,
                              const google::protobuf::RepeatedPtrField<v1::Chunk>& chunks) = 0;
};

}  // namespace ferry

#endif  // FERRY_AGENT_PEERS_STAGING_PROVIDER_H_
