// QosPolicy: which traffic classes and what share of the NICs each pod gets, from the
// agent's --qos_* flags; the agent refuses to start on a policy that does not parse.
//
//   absl::StatusOr<QosPolicy> policy = ParseQosPolicy(flags);  // errors name flag and field
//   const TenantRule& rule = policy->Match(creds.uid, creds.gid);
//   absl::StatusOr<TrafficClass> c = ResolveClass(rule, request.traffic_class());
//
// --qos_tenants is a list of rules separated by ';', each a list of key=value fields
// separated by ',' (the first rule that matches a pod wins; --qos_default_tenant, the
// same fields without uid/gid, covers every other pod):
//   uid=N | gid=N        which pods (SO_PEERCRED of their session connection)
//   ceiling=CLASS        the highest class they may ask for (latency > bulk > background)
//   class=CLASS          what they get when they ask for none
//   weight=N             their share against other pods of the same class (1..1000)
//   inflight=BYTES       most bytes of theirs posted at once per NIC (>= one op)
//   rate=BYTES           most bytes per second per NIC
// BYTES takes a suffix: KiB, MiB, GiB (or KB, MB, GB in powers of ten).
// e.g. --qos_tenants='uid=1000,ceiling=latency,class=latency,weight=4;gid=2000,ceiling=bulk,rate=2GB'
#ifndef FERRY_AGENT_QOS_QOS_POLICY_H_
#define FERRY_AGENT_QOS_QOS_POLICY_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "agent/qos/traffic_class.h"
#include "proto/ferry/v1/ferry.pb.h"

namespace ferry {

struct TenantRule {
  std::string name = "default";  // how status and errors name it: "uid=1000", "gid=2000"
  enum class Match { kAny, kUid, kGid };
  Match match = Match::kAny;
  uint32_t id = 0;
  TrafficClass ceiling = TrafficClass::kLatency;
  TrafficClass default_class = TrafficClass::kBulk;
  uint32_t weight = 1;
  uint64_t inflight_cap = 0;  // 0: none
  uint64_t rate_cap = 0;      // bytes per second; 0: none
};

// How each NIC worker orders ops (agent/engine/op_scheduler.h). The defaults here are
// those of ferryd's --qos, --qos_class_weights and --qos_*window_bytes flags.
struct QosScheduling {
  // False (--qos=false): every NIC worker posts each peer's ops first in, first out,
  // as ferry did before traffic classes; classes are still checked against ceilings and
  // counted in the metrics and status.
  bool enabled = true;
  // Shares between classes while each has a backlog (the latency class is also served
  // first): latency, bulk, background.
  uint32_t class_weights[kTrafficClasses] = {8, 4, 1};
  // The other classes keep at most this many bytes posted per NIC (plus the op that
  // crosses it); beyond, ops wait in the NIC worker's queues, ordered by class and weight.
  uint64_t window_bytes = 16 << 20;
  // The same while latency-class writes are about: what a latency write may find ahead
  // of it in the provider's queue.
  uint64_t latency_window_bytes = 2 << 20;
};

struct QosPolicy {
  QosScheduling scheduling;
  std::vector<TenantRule> rules;
  TenantRule fallback;

  const TenantRule& Match(uid_t uid, gid_t gid) const;
};

struct QosFlags {
  bool enabled = QosScheduling().enabled;
  std::string tenants;         // --qos_tenants
  std::string default_tenant;  // --qos_default_tenant
  std::string class_weights;   // --qos_class_weights; empty: QosScheduling's
  uint64_t window_bytes = QosScheduling().window_bytes;
  uint64_t latency_window_bytes = QosScheduling().latency_window_bytes;
  uint64_t max_op_bytes = 1 << 20;  // --fabric_max_op_bytes: no cap may be smaller
};

absl::StatusOr<QosPolicy> ParseQosPolicy(const QosFlags& flags);

// The class a write runs in: `asked`, or the rule's default when unspecified.
// PERMISSION_DENIED above the rule's ceiling, INVALID_ARGUMENT for an unknown value.
absl::StatusOr<TrafficClass> ResolveClass(const TenantRule& rule, v1::TrafficClass asked);

// "latency=8,bulk=4,background=1", as --qos_class_weights takes them.
std::string FormatClassWeights(const QosScheduling& scheduling);

// "64MiB", "2GB", "4096": bytes. False on anything else (or overflow).
bool ParseBytes(absl::string_view text, uint64_t* out);

}  // namespace ferry

#endif  // FERRY_AGENT_QOS_QOS_POLICY_H_
