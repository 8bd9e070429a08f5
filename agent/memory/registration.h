// What a transport attaches to a region: its registration with each NIC (the keys
// peers write with), released when the attachment is destroyed.
#ifndef FERRY_AGENT_MEMORY_REGISTRATION_H_
#define FERRY_AGENT_MEMORY_REGISTRATION_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"

namespace ferry {

class MemoryBacking;  // region.h

// Per-NIC information a transport attached to a region.
struct NicRegistration {
  uint64_t key = 0;            // remote key peers use to write into the region
  uint64_t remote_base = 0;    // remote address of byte 0 (0 for offset addressing)
  void* local_desc = nullptr;  // fi_mr_desc for FI_MR_LOCAL providers
};

// Releases transport resources (e.g. closes MRs) when destroyed.
class TransportAttachment {
 public:
  virtual ~TransportAttachment() = default;
};

struct RegionRegistration {
  std::vector<NicRegistration> nics;
  std::unique_ptr<TransportAttachment> owner;
};

// Attaches transports to new regions (e.g. registers them with every NIC). Called
// before a region is published; a failure fails the RegisterMemory call.
class RegionRegistrar {
 public:
  virtual ~RegionRegistrar() = default;
  virtual absl::StatusOr<RegionRegistration> Register(const MemoryBacking& backing) = 0;
  // Registers bytes [offset, offset + length) of a registered region alone, under keys
  // of their own (a write window's, revoked by destroying the result). Each
  // NicRegistration's remote_base is that of the region's byte 0, as in Register.
  virtual absl::StatusOr<RegionRegistration> RegisterRange(const MemoryBacking& backing, uint64_t offset,
                                                           uint64_t length) {
    return absl::FailedPreconditionError("this agent's transport cannot register part of a region");
  }
};

}  // namespace ferry

#endif  // FERRY_AGENT_MEMORY_REGISTRATION_H_
