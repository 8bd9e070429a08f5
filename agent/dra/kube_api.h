// KubeApi: the few reads of the Kubernetes API that ferry makes, behind an interface.
//
//   absl::StatusOr<std::unique_ptr<KubeApi>> api = InClusterKubeApi();   // in a pod
//   absl::StatusOr<std::string> json = (*api)->Get("/api/v1/namespaces/ferry/pods/ferry-abcde");
//
// Only the agent pod's init container uses it (`ferryctl claimed-devices`): the agent
// itself never holds an API token. Get returns the body of a 200 response; any other
// status becomes an error carrying the HTTP code and the API server's own message
// (NOT_FOUND for 404, PERMISSION_DENIED for 401/403, UNAVAILABLE when unreachable).
#ifndef FERRY_AGENT_DRA_KUBE_API_H_
#define FERRY_AGENT_DRA_KUBE_API_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace ferry {

class KubeApi {
 public:
  virtual ~KubeApi() = default;
  // `path` starts with '/' and may carry a query ("?fieldSelector=...", already escaped).
  virtual absl::StatusOr<std::string> Get(const std::string& path) = 0;
};

// Where and how to reach the API server.
struct KubeApiEndpoint {
  std::string host;  // an IP address or a DNS name
  int port = 443;
  std::string token;       // bearer token
  std::string ca_file;     // PEM bundle the server's certificate must chain to
  int timeout_ms = 10000;  // per request: connect, TLS handshake, response
};

// The pod's own view, as every in-cluster client reads it: KUBERNETES_SERVICE_HOST and
// _PORT, and the service account token and CA under `service_account_dir`
// (normally /var/run/secrets/kubernetes.io/serviceaccount). Errors name what is missing.
absl::StatusOr<KubeApiEndpoint> InClusterEndpoint(
    const std::string& service_account_dir = "/var/run/secrets/kubernetes.io/serviceaccount");

// HTTPS with the server's certificate verified against `ca_file` and its name (or IP).
std::unique_ptr<KubeApi> NewHttpsKubeApi(KubeApiEndpoint endpoint);

}  // namespace ferry

#endif  // FERRY_AGENT_DRA_KUBE_API_H_
