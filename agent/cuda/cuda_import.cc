#include "agent/cuda/cuda_import.h"

#include <fcntl.h>
#include <linux/kcmp.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>

#include <cctype>
#include <cstring>
#include <fstream>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "agent/common/log.h"
#include "agent/common/status_macros.h"
#include "agent/common/status_prefix.h"

namespace ferry {
namespace {

// Driver calls on an import's teardown path: nothing useful can be done with an error
// there, and the context must be the one the memory was mapped in.
void BestEffort(const CudaDriver& cu, CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) (void)cu.Check(r, what);
}

class IpcImport : public CudaImport {
 public:
  IpcImport(const CudaDriver* cu, CUdeviceptr base, uint64_t size, int device) : cu_(cu) {
    base_ = base;
    size_ = size;
    device_ = device;
  }
  ~IpcImport() override {
    for (const auto& [device, base] : peers_) {
      if (UseDevice(*cu_, device).ok()) BestEffort(*cu_, cu_->cuIpcCloseMemHandle(base), "cuIpcCloseMemHandle");
    }
    if (UseDevice(*cu_, device_).ok()) BestEffort(*cu_, cu_->cuIpcCloseMemHandle(base_), "cuIpcCloseMemHandle");
  }

  // Opens `h` again in the context of every other device that can reach this one (with
  // lazily enabled peer access): a legacy IPC mapping serves only the context that opened
  // it, and a GPU-to-GPU copy's kernel runs on one end and dereferences both. Without
  // these, such copies went to the copy engines a chunk at a time (a KV handoff between
  // two GPUs at ~2 GB/s). Best effort: a device whose open fails is left out, and copies
  // it would have run use the copy engines.
  void OpenOnPeers(const CUipcMemHandle& h) {
    for (int d = 0; d < cu_->device_count; ++d) {
      int can = 0;
      if (d == device_ || cu_->cuDeviceCanAccessPeer(&can, d, device_) != CUDA_SUCCESS || !can) continue;
      CUdeviceptr ptr = 0;
      absl::Status opened = UseDevice(*cu_, d);
      if (opened.ok()) {
        opened = cu_->Check(cu_->cuIpcOpenMemHandle(&ptr, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
                            "cuIpcOpenMemHandle on a peer device");
      }
      if (!opened.ok()) {
        FERRY_LOG(WARNING) << "cuda_ipc: device " << device_ << "'s allocation stays unmapped on device " << d << ": "
                           << opened.message() << " (copies between them use the copy engines)";
        continue;
      }
      peers_.emplace_back(d, ptr);
    }
    (void)UseDevice(*cu_, device_);
  }

  bool AccessibleFrom(int device) const override { return device == device_ || Peer(device) != 0; }
  CUdeviceptr BaseOn(int device) const override { return device == device_ ? base_ : Peer(device); }

 private:
  CUdeviceptr Peer(int device) const {
    for (const auto& [d, base] : peers_) {
      if (d == device) return base;
    }
    return 0;
  }

  const CudaDriver* cu_;
  std::vector<std::pair<int, CUdeviceptr>> peers_;  // (device, the mapping in its context)
};

class VmmImport : public CudaImport {
 public:
  VmmImport(const CudaDriver* cu, int device) : cu_(cu) { device_ = device; }

  bool AccessibleFrom(int device) const override {
    return std::find(peers_.begin(), peers_.end(), device) != peers_.end();
  }
  // Every exported CUDA fd shares one anonymous inode, so files are told apart by
  // kcmp(KCMP_FILE): fds passed over SCM_RIGHTS refer to the same open file. Where
  // kcmp is unavailable, nothing matches and each registration imports afresh.
  bool SameFile(int fd) const override { return syscall(SYS_kcmp, getpid(), getpid(), KCMP_FILE, fd_, fd) == 0; }
  ~VmmImport() override {
    if (!UseDevice(*cu_, device_).ok()) return;
    if (mapped_) BestEffort(*cu_, cu_->cuMemUnmap(base_, size_), "cuMemUnmap");
    if (base_ != 0) BestEffort(*cu_, cu_->cuMemAddressFree(base_, size_), "cuMemAddressFree");
    if (handle_ != 0) BestEffort(*cu_, cu_->cuMemRelease(handle_), "cuMemRelease");
    if (fd_ >= 0) close(fd_);
  }

