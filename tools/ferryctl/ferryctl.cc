// ferryctl: inspect a running ferryd.
//
//   ferryctl [--socket=/run/ferry/ferry.sock] status [--json]
//   ferryctl [--socket=...] topology [--json]
//   ferryctl claimed-devices --claims=nics --out=FILE   (in the agent pod's init container)
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "agent/dra/claim_resolver.h"
#include "agent/dra/claimed_nics.h"
#include "agent/topology/cpu_list.h"
#include "proto/ferry/v1/ferry.grpc.pb.h"

ABSL_FLAG(std::string, socket, "/run/ferry/ferry.sock", "the agent's gRPC socket");
ABSL_FLAG(bool, json, false, "print JSON instead of a table");
ABSL_FLAG(int, timeout_ms, 5000, "RPC deadline");
ABSL_FLAG(std::string, claims, "nics", "claimed-devices: the pod's resource claims to resolve (comma-separated)");
ABSL_FLAG(std::string, out, "", "claimed-devices: the file to write (ferryd's --claimed_devices)");

namespace {

using ferry::v1::Agent;

std::string HumanBytes(uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? absl::StrFormat("%.0f %s", v, units[u]) : absl::StrFormat("%.1f %s", v, units[u]);
}

int PrintJson(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions opts;
  opts.add_whitespace = true;
  opts.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, opts);
  printf("%s", out.c_str());
  return 0;
}

std::string Cores(const google::protobuf::RepeatedField<int32_t>& cpus) {
  return cpus.empty() ? "unpinned" : ferry::FormatCpuList({cpus.begin(), cpus.end()});
}

std::string Numa(int node) { return node < 0 ? "-" : absl::StrCat(node); }

const char* ClassName(int c) {
  switch (c) {
    case ferry::v1::TRAFFIC_CLASS_LATENCY:
      return "latency";
    case ferry::v1::TRAFFIC_CLASS_BULK:
      return "bulk";
    case ferry::v1::TRAFFIC_CLASS_BACKGROUND:
      return "background";
    default:
      return "-";
  }
}

// Each pod's rule and its share of the bytes the pods sent over the fabric, per class.
void PrintTenants(const ferry::v1::GetStatusResponse& s) {
  if (s.tenants_size() == 0) return;
  uint64_t total = 0;
  for (const auto& t : s.tenants()) {
    for (uint64_t b : t.fabric_bytes()) total += b;
  }
  printf("\ntraffic classes %s\n",
         s.qos() ? "(scheduled per class and pod)" : "(off: --qos=false, first in first out)");
  printf("%-8s %-8s %-7s %-12s %-11s %-11s %6s %12s %12s %12s %7s\n", "session", "pid", "uid", "rule", "ceiling",
         "default", "weight", "latency", "bulk", "background", "share");
  for (const auto& t : s.tenants()) {
    uint64_t mine = 0;
    std::string by_class[3];
    for (int c = 0; c < 3; ++c) {
      const uint64_t b = c < t.fabric_bytes_size() ? t.fabric_bytes(c) : 0;
      mine += b;
      by_class[c] = HumanBytes(b);
    }
    // pid 0: a client in a pid namespace the agent cannot see (another container).
    const std::string pid = t.pid() > 0 ? absl::StrCat(t.pid()) : "other-ns";
    printf("%-8llu %-8s %-7u %-12s %-11s %-11s %6u %12s %12s %12s %6.1f%%\n",
           static_cast<unsigned long long>(t.session_id()), pid.c_str(), t.uid(), t.rule().c_str(),
           ClassName(t.ceiling()), ClassName(t.default_class()), t.weight(), by_class[0].c_str(), by_class[1].c_str(),
           by_class[2].c_str(), total == 0 ? 0.0 : 100.0 * static_cast<double>(mine) / static_cast<double>(total));
  }
}

