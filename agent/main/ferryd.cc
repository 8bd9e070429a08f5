// ferryd: the ferry node agent. See README.md and `ferryd --help`.
#include <grp.h>
#include <malloc.h>
#include <signal.h>
#include <sys/resource.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "agent/common/log.h"
#include "agent/common/status_macros.h"
#include "agent/main/agent.h"

ABSL_FLAG(std::string, socket, "/run/ferry/ferry.sock",
          "Unix socket of the local gRPC API. The session socket lives beside it "
          "(<socket minus .sock>.session.sock).");
ABSL_FLAG(std::string, socket_mode, "0660", "File mode of both sockets (octal).");
ABSL_FLAG(std::string, socket_group, "",
          "Group (name or gid) that owns the sockets; workload pods run with it. Empty: the agent's group.");
ABSL_FLAG(std::string, allowed_uids, "", "Comma-separated UIDs allowed to open sessions; empty allows any.");
ABSL_FLAG(std::string, metrics_address, "127.0.0.1:9464",
          "host:port for /metrics, /healthz and /readyz (port 0 picks a free one; see --ready_file).");
ABSL_FLAG(std::string, peer_address, "",
          "host:port of the agent-to-agent gRPC service; empty disables cross-node transfers.");
ABSL_FLAG(std::string, advertise_address, "",
          "Peer address written into region descriptors; default: the bound --peer_address.");
ABSL_FLAG(std::string, fabric_provider, "auto",
          "libfabric provider: auto (efa, then verbs;ofi_rxm, then tcp;ofi_rxm), or a name such as tcp;ofi_rxm.");
ABSL_FLAG(std::string, fabric_iface, "",
          "Comma-separated NIC addresses or interface names, one fabric endpoint each. Required with "
          "--peer_address: the agent never guesses an interface.");
ABSL_FLAG(bool, fabric_hmem, true,
          "Register GPU memory with the NICs (FI_HMEM: GPUDirect RDMA) where the provider offers it; false, or a "
          "provider without it, sends GPU memory through host staging buffers.");
ABSL_FLAG(bool, fabric_messages, true,
          "Send a notified write's notification to the target agent as a fabric message after the data (no RPC), "
          "and receive them, where both agents' providers have FI_MSG; false: by the peer Notify RPC.");
ABSL_FLAG(bool, fabric_latency_lane, false,
          "Give each NIC a latency lane: a second endpoint (its own connection and worker thread) that "
          "latency-class writes take to peers that have lanes too, so they never wait behind bulk bytes in one "
          "connection. Needs --qos.");
ABSL_FLAG(uint64_t, fabric_tx_size, 0,
          "Transmit queue depth per NIC; 0 keeps the provider's. Small values force -FI_EAGAIN (tests).");
ABSL_FLAG(std::string, peer_tls_cert, "",
          "PEM certificate of this agent for agent-to-agent mTLS (with --peer_tls_key and --peer_tls_ca; "
          "e.g. from a Kubernetes Secret). With TLS on, plaintext peers are refused.");
ABSL_FLAG(std::string, peer_tls_key, "", "PEM private key for --peer_tls_cert.");
ABSL_FLAG(std::string, peer_tls_ca, "", "PEM CA bundle that signs every agent's certificate.");
ABSL_FLAG(std::string, peer_tls_server_name, "ferry-peer",
          "Name (DNS SAN) every agent certificate carries; verified instead of the peer's IP address.");
ABSL_FLAG(uint32_t, fabric_spin_us, 100,
          "How long a NIC worker keeps polling after its last activity before it sleeps on the CQ. Raise it "
          "(e.g. 1000000) on nodes with a core to spare for progress: rxm/tcp move incoming data only while "
          "the target polls. Idle CPU grows with it.");
ABSL_FLAG(std::string, sysfs_root, "/sys",
          "Where to read the node's topology (GPUs, NICs, NUMA nodes, PCIe tree); tests point it at a fake tree.");
ABSL_FLAG(std::string, claimed_devices, "",
          "A file of the devices the agent's pod claimed through DRA (written by `ferryctl claimed-devices`): its "
          "NICs and their places come from the claim, not sysfs, and are the fabric NICs when --fabric_iface is "
          "empty.");
ABSL_FLAG(uint64_t, max_peers, 4096,
          "Most agents this one is connected to at once (each costs address-vector entries, a gRPC channel and "
          "provider connections); a transfer to one more fails RESOURCE_EXHAUSTED. 0: no limit.");
