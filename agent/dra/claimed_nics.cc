#include "agent/dra/claimed_nics.h"

#include <fstream>
#include <sstream>

#include <google/protobuf/util/json_util.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ferry {
namespace {

// The attribute `name` of `d` in the first of `domains` that has it (the device's own
// driver is always tried last).
const v1::DeviceAttribute* Find(const v1::ClaimedDevice& d, std::initializer_list<const char*> domains,
                                const char* name) {
  for (const char* domain : domains) {
    auto it = d.attributes().find(absl::StrCat(domain, "/", name));
    if (it != d.attributes().end()) return &it->second;
  }
  auto it = d.attributes().find(absl::StrCat(d.driver(), "/", name));
  return it == d.attributes().end() ? nullptr : &it->second;
}

std::string StringOf(const v1::DeviceAttribute* a) {
  return a != nullptr && a->value_case() == v1::DeviceAttribute::kStringValue ? a->string_value() : "";
}

int IntOf(const v1::DeviceAttribute* a) {
  return a != nullptr && a->value_case() == v1::DeviceAttribute::kIntValue && a->int_value() >= 0 &&
                 a->int_value() < (1 << 16)
             ? static_cast<int>(a->int_value())
             : -1;
}

std::string Where(const v1::ClaimedDevice& d) { return absl::StrCat(d.driver(), "/", d.pool(), "/", d.device()); }

}  // namespace

absl::StatusOr<v1::ClaimedDevices> ReadClaimedDevices(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("--claimed_devices: cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  v1::ClaimedDevices claimed;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  const auto parsed = google::protobuf::util::JsonStringToMessage(text.str(), &claimed, options);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--claimed_devices: ", path, " is not a claimed-devices file: ", parsed.ToString()));
  }
  return claimed;
}

absl::StatusOr<std::vector<NicDevice>> ClaimedNics(const v1::ClaimedDevices& claimed) {
  std::vector<NicDevice> nics;
  std::vector<std::string> others;
  for (const v1::ClaimedDevice& d : claimed.devices()) {
    NicDevice nic;
    nic.netdev = StringOf(Find(d, {"dra.net"}, "ifName"));
    nic.rdma_device = StringOf(Find(d, {"dra.net"}, "rdmaDevice"));
    if (nic.netdev.empty() && nic.rdma_device.empty()) {
      others.push_back(Where(d));
      continue;
    }
    nic.name = nic.rdma_device.empty() ? nic.netdev : nic.rdma_device;
    nic.pci.address = StringOf(Find(d, {"dra.net"}, "pciAddress"));
    if (nic.pci.address.empty()) nic.pci.address = StringOf(Find(d, {"resource.kubernetes.io"}, "pciBusID"));
    nic.pci.pcie_root = StringOf(Find(d, {"resource.kubernetes.io"}, "pcieRoot"));
    nic.pci.numa_node = IntOf(Find(d, {"dra.net", "resource.kubernetes.io"}, "numaNode"));
    nic.claimed_device = Where(d);
    for (const NicDevice& seen : nics) {
      if (seen.name == nic.name) {
        return absl::InvalidArgumentError(absl::StrCat("claimed devices ", seen.claimed_device, " and ",
                                                       nic.claimed_device, " both name NIC '", nic.name, "'"));
      }
    }
    nics.push_back(std::move(nic));
  }
  if (nics.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the pod's claimed devices name no NIC (no dra.net/ifName or dra.net/rdmaDevice attribute; devices: ",
        others.empty() ? "none" : absl::StrJoin(others, ", "),
        "): the chart's dra.deviceClassName must select the node's RDMA NICs (mrdma.google.com on GKE, "
        "efa.networking.k8s.aws on EKS)"));
  }
  return nics;
}

std::vector<std::string> FabricNames(const std::vector<NicDevice>& nics) {
  std::vector<std::string> names;
  names.reserve(nics.size());
  for (const NicDevice& nic : nics) names.push_back(nic.netdev.empty() ? nic.rdma_device : nic.netdev);
  return names;
}

}  // namespace ferry
