// GPU memory a pod allocates and registers with ferry, exported as any of the three
// handle kinds the agent imports.
//
//   absl::StatusOr<ferry::CudaBuffer> kv = ferry::CudaBuffer::Allocate(/*device=*/0, 1 << 30,
//                                                                      ferry::CudaExport::kPosixFd);
//   absl::StatusOr<ferry::v1::RegisterMemoryResponse> reg = ferry::RegisterCuda(*client, *kv);
//   // reg->region() is the descriptor to hand to other pods, as for host memory.
//
// kPosixFd is the kind to use between pods: the fd travels over the session socket
// (SCM_RIGHTS) and needs no shared PID or IPC namespace with the agent (see
// deploy/README.md). kIpc is the legacy cudaIpcMemHandle_t; kDmaBuf is for NICs with
// FI_HMEM dma-buf support. The buffer is freed when the CudaBuffer goes; an agent that
// imported it keeps the memory alive until the last region on it is deregistered.
#ifndef FERRY_CLIENT_CPP_CUDA_BUFFER_H_
#define FERRY_CLIENT_CPP_CUDA_BUFFER_H_

#include <cuda.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "client/cpp/ferry_client.h"
#include "proto/ferry/cuda/cuda_driver.h"

namespace ferry {

enum class CudaExport { kIpc, kPosixFd, kDmaBuf };

class CudaBuffer {
 public:
  // kIpc: cuMemAlloc. kPosixFd, kDmaBuf: cuMemCreate (exportable as a POSIX fd), mapped
  // read-write here; `size` is rounded up to the allocation granularity.
  static absl::StatusOr<CudaBuffer> Allocate(int device, uint64_t size, CudaExport how);
  CudaBuffer(CudaBuffer&& o) noexcept;
  CudaBuffer& operator=(CudaBuffer&& o) noexcept;
  CudaBuffer(const CudaBuffer&) = delete;
  CudaBuffer& operator=(const CudaBuffer&) = delete;
  ~CudaBuffer();

  CUdeviceptr ptr() const { return ptr_; }
  uint64_t size() const { return size_; }
  int device() const { return device_; }
  CudaExport kind() const { return kind_; }
  const std::string& pci_bus_id() const { return pci_bus_id_; }

  // The 64-byte legacy IPC handle (kIpc buffers).
  absl::StatusOr<std::string> IpcHandle() const;
  // The allocation's exported fd (kPosixFd: cuMemExportToShareableHandle; kDmaBuf:
  // cuMemGetHandleForAddressRange), made once and owned by the buffer. Registering
  // several regions of one buffer sends this same file, so the agent imports the
  // allocation once.
  absl::StatusOr<int> ExportFd() const;

  // Frees the memory now (tests: a pod freeing memory it registered).
  void Free();

 private:
  CudaBuffer() = default;
  const CudaDriver* cu_ = nullptr;
  CUdeviceptr ptr_ = 0;
  uint64_t size_ = 0;
  int device_ = -1;
  CudaExport kind_ = CudaExport::kIpc;
  CUmemGenericAllocationHandle handle_ = 0;  // cuMemCreate buffers
  mutable int exported_fd_ = -1;
  std::string pci_bus_id_;
};

// A RegisterMemoryRequest for [offset, offset + size) of `buffer` (size 0: to the end),
// with any fd already sent on `client`'s session. Tests may alter it before sending.
absl::StatusOr<v1::RegisterMemoryRequest> CudaRegistration(Client& client, const CudaBuffer& buffer,
                                                           uint64_t offset = 0, uint64_t size = 0);
// CudaRegistration, sent.
absl::StatusOr<v1::RegisterMemoryResponse> RegisterCuda(Client& client, const CudaBuffer& buffer, uint64_t offset = 0,
                                                        uint64_t size = 0);

}  // namespace ferry

#endif  // FERRY_CLIENT_CPP_CUDA_BUFFER_H_
