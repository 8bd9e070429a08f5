// FabricNic: one libfabric RDM endpoint on one NIC, and what it needs to post
// one-sided writes: domain, address vector, completion queue, memory registration.
//
//   absl::StatusOr<std::unique_ptr<FabricNic>> nic = FabricNic::Open({"tcp;ofi_rxm", "127.0.0.1", 0});
//   absl::StatusOr<NicRegistration> mr = (*nic)->Register(buf, len);   // per region
//   absl::StatusOr<fi_addr_t> peer = (*nic)->InsertPeer(remote_name);
//   (*nic)->PostWrite(...);      // only from the NIC's worker thread (NicInterface)
//
// The NIC honours the mr_mode the provider returns (offset or virtual addressing,
// provider-chosen keys, FI_MR_LOCAL descriptors, FI_MR_ENDPOINT binding) instead of
// assuming one. Writes request FI_DELIVERY_COMPLETE: a completion means the bytes are in
// the target's memory, not merely sent.
//
// Messages: where the provider has FI_MSG (tcp;ofi_rxm, verbs;ofi_rxm and efa all do)
// and the owner gives an `on_message` handler, the NIC keeps kMessageBuffers registered
// receive buffers posted and as many send buffers. A message that arrives is handed to
// `on_message` from ReadCompletions (the worker's thread), then its buffer is posted
// again; what the worker sees of the NIC's CQ is only its own ops' completions. The
// agent sends its notifications this way (agent/engine/fabric_engine.h).
//
// GPU memory: when the provider offers FI_HMEM (GPUDirect RDMA on efa and verbs, CUDA
// IPC on shm), the NIC asks for it and registers CUDA memory with FI_HMEM_CUDA and its
// device, so writes go to and from GPU memory directly; otherwise hmem() is false and
// GPU memory takes the staged path (agent/staged).
#ifndef FERRY_AGENT_FABRIC_FABRIC_NIC_H_
#define FERRY_AGENT_FABRIC_FABRIC_NIC_H_

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_rma.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "agent/fabric/nic_interface.h"
#include "agent/memory/region.h"

namespace ferry {

struct FabricNicOptions {
  // A provider name as fi_info prints it ("tcp;ofi_rxm", "efa", "verbs;ofi_rxm"), or
  // "auto": efa, then verbs;ofi_rxm, then tcp;ofi_rxm.
  std::string provider = "auto";
  // IPv4 address or interface name the endpoint binds to; or, for NICs without an IP
  // (EFA), the RDMA device or libfabric domain ("rdmap16s27", "rdmap16s27-rdm").
  std::string iface;
  int index = 0;
  // >= 0: this endpoint is the latency lane of NIC `latency_lane_of` (the same device,
  // its own domain, endpoint and worker; see FabricEngineOptions::latency_lanes).
  int latency_lane_of = -1;
  // Overrides the provider's transmit queue depth when > 0 (tests force -FI_EAGAIN).
  size_t tx_size = 0;
  // Ask for FI_HMEM (device memory registration) where the provider has it.
  bool hmem = true;
  // Receives messages from peers (called on the NIC worker's thread, with a view into a
  // receive buffer that is reused once it returns). Null: the NIC receives none.
  std::function<void(absl::string_view)> on_message;
};

class FabricNic : public NicInterface {
 public:
  static absl::StatusOr<std::unique_ptr<FabricNic>> Open(const FabricNicOptions& options);
  ~FabricNic() override;

  const std::string& name() const override { return name_; }  // "nic0", a lane "nic0-latency"
  int latency_lane_of() const { return latency_lane_of_; }    // -1: a NIC of its own
  const std::string& provider() const { return provider_; }   // as resolved, e.g. "tcp;ofi_rxm"
  const std::string& iface() const { return iface_; }         // the bound IPv4 address, or the domain
  // Where the NIC is in sysfs (agent/topology): the interface holding iface(), and the
  // libfabric domain ("mlx5_0" for verbs, "rdmap16s27-rdm" for efa, the netdev for tcp).
  const std::string& netdev() const { return netdev_; }
  const std::string& domain_name() const { return domain_name_; }
  // Raw endpoint name for peers' address vectors, and a printable form.
  const std::string& address() const { return address_; }
  std::string address_string() const;
  uint64_t max_msg_size() const { return max_msg_size_; }
  size_t tx_size() const { return tx_size_; }

