// CudaDriver: the CUDA driver API, loaded at run time from libcuda.so.1.
//
//   absl::StatusOr<const CudaDriver*> cu = CudaDriver::Load();
//   if (!cu.ok()) return cu.status();     // FAILED_PRECONDITION on a node without a driver
//   CUdeviceptr p;
//   FERRY_RETURN_IF_CU_ERROR(*cu, (*cu)->cuMemAlloc(&p, 1 << 20), "cuMemAlloc");
//
// One ferryd binary serves GPU and CPU-only nodes: nothing links against libcuda, and
// every entry point is resolved once, by the versioned name cuda.h maps it to
// (cuMemAlloc -> cuMemAlloc_v2), so a member is called exactly as the C API is.
#ifndef FERRY_PROTO_FERRY_CUDA_CUDA_DRIVER_H_
#define FERRY_PROTO_FERRY_CUDA_CUDA_DRIVER_H_

#include <cuda.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ferry {

// Every driver entry point ferry uses (agent and client helpers).
// (Kept out of clang-format: a group of related calls per line reads better.)
// clang-format off
#define FERRY_CUDA_FUNCTIONS(X)                                                                                \
  X(cuInit) X(cuDriverGetVersion) X(cuGetErrorName) X(cuGetErrorString)                                        \
  X(cuDeviceGetCount) X(cuDeviceGet) X(cuDeviceGetAttribute) X(cuDeviceGetPCIBusId)                            \
  X(cuDeviceCanAccessPeer) X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease)                            \
  X(cuCtxSetCurrent) X(cuCtxGetCurrent) X(cuCtxEnablePeerAccess) X(cuCtxCreate) X(cuCtxDestroy)                \
  X(cuMemAlloc) X(cuMemFree) X(cuMemsetD8) X(cuMemcpyHtoD) X(cuMemcpyDtoH)                                     \
  X(cuMemcpyAsync) X(cuMemcpyHtoDAsync) X(cuMemcpyDtoHAsync) X(cuMemGetAddressRange) X(cuPointerGetAttribute)  \
  X(cuMemHostAlloc) X(cuMemFreeHost) X(cuMemAllocAsync) X(cuMemFreeAsync)                                      \
  X(cuIpcGetMemHandle) X(cuIpcOpenMemHandle) X(cuIpcCloseMemHandle)                                            \
  X(cuMemCreate) X(cuMemRelease) X(cuMemGetAllocationGranularity)                                              \
  X(cuMemExportToShareableHandle) X(cuMemImportFromShareableHandle)                                            \
  X(cuMemGetAllocationPropertiesFromHandle) X(cuMemAddressReserve) X(cuMemAddressFree)                         \
  X(cuMemMap) X(cuMemUnmap) X(cuMemSetAccess) X(cuMemGetHandleForAddressRange)                                 \
  X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamSynchronize)                                                  \
  X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord) X(cuEventQuery)                                          \
  X(cuEventSynchronize) X(cuEventElapsedTime)                                                                  \
  X(cuModuleLoadData) X(cuModuleUnload) X(cuModuleGetFunction) X(cuLaunchKernel)                               \
  X(cuOccupancyMaxActiveBlocksPerMultiprocessor)
// clang-format on

struct CudaDriver {
  // Loads libcuda.so.1 and calls cuInit once per process; later calls return the same
  // driver or the same error. FAILED_PRECONDITION says why CUDA is unusable here.
  static absl::StatusOr<const CudaDriver*> Load();

  // OK for CUDA_SUCCESS; otherwise a status with `what` and the driver's error name and
  // text. Out-of-memory maps to RESOURCE_EXHAUSTED, bad arguments to INVALID_ARGUMENT.
  absl::Status Check(CUresult r, absl::string_view what) const;

  int version = 0;  // cuDriverGetVersion, e.g. 12090
  int device_count = 0;

#define FERRY_CUDA_MEMBER(name) decltype(&::name) name = nullptr;
  FERRY_CUDA_FUNCTIONS(FERRY_CUDA_MEMBER)
#undef FERRY_CUDA_MEMBER
};

// Makes `device`'s primary context current on the calling thread (retaining it on first
// use for the life of the process). Every thread that calls CUDA does this first.
absl::Status UseDevice(const CudaDriver& cu, int device);

// With `device` current, enables access to every peer device that supports it, so a
// kernel on `device` can read and write memory mapped on the others (NVLink / PCIe P2P).
// Returns how many peers are reachable.
absl::StatusOr<int> EnablePeerAccess(const CudaDriver& cu, int device);

}  // namespace ferry

#define FERRY_RETURN_IF_CU_ERROR(cu, call, what)                 \
  do {                                                           \
    absl::Status _ferry_cu_status = (cu)->Check((call), (what)); \
    if (!_ferry_cu_status.ok()) return _ferry_cu_status;         \
  } while (0)

#endif  // FERRY_PROTO_FERRY_CUDA_CUDA_DRIVER_H_