  // Maps the whole imported allocation and grants every device that can reach it
  // read/write access (kernels run on either end of a GPU-to-GPU copy).
  absl::Status Map(int fd, uint64_t allocation_size) {
    const CudaDriver* cu = cu_;
    // Kept open while the import lives, for SameFile.
    fd_ = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (fd_ < 0) return absl::ResourceExhaustedError("cuda_fd: out of file descriptors in the agent");
    FERRY_RETURN_IF_CU_ERROR(
        cu,
        cu->cuMemImportFromShareableHandle(&handle_, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                                           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
        "cuda_fd: importing the fd (is it a cuMemExportToShareableHandle POSIX fd?)");
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    FERRY_RETURN_IF_CU_ERROR(cu, cu->cuMemGetAllocationPropertiesFromHandle(&prop, handle_),
                             "cuMemGetAllocationPropertiesFromHandle");
    if (prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop.location.id != device_) {
      return absl::InvalidArgumentError(absl::StrCat("cuda_fd: the allocation lives on device ", prop.location.id,
                                                     ", not on device ", device_, " as the request says"));
    }
    size_t granularity = 0;
    FERRY_RETURN_IF_CU_ERROR(cu,
                             cu->cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                             "cuMemGetAllocationGranularity");
    if (allocation_size == 0 || allocation_size % granularity != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("cuda_fd.allocation_size must be the allocation's size, a multiple of ", granularity,
                       " bytes; got ", allocation_size));
    }
    size_ = allocation_size;
    FERRY_RETURN_IF_CU_ERROR(cu, cu->cuMemAddressReserve(&base_, size_, granularity, 0, 0), "cuMemAddressReserve");
    absl::Status mapped = cu->Check(cu->cuMemMap(base_, size_, 0, handle_, 0), "cuMemMap");
    if (!mapped.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("cuda_fd.allocation_size ", allocation_size,
                                                     " is larger than the exported allocation (", mapped.message(),
                                                     ")"));
    }
    mapped_ = true;
    std::vector<CUmemAccessDesc> access;
    for (int d = 0; d < cu->device_count; ++d) {
      int can = d == device_ ? 1 : 0;
      if (d != device_ && cu->cuDeviceCanAccessPeer(&can, d, device_) != CUDA_SUCCESS) can = 0;
      if (!can) continue;
      CUmemAccessDesc a;
      memset(&a, 0, sizeof(a));
      a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      a.location.id = d;
      a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      access.push_back(a);
      peers_.push_back(d);
    }
    return cu->Check(cu->cuMemSetAccess(base_, size_, access.data(), access.size()), "cuMemSetAccess");
  }

 private:
  const CudaDriver* cu_;
  CUmemGenericAllocationHandle handle_ = 0;
  bool mapped_ = false;
  int fd_ = -1;
  std::vector<int> peers_;  // devices granted access, this one included
};

// A region: a window [offset, offset + size) of a shared import.
class CudaBacking : public MemoryBacking {
 public:
  CudaBacking(std::shared_ptr<CudaImport> import, uint64_t offset, uint64_t size)
      : import_(std::move(import)), offset_(offset), size_(size) {}
  MemoryKind kind() const override { return MemoryKind::kCuda; }
  void* data() const override { return reinterpret_cast<void*>(import_->base() + offset_); }
  void* DataOn(int device) const override { return reinterpret_cast<void*>(import_->BaseOn(device) + offset_); }
  uint64_t size() const override { return size_; }
  int device() const override { return import_->device(); }
  bool AccessibleFrom(int device) const override { return import_->AccessibleFrom(device); }

