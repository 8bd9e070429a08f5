// The NICs a pod claimed through DRA, as the agent's topology describes NICs.
//
//   absl::StatusOr<v1::ClaimedDevices> claimed = ReadClaimedDevices("/etc/ferry/node/claimed-devices.json");
//   absl::StatusOr<std::vector<NicDevice>> nics = ClaimedNics(*claimed);
//   topology.nics = *nics;                    // instead of /sys/class/infiniband
//   std::vector<std::string> ifaces = FabricNames(*nics);   // --fabric_iface, when not given
//
// The file is written by `ferryctl claimed-devices` in the agent pod's init container
// (agent/dra/claim_resolver.h): the devices the scheduler allocated to the pod's claims,
// each with the attributes its driver published. A device is a NIC when it names one:
// a netdev (`ifName`) or an RDMA device (`rdmaDevice`), in the `dra.net` domain (GKE's
// managed DRANet, dranet) or in its own driver's. Its place in the PCIe tree comes from
// `resource.kubernetes.io/pcieRoot` and the NUMA node from `dra.net/numaNode` (or
// `resource.kubernetes.io/numaNode`): the attributes the scheduler aligned GPUs, NICs
// and CPUs by, so the agent's rails follow the same facts. Devices that name no NIC
// (a GPU or CPU claim) are not NICs; a file with no NIC is an error that says which
// setting selects them.
#ifndef FERRY_AGENT_DRA_CLAIMED_NICS_H_
#define FERRY_AGENT_DRA_CLAIMED_NICS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/topology/topology.h"
#include "proto/ferry/v1/dra.pb.h"

namespace ferry {

// Reads and parses the JSON file; errors name the file and what is wrong with it.
absl::StatusOr<v1::ClaimedDevices> ReadClaimedDevices(const std::string& path);

// One NicDevice per claimed device that names a NIC, in the file's order. Fails when
// none does, or when two devices name the same NIC.
absl::StatusOr<std::vector<NicDevice>> ClaimedNics(const v1::ClaimedDevices& claimed);

// What --fabric_iface names for each NIC: its netdev, else (EFA has none) its RDMA device.
std::vector<std::string> FabricNames(const std::vector<NicDevice>& nics);

}  // namespace ferry

#endif  // FERRY_AGENT_DRA_CLAIMED_NICS_H_
