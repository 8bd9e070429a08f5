#include "agent/topology/topology.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "agent/topology/cpu_list.h"

namespace ferry {
namespace {

namespace fs = std::filesystem;

std::string ReadLine(const fs::path& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return std::string(absl::StripAsciiWhitespace(line));
}

// "0000:8f:00.0": domain:bus:device.function, hex.
bool IsPciAddress(absl::string_view s) {
  if (s.size() != 12 || s[4] != ':' || s[7] != ':' || s[10] != '.') return false;
  for (size_t i : {0, 1, 2, 3, 5, 6, 8, 9, 11}) {
    if (!std::isxdigit(static_cast<unsigned char>(s[i]))) return false;
  }
  return true;
}

std::vector<fs::path> SortedEntries(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

class SysfsReader {
 public:
  explicit SysfsReader(fs::path devices) : devices_(std::move(devices)) {}

  // The PCI location of the device a sysfs link (".../device", "bus/pci/devices/X")
  // points to; nullopt for devices not on PCI (virtual NICs, platform devices).
  std::optional<PciLocation> Locate(const fs::path& link) const {
    std::error_code ec;
    const fs::path target = fs::canonical(link, ec);
    if (ec) return std::nullopt;
    const fs::path rel = target.lexically_relative(devices_);
    std::vector<std::string> parts;
    for (const auto& p : rel) parts.push_back(p.string());
    if (parts.size() < 2 || !absl::StartsWith(parts[0], "pci")) return std::nullopt;
    PciLocation loc;
    loc.pcie_root = absl::AsciiStrToLower(parts[0]);
    for (size_t i = 1; i < parts.size(); ++i) {
      if (!IsPciAddress(parts[i])) return std::nullopt;
      parts[i] = absl::AsciiStrToLower(parts[i]);
    }
    loc.address = parts.back();
    loc.bridges.assign(parts.begin() + 1, parts.end() - 1);
    int node;
    if (absl::SimpleAtoi(ReadLine(target / "numa_node"), &node) && node >= 0) loc.numa_node = node;
    return loc;
  }

 private:
  const fs::path devices_;
};

std::vector<NumaNode> ReadNumaNodes(const fs::path& root) {
  std::vector<NumaNode> nodes;
  for (const fs::path& p : SortedEntries(root / "devices/system/node")) {
    const std::string name = p.filename().string();
    int id;
    if (!absl::StartsWith(name, "node") || !absl::SimpleAtoi(name.substr(4), &id)) continue;
    absl::StatusOr<std::vector<int>> cpus = ParseCpuList(ReadLine(p / "cpulist"));
    if (!cpus.ok()) continue;
    nodes.push_back({id, std::move(*cpus)});
  }
  if (nodes.empty()) {
    // Kernels without NUMA support still list the CPUs: one node 0.
    absl::StatusOr<std::vector<int>> cpus = ParseCpuList(ReadLine(root / "devices/system/cpu/online"));
    if (cpus.ok() && !cpus->empty()) nodes.push_back({0, std::move(*cpus)});
  }
  std::sort(nodes.begin(), nodes.end(), [](const NumaNode& a, const NumaNode& b) { return a.id < b.id; });
  return nodes;
}

std::vector<GpuDevice> ReadGpus(const fs::path& root, const SysfsReader& reader) {
  std::vector<GpuDevice> gpus;
  for (const fs::path& dev : SortedEntries(root / "bus/pci/devices")) {
    // NVIDIA, class VGA (0x0300xx) or 3D controller (0x0302xx); NVSwitches are bridges.
    const std::string cls = ReadLine(dev / "class");
    if (ReadLine(dev / "vendor") != "0x10de" || !(absl::StartsWith(cls, "0x0300") || absl::StartsWith(cls, "0x0302"))) {
      continue;
    }
    std::optional<PciLocation> loc = reader.Locate(dev);
    if (!loc) continue;
    GpuDevice g;
    const std::string device = ReadLine(dev / "device");
    g.name = absl::StrCat("10de:", absl::StartsWith(device, "0x") ? device.substr(2) : device);
    g.pci = std::move(*loc);
    gpus.push_back(std::move(g));
  }
  std::sort(gpus.begin(), gpus.end(),
            [](const GpuDevice& a, const GpuDevice& b) { return a.pci.address < b.pci.address; });
  for (size_t i = 0; i < gpus.size(); ++i) gpus[i].index = static_cast<int>(i);
  return gpus;
}

std::vector<NicDevice> ReadNics(const fs::path& root, const SysfsReader& reader) {
  std::vector<NicDevice> nics;
  for (const fs::path& ib : SortedEntries(root / "class/infiniband")) {
    std::optional<PciLocation> loc = reader.Locate(ib / "device");
    if (!loc) continue;
    NicDevice n;
    n.name = n.rdma_device = ib.filename().string();
    std::vector<fs::path> net = SortedEntries(ib / "device/net");
    if (!net.empty()) n.netdev = net.front().filename().string();
    n.pci = std::move(*loc);
    nics.push_back(std::move(n));
  }
  for (const fs::path& net : SortedEntries(root / "class/net")) {
    std::optional<PciLocation> loc = reader.Locate(net / "device");
    if (!loc) continue;  // lo, veth, bridges: no device
    const std::string name = net.filename().string();
    auto same =
        std::find_if(nics.begin(), nics.end(), [&](const NicDevice& n) { return n.pci.address == loc->address; });
    if (same != nics.end()) {
      if (same->netdev.empty()) same->netdev = name;
      continue;
    }
    NicDevice n;
    n.name = n.netdev = name;
    n.pci = std::move(*loc);
    nics.push_back(std::move(n));
  }
  std::sort(nics.begin(), nics.end(), [](const NicDevice& a, const NicDevice& b) {
    return std::tie(a.pci.address, a.name) < std::tie(b.pci.address, b.name);
  });
  return nics;
}

size_t CommonBridges(const PciLocation& a, const PciLocation& b) {
  size_t k = 0;
  while (k < a.bridges.size() && k < b.bridges.size() && a.bridges[k] == b.bridges[k]) ++k;
  return k;
}

}  // namespace

const NumaNode* Topology::FindNuma(int id) const {
  for (const NumaNode& n : numa_nodes) {
    if (n.id == id) return &n;
  }
  return nullptr;
}

const GpuDevice* Topology::FindGpu(absl::string_view pci_address) const {
  for (const GpuDevice& g : gpus) {
    if (absl::EqualsIgnoreCase(g.pci.address, pci_address)) return &g;
  }
  return nullptr;
}

const NicDevice* Topology::FindNic(absl::string_view name) const {
  if (name.empty()) return nullptr;
  for (const NicDevice& n : nics) {
    if (n.netdev == name || n.rdma_device == name) return &n;
  }
  // libfabric's efa domains are "<device>-rdm" / "<device>-dgrm".
  for (absl::string_view suffix : {"-rdm", "-dgrm"}) {
    if (absl::EndsWith(name, suffix)) return FindNic(name.substr(0, name.size() - suffix.size()));
  }
  return nullptr;
}

int Topology::NumaNodeOfCpus(const std::vector<int>& cpus) const {
  if (cpus.empty()) return -1;
  for (const NumaNode& n : numa_nodes) {
    if (std::includes(n.cpus.begin(), n.cpus.end(), cpus.begin(), cpus.end())) return n.id;
  }
  return -1;
}

std::vector<int> Topology::AllCpus() const {
  std::vector<int> all;
  for (const NumaNode& n : numa_nodes) all.insert(all.end(), n.cpus.begin(), n.cpus.end());
  std::sort(all.begin(), all.end());
  return all;
}

absl::StatusOr<Topology> DiscoverTopology(const std::string& sysfs_root) {
  std::error_code ec;
  const fs::path root = fs::canonical(sysfs_root, ec);
  if (ec || !fs::is_directory(root)) {
    return absl::NotFoundError(absl::StrCat("sysfs root '", sysfs_root, "' is not a readable directory"));
  }
  Topology t;
  const SysfsReader reader(root / "devices");
  t.numa_nodes = ReadNumaNodes(root);
  t.gpus = ReadGpus(root, reader);
  t.nics = ReadNics(root, reader);
  // Single-socket machines often report -1 for every device: there is only one node.
  if (t.numa_nodes.size() == 1) {
    const int only = t.numa_nodes.front().id;
    for (GpuDevice& g : t.gpus) {
      if (g.pci.numa_node < 0) g.pci.numa_node = only;
    }
    for (NicDevice& n : t.nics) {
      if (n.pci.numa_node < 0) n.pci.numa_node = only;
    }
  }
  return t;
}

Link Classify(const PciLocation& a, const PciLocation& b) {
  if (!a.address.empty() && a.address == b.address) return Link::kSelf;
  if (a.pcie_root.empty() || b.pcie_root.empty()) return Link::kSys;
  if (a.pcie_root == b.pcie_root) {
    const size_t k = CommonBridges(a, b);
    if (k == 0) return Link::kPhb;
    // Below their lowest common bridge (a switch's upstream port), each device sits
    // behind at most one more bridge (that switch's downstream port): one switch.
    return a.bridges.size() - k <= 1 && b.bridges.size() - k <= 1 ? Link::kPix : Link::kPxb;
  }
  if (a.numa_node >= 0 && a.numa_node == b.numa_node) return Link::kNode;
  return Link::kSys;
}

const char* LinkName(Link link) {
  switch (link) {
    case Link::kSelf:
      return "X";
    case Link::kPix:
      return "PIX";
    case Link::kPxb:
      return "PXB";
    case Link::kPhb:
      return "PHB";
    case Link::kNode:
      return "NODE";
    case Link::kSys:
      return "SYS";
  }
  return "?";
}

}  // namespace ferry
