// Traffic classes and what a pod's transfers carry of its share of the NICs.
//
// A NIC worker (agent/engine/op_scheduler.h) posts latency-class ops first, then shares
// the rest between pods and classes by weight. Each transfer's TenantShare travels on its
// TransferState, so the worker reads it per op without a lookup.
#ifndef FERRY_AGENT_QOS_TRAFFIC_CLASS_H_
#define FERRY_AGENT_QOS_TRAFFIC_CLASS_H_

#include <cstdint>

#include "absl/strings/string_view.h"
#include "proto/ferry/v1/ferry.pb.h"

namespace ferry {

// In priority order: a lower value is served first. Values index per-class arrays.
enum class TrafficClass : uint8_t { kLatency = 0, kBulk = 1, kBackground = 2 };
inline constexpr int kTrafficClasses = 3;

inline int ClassIndex(TrafficClass c) { return static_cast<int>(c); }
const char* ClassName(TrafficClass c);  // "latency", "bulk", "background"
// By name as ClassName writes it; false for anything else.
bool ParseClassName(absl::string_view name, TrafficClass* out);
// TRAFFIC_CLASS_UNSPECIFIED is the caller's to resolve; false for it and unknown values.
bool FromProto(v1::TrafficClass proto, TrafficClass* out);
v1::TrafficClass ToProto(TrafficClass c);

// What one pod (a session) gets, from the --qos_tenants rule that matched it.
struct TenantShare {
  uint64_t tenant = 0;  // the session's id; 0 for the agent's own traffic
  TrafficClass traffic_class = TrafficClass::kBulk;
  uint32_t weight = 1;
  uint64_t inflight_cap = 0;  // bytes posted at once per NIC; 0: no cap
  uint64_t rate_cap = 0;      // bytes per second per NIC; 0: no cap
};

}  // namespace ferry

#endif  // FERRY_AGENT_QOS_TRAFFIC_CLASS_H_
