#include "agent/staged/staging_memory.h"

#include <sys/mman.h>

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"
#include "agent/memory/retired_memory.h"

namespace ferry {
namespace {

class StagingBacking : public MemoryBacking {
 public:
  StagingBacking(const CudaDriver* cu, void* data, uint64_t size) : cu_(cu), data_(data), size_(size) {}
  // A peer may still be writing into the buffer (see retired_memory.h): it is the
  // agent's own memory, so it simply stays allocated until the grace has passed.
  ~StagingBacking() override {
    RetiredMemory::Global().Add([cu = cu_, data = data_, size = size_] {
      if (cu != nullptr) {
        (void)UseDevice(*cu, 0);  // the sweep may run on any thread; the buffer is device 0's
        cu->cuMemFreeHost(data);
      } else {
        munmap(data, size);
      }
    });
  }
  MemoryKind kind() const override { return MemoryKind::kHost; }
  void* data() const override { return data_; }
  uint64_t size() const override { return size_; }

 private:
  const CudaDriver* cu_;  // null: mmap'd
  void* data_;
  uint64_t size_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<Region>> AllocateStagingRegion(uint64_t size, const CudaDriver* cu,
                                                              RegionRegistrar* registrar) {
  size = (size + 4095) & ~uint64_t{4095};
  std::unique_ptr<MemoryBacking> backing;
  if (cu != nullptr) {
    FERRY_RETURN_IF_ERROR(UseDevice(*cu, 0));
    void* p = nullptr;
    FERRY_RETURN_IF_CU_ERROR(cu, cu->cuMemHostAlloc(&p, size, CU_MEMHOSTALLOC_PORTABLE), "staging: cuMemHostAlloc");
    backing = std::make_unique<StagingBacking>(cu, p, size);
  } else {
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return absl::ResourceExhaustedError(absl::StrCat("staging: cannot map ", size, " bytes"));
    backing = std::make_unique<StagingBacking>(nullptr, p, size);
  }
  auto region = std::make_shared<Region>(/*id=*/0, /*owner_session=*/0, Token::Random(), std::move(backing));
  FERRY_ASSIGN_OR_RETURN(RegionRegistration reg, registrar->Register(region->backing()));
  region->set_registration(std::move(reg));
  return region;
}

}  // namespace ferry