ABSL_FLAG(uint32_t, peer_idle_s, 300,
          "Close the connection to a peer no transfer used for this many seconds (its gRPC channel, address-vector "
          "entries and region caches); the next transfer to it handshakes again. 0: never.");
ABSL_FLAG(bool, pin_workers, true,
          "Pin each NIC's worker thread to the cores of the NIC's NUMA node (within the agent's own cpuset).");
ABSL_FLAG(uint64_t, fabric_max_op_bytes, 1 << 20,
          "Largest single RDMA write; larger chunks are split so they stripe over the NICs (and a latency-class "
          "write finds at most about one such op of other classes ahead of it).");
ABSL_FLAG(uint64_t, max_region_bytes, 1ull << 40, "Largest region one RegisterMemory may register.");
ABSL_FLAG(uint64_t, max_chunks_per_write, 1 << 20, "Most chunks (or paged blocks) in one Write.");
ABSL_FLAG(uint64_t, max_pending_fds, 64, "Most fds a session may hold before registering them.");
ABSL_FLAG(uint64_t, max_regions_per_session, 4096, "Most regions one session may have registered.");
ABSL_FLAG(uint64_t, max_regions_per_uid, 16384,
          "Most regions one pod (its sessions' uid) may have registered over all its sessions.");
ABSL_FLAG(uint64_t, max_regions, 32768,
          "Most regions on the node. Each is a mapping in the agent, and vm.max_map_count (65530 by default) is "
          "one pool for all of them: keep this well below it.");
ABSL_FLAG(uint64_t, max_sessions, 256, "Most client sessions on the node (each may hold an inbox and its thread).");
ABSL_FLAG(uint64_t, max_sessions_per_uid, 64, "Most of those one pod (its sessions' uid) may have.");
ABSL_FLAG(uint64_t, max_queued_notification_bytes, 1 << 20,
          "Most bytes one session's unread notifications may hold (its unread completions apart, the same); "
          "more are dropped and counted like --max_queued_notifications.");
ABSL_FLAG(uint64_t, max_inflight_transfers, 4096, "Most transfers one session may have in flight.");
ABSL_FLAG(uint64_t, max_queued_notifications, 65536,
          "Most notifications one session's queue holds unread; more are dropped, counted, and the session's next "
          "notification says how many (lost_before).");
ABSL_FLAG(uint64_t, max_queues, 256, "Most shared-memory transfer queues (CreateQueue), all sessions together.");
ABSL_FLAG(uint64_t, max_queues_per_uid, 64,
          "Most of those one pod (its sessions' uid) may have, so that one pod cannot take every pod's queues.");
ABSL_FLAG(bool, queues_on_nic_worker, true,
          "Take shared-memory queue submissions on the first NIC worker's thread (no hand-off between threads); "
          "false: on a thread of their own. Without a fabric they always have their own thread.");
ABSL_FLAG(uint32_t, transfer_timeout_ms, 30000, "Default transfer deadline when a Write sets none.");
ABSL_FLAG(uint32_t, max_transfer_timeout_ms, 600000,
          "Longest transfer, message or queue deadline a request may ask for (timeout_ms); longer ones are refused.");
ABSL_FLAG(uint32_t, max_wait_ms, 60000, "Longest a single Wait call blocks.");
ABSL_FLAG(int32_t, local_copy_threads, 2, "Threads for node-local host copies.");
ABSL_FLAG(uint64_t, staging_buffer_bytes, 32 << 20,
          "Size of each staging buffer of the staged path (GPU memory across nodes without FI_HMEM).");
ABSL_FLAG(uint64_t, stage_bytes, 1 << 20,
          "Largest stage of the staged path: a transfer is pipelined (copy out, write, commit) in stages of "
          "this size, each in its own slot of the staging buffers.");
ABSL_FLAG(uint32_t, max_staging_buffers, 64, "Most staging buffers this agent keeps for peers writing into it.");
ABSL_FLAG(bool, stage_host_regions, false,
          "Carry host regions through the staged path too (exercises it where there is no GPU; slower).");
ABSL_FLAG(bool, gpu_kernel_pull, false,
          "Run the GPU gather/scatter kernel on the destination GPU (remote reads) instead of the source GPU "
          "(remote writes).");
