#include "proto/ferry/wire/ring_shape.h"

#include "absl/strings/str_cat.h"
#include "proto/ferry/wire/ring_layout.h"

namespace ferry::queue {

absl::Status CheckRingShape(uint32_t entries, uint32_t table_ids) {
  if (!ValidEntries(entries)) {
    return absl::InvalidArgumentError(
        absl::StrCat("entries must be a power of two in [", kMinEntries, ", ", kMaxEntries, "], got ", entries));
  }
  if (table_ids > kMaxTableIds) {
    return absl::InvalidArgumentError(absl::StrCat("table_ids must be at most ", kMaxTableIds, ", got ", table_ids));
  }
  return absl::OkStatus();
}

}  // namespace ferry::queue
