#include "client/cpp/cuda_buffer.h"

#include <unistd.h>

#include <cstring>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace ferry {
namespace {

CUmemAllocationProp ExportableProp(int device) {
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof(prop));
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

}  // namespace

absl::StatusOr<CudaBuffer> CudaBuffer::Allocate(int device, uint64_t size, CudaExport how) {
  absl::StatusOr<const CudaDriver*> cu = CudaDriver::Load();
  if (!cu.ok()) return cu.status();
  const CudaDriver* d = *cu;
  absl::Status use = UseDevice(*d, device);
  if (!use.ok()) return use;
  if (size == 0) return absl::InvalidArgumentError("size must be at least 1 byte");
  CudaBuffer b;
  b.cu_ = d;
  b.device_ = device;
  b.kind_ = how;
  char bus[32] = {0};
  CUdevice dev;
  FERRY_RETURN_IF_CU_ERROR(d, d->cuDeviceGet(&dev, device), "cuDeviceGet");
  FERRY_RETURN_IF_CU_ERROR(d, d->cuDeviceGetPCIBusId(bus, sizeof(bus), dev), "cuDeviceGetPCIBusId");
  b.pci_bus_id_ = absl::AsciiStrToLower(bus);
  if (how == CudaExport::kIpc) {
    FERRY_RETURN_IF_CU_ERROR(d, d->cuMemAlloc(&b.ptr_, size), "cuMemAlloc");
    b.size_ = size;
    return b;
  }
  CUmemAllocationProp prop = ExportableProp(device);
  size_t granularity = 0;
  FERRY_RETURN_IF_CU_ERROR(d, d->cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                           "cuMemGetAllocationGranularity");
  b.size_ = (size + granularity - 1) / granularity * granularity;
  // `b` frees whatever was set up so far if a later step fails.
  FERRY_RETURN_IF_CU_ERROR(d, d->cuMemCreate(&b.handle_, b.size_, &prop, 0), "cuMemCreate");
  FERRY_RETURN_IF_CU_ERROR(d, d->cuMemAddressReserve(&b.ptr_, b.size_, granularity, 0, 0), "cuMemAddressReserve");
  CUresult mapped = d->cuMemMap(b.ptr_, b.size_, 0, b.handle_, 0);
  if (mapped != CUDA_SUCCESS) {
    d->cuMemAddressFree(b.ptr_, b.size_);
    b.ptr_ = 0;
    return d->Check(mapped, "cuMemMap");
  }
  CUmemAccessDesc access;
  memset(&access, 0, sizeof(access));
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  FERRY_RETURN_IF_CU_ERROR(d, d->cuMemSetAccess(b.ptr_, b.size_, &access, 1), "cuMemSetAccess");
  return b;
}

CudaBuffer::CudaBuffer(CudaBuffer&& o) noexcept { *this = std::move(o); }

CudaBuffer& CudaBuffer::operator=(CudaBuffer&& o) noexcept {
  if (this != &o) {
    Free();
    cu_ = o.cu_;
    ptr_ = std::exchange(o.ptr_, 0);
    size_ = o.size_;
    device_ = o.device_;
    kind_ = o.kind_;
    handle_ = std::exchange(o.handle_, 0);
    exported_fd_ = std::exchange(o.exported_fd_, -1);
    pci_bus_id_ = std::move(o.pci_bus_id_);
  }
  return *this;
}

CudaBuffer::~CudaBuffer() { Free(); }

void CudaBuffer::Free() {
  if (exported_fd_ >= 0) close(std::exchange(exported_fd_, -1));
  if (cu_ == nullptr || (ptr_ == 0 && handle_ == 0)) return;
  if (!UseDevice(*cu_, device_).ok()) return;
  if (handle_ != 0) {
    if (ptr_ != 0) {
      cu_->cuMemUnmap(ptr_, size_);
      cu_->cuMemAddressFree(ptr_, size_);
    }
    cu_->cuMemRelease(handle_);
  } else if (ptr_ != 0) {
    cu_->cuMemFree(ptr_);
  }
  ptr_ = 0;
  handle_ = 0;
}