ABSL_FLAG(bool, qos, ferry::QosScheduling().enabled,
          "Schedule each NIC's ops by traffic class and pod (latency first, weighted fair shares, caps); false: "
          "each peer's ops first in, first out.");
ABSL_FLAG(std::string, qos_tenants, "",
          "Pods' traffic classes and shares: rules separated by ';', fields by ',': uid=N or gid=N, ceiling=CLASS, "
          "class=CLASS, weight=1..1000, inflight=BYTES, rate=BYTES (per second); classes latency, bulk, background. "
          "e.g. 'uid=1000,ceiling=latency,weight=4;gid=2000,ceiling=bulk,rate=2GB'.");
ABSL_FLAG(std::string, qos_default_tenant, "ceiling=latency,class=bulk,weight=1",
          "The rule of pods no --qos_tenants rule matches (the same fields, without uid/gid).");
ABSL_FLAG(std::string, qos_class_weights, ferry::FormatClassWeights(ferry::QosScheduling()),
          "Shares between traffic classes while each has a backlog.");
ABSL_FLAG(uint64_t, qos_window_bytes, ferry::QosScheduling().window_bytes,
          "Bulk and background keep at most this many bytes posted per NIC (plus one op); the rest waits in ferry's "
          "queues, ordered by class and weight.");
ABSL_FLAG(uint64_t, qos_latency_window_bytes, ferry::QosScheduling().latency_window_bytes,
          "While latency-class writes are about, other classes keep at most this many bytes posted per NIC (plus "
          "one op): what a latency write may find ahead of it.");
ABSL_FLAG(uint32_t, shutdown_grace_ms, 5000, "On SIGTERM, how long in-flight transfers may finish.");
ABSL_FLAG(std::string, ready_file, "",
          "When set, written once the agent serves: lines key=value with the bound addresses.");
ABSL_FLAG(std::string, log_level, "info", "debug, info, warning or error.");

