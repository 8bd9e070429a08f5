#include "agent/staged/staging_table.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "agent/staged/staging_memory.h"

namespace ferry {

bool StagingTable::NeedsStaging(const Region& region) const {
  // GPU memory the NICs could not register (no FI_HMEM).
  return region.nics().empty() || options_.stage_host_regions;
}

size_t StagingTable::buffers() const {
  absl::MutexLock lock(&mu_);
  return entries_.size();
}

absl::StatusOr<v1::StagingBuffer> StagingTable::Open(const std::shared_ptr<Region>& region) {
  {
    // Make room: drop buffers whose region is gone.
    absl::MutexLock lock(&mu_);
    for (auto it = entries_.begin(); it != entries_.end();) {
      auto cur = it++;
      if (cur->second.target.expired()) entries_.erase(cur);
    }
    if (entries_.size() >= options_.max_buffers) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the target agent has ", entries_.size(), " staging buffers in use (--max_staging_buffers)"));
    }
  }
  const uint64_t size = std::min(options_.buffer_bytes, region->size());
  absl::StatusOr<std::shared_ptr<Region>> memory = AllocateStagingRegion(size, cu_, registrar_);
  if (!memory.ok()) return memory.status();
  v1::StagingBuffer out;
  out.set_size((*memory)->size());
  for (const NicRegistration& r : (*memory)->nics()) {
    v1::RemoteKey* k = out.add_keys();
    k->set_key(r.key);
    k->set_base(r.remote_base);
  }
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_id_++;
  entries_[id] = Entry{std::move(*memory), region, region->id()};
  out.set_id(id);
  return out;
}

absl::Status StagingTable::Commit(const std::shared_ptr<Region>& region, uint64_t staging_id,
                                  const google::protobuf::RepeatedPtrField<v1::Chunk>& chunks) {
  std::shared_ptr<Region> memory;
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(staging_id);
    if (it == entries_.end() || it->second.target_id != region->id()) {
      return absl::NotFoundError(absl::StrCat("staging buffer ", staging_id, " is not open for region ", region->id(),
                                              "; open the region again"));
    }
    memory = it->second.memory;
  }
  // The request comes from a peer: check every chunk against both sides.
  std::vector<CopyChunk> plan;
  plan.reserve(chunks.size());
  for (int i = 0; i < chunks.size(); ++i) {
    const v1::Chunk& c = chunks[i];
    if (c.length() == 0 || c.src_offset() > memory->size() || c.length() > memory->size() - c.src_offset() ||
        c.dst_offset() > region->size() || c.length() > region->size() - c.dst_offset()) {
      return absl::OutOfRangeError(absl::StrCat("staged chunk ", i, " is outside the staging buffer (", memory->size(),
                                                " bytes) or the region (", region->size(), " bytes)"));
    }
    plan.push_back({c.src_offset(), c.dst_offset(), c.length()});
  }
  return copier_->ToRegion(*region, memory->data(), plan);
}

}  // namespace ferry