int Status(Agent::Stub& stub, grpc::ClientContext& ctx) {
  ferry::v1::GetStatusResponse s;
  grpc::Status st = stub.GetStatus(&ctx, ferry::v1::GetStatusRequest(), &s);
  if (!st.ok()) {
    fprintf(stderr, "ferryctl: GetStatus: %s\n", st.error_message().c_str());
    return 1;
  }
  if (absl::GetFlag(FLAGS_json)) return PrintJson(s);
  printf("%-22s %s\n", "version", s.version().c_str());
  printf("%-22s %016llx\n", "incarnation", static_cast<unsigned long long>(s.incarnation()));
  printf("%-22s %s\n", "socket", s.socket().c_str());
  printf("%-22s %s\n", "peer address", s.peer_address().empty() ? "(none: node-local only)" : s.peer_address().c_str());
  printf("%-22s %s\n", "metrics", s.metrics_address().c_str());
  printf("%-22s %llus\n", "uptime", static_cast<unsigned long long>(s.uptime_seconds()));
  printf("%-22s %u\n", "sessions", s.sessions());
  printf("%-22s %u (%s)\n", "regions", s.regions(), HumanBytes(s.registered_bytes()).c_str());
  printf("%-22s %u in flight, %llu completed, %llu failed\n", "transfers", s.transfers_inflight(),
         static_cast<unsigned long long>(s.transfers_completed()),
         static_cast<unsigned long long>(s.transfers_failed()));
  printf("%-22s %s\n", "fabric provider", s.fabric_provider().empty() ? "(none)" : s.fabric_provider().c_str());
  if (s.nics_size() > 0) {
    printf("\n%-12s %-14s %-28s %12s %12s %8s %-12s %-5s %s\n", "NIC", "provider", "address", "tx", "rx", "inflight",
           "device", "NUMA", "worker cores");
    for (const auto& n : s.nics()) {
      printf("%-12s %-14s %-28s %12s %12s %8llu %-12s %-5s %s\n", n.name().c_str(), n.provider().c_str(),
             n.address().c_str(), HumanBytes(n.tx_bytes()).c_str(), HumanBytes(n.rx_bytes()).c_str(),
             static_cast<unsigned long long>(n.ops_inflight()), n.device().empty() ? "-" : n.device().c_str(),
             Numa(n.numa_node()).c_str(), Cores(n.cpus()).c_str());
    }
  }
  if (s.peers_size() > 0) {
    printf("\n%-24s %-18s %-10s %s\n", "peer", "incarnation", "state", "open regions");
    for (const auto& p : s.peers()) {
      printf("%-24s %016llx   %-10s %llu\n", p.address().c_str(), static_cast<unsigned long long>(p.incarnation()),
             p.state().c_str(), static_cast<unsigned long long>(p.open_regions()));
    }
  }
  PrintTenants(s);
  return 0;
}

// A GPU x NIC matrix in the words of `nvidia-smi topo -m`, the NICs, then the rails.
int Topology(Agent::Stub& stub, grpc::ClientContext& ctx) {
  ferry::v1::GetTopologyResponse t;
  grpc::Status st = stub.GetTopology(&ctx, ferry::v1::GetTopologyRequest(), &t);
  if (!st.ok()) {
    fprintf(stderr, "ferryctl: GetTopology: %s\n", st.error_message().c_str());
    return 1;
  }
  if (absl::GetFlag(FLAGS_json)) return PrintJson(t);
  printf("host %s: %d GPUs, %d NICs, %d NUMA nodes\n", t.hostname().c_str(), t.gpus_size(), t.nics_size(),
         t.numa_nodes_size());
  if (t.gpus_size() > 0 && t.nics_size() > 0) {
    printf("\n%-6s", "");
    for (const auto& n : t.nics()) printf(" %-12s", n.name().c_str());
    printf(" %-5s %s\n", "NUMA", "PCIe root");
    for (const auto& g : t.gpus()) {
      printf("%-6s", absl::StrCat("GPU", g.index()).c_str());
      for (const std::string& l : g.nic_links()) printf(" %-12s", l.c_str());
      printf(" %-5s %s\n", Numa(g.numa_node()).c_str(), g.pcie_root().c_str());
    }
    printf(
        "\nLegend: PIX = one PCIe switch between them; PXB = several switches; PHB = through the PCIe host\n"
        "bridge; NODE = across root complexes of one NUMA node; SYS = across NUMA nodes, or place unknown\n");
  }
  if (t.nics_size() > 0) {
    printf("\n%-12s %-12s %-12s %-13s %-11s %-5s %-24s %s\n", "NIC", "RDMA device", "netdev", "PCI", "PCIe root",
           "NUMA", "fabric address", "worker cores");
    for (const auto& n : t.nics()) {
      printf("%-12s %-12s %-12s %-13s %-11s %-5s %-24s %s\n", n.name().c_str(), n.rdma_device().c_str(),
             n.netdev().c_str(), n.pci_address().c_str(), n.pcie_root().c_str(), Numa(n.numa_node()).c_str(),
             n.fabric_address().empty() ? "(not used)" : n.fabric_address().c_str(),
             n.fabric_address().empty() ? "" : Cores(n.cpus()).c_str());
    }
  }
  if (t.rails_size() > 0) {
    printf("\nRails (a GPU region's bytes go over its rail):\n");
    for (const auto& r : t.rails()) {
      printf("  GPU%d -> %s [%s], worker cores %s\n", r.gpu_index(), absl::StrJoin(r.nics(), ",").c_str(),
             r.link().c_str(), Cores(r.cpus()).c_str());
    }
  }
  bool claimed = false;
  for (const auto& n : t.nics()) claimed |= !n.claimed_device().empty();
  if (claimed) {
    printf("\nNICs claimed through DRA (their place is the claim's attributes):\n");
    for (const auto& n : t.nics()) {
      if (!n.claimed_device().empty()) printf("  %-12s <- %s\n", n.name().c_str(), n.claimed_device().c_str());
    }
  }
  printf("\nNUMA nodes (a host region goes over its client's node's NICs, or all when it has none):\n");
  for (const auto& n : t.numa_nodes()) {
    printf("  numa%d cpus %s -> %s\n", n.numa_node(), Cores(n.cpus()).c_str(),
           n.nics().empty() ? "all NICs" : absl::StrJoin(n.nics(), ",").c_str());
  }
  return 0;
}

