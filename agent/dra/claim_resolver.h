// ResolveClaimedDevices: which devices the scheduler gave a pod's DRA claims, with the
// attributes their drivers published: what the agent needs to know about its claimed
// NICs, from the objects the scheduler itself allocated them by.
//
//   std::unique_ptr<KubeApi> api = NewHttpsKubeApi(*InClusterEndpoint());
//   absl::StatusOr<v1::ClaimedDevices> claimed =
//       ResolveClaimedDevices(*api, {"ferry", "ferry-x7k2p", {"nics"}});   // namespace, pod, claims
//
// Three reads: the pod (which ResourceClaim each of its claims became, and its node), each
// ResourceClaim (status.allocation: driver, pool, device per result), and the node's
// ResourceSlices (each device's attributes). Attribute names come back qualified: an
// unqualified name in a slice ("ifName") is in its driver's domain ("dra.net/ifName").
// Errors say what to change: a claim the pod does not have, one not allocated yet, a
// device no slice publishes, an API the service account may not read.
#ifndef FERRY_AGENT_DRA_CLAIM_RESOLVER_H_
#define FERRY_AGENT_DRA_CLAIM_RESOLVER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/dra/kube_api.h"
#include "proto/ferry/v1/dra.pb.h"

namespace ferry {

struct ClaimQuery {
  std::string namespace_;
  std::string pod;
  std::vector<std::string> claims;  // the pod spec's resourceClaims[].name; none: all
};

absl::StatusOr<v1::ClaimedDevices> ResolveClaimedDevices(KubeApi& api, const ClaimQuery& query);

}  // namespace ferry

#endif  // FERRY_AGENT_DRA_CLAIM_RESOLVER_H_
