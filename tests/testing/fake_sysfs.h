// A fake sysfs tree for topology tests, written from a short spec (fixtures under
// tests/topology/fixtures/*.sysfs):
//
//   node <id> <cpulist>
//   gpu <path below devices/> [numa N] [device 0xID]
//   ib <rdma device> <path> [numa N] [netdev NAME]
//   net <netdev> <path> [numa N]
//
// A path names the PCIe root, the bridges and the device, as under /sys/devices:
// "pci0000:8c/0000:8c:00.0/0000:8d:00.0/0000:8f:00.0". The tree has what
// DiscoverTopology reads: devices/ with numa_node, vendor, class and device files,
// bus/pci/devices and class/{infiniband,net} links (relative, so the tree can move).
#ifndef FERRY_TESTS_TESTING_FAKE_SYSFS_H_
#define FERRY_TESTS_TESTING_FAKE_SYSFS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ferry::testing {

// Writes the tree described by `spec` under `root` (created if missing).
absl::Status WriteFakeSysfs(absl::string_view spec, const std::string& root);
// The same from a spec file.
absl::Status WriteFakeSysfsFromFile(const std::string& spec_path, const std::string& root);

}  // namespace ferry::testing

#endif  // FERRY_TESTS_TESTING_FAKE_SYSFS_H_