namespace {

int Fail(const std::string& message) {
  fprintf(stderr, "ferryd: %s\n", message.c_str());
  return 2;
}

// The agent's configuration from its flags (every flag is defined above, and only
// here), and the log level; an error names the flag to fix.
absl::StatusOr<ferry::AgentConfig> ConfigFromFlags() {
  ferry::AgentConfig config;
  const std::string level = absl::GetFlag(FLAGS_log_level);
  if (level == "debug")
    ferry::SetMinLogLevel(ferry::LogLevel::kDebug);
  else if (level == "warning")
    ferry::SetMinLogLevel(ferry::LogLevel::kWarning);
  else if (level == "error")
    ferry::SetMinLogLevel(ferry::LogLevel::kError);
  else if (level != "info")
    return absl::InvalidArgumentError("--log_level must be debug, info, warning or error");

  config.socket = absl::GetFlag(FLAGS_socket);
  unsigned long mode = 0;
  try {
    mode = std::stoul(absl::GetFlag(FLAGS_socket_mode), nullptr, 8);
  } catch (...) {
    return absl::InvalidArgumentError("--socket_mode must be an octal mode such as 0660");
  }
  if (mode > 0777) return absl::InvalidArgumentError("--socket_mode must be within 0000..0777");
  config.socket_mode = static_cast<mode_t>(mode);
  const std::string group = absl::GetFlag(FLAGS_socket_group);
  if (!group.empty()) {
    uint32_t gid;
    if (absl::SimpleAtoi(group, &gid)) {
      config.socket_gid = gid;
    } else if (struct group* g = getgrnam(group.c_str())) {
      config.socket_gid = g->gr_gid;
    } else {
      return absl::InvalidArgumentError("--socket_group: no group named '" + group + "'");
    }
  }
  for (absl::string_view uid : absl::StrSplit(absl::GetFlag(FLAGS_allowed_uids), ',', absl::SkipEmpty())) {
    uint32_t v;
    if (!absl::SimpleAtoi(uid, &v)) return absl::InvalidArgumentError("--allowed_uids must be comma-separated numbers");
    config.allowed_uids.push_back(v);
  }
  config.metrics_address = absl::GetFlag(FLAGS_metrics_address);
  config.peer_address = absl::GetFlag(FLAGS_peer_address);
  config.advertise_address = absl::GetFlag(FLAGS_advertise_address);
  config.fabric_provider = absl::GetFlag(FLAGS_fabric_provider);
  config.fabric_ifaces = absl::StrSplit(absl::GetFlag(FLAGS_fabric_iface), ',', absl::SkipEmpty());
  config.fabric_tx_size = absl::GetFlag(FLAGS_fabric_tx_size);
  config.fabric_hmem = absl::GetFlag(FLAGS_fabric_hmem);
  config.fabric_messages = absl::GetFlag(FLAGS_fabric_messages);
  config.fabric_latency_lane = absl::GetFlag(FLAGS_fabric_latency_lane);
  config.fabric_max_op_bytes = absl::GetFlag(FLAGS_fabric_max_op_bytes);
  config.fabric_spin_us = absl::GetFlag(FLAGS_fabric_spin_us);
  config.sysfs_root = absl::GetFlag(FLAGS_sysfs_root);
  config.claimed_devices = absl::GetFlag(FLAGS_claimed_devices);
  config.pin_workers = absl::GetFlag(FLAGS_pin_workers);
  config.max_peers = absl::GetFlag(FLAGS_max_peers);
  config.peer_idle_s = absl::GetFlag(FLAGS_peer_idle_s);
  config.peer_tls_cert = absl::GetFlag(FLAGS_peer_tls_cert);
  config.peer_tls_key = absl::GetFlag(FLAGS_peer_tls_key);
  config.peer_tls_ca = absl::GetFlag(FLAGS_peer_tls_ca);
  config.peer_tls_server_name = absl::GetFlag(FLAGS_peer_tls_server_name);
  config.max_region_bytes = absl::GetFlag(FLAGS_max_region_bytes);
  config.max_chunks_per_write = absl::GetFlag(FLAGS_max_chunks_per_write);
  config.max_pending_fds = absl::GetFlag(FLAGS_max_pending_fds);
  config.max_regions_per_session = absl::GetFlag(FLAGS_max_regions_per_session);
  config.max_regions_per_uid = absl::GetFlag(FLAGS_max_regions_per_uid);
  config.max_regions = absl::GetFlag(FLAGS_max_regions);
  config.max_sessions = absl::GetFlag(FLAGS_max_sessions);
  config.max_sessions_per_uid = absl::GetFlag(FLAGS_max_sessions_per_uid);
  config.max_queued_notification_bytes = absl::GetFlag(FLAGS_max_queued_notification_bytes);
  if (config.max_sessions == 0 || config.max_sessions_per_uid == 0) {
    return absl::InvalidArgumentError("--max_sessions and --max_sessions_per_uid must be at least 1");
  }
  if (config.max_queued_notification_bytes < 8192) {
    // Below that, a notification with the largest payload (4 KiB) might never fit.
    return absl::InvalidArgumentError("--max_queued_notification_bytes must be at least 8192");
  }
  config.max_inflight_transfers = absl::GetFlag(FLAGS_max_inflight_transfers);
  config.max_queued_notifications = absl::GetFlag(FLAGS_max_queued_notifications);
  if (config.max_queued_notifications == 0) {
    return absl::InvalidArgumentError("--max_queued_notifications must be at least 1");
  }
  config.max_queues = absl::GetFlag(FLAGS_max_queues);
  config.max_queues_per_uid = absl::GetFlag(FLAGS_max_queues_per_uid);
  config.queues_on_nic_worker = absl::GetFlag(FLAGS_queues_on_nic_worker);
  config.transfer_timeout_ms = absl::GetFlag(FLAGS_transfer_timeout_ms);
  config.max_transfer_timeout_ms = absl::GetFlag(FLAGS_max_transfer_timeout_ms);
  config.max_wait_ms = absl::GetFlag(FLAGS_max_wait_ms);
  config.local_copy_threads = absl::GetFlag(FLAGS_local_copy_threads);
  config.gpu_kernel_pull = absl::GetFlag(FLAGS_gpu_kernel_pull);
  config.staging_buffer_bytes = absl::GetFlag(FLAGS_staging_buffer_bytes);
  config.stage_bytes = absl::GetFlag(FLAGS_stage_bytes);
  config.max_staging_buffers = absl::GetFlag(FLAGS_max_staging_buffers);
  config.stage_host_regions = absl::GetFlag(FLAGS_stage_host_regions);
  if (config.staging_buffer_bytes < 4096 || config.staging_buffer_bytes > (1ull << 32)) {
    return absl::InvalidArgumentError("--staging_buffer_bytes must be 4096..4294967296");
  }
  if (config.stage_bytes < 4096 || config.stage_bytes > (1ull << 32)) {
    return absl::InvalidArgumentError("--stage_bytes must be 4096..4294967296");
  }
  config.shutdown_grace_ms = absl::GetFlag(FLAGS_shutdown_grace_ms);
  if (config.local_copy_threads < 1 || config.local_copy_threads > 64) {
    return absl::InvalidArgumentError("--local_copy_threads must be 1..64");
  }
  if (config.transfer_timeout_ms == 0 || config.transfer_timeout_ms > config.max_transfer_timeout_ms) {
    return absl::InvalidArgumentError("--transfer_timeout_ms must be 1..--max_transfer_timeout_ms");
  }
  ferry::QosFlags qos;
  qos.enabled = absl::GetFlag(FLAGS_qos);
  qos.tenants = absl::GetFlag(FLAGS_qos_tenants);
  qos.default_tenant = absl::GetFlag(FLAGS_qos_default_tenant);
  qos.class_weights = absl::GetFlag(FLAGS_qos_class_weights);
  qos.window_bytes = absl::GetFlag(FLAGS_qos_window_bytes);
  qos.latency_window_bytes = absl::GetFlag(FLAGS_qos_latency_window_bytes);
  qos.max_op_bytes = config.fabric_max_op_bytes;
  FERRY_ASSIGN_OR_RETURN(ferry::QosPolicy policy, ferry::ParseQosPolicy(qos));
  config.qos = std::move(policy);
  if (config.fabric_latency_lane && !config.qos.scheduling.enabled) {
    return absl::InvalidArgumentError("--fabric_latency_lane needs --qos (the lanes carry the latency class)");
  }
  if (!config.peer_address.empty() && config.fabric_ifaces.empty() && config.claimed_devices.empty()) {
    return absl::InvalidArgumentError(
        "--peer_address needs --fabric_iface (e.g. 127.0.0.1 for a loopback test) or --claimed_devices");
  }
  return config;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "ferry node agent: moves registered GPU/host memory between pods and nodes.\n"
      "Usage: ferryd [--socket=/run/ferry/ferry.sock] [--peer_address=HOST:PORT --fabric_iface=ADDR] ...");
  absl::ParseCommandLine(argc, argv);
  // Debian's Abseil checks every Mutex acquisition for lock-order cycles; that costs
  // more than the agent's per-transfer work. The tsan build is the place for such checks.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // A paged write of 16,384 KV blocks allocates a few hundred KiB per request (its
  // message, chunk plan and piece list) on gRPC's threads. glibc would hand such blocks
  // back to the kernel on every free (mmap above 128 KiB, arena trimming), so each
  // request paid a few hundred page faults: keep them in the heap instead.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  // Each peer costs a few file descriptors (a gRPC connection, a provider connection per
  // pair of NICs on tcp / verbs): a thousand peers outgrow the usual soft limit of 1024.
  if (rlimit files; getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
  }