// Resolves the agent pod's own claims through the Kubernetes API and writes what ferryd
// reads. Runs where the service account token is mounted (the init container only).
int ClaimedDevices() {
  const char* ns = getenv("POD_NAMESPACE");
  const char* pod = getenv("POD_NAME");
  const std::string out = absl::GetFlag(FLAGS_out);
  if (ns == nullptr || pod == nullptr || out.empty()) {
    fprintf(stderr, "ferryctl claimed-devices: needs --out and POD_NAMESPACE, POD_NAME (the downward API)\n");
    return 2;
  }
  absl::StatusOr<ferry::KubeApiEndpoint> endpoint = ferry::InClusterEndpoint();
  if (!endpoint.ok()) {
    fprintf(stderr, "ferryctl claimed-devices: %s\n", endpoint.status().ToString().c_str());
    return 1;
  }
  std::unique_ptr<ferry::KubeApi> api = ferry::NewHttpsKubeApi(*std::move(endpoint));
  ferry::ClaimQuery query{ns, pod, absl::StrSplit(absl::GetFlag(FLAGS_claims), ',', absl::SkipEmpty())};
  absl::StatusOr<ferry::v1::ClaimedDevices> claimed = ferry::ResolveClaimedDevices(*api, query);
  if (!claimed.ok()) {
    fprintf(stderr, "ferryctl claimed-devices: %s\n", claimed.status().ToString().c_str());
    return 1;
  }
  // Checked here too, so that a claim without NICs fails the init container with the
  // reason, before the agent starts.
  absl::StatusOr<std::vector<ferry::NicDevice>> nics = ferry::ClaimedNics(*claimed);
  if (!nics.ok()) {
    fprintf(stderr, "ferryctl claimed-devices: %s\n", nics.status().ToString().c_str());
    return 1;
  }
  std::string json;
  google::protobuf::util::JsonPrintOptions opts;
  opts.add_whitespace = true;
  (void)google::protobuf::util::MessageToJsonString(*claimed, &json, opts);
  const std::string tmp = out + ".tmp";
  {
    std::ofstream f(tmp);
    f << json;
    if (!f.flush()) {
      fprintf(stderr, "ferryctl claimed-devices: cannot write %s\n", tmp.c_str());
      return 1;
    }
  }
  if (rename(tmp.c_str(), out.c_str()) != 0) {
    fprintf(stderr, "ferryctl claimed-devices: cannot rename %s to %s\n", tmp.c_str(), out.c_str());
    return 1;
  }
  printf("pod %s on node %s: %d claimed devices, %zu NICs\n", claimed->pod().c_str(), claimed->node().c_str(),
         claimed->devices_size(), nics->size());
  for (const ferry::NicDevice& n : *nics) {
    printf("  %-12s %-12s PCIe root %-11s NUMA %-3s <- %s\n", n.netdev.empty() ? "-" : n.netdev.c_str(),
           n.rdma_device.empty() ? "-" : n.rdma_device.c_str(), n.pci.pcie_root.empty() ? "-" : n.pci.pcie_root.c_str(),
           Numa(n.pci.numa_node).c_str(), n.claimed_device.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("ferryctl [--socket=PATH] status|topology [--json] | claimed-devices --out=FILE");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2) {
    fprintf(stderr, "usage: ferryctl [--socket=PATH] status|topology [--json] | claimed-devices --out=FILE\n");
    return 2;
  }
  if (std::string(args[1]) == "claimed-devices") return ClaimedDevices();
  auto channel = grpc::CreateChannel("unix:" + absl::GetFlag(FLAGS_socket), grpc::InsecureChannelCredentials());
  auto stub = Agent::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Milliseconds(absl::GetFlag(FLAGS_timeout_ms))));
  std::string cmd = args[1];
  if (cmd == "status") return Status(*stub, ctx);
  if (cmd == "topology") return Topology(*stub, ctx);
  fprintf(stderr, "ferryctl: unknown command '%s' (status, topology, claimed-devices)\n", cmd.c_str());
  return 2;
}
