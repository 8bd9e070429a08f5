// Importing pods' GPU memory into the agent.
//
//   CudaMemory gpus(/*driver=*/*CudaDriver::Load());
//   absl::StatusOr<std::unique_ptr<MemoryBacking>> b = gpus.ImportIpc(req.cuda_ipc(), req.size());
//   absl::StatusOr<std::unique_ptr<MemoryBacking>> c = gpus.ImportFd(fd.get(), req.cuda_fd(), req.size());
//
// Three handle kinds name a pod's allocation:
//  - a legacy IPC handle (cuIpcGetMemHandle): 64 bytes, opened with cuIpcOpenMemHandle;
//  - a POSIX fd (cuMemCreate + cuMemExportToShareableHandle), passed with SCM_RIGHTS,
//    imported and mapped (cuMemImportFromShareableHandle, cuMemMap, cuMemSetAccess);
//  - a dma-buf fd (cuMemGetHandleForAddressRange), which CUDA cannot map back: it is
//    only usable by a NIC provider with FI_HMEM dma-buf support.
// Bounds are checked against the allocation's real size, the device of fd handles
// against the allocation's real device (legacy IPC cannot tell; see ImportIpc). Imports are cached per allocation
// (import_cache.h): a region keeps its import alive, so memory a pod frees stays valid for the agent's in-flight
// operations until the last region on it is gone.
#ifndef FERRY_AGENT_CUDA_CUDA_IMPORT_H_
#define FERRY_AGENT_CUDA_CUDA_IMPORT_H_

#include <cuda.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/cuda/import_cache.h"
#include "agent/memory/region.h"
#include "proto/ferry/cuda/cuda_driver.h"
#include "proto/ferry/v1/ferry.pb.h"

namespace ferry {

// One imported allocation, mapped into the agent's address space (UVA, so the same
// pointer works from every device with peer access).
class CudaImport {
 public:
  virtual ~CudaImport() = default;
  CUdeviceptr base() const { return base_; }
  uint64_t size() const { return size_; }
  int device() const { return device_; }
  // Whether a kernel running on `device` may dereference this mapping (at BaseOn(device)):
  // a VMM mapping grants every peer device access; a legacy IPC handle is opened in each
  // peer device's context too.
  virtual bool AccessibleFrom(int device) const { return device == device_; }
  // The mapping's address for a kernel on `device` (one AccessibleFrom): base() but for
  // a legacy IPC handle, which has a mapping of its own in each context that opened it.
  virtual CUdeviceptr BaseOn(int device) const { return base_; }
  // Whether this import was made from the same open file as `fd` (fd handles only).
  virtual bool SameFile(int fd) const { return false; }

 protected:
  CUdeviceptr base_ = 0;
  uint64_t size_ = 0;
  int device_ = -1;
};

class CudaMemory {
 public:
  // `on_cache_hit` (may be empty) runs when a registration reuses a live import.
  explicit CudaMemory(const CudaDriver* cu, std::function<void()> on_cache_hit = nullptr);

  absl::StatusOr<std::unique_ptr<MemoryBacking>> ImportIpc(const v1::CudaIpcMemory& m, uint64_t size);
  // Does not take `fd`: the caller closes it (an import keeps its own reference).
  absl::StatusOr<std::unique_ptr<MemoryBacking>> ImportFd(int fd, const v1::CudaFdMemory& m, uint64_t size);

  // Imports alive (regions share one per allocation).
  size_t live_imports() const { return cache_.live(); }
  // "0000:8f:00.0" for an ordinal; empty for one the driver did not name.
  std::string PciBusId(int device) const {
    return device >= 0 && static_cast<size_t>(device) < bus_ids_.size() ? bus_ids_[device] : std::string();
  }

 private:
  // The agent's ordinal for the request's (device, pci_bus_id).
  absl::StatusOr<int> ResolveDevice(int32_t device, const std::string& pci_bus_id) const;

  const CudaDriver* cu_;
  std::vector<std::string> bus_ids_;  // by ordinal, lowercase "0000:1b:00.0"
  std::function<void()> on_cache_hit_;
  ImportCache<CudaImport> cache_;
};

}  // namespace ferry

#endif  // FERRY_AGENT_CUDA_CUDA_IMPORT_H_
