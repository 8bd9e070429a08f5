// NicInterface: what a NIC's worker (agent/engine/rail_worker) needs of one NIC: post a
// one-sided write or a small message, read completions, and a way to sleep until there
// may be some.
//
//   NicInterface* nic = fabric_nic.get();             // FabricNic implements it
//   ssize_t rc = nic->PostWrite(local, len, desc, peer, remote_addr, key, &op->context);
//   rc = nic->PostMessage(record.data(), record.size(), peer, &op->context);
//   void* done[64];
//   ssize_t n = nic->ReadCompletions(done, 64);       // n contexts, 0, or -FI_EAVAIL
//
// FabricNic is libfabric's implementation (efa, verbs;ofi_rxm, tcp;ofi_rxm); unit tests
// drive RailWorker with a fake NIC to inject -FI_EAGAIN, dropped connections and error
// completions in milliseconds. Return codes keep libfabric's meaning (0, -FI_EAGAIN,
// -FI_EAVAIL, other negative fi_errno values) so the worker has one error vocabulary.
// Every method but name() is called only from the worker's thread.
#ifndef FERRY_AGENT_FABRIC_NIC_INTERFACE_H_
#define FERRY_AGENT_FABRIC_NIC_INTERFACE_H_

#include <rdma/fabric.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace ferry {

// The largest message PostMessage takes (a notification record: a 4 KiB payload and its
// header).
inline constexpr size_t kMaxFabricMessageBytes = 8192;

class NicInterface {
 public:
  virtual ~NicInterface() = default;

  // "nic0": the label of this NIC's metrics and log lines.
  virtual const std::string& name() const = 0;

  // Posts one write of [local, local + len) (registration `desc`) to `key` at
  // `remote_addr` of `peer`. Returns 0 (a completion for `context` will follow),
  // -FI_EAGAIN (the provider's queue is full: read completions, then post again), or
  // another negative fi_errno (nothing was posted). Never FI_MORE: a provider that honours
  // it (efa) rings no doorbell until a later post without it, and the worker cannot
  // promise one (the window, credit or a cap may end its turn; a queued op may be dropped).
  virtual ssize_t PostWrite(const void* local, size_t len, void* desc, fi_addr_t peer, uint64_t remote_addr,
                            uint64_t key, void* context) = 0;

  // Posts a two-sided message of [data, data + len) (len <= kMaxFabricMessageBytes) to
  // `peer`, delivery-complete: its completion means the message is in a receive buffer
  // of the peer. The NIC copies it into a buffer of its own, so `data` may go as soon as
  // this returns. Returns as PostWrite does (-FI_EAGAIN also while all the NIC's send
  // buffers are in flight; -FI_ENOSYS from a NIC without messages).
  virtual ssize_t PostMessage(const void* data, size_t len, fi_addr_t peer, void* context) = 0;

  // Takes up to `max` successful completions, storing their contexts. Returns how many
  // (0: none now), -FI_EAVAIL when an error completion is next (ReadError takes it), or
  // another negative fi_errno.
  virtual ssize_t ReadCompletions(void** contexts, size_t max) = 0;

  struct ErrorCompletion {
    void* context = nullptr;  // the failed post's context; null for errors of no op
    int err = 0;              // a positive fi_errno (FI_ECONNRESET, FI_EIO, ...)
    std::string detail;       // the provider's explanation, for the log and the status
  };
  // Takes the error completion ReadCompletions announced; false if there is none.
  virtual bool ReadError(ErrorCompletion* out) = 0;

  // Readable when completions may be waiting; -1 when the NIC has no such fd (the worker
  // then polls every millisecond while idle).
  virtual int wait_fd() const = 0;
  // True when it is safe to block on wait_fd() (nothing is already waiting).
  virtual bool TryWait() = 0;
};

}  // namespace ferry

#endif  // FERRY_AGENT_FABRIC_NIC_INTERFACE_H_
