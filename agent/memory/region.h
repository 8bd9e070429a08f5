// Region: memory a client registered with the agent.
//
// A Region owns its backing (the mapping of the client's memory) and whatever
// transports attached to it (e.g. libfabric memory registrations, one per NIC).
// Operations in flight hold a std::shared_ptr<Region>, so a deregistered region's
// registrations are closed and its memory unmapped only after the last operation on it
// has completed. Incoming RMA writes hold no reference, so a region that goes first
// detaches its memory (MemoryBacking::Retire, see retired_memory.h), then closes its
// registrations: a late write from a peer lands in throwaway pages, never in freed
// memory or in the client's memory after Deregister returned.
#ifndef FERRY_AGENT_MEMORY_REGION_H_
#define FERRY_AGENT_MEMORY_REGION_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/common/token.h"
#include "agent/memory/registration.h"
#include "agent/memory/writer_keys.h"
#include "agent/topology/placement.h"

namespace ferry {

enum class MemoryKind { kHost = 1, kCuda = 2 };
const char* MemoryKindName(MemoryKind kind);  // "host", "cuda" (metric label values)

// The memory behind a region, as mapped into the agent.
class MemoryBacking {
 public:
  virtual ~MemoryBacking() = default;
  virtual MemoryKind kind() const = 0;
  // Address of byte 0 of the region in the agent's address space (device address for
  // CUDA memory).
  virtual void* data() const = 0;
  virtual uint64_t size() const = 0;
  // CUDA device ordinal, or -1 for host memory.
  virtual int device() const { return -1; }
  // Whether a GPU kernel on `device` may dereference the region (CUDA memory only), at
  // DataOn(device): data() but for memory mapped separately in each device's context.
  virtual bool AccessibleFrom(int device) const { return false; }
  virtual void* DataOn(int device) const { return data(); }
  // Called once when the region goes, before its transport registrations are closed:
  // afterwards a write a provider is still receiving into data() must neither fault nor
  // reach the client's memory. The backing keeps (or hands to RetiredMemory) whatever
  // such a write may still touch.
  virtual void Retire() {}
};

// Maps `size` bytes of a memfd at `offset`, after sealing it against shrinking
// (F_SEAL_SHRINK: a pod that shrank a registered file would fault the agent).
// Takes ownership of `fd` (closed before returning: the mapping keeps the memory).
// Refuses fds that cannot back shared memory (pipes, sockets, directories) or cannot be
// sealed (a memfd without MFD_ALLOW_SEALING, a /dev/shm file), and ranges past the end
// of the file, with INVALID_ARGUMENT / OUT_OF_RANGE.
absl::StatusOr<std::unique_ptr<MemoryBacking>> MapHostFd(int fd, uint64_t offset, uint64_t size);

class Region {
 public:
  Region(uint64_t id, uint64_t owner_session, Token token, std::unique_ptr<MemoryBacking> backing)
      : id_(id), owner_session_(owner_session), token_(token), backing_(std::move(backing)) {}
  ~Region() { backing_->Retire(); }
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

  uint64_t id() const { return id_; }
  uint64_t owner_session() const { return owner_session_; }
  const Token& token() const { return token_; }
  MemoryKind kind() const { return backing_->kind(); }
  uint64_t size() const { return backing_->size(); }
  int device() const { return backing_->device(); }
  uint8_t* data() const { return static_cast<uint8_t*>(backing_->data()); }
  const MemoryBacking& backing() const { return *backing_; }

  // Set once, before the region is published in the RegionTable.
  void set_registration(RegionRegistration reg) { registration_ = std::move(reg); }
  const std::vector<NicRegistration>& nics() const { return registration_.nics; }
  // Where the memory is (its GPU, or its owner's NUMA node): picks the NICs that carry
  // it. Set once, before the region is published.
  void set_placement(Placement p) { placement_ = std::move(p); }
  const Placement& placement() const { return placement_; }
  // Window mode (RegisterMemoryRequest.write_windows): writes only through write windows
  // (write_windows.h). Set once, before the region is published.
  void set_write_windows(bool on) { write_windows_ = on; }
  bool write_windows() const { return write_windows_; }
  // The keys of each agent that writes into the region over the fabric (writer_keys.h).
  WriterKeys& writers() { return writers_; }

 private:
  const uint64_t id_;
  const uint64_t owner_session_;
  const Token token_;
  // Declaration order matters: members are destroyed bottom-up, so transport
  // registrations (the writers' and the region's own) are released (after ~Region
  // retired the backing) before the backing.
  std::unique_ptr<MemoryBacking> backing_;
  RegionRegistration registration_;
  WriterKeys writers_;
  Placement placement_;
  bool write_windows_ = false;
};

}  // namespace ferry

#endif  // FERRY_AGENT_MEMORY_REGION_H_