 private:
  std::shared_ptr<CudaImport> import_;
  const uint64_t offset_;
  const uint64_t size_;
};

absl::Status CheckWindow(const char* field, uint64_t offset, uint64_t size, uint64_t allocation) {
  if (offset > allocation || size > allocation - offset) {
    return absl::OutOfRangeError(absl::StrCat(field, ": offset ", offset, " + size ", size,
                                              " runs past the end of the ", allocation, "-byte allocation"));
  }
  return absl::OkStatus();
}

// "dma-buf" fds carry an exporter name in /proc/self/fdinfo.
bool IsDmaBuf(int fd) {
  std::ifstream info(absl::StrCat("/proc/self/fdinfo/", fd));
  std::string line;
  while (std::getline(info, line)) {
    if (line.rfind("exp_name:", 0) == 0) return true;
  }
  return false;
}

}  // namespace

CudaMemory::CudaMemory(const CudaDriver* cu, std::function<void()> on_cache_hit)
    : cu_(cu), on_cache_hit_(std::move(on_cache_hit)) {
  for (int d = 0; d < cu_->device_count; ++d) {
    char bus[32] = {0};
    CUdevice dev;
    if (cu_->cuDeviceGet(&dev, d) != CUDA_SUCCESS || cu_->cuDeviceGetPCIBusId(bus, sizeof(bus), dev) != CUDA_SUCCESS) {
      bus[0] = '\0';
    }
    bus_ids_.push_back(absl::AsciiStrToLower(bus));
  }
}

absl::StatusOr<int> CudaMemory::ResolveDevice(int32_t device, const std::string& pci_bus_id) const {
  if (!pci_bus_id.empty()) {
    std::string want = absl::AsciiStrToLower(pci_bus_id);
    for (size_t d = 0; d < bus_ids_.size(); ++d) {
      if (bus_ids_[d] == want) return static_cast<int>(d);
    }
    return absl::InvalidArgumentError(
        absl::StrCat("pci_bus_id \"", absl::CHexEscape(pci_bus_id), "\" is not a CUDA device on this node"));
  }
  if (device < 0 || device >= cu_->device_count) {
    return absl::InvalidArgumentError(
        absl::StrCat("device ", device, " does not exist: this node has ", cu_->device_count, " CUDA devices"));
  }
  return device;
}

