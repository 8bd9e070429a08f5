// ImportCache: one import per CUDA allocation, shared by every region on it.
//
//   ImportCache<CudaImport> cache;
//   absl::StatusOr<std::shared_ptr<CudaImport>> imp =
//       cache.GetOrImport(key, [&] { return ImportIpcHandle(cu, handle, device); });
//
// A pod commonly registers many regions (KV blocks, layers) inside one allocation. The
// driver import (cuIpcOpenMemHandle, cuMemImportFromShareableHandle + map) is done once
// per key; later registrations share it. The cache holds only weak references, so an
// import is released when the last region using it goes, and a later registration of
// the same key imports afresh.
#ifndef FERRY_AGENT_CUDA_IMPORT_CACHE_H_
#define FERRY_AGENT_CUDA_IMPORT_CACHE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace ferry {

template <typename Import>
class ImportCache {
 public:
  using Importer = absl::FunctionRef<absl::StatusOr<std::shared_ptr<Import>>()>;

  // Returns the live import for `key`, or runs `import` and remembers its result. A
  // failed import is not cached. Imports are serialized: two registrations of one new
  // allocation never import it twice.
  absl::StatusOr<std::shared_ptr<Import>> GetOrImport(const std::string& key, Importer import, bool* hit = nullptr) {
    absl::MutexLock lock(&mu_);
    if (hit != nullptr) *hit = false;
    auto it = imports_.find(key);
    if (it != imports_.end()) {
      if (std::shared_ptr<Import> live = it->second.lock()) {
        if (hit != nullptr) *hit = true;
        return live;
      }
      imports_.erase(it);
    }
    absl::StatusOr<std::shared_ptr<Import>> fresh = import();
    if (!fresh.ok()) return fresh.status();
    imports_[key] = *fresh;
    SweepLocked();
    return fresh;
  }

  // Like GetOrImport, for imports with no stable key: the first live import for which
  // `match` holds is reused (e.g. one mapping the same open file, found with kcmp).
  absl::StatusOr<std::shared_ptr<Import>> MatchOrImport(absl::FunctionRef<bool(const Import&)> match, Importer import,
                                                        bool* hit = nullptr) {
    absl::MutexLock lock(&mu_);
    if (hit != nullptr) *hit = false;
    for (const auto& [key, weak] : imports_) {
      std::shared_ptr<Import> live = weak.lock();
      if (live != nullptr && match(*live)) {
        if (hit != nullptr) *hit = true;
        return live;
      }
    }
    absl::StatusOr<std::shared_ptr<Import>> fresh = import();
    if (!fresh.ok()) return fresh.status();
    imports_[absl::StrCat("#", ++unkeyed_)] = *fresh;
    SweepLocked();
    return fresh;
  }

  // Imports still referenced by some region.
  size_t live() const {
    absl::MutexLock lock(&mu_);
    size_t n = 0;
    for (const auto& [key, weak] : imports_) n += weak.expired() ? 0 : 1;
    return n;
  }

 private:
  // Forgets released imports once they outnumber the live ones, so the map stays
  // proportional to what is registered (amortized O(1) per import).
  void SweepLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (imports_.size() < 2 * sweep_floor_) return;
    for (auto it = imports_.begin(); it != imports_.end();) {
      auto cur = it++;
      if (cur->second.expired()) imports_.erase(cur);
    }
    sweep_floor_ = std::max<size_t>(16, imports_.size());
  }

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::weak_ptr<Import>> imports_ ABSL_GUARDED_BY(mu_);
  size_t sweep_floor_ ABSL_GUARDED_BY(mu_) = 16;
  uint64_t unkeyed_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ferry

#endif  // FERRY_AGENT_CUDA_IMPORT_CACHE_H_
