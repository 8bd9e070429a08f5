// The agent's DRA claim, read as one component: ResolveClaimedDevices against a KubeApi
// that answers with the JSON an API server sends (GKE DRANet's attribute names, the
// shapes of resource.k8s.io/v1), and ClaimedNics turning the result into the topology's
// NICs. The HTTPS client and the chart's init container run against a real API server
// and kubelet in tools/k8s/node_e2e.sh.
#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>

#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/message_differencer.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "agent/dra/claim_resolver.h"
#include "agent/dra/claimed_nics.h"

namespace ferry {
namespace {

class FakeKubeApi : public KubeApi {
 public:
  absl::StatusOr<std::string> Get(const std::string& path) override {
    gets.push_back(path);
    auto it = objects.find(path);
    if (it == objects.end()) return absl::NotFoundError(absl::StrCat("GET ", path, ": HTTP 404: not found"));
    return it->second;
  }
  std::map<std::string, std::string> objects;
  std::vector<std::string> gets;
};

constexpr char kPodPath[] = "/api/v1/namespaces/ferry/pods/ferry-x7k2p";
constexpr char kClaimPath[] = "/apis/resource.k8s.io/v1/namespaces/ferry/resourceclaims/ferry-x7k2p-nics-5kq8d";
constexpr char kSlicesPath[] = "/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName%3Dnode-a";

// As the API server writes them, fields ferry ignores included.
FakeKubeApi Cluster() {
  FakeKubeApi api;
  api.objects[kPodPath] = R"({"kind": "Pod", "apiVersion": "v1",
    "metadata": {"name": "ferry-x7k2p", "namespace": "ferry", "uid": "u1", "labels": {"app": "ferry"}},
    "spec": {"nodeName": "node-a", "hostNetwork": false, "containers": [{"name": "ferryd"}]},
    "status": {"phase": "Pending", "resourceClaimStatuses": [
      {"name": "nics", "resourceClaimName": "ferry-x7k2p-nics-5kq8d"}]}})";
  api.objects[kClaimPath] = R"({"kind": "ResourceClaim", "metadata": {"name": "ferry-x7k2p-nics-5kq8d"},
    "status": {"allocation": {"devices": {"results": [
      {"request": "nics", "driver": "dra.net", "pool": "node-a", "device": "pci-0000-cd-00-0"},
      {"request": "nics", "driver": "dra.net", "pool": "node-a", "device": "pci-0000-91-00-0"}]},
      "nodeSelector": {"nodeSelectorTerms": []}}, "reservedFor": [{"resource": "pods", "name": "ferry-x7k2p"}]}})";
  api.objects[kSlicesPath] = R"({"kind": "ResourceSliceList", "items": [
    {"metadata": {"name": "node-a-dra.net-abcde"}, "spec": {"driver": "dra.net", "nodeName": "node-a",
     "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1}, "devices": [
      {"name": "pci-0000-91-00-0", "attributes": {
        "dra.net/ifName": {"string": "gpu0rdma0"}, "dra.net/numaNode": {"int": 0}, "dra.net/rdma": {"bool": true},
        "dra.net/rdmaDevice": {"string": "mlx5_0"}, "dra.net/pciAddress": {"string": "0000:91:00.0"},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:8c"}}},
      {"name": "pci-0000-cd-00-0", "attributes": {
        "ifName": {"string": "gpu6rdma0"}, "numaNode": {"int": 1}, "rdma": {"bool": true},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:c8"}}},
      {"name": "pci-0000-05-00-0", "attributes": {"dra.net/ifName": {"string": "eth0"}}}]}},
    {"metadata": {"name": "node-a-gpu"}, "spec": {"driver": "gpu.nvidia.com", "nodeName": "node-a",
     "pool": {"name": "node-a"}, "devices": [{"name": "gpu-0", "attributes": {
        "type": {"string": "gpu"}, "driverVersion": {"version": "580.126.20"}}}]}}]})";
  return api;
}

TEST_CASE("a pod's claim resolves to its devices with their published attributes", "[dra]") {
  FakeKubeApi api = Cluster();
  absl::StatusOr<v1::ClaimedDevices> claimed = ResolveClaimedDevices(api, {"ferry", "ferry-x7k2p", {"nics"}});
  REQUIRE(claimed.ok());
  CHECK(claimed->pod() == "ferry/ferry-x7k2p");
  CHECK(claimed->node() == "node-a");
  REQUIRE(claimed->devices_size() == 2);
  const v1::ClaimedDevice& first = claimed->devices(0);  // the claim's order, not the slice's
  CHECK(first.device() == "pci-0000-cd-00-0");
  CHECK(first.claim() == "nics");
  CHECK(first.request() == "nics");
  // Unqualified names are the driver's.
  CHECK(first.attributes().at("dra.net/ifName").string_value() == "gpu6rdma0");
  CHECK(first.attributes().at("dra.net/numaNode").int_value() == 1);
  CHECK(first.attributes().at("resource.kubernetes.io/pcieRoot").string_value() == "pci0000:c8");
  CHECK(api.gets == std::vector<std::string>{kPodPath, kSlicesPath, kClaimPath});

  absl::StatusOr<std::vector<NicDevice>> nics = ClaimedNics(*claimed);
  REQUIRE(nics.ok());
  REQUIRE(nics->size() == 2);
  CHECK((*nics)[0].name == "gpu6rdma0");
  CHECK((*nics)[0].netdev == "gpu6rdma0");
  CHECK((*nics)[0].pci.pcie_root == "pci0000:c8");
  CHECK((*nics)[0].pci.numa_node == 1);
  CHECK((*nics)[0].claimed_device == "dra.net/node-a/pci-0000-cd-00-0");
  CHECK((*nics)[1].name == "mlx5_0");
  CHECK((*nics)[1].rdma_device == "mlx5_0");
  CHECK((*nics)[1].pci.address == "0000:91:00.0");
  CHECK(FabricNames(*nics) == std::vector<std::string>{"gpu6rdma0", "gpu0rdma0"});

  // What the agent reads is what ferryctl wrote.
  const std::string path = "/tmp/ferry-claimed-devices-test.json";
  {
    std::string json;
    REQUIRE(google::protobuf::util::MessageToJsonString(*claimed, &json).ok());
    std::ofstream(path) << json;
  }
  absl::StatusOr<v1::ClaimedDevices> read = ReadClaimedDevices(path);
  std::remove(path.c_str());
  REQUIRE(read.ok());
  CHECK(google::protobuf::util::MessageDifferencer::Equals(*read, *claimed));
}