absl::StatusOr<std::unique_ptr<MemoryBacking>> CudaMemory::ImportIpc(const v1::CudaIpcMemory& m, uint64_t size) {
  if (m.ipc_handle().size() != sizeof(CUipcMemHandle)) {
    return absl::InvalidArgumentError(absl::StrCat("cuda_ipc.ipc_handle must be ", sizeof(CUipcMemHandle),
                                                   " bytes (a cudaIpcMemHandle_t), got ", m.ipc_handle().size()));
  }
  absl::StatusOr<int> device = ResolveDevice(m.device(), m.pci_bus_id());
  if (!device.ok()) return WithPrefix(device.status(), "cuda_ipc.");
  bool hit = false;
  absl::StatusOr<std::shared_ptr<CudaImport>> import = cache_.GetOrImport(
      absl::StrCat("ipc:", m.ipc_handle()),
      [&]() -> absl::StatusOr<std::shared_ptr<CudaImport>> {
        FERRY_RETURN_IF_ERROR(UseDevice(*cu_, *device));
        CUipcMemHandle h;
        memcpy(&h, m.ipc_handle().data(), sizeof(h));
        // Opened in the named device's context. The driver does not say where legacy
        // IPC memory really lives (the pointer reports the opening context's device),
        // so a wrong device is not detected here; it costs only locality: the mapping
        // reaches the memory over NVLink through lazily enabled peer access.
        CUdeviceptr ptr = 0;
        absl::Status opened = cu_->Check(cu_->cuIpcOpenMemHandle(&ptr, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
                                         "cuda_ipc: cuIpcOpenMemHandle");
        if (!opened.ok()) {
          return absl::InvalidArgumentError(
              absl::StrCat(opened.message(),
                           "; the handle is garbage, its memory was freed, or the exporting process is not "
                           "reachable from the agent (legacy IPC handles need a shared PID namespace)"));
        }
        auto close = absl::MakeCleanup([&] { BestEffort(*cu_, cu_->cuIpcCloseMemHandle(ptr), "cuIpcCloseMemHandle"); });
        CUdeviceptr base = 0;
        size_t bytes = 0;
        FERRY_RETURN_IF_CU_ERROR(cu_, cu_->cuMemGetAddressRange(&base, &bytes, ptr), "cuMemGetAddressRange");
        std::move(close).Cancel();
        auto import = std::make_shared<IpcImport>(cu_, ptr, bytes, *device);
        import->OpenOnPeers(h);
        return import;
      },
      &hit);
  if (!import.ok()) return import.status();
  if ((*import)->device() != *device) {
    return absl::InvalidArgumentError(absl::StrCat("cuda_ipc: this allocation is already registered as device ",
                                                   (*import)->device(), ", not device ", *device));
  }
  if (hit && on_cache_hit_) on_cache_hit_();
  FERRY_RETURN_IF_ERROR(CheckWindow("cuda_ipc", m.offset(), size, (*import)->size()));
  return std::make_unique<CudaBacking>(std::move(*import), m.offset(), size);
}

absl::StatusOr<std::unique_ptr<MemoryBacking>> CudaMemory::ImportFd(int fd, const v1::CudaFdMemory& m, uint64_t size) {
  struct stat st;
  if (fstat(fd, &st) != 0) return absl::InvalidArgumentError("cuda_fd: the fd is not open");
  if (S_ISDIR(st.st_mode) || S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode)) {
    return absl::InvalidArgumentError(
        "cuda_fd: the fd is a directory, pipe or socket, not an exported CUDA allocation");
  }
  absl::StatusOr<int> device = ResolveDevice(m.device(), m.pci_bus_id());
  if (!device.ok()) return WithPrefix(device.status(), "cuda_fd.");
  switch (m.fd_kind()) {
    case v1::CudaFdMemory::FD_KIND_POSIX:
      break;
    case v1::CudaFdMemory::FD_KIND_DMABUF:
      if (!IsDmaBuf(fd))
        return absl::InvalidArgumentError("cuda_fd: fd_kind is FD_KIND_DMABUF but the fd is not a dma-buf");
      // CUDA cannot map a dma-buf back into a process; only a NIC can use it, through a
      // provider with FI_HMEM dma-buf registration, which this agent does not drive yet.
      return absl::FailedPreconditionError(
          "cuda_fd: dma-buf regions need a fabric provider with FI_HMEM dma-buf support, which this agent does not "
          "use; export the allocation with FD_KIND_POSIX (cuMemExportToShareableHandle) instead");
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("cuda_fd.fd_kind must be FD_KIND_POSIX or FD_KIND_DMABUF, got ", static_cast<int>(m.fd_kind())));
  }
  absl::Status window = CheckWindow("cuda_fd", m.offset(), size, m.allocation_size());
  if (!window.ok()) return window;
  bool hit = false;
  absl::StatusOr<std::shared_ptr<CudaImport>> import =
      cache_.MatchOrImport([fd](const CudaImport& i) { return i.SameFile(fd); },
                           [&]() -> absl::StatusOr<std::shared_ptr<CudaImport>> {
                             FERRY_RETURN_IF_ERROR(UseDevice(*cu_, *device));
                             auto import = std::make_shared<VmmImport>(cu_, *device);
                             FERRY_RETURN_IF_ERROR(import->Map(fd, m.allocation_size()));
                             return import;
                           },
                           &hit);
  if (!import.ok()) return import.status();
  if ((*import)->device() != *device) {
    return absl::InvalidArgumentError(absl::StrCat("cuda_fd: the allocation lives on device ", (*import)->device(),
                                                   ", not on device ", *device, " as the request says"));
  }
  if (hit && on_cache_hit_) on_cache_hit_();
  window = CheckWindow("cuda_fd", m.offset(), size, (*import)->size());
  if (!window.ok()) return window;
  return std::make_unique<CudaBacking>(std::move(*import), m.offset(), size);
}

}  // namespace ferry
