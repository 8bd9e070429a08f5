// AgentConfig: every setting of ferryd, filled from its flags (defined in one place,
// agent/main/ferryd.cc).
#ifndef FERRY_AGENT_CONFIG_CONFIG_H_
#define FERRY_AGENT_CONFIG_CONFIG_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "agent/qos/qos_policy.h"

namespace ferry {

inline constexpr char kFerryVersion[] = "0.1.0";

struct AgentConfig {
  std::string socket = "/run/ferry/ferry.sock";
  std::string session_socket;  // derived from `socket` when empty
  mode_t socket_mode = 0660;
  gid_t socket_gid = static_cast<gid_t>(-1);
  std::vector<uid_t> allowed_uids;  // empty: any uid that can open the socket
  std::string metrics_address = "127.0.0.1:9464";
  // Agent-to-agent service (host:port); empty disables cross-node transfers.
  std::string peer_address;
  // Address written into descriptors (defaults to the bound peer address).
  std::string advertise_address;
  std::string fabric_provider = "auto";
  std::vector<std::string> fabric_ifaces;  // one per NIC: IPv4 address or interface name
  size_t fabric_tx_size = 0;               // > 0 overrides the provider's queue depth
  bool fabric_hmem = true;                 // FI_HMEM for GPU memory where offered
  bool fabric_messages = true;             // notifications by fabric message where both ends can
  bool fabric_latency_lane = false;        // a second endpoint per NIC for latency-class writes
  uint64_t fabric_max_op_bytes = 1 << 20;  // larger chunks are split (and striped)
  uint32_t fabric_spin_us = 100;           // NIC worker polling after activity
  std::string sysfs_root = "/sys";         // topology discovery (a fake tree in tests)
  // The pod's DRA-claimed devices (agent/dra): its NICs instead of sysfs's; they are
  // the fabric NICs when fabric_ifaces is empty.
  std::string claimed_devices;
  bool pin_workers = true;     // NIC workers on their NIC's NUMA-local cores
  size_t max_peers = 4096;     // agents connected at once; 0: no limit
  uint32_t peer_idle_s = 300;  // close connections unused this long; 0: never
  // Agent-to-agent mTLS: PEM files (all three, or none for plaintext), and the name
  // every agent's certificate carries (a DNS SAN), checked instead of the peer's IP.
  std::string peer_tls_cert, peer_tls_key, peer_tls_ca;
  std::string peer_tls_server_name = "ferry-peer";

  uint64_t max_region_bytes = 1ull << 40;
  uint64_t max_chunks_per_write = 1 << 20;
  size_t max_pending_fds = 64;
  size_t max_inflight_transfers = 4096;
  size_t max_queued_notifications = 65536;  // per session; more are dropped and counted
  size_t max_regions_per_session = 4096;
  size_t max_regions_per_uid = 16384;  // one pod's regions over all its sessions
  size_t max_regions = 32768;          // the node's; each is a mapping (vm.max_map_count)
  size_t max_sessions = 256;           // the node's sessions (each may hold an inbox)
  size_t max_sessions_per_uid = 64;    // of which one pod (uid) may have
  // Bytes one session's unread notifications (and, apart, its completions) may hold.
  size_t max_queued_notification_bytes = 1 << 20;
  size_t max_queues = 256;           // shared-memory transfer queues, all sessions together
  size_t max_queues_per_uid = 64;    // of which one pod (uid) may have
  bool queues_on_nic_worker = true;  // the first NIC worker takes queue submissions
  uint32_t transfer_timeout_ms = 30000;
  // Longest deadline a request may ask for: a transfer, a message or a queue's entries
  // may hold their pod's resources (and its lane of cross-agent messages) that long.
  uint32_t max_transfer_timeout_ms = 600000;
  uint32_t max_wait_ms = 60000;
  int local_copy_threads = 2;
  bool gpu_kernel_pull = false;
  // Staged path (agent/staged).
  uint64_t staging_buffer_bytes = 32 << 20;
  uint64_t stage_bytes = 1 << 20;
  uint32_t max_staging_buffers = 64;
  bool stage_host_regions = false;
  uint32_t shutdown_grace_ms = 5000;
  // Traffic classes and each pod's share of the NICs (--qos_*).
  QosPolicy qos;
};

}  // namespace ferry

#endif  // FERRY_AGENT_CONFIG_CONFIG_H_
