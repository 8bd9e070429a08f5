#include "proto/ferry/cuda/cuda_driver.h"

#include <dlfcn.h>

#include <mutex>
#include <vector>

#include "absl/base/call_once.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace ferry {
namespace {

#define FERRY_STRINGIZE2(x) #x
#define FERRY_STRINGIZE(x) FERRY_STRINGIZE2(x)

absl::StatusOr<const CudaDriver*> LoadOnce() {
  // Never unloaded: regions and contexts may live until exit.
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("no CUDA driver on this node (", dlerror(), "); GPU memory needs a node with the NVIDIA driver"));
  }
  auto* cu = new CudaDriver();
  std::string missing;
#define FERRY_CUDA_RESOLVE(name)                                                      \
  cu->name = reinterpret_cast<decltype(cu->name)>(dlsym(lib, FERRY_STRINGIZE(name))); \
  if (cu->name == nullptr) absl::StrAppend(&missing, missing.empty() ? "" : ", ", FERRY_STRINGIZE(name));
  FERRY_CUDA_FUNCTIONS(FERRY_CUDA_RESOLVE)
#undef FERRY_CUDA_RESOLVE
  if (!missing.empty()) {
    delete cu;
    return absl::FailedPreconditionError(
        absl::StrCat("the CUDA driver is too old for ferry (missing ", missing, "); CUDA 12 or newer is needed"));
  }
  CUresult r = cu->cuInit(0);
  if (r != CUDA_SUCCESS) {
    absl::Status s = cu->Check(r, "cuInit");
    delete cu;
    return absl::FailedPreconditionError(absl::StrCat("the CUDA driver is present but unusable: ", s.message()));
  }
  cu->cuDriverGetVersion(&cu->version);
  cu->cuDeviceGetCount(&cu->device_count);
  return cu;
}

}  // namespace

absl::StatusOr<const CudaDriver*> CudaDriver::Load() {
  static absl::once_flag once;
  static absl::StatusOr<const CudaDriver*>* loaded = nullptr;
  absl::call_once(once, [] { loaded = new absl::StatusOr<const CudaDriver*>(LoadOnce()); });
  return *loaded;
}

absl::Status CudaDriver::Check(CUresult r, absl::string_view what) const {
  if (r == CUDA_SUCCESS) return absl::OkStatus();
  const char* name = "CUDA_ERROR_UNKNOWN";
  const char* text = "unknown error";
  if (cuGetErrorName != nullptr) cuGetErrorName(r, &name);
  if (cuGetErrorString != nullptr) cuGetErrorString(r, &text);
  std::string msg = absl::StrCat(what, " failed: ", name, " (", text, ")");
  switch (r) {
    case CUDA_ERROR_OUT_OF_MEMORY:
      return absl::ResourceExhaustedError(msg);
    case CUDA_ERROR_INVALID_VALUE:
    case CUDA_ERROR_INVALID_HANDLE:
    case CUDA_ERROR_INVALID_DEVICE:
    case CUDA_ERROR_NOT_FOUND:
    case CUDA_ERROR_ALREADY_MAPPED:
      return absl::InvalidArgumentError(msg);
    case CUDA_ERROR_NOT_SUPPORTED:
    case CUDA_ERROR_NOT_PERMITTED:
      return absl::FailedPreconditionError(msg);
    default:
      return absl::InternalError(msg);
  }
}

absl::Status UseDevice(const CudaDriver& cu, int device) {
  if (device < 0 || device >= cu.device_count) {
    return absl::InvalidArgumentError(
        absl::StrCat("device ", device, " does not exist: this node has ", cu.device_count, " CUDA devices"));
  }
  static absl::Mutex mu;
  static std::vector<CUcontext>* contexts = new std::vector<CUcontext>();
  CUcontext ctx = nullptr;
  {
    absl::MutexLock lock(&mu);
    if (contexts->empty()) contexts->resize(cu.device_count, nullptr);
    if ((*contexts)[device] == nullptr) {
      CUdevice dev;
      FERRY_RETURN_IF_CU_ERROR(&cu, cu.cuDeviceGet(&dev, device), "cuDeviceGet");
      FERRY_RETURN_IF_CU_ERROR(&cu, cu.cuDevicePrimaryCtxRetain(&(*contexts)[device], dev), "cuDevicePrimaryCtxRetain");
    }
    ctx = (*contexts)[device];
  }
  return cu.Check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
}

absl::StatusOr<int> EnablePeerAccess(const CudaDriver& cu, int device) {
  std::vector<CUcontext> peers;
  for (int d = 0; d < cu.device_count; ++d) {
    if (d == device) continue;
    int can = 0;
    if (cu.cuDeviceCanAccessPeer(&can, device, d) != CUDA_SUCCESS || !can) continue;
    absl::Status use = UseDevice(cu, d);  // retains the peer's primary context
    if (!use.ok()) return use;
    CUcontext ctx = nullptr;
    FERRY_RETURN_IF_CU_ERROR(&cu, cu.cuCtxGetCurrent(&ctx), "cuCtxGetCurrent");
    peers.push_back(ctx);
  }
  absl::Status use = UseDevice(cu, device);
  if (!use.ok()) return use;
  for (CUcontext peer : peers) {
    CUresult r = cu.cuCtxEnablePeerAccess(peer, 0);
    if (r != CUDA_SUCCESS && r != CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) {
      return cu.Check(r, "cuCtxEnablePeerAccess");
    }
  }
  return static_cast<int>(peers.size());
}

}  // namespace ferry