TEST_CASE("an EFA device names its NIC by its RDMA device", "[dra]") {
  v1::ClaimedDevices claimed;
  v1::ClaimedDevice* d = claimed.add_devices();
  d->set_driver("efa.networking.k8s.aws");
  d->set_pool("node-b");
  d->set_device("efa-0");
  (*d->mutable_attributes())["efa.networking.k8s.aws/rdmaDevice"].set_string_value("rdmap16s27");
  (*d->mutable_attributes())["resource.kubernetes.io/numaNode"].set_int_value(0);
  absl::StatusOr<std::vector<NicDevice>> nics = ClaimedNics(claimed);
  REQUIRE(nics.ok());
  CHECK((*nics)[0].name == "rdmap16s27");
  CHECK((*nics)[0].netdev.empty());
  CHECK((*nics)[0].pci.numa_node == 0);
  CHECK(FabricNames(*nics) == std::vector<std::string>{"rdmap16s27"});
}

TEST_CASE("a claim that is not what the agent needs says what to change", "[dra]") {
  SECTION("the pod has no such claim") {
    FakeKubeApi api = Cluster();
    absl::Status s = ResolveClaimedDevices(api, {"ferry", "ferry-x7k2p", {"rdma"}}).status();
    CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
    CHECK(absl::StrContains(s.message(), "no allocated resource claim 'rdma' (its claims: nics)"));
  }
  SECTION("the claim is not allocated") {
    FakeKubeApi api = Cluster();
    api.objects[kClaimPath] = R"({"metadata": {"name": "ferry-x7k2p-nics-5kq8d"}, "status": {}})";
    absl::Status s = ResolveClaimedDevices(api, {"ferry", "ferry-x7k2p", {"nics"}}).status();
    CHECK(absl::StrContains(s.message(), "has no allocated devices"));
  }
  SECTION("a device no slice of the node publishes") {
    FakeKubeApi api = Cluster();
    api.objects[kSlicesPath] = R"({"items": []})";
    absl::Status s = ResolveClaimedDevices(api, {"ferry", "ferry-x7k2p", {"nics"}}).status();
    CHECK(absl::StrContains(s.message(), "dra.net/node-a/pci-0000-cd-00-0 is in no ResourceSlice of node node-a"));
  }
  SECTION("the API refuses the service account: its own status, unchanged") {
    FakeKubeApi api;
    absl::Status s = ResolveClaimedDevices(api, {"ferry", "ferry-x7k2p", {}}).status();
    CHECK(s.code() == absl::StatusCode::kNotFound);
  }
  SECTION("names that are not Kubernetes names never reach a URL") {
    FakeKubeApi api = Cluster();
    CHECK(ResolveClaimedDevices(api, {"ferry", "../../secrets", {}}).status().code() ==
          absl::StatusCode::kInvalidArgument);
    CHECK(api.gets.empty());
  }
  SECTION("devices that name no NIC") {
    v1::ClaimedDevices claimed;
    v1::ClaimedDevice* d = claimed.add_devices();
    d->set_driver("gpu.nvidia.com");
    d->set_pool("node-a");
    d->set_device("gpu-0");
    absl::Status s = ClaimedNics(claimed).status();
    CHECK(s.code() == absl::StatusCode::kFailedPrecondition);
    CHECK(absl::StrContains(s.message(), "name no NIC"));
    CHECK(absl::StrContains(s.message(), "gpu.nvidia.com/node-a/gpu-0"));
    CHECK(absl::StrContains(s.message(), "dra.deviceClassName"));
  }
  SECTION("two devices naming one NIC") {
    v1::ClaimedDevices claimed;
    for (const char* name : {"a", "b"}) {
      v1::ClaimedDevice* d = claimed.add_devices();
      d->set_driver("dra.net");
      d->set_device(name);
      (*d->mutable_attributes())["dra.net/ifName"].set_string_value("eth1");
    }
    CHECK(absl::StrContains(ClaimedNics(claimed).status().message(), "both name NIC 'eth1'"));
  }
  SECTION("a file that is not one") {
    const std::string path = "/tmp/ferry-claimed-devices-bad.json";
    std::ofstream(path) << "{\"devices\": 7}";
    absl::Status s = ReadClaimedDevices(path).status();
    std::remove(path.c_str());
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
    CHECK(absl::StrContains(s.message(), "is not a claimed-devices file"));
    CHECK(ReadClaimedDevices("/nonexistent/claimed.json").status().code() == absl::StatusCode::kNotFound);
  }
}

}  // namespace
}  // namespace ferry
