#include "agent/staged/staging_table.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "agent/common/status_macros.h"
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

v1::StagingBuffer StagingTable::Describe(uint64_t id, const Region& memory) {
  v1::StagingBuffer out;
  out.set_id(id);
  out.set_size(memory.size());
  for (const NicRegistration& r : memory.nics()) {
    v1::RemoteKey* k = out.add_keys();
    k->set_key(r.key);
    k->set_base(r.remote_base);
  }
  return out;
}

std::vector<std::shared_ptr<Region>> StagingTable::PruneLocked(uint64_t region_id, const StagingInitiator& initiator,
                                                               uint64_t* found) {
  std::vector<std::shared_ptr<Region>> doomed;
  *found = 0;
  for (auto it = entries_.begin(); it != entries_.end();) {
    auto cur = it++;
    const Entry& e = cur->second;
    const bool mine = initiator.incarnation != 0 && e.target_id == region_id;
    if (mine && e.initiator.incarnation == initiator.incarnation) {
      *found = cur->first;
      continue;
    }
    const bool restarted = mine && !initiator.address.empty() && e.initiator.address == initiator.address;
    if (restarted || e.target.expired()) {
      doomed.push_back(std::move(cur->second.memory));
      entries_.erase(cur);
    }
  }
  return doomed;
}

void StagingTable::Counted(size_t n) const {
  if (options_.on_count) options_.on_count(n);
}

absl::StatusOr<v1::StagingBuffer> StagingTable::Open(const std::shared_ptr<Region>& region,
                                                     const StagingInitiator& initiator) {
  std::vector<std::shared_ptr<Region>> doomed;  // freed outside the lock
  std::optional<v1::StagingBuffer> out;
  size_t count = 0;
  {
    absl::MutexLock lock(&mu_);
    uint64_t found = 0;
    doomed = PruneLocked(region->id(), initiator, &found);
    // This initiator opened the region before (its cache forgot it after a failed
    // commit): the same buffer, or it would hold two.
    if (found != 0) out = Describe(found, *entries_[found].memory);
    count = entries_.size();
  }
  doomed.clear();
  Counted(count);
  if (out.has_value()) return *std::move(out);
  if (count >= options_.max_buffers) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the target agent has ", count, " staging buffers in use (--max_staging_buffers)"));
  }
  const uint64_t size = std::min(options_.buffer_bytes, region->size());
  absl::StatusOr<std::shared_ptr<Region>> memory = AllocateStagingRegion(size, cu_, registrar_);
  if (!memory.ok()) return memory.status();
  {
    absl::MutexLock lock(&mu_);
    uint64_t found = 0;
    doomed = PruneLocked(region->id(), initiator, &found);
    if (found != 0) {
      // A concurrent Open from the same initiator won the race: share its buffer.
      out = Describe(found, *entries_[found].memory);
      doomed.push_back(std::move(*memory));
    } else {
      const uint64_t id = next_id_++;
      out = Describe(id, **memory);
      entries_[id] = Entry{std::move(*memory), region, region->id(), initiator};
    }
    count = entries_.size();
  }
  doomed.clear();
  Counted(count);
  return *std::move(out);
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
    // A writer whose write into the region was declared lost commits no more of it.
    if (it->second.initiator.incarnation != 0) {
      FERRY_RETURN_IF_ERROR(region->writers().Admit(it->second.initiator.incarnation));
    }
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
