#include "agent/dra/claim_resolver.h"

#include <algorithm>
#include <map>
#include <tuple>

#include <google/protobuf/util/json_util.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agent/common/status_macros.h"

namespace ferry {
namespace {

template <typename Message>
absl::StatusOr<Message> GetObject(KubeApi& api, const std::string& path, absl::string_view what) {
  FERRY_ASSIGN_OR_RETURN(std::string json, api.Get(path));
  Message m;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  const auto parsed = google::protobuf::util::JsonStringToMessage(json, &m, options);
  if (!parsed.ok()) {
    return absl::InternalError(absl::StrCat("the API server's ", what, " did not parse: ", parsed.ToString()));
  }
  return m;
}

// Kubernetes names are DNS labels or subdomains: nothing to escape in a path, but a
// name with anything else must not reach a URL.
absl::Status CheckName(absl::string_view what, absl::string_view name) {
  const bool ok = !name.empty() && name.size() <= 253 && std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.';
  });
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, " '", name, "' is not a Kubernetes object name"));
}

}  // namespace

absl::StatusOr<v1::ClaimedDevices> ResolveClaimedDevices(KubeApi& api, const ClaimQuery& query) {
  FERRY_RETURN_IF_ERROR(CheckName("namespace", query.namespace_));
  FERRY_RETURN_IF_ERROR(CheckName("pod", query.pod));
  FERRY_ASSIGN_OR_RETURN(
      v1::Pod pod,
      GetObject<v1::Pod>(api, absl::StrCat("/api/v1/namespaces/", query.namespace_, "/pods/", query.pod), "pod"));
  const std::string& node = pod.spec().node_name();
  FERRY_RETURN_IF_ERROR(CheckName("the pod's node", node));

  // The pod's claims, by the names its spec gives them.
  std::vector<std::pair<std::string, std::string>> claims;  // (pod's name, ResourceClaim)
  std::vector<std::string> known;
  for (const v1::Pod::ResourceClaimStatus& s : pod.status().resource_claim_statuses()) {
    known.push_back(s.name());
    const bool wanted =
        query.claims.empty() || std::find(query.claims.begin(), query.claims.end(), s.name()) != query.claims.end();
    if (wanted && !s.resource_claim_name().empty()) claims.emplace_back(s.name(), s.resource_claim_name());
  }
  for (const std::string& name : query.claims) {
    if (std::none_of(claims.begin(), claims.end(), [&](const auto& c) { return c.first == name; })) {
      return absl::FailedPreconditionError(
          absl::StrCat("pod ", query.namespace_, "/", query.pod, " has no allocated resource claim '", name,
                       "' (its claims: ", known.empty() ? "none" : absl::StrJoin(known, ", "),
                       "): the pod spec's resourceClaims must name it (the chart does when dra.enabled is set)"));
    }
  }
  if (claims.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("pod ", query.namespace_, "/", query.pod, " has no resource claims"));
  }

  // The node's slices, indexed by (driver, pool, device).
  FERRY_ASSIGN_OR_RETURN(
      v1::ResourceSliceList slices,
      GetObject<v1::ResourceSliceList>(
          api, absl::StrCat("/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName%3D", node),
          "ResourceSlice list"));
  std::map<std::tuple<std::string, std::string, std::string>, const v1::ResourceSlice::Device*> published;
  for (const v1::ResourceSlice& slice : slices.items()) {
    for (const v1::ResourceSlice::Device& d : slice.spec().devices()) {
      published[{slice.spec().driver(), slice.spec().pool().name(), d.name()}] = &d;
    }
  }

  v1::ClaimedDevices out;
  out.set_pod(absl::StrCat(query.namespace_, "/", query.pod));
  out.set_node(node);
  for (const auto& [name, claim_name] : claims) {
    FERRY_RETURN_IF_ERROR(CheckName("resource claim", claim_name));
    FERRY_ASSIGN_OR_RETURN(
        v1::ResourceClaim claim,
        GetObject<v1::ResourceClaim>(
            api, absl::StrCat("/apis/resource.k8s.io/v1/namespaces/", query.namespace_, "/resourceclaims/", claim_name),
            "ResourceClaim"));
    const auto& results = claim.status().allocation().devices().results();
    if (results.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("resource claim ", claim_name, " (the pod's '", name, "') has no allocated devices"));
    }
    for (const v1::ResourceClaim::DeviceRequestAllocationResult& r : results) {
      auto it = published.find({r.driver(), r.pool(), r.device()});
      if (it == published.end()) {
        return absl::FailedPreconditionError(absl::StrCat("claimed device ", r.driver(), "/", r.pool(), "/", r.device(),
                                                          " is in no ResourceSlice of node ", node));
      }
      v1::ClaimedDevice* d = out.add_devices();
      d->set_claim(name);
      d->set_request(r.request());
      d->set_driver(r.driver());
      d->set_pool(r.pool());
      d->set_device(r.device());
      for (const auto& [key, value] : it->second->attributes()) {
        const std::string qualified = key.find('/') == std::string::npos ? absl::StrCat(r.driver(), "/", key) : key;
        (*d->mutable_attributes())[qualified] = value;
      }
    }
  }
  return out;
}

}  // namespace ferry