absl::StatusOr<std::string> CudaBuffer::IpcHandle() const {
  if (kind_ != CudaExport::kIpc) return absl::FailedPreconditionError("not a kIpc buffer");
  absl::Status use = UseDevice(*cu_, device_);
  if (!use.ok()) return use;
  CUipcMemHandle h;
  FERRY_RETURN_IF_CU_ERROR(cu_, cu_->cuIpcGetMemHandle(&h, ptr_), "cuIpcGetMemHandle");
  return std::string(reinterpret_cast<const char*>(&h), sizeof(h));
}

absl::StatusOr<int> CudaBuffer::ExportFd() const {
  if (exported_fd_ >= 0) return exported_fd_;
  absl::Status use = UseDevice(*cu_, device_);
  if (!use.ok()) return use;
  int fd = -1;
  if (kind_ == CudaExport::kPosixFd) {
    FERRY_RETURN_IF_CU_ERROR(
        cu_, cu_->cuMemExportToShareableHandle(&fd, handle_, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
        "cuMemExportToShareableHandle");
  } else if (kind_ == CudaExport::kDmaBuf) {
    FERRY_RETURN_IF_CU_ERROR(
        cu_, cu_->cuMemGetHandleForAddressRange(&fd, ptr_, size_, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0),
        "cuMemGetHandleForAddressRange(DMA_BUF_FD)");
  } else {
    return absl::FailedPreconditionError("kIpc buffers export an IPC handle, not an fd");
  }
  exported_fd_ = fd;
  return fd;
}

absl::StatusOr<v1::RegisterMemoryRequest> CudaRegistration(Client& client, const CudaBuffer& buffer, uint64_t offset,
                                                           uint64_t size) {
  if (offset > buffer.size()) return absl::OutOfRangeError("offset is past the end of the buffer");
  v1::RegisterMemoryRequest req;
  req.set_size(size != 0 ? size : buffer.size() - offset);
  if (buffer.kind() == CudaExport::kIpc) {
    absl::StatusOr<std::string> h = buffer.IpcHandle();
    if (!h.ok()) return h.status();
    v1::CudaIpcMemory* m = req.mutable_cuda_ipc();
    m->set_ipc_handle(*h);
    m->set_pci_bus_id(buffer.pci_bus_id());
    m->set_offset(offset);
    return req;
  }
  absl::StatusOr<int> fd = buffer.ExportFd();
  if (!fd.ok()) return fd.status();
  absl::StatusOr<uint64_t> handle = client.SendFd(*fd);
  if (!handle.ok()) return handle.status();
  v1::CudaFdMemory* m = req.mutable_cuda_fd();
  m->set_fd_handle(*handle);
  m->set_fd_kind(buffer.kind() == CudaExport::kPosixFd ? v1::CudaFdMemory::FD_KIND_POSIX
                                                       : v1::CudaFdMemory::FD_KIND_DMABUF);
  m->set_pci_bus_id(buffer.pci_bus_id());
  m->set_offset(offset);
  m->set_allocation_size(buffer.size());
  return req;
}

absl::StatusOr<v1::RegisterMemoryResponse> RegisterCuda(Client& client, const CudaBuffer& buffer, uint64_t offset,
                                                        uint64_t size) {
  absl::StatusOr<v1::RegisterMemoryRequest> req = CudaRegistration(client, buffer, offset, size);
  if (!req.ok()) return req.status();
  auto ctx = client.NewContext();
  v1::RegisterMemoryResponse resp;
  absl::Status s = FromGrpcStatus(client.stub()->RegisterMemory(ctx.get(), *req, &resp));
  if (!s.ok()) return s;
  return resp;
}

}  // namespace ferry