  // Whether GPU memory can be registered (the provider granted FI_HMEM).
  bool hmem() const { return hmem_; }
  // Whether the NIC receives messages (the provider granted FI_MSG and on_message was
  // given): what peers ask before they send one (HandshakeResponse.fabric_messages).
  bool messages() const { return messages_; }

  // Registers [buf, buf + len) for local and remote writes on this NIC. Thread-safe.
  // `cuda_device` >= 0: buf is CUDA memory of that device (needs hmem()).
  absl::StatusOr<NicRegistration> Register(void* buf, uint64_t len, fid_mr** mr_out, int cuda_device = -1);

  absl::StatusOr<fi_addr_t> InsertPeer(const std::string& raw_address);
  void RemovePeer(fi_addr_t addr);

  // NicInterface, for the NIC's RailWorker. The wait fd is the CQ's (FI_WAIT_FD), or -1
  // when the provider has none.
  ssize_t PostWrite(const void* local, size_t len, void* desc, fi_addr_t peer, uint64_t remote_addr, uint64_t key,
                    void* context) override;
  ssize_t PostMessage(const void* data, size_t len, fi_addr_t peer, void* context) override;
  ssize_t ReadCompletions(void** contexts, size_t max) override;
  bool ReadError(ErrorCompletion* out) override;
  int wait_fd() const override { return wait_fd_; }
  bool TryWait() override;

 private:
  FabricNic() = default;
  absl::Status OpenMessageBuffers();
  // A message buffer, receive or send. `context` comes first: its address is what the
  // CQ hands back.
  struct MessageSlot {
    fi_context2 context;
    uint8_t* buf = nullptr;
    void* op_context = nullptr;  // a send's: the worker's op it completes
    MessageSlot* next_free = nullptr;
  };
  static constexpr size_t kMessageBuffers = 32;  // each way
  // The slot a completion context is, or null for the worker's own ops.
  MessageSlot* SlotOf(void* context);
  bool IsReceive(const MessageSlot* s) const { return s < &slots_[kMessageBuffers]; }
  void PostReceive(MessageSlot* s);
  // A one-buffer fi_msg over slot `s`'s `iov` (which the caller fills and keeps).
  fi_msg SlotMessage(MessageSlot* s, iovec* iov, fi_addr_t peer);

  std::string name_, provider_, iface_, netdev_, domain_name_, address_;
  int latency_lane_of_ = -1;
  fi_info* info_ = nullptr;
  fid_fabric* fabric_ = nullptr;
  fid_domain* domain_ = nullptr;
  fid_av* av_ = nullptr;
  fid_cq* cq_ = nullptr;
  fid_ep* ep_ = nullptr;
  int wait_fd_ = -1;
  bool hmem_ = false;
  uint64_t mr_mode_ = 0;
  uint64_t max_msg_size_ = 0;
  size_t tx_size_ = 0;
  std::atomic<uint64_t> next_key_{1};

  bool messages_ = false;
  std::function<void(absl::string_view)> on_message_;
  // kMessageBuffers receive slots, then kMessageBuffers send slots, over one registered
  // buffer. Touched only from the worker's thread once Open returns.
  std::vector<MessageSlot> slots_;
  std::unique_ptr<uint8_t[]> message_memory_;
  fid_mr* message_mr_ = nullptr;
  void* message_desc_ = nullptr;
  MessageSlot* free_send_ = nullptr;
  std::vector<MessageSlot*> unposted_;  // receive slots a full queue refused: posted again later
};

// Releases the MRs of one region on every NIC (the region's TransportAttachment).
class FabricRegistrations : public TransportAttachment {
 public:
  ~FabricRegistrations() override;
  void Add(fid_mr* mr) { mrs_.push_back(mr); }

 private:
  std::vector<fid_mr*> mrs_;
};

// "1.17.0": the libfabric library version in use.
std::string LibfabricVersion();

}  // namespace ferry

#endif  // FERRY_AGENT_FABRIC_FABRIC_NIC_H_
