// The one check of a write queue's shape (ring_layout.h), made by the client library
// before it builds a queue and by the agent before it maps one, so that both refuse the
// same shapes with the same words.
//
//   FERRY_RETURN_IF_ERROR(queue::CheckRingShape(entries, table_ids));
#ifndef FERRY_PROTO_FERRY_WIRE_RING_SHAPE_H_
#define FERRY_PROTO_FERRY_WIRE_RING_SHAPE_H_

#include <cstdint>

#include "absl/status/status.h"

namespace ferry::queue {

// INVALID_ARGUMENT naming `entries` (a power of two in [kMinEntries, kMaxEntries]) or
// `table_ids` (at most kMaxTableIds); OK otherwise.
absl::Status CheckRingShape(uint32_t entries, uint32_t table_ids);

}  // namespace ferry::queue

#endif  // FERRY_PROTO_FERRY_WIRE_RING_SHAPE_H_