  absl::StatusOr<ferry::AgentConfig> parsed = ConfigFromFlags();
  if (!parsed.ok()) return Fail(std::string(parsed.status().message()));
  const ferry::AgentConfig& config = *parsed;

  // Block the stop signals before any thread starts, then wait for them here.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  absl::StatusOr<std::unique_ptr<ferry::Agent>> agent = ferry::Agent::Start(config);
  if (!agent.ok()) return Fail(std::string(agent.status().message()));

  const std::string ready_file = absl::GetFlag(FLAGS_ready_file);
  if (!ready_file.empty()) {
    std::string tmp = ready_file + ".tmp";
    std::ofstream out(tmp);
    out << "pid=" << getpid() << "\n"
        << "incarnation=" << (*agent)->incarnation() << "\n"
        << "socket=" << config.socket << "\n"
        << "metrics_port=" << (*agent)->metrics_port() << "\n"
        << "peer_address=" << (*agent)->advertise_address() << "\n";
    out.close();
    rename(tmp.c_str(), ready_file.c_str());
  }

  int sig = 0;
  sigwait(&stop_signals, &sig);
  FERRY_LOG(INFO) << "signal " << sig << ": draining";
  (*agent)->Shutdown(absl::Milliseconds(config.shutdown_grace_ms));
  return 0;
}
