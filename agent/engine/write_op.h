// WriteOp and TransferState: the units the fabric engine moves.
//
// A transfer is split into WriteOps (one fi_writemsg each), spread over the NICs of its
// rail. A WriteOp is a small value: the NIC's worker copies it into its per-peer queue
// and, when posting, into one of its preallocated slots (agent/engine/rail_worker.h), so
// nothing is allocated per op. Ops point at their TransferState without counting
// references; the state keeps itself alive until its last op is done (Create), so the
// source region (and with it the memory being read) outlives the last op even if the
// transfer already failed its deadline. The first op error or the deadline, whichever
// comes first, decides the result; later completions are counted and dropped.
#ifndef FERRY_AGENT_ENGINE_WRITE_OP_H_
#define FERRY_AGENT_ENGINE_WRITE_OP_H_

#include <rdma/fabric.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/common/check.h"
#include "agent/transfer/transfer.h"

namespace ferry {

class PeerConnection;

class TransferState {
 public:
  using Done = std::function<void(absl::Status)>;

  // A state for `ops` (> 0) ops, which holds itself until the last of them is done.
  static std::shared_ptr<TransferState> Create(std::shared_ptr<Transfer> t, std::shared_ptr<PeerConnection> peer,
                                               uint64_t ops, Done done) {
    FERRY_DCHECK(ops > 0) << "transfer " << t->id << ": a transfer of no ops would never finish";
    std::shared_ptr<TransferState> state(new TransferState(std::move(t), std::move(peer), ops, std::move(done)));
    state->self_ = state;
    return state;
  }

  // Bytes a message op of this state sends: they live as long as the state, which
  // outlives its ops.
  std::string& message() { return message_; }

  const Transfer& transfer() const { return *transfer_; }
  const std::shared_ptr<PeerConnection>& peer() const { return peer_; }
  absl::Time deadline() const { return transfer_->deadline; }
  // Whether the watchdog should stop it (Transfer::Stopped). A notification message is
  // held only to the deadline: its transfer's bytes have landed.
  absl::Status Stopped(absl::Time now) const {
    if (message_.empty()) return transfer_->Stopped(now);
    if (now > transfer_->deadline) {
      return absl::DeadlineExceededError(absl::StrCat("transfer ", transfer_->id, " passed its deadline"));
    }
    return absl::OkStatus();
  }

  // Posts none of its remaining ops; the transfer ends with `status` once those already
  // posted are done, so no byte of it lands after its result (and the receiver's
  // notification) went out. Unlike Finish, which decides at once (a deadline: the peer
  // may never answer).
  void Stop(const absl::Status& status) {
    {
      absl::MutexLock lock(&mu_);
      if (error_.ok()) error_ = status;
    }
    stopped_.store(true, std::memory_order_release);
  }
  bool stopped() const { return stopped_.load(std::memory_order_acquire); }

  // True once the result is decided; ops of a finished transfer are not posted.
  bool finished() const { return finished_.load(std::memory_order_acquire); }

  // Called once per op. The last one finishes the transfer with the first error seen
  // and lets go of the state (which may destroy it).
  void OpDone(const absl::Status& status) {
    if (!status.ok()) {
      absl::MutexLock lock(&mu_);
      if (error_.ok()) error_ = status;
    }
    const uint64_t before = remaining_.fetch_sub(1, std::memory_order_acq_rel);
    FERRY_DCHECK(before > 0) << "transfer " << transfer_->id << ": more ops done than it has";
    if (before == 1) {
      absl::Status result;
      {
        absl::MutexLock lock(&mu_);
        result = error_;
      }
      Finish(result);
      // Possibly the last reference: nothing after this line may touch *this.
      std::shared_ptr<TransferState> last = std::move(self_);
    }
  }

  // Decides the result now (deadline, peer restart). Returns false if already decided.
  bool Finish(const absl::Status& status) {
    if (finished_.exchange(true, std::memory_order_acq_rel)) return false;
    Done done = std::move(done_);
    done(status);
    return true;
  }

 private:
  TransferState(std::shared_ptr<Transfer> t, std::shared_ptr<PeerConnection> peer, uint64_t ops, Done done)
      : transfer_(std::move(t)), peer_(std::move(peer)), remaining_(ops), done_(std::move(done)) {}

  std::shared_ptr<TransferState> self_;  // set by Create, dropped by the last OpDone
  std::shared_ptr<Transfer> transfer_;
  std::shared_ptr<PeerConnection> peer_;
  std::atomic<uint64_t> remaining_;
  std::atomic<bool> finished_{false};
  std::atomic<bool> stopped_{false};
  absl::Mutex mu_;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  Done done_;
  std::string message_;
};

// One write, as the engine hands it to a NIC's worker; or, with `message`, one message
// of [local, local + length) to `peer` (a notification; no key, desc or remote_addr).
struct WriteOp {
  TransferState* state = nullptr;  // alive until this op's OpDone (see Create)
  bool message = false;
  const uint8_t* local = nullptr;
  uint64_t length = 0;
  void* desc = nullptr;
  fi_addr_t peer = FI_ADDR_UNSPEC;
  uint64_t remote_addr = 0;
  uint64_t key = 0;
  absl::Time keys_since;  // when `key` was fetched from the target (RemoteRegion::opened)
};

}  // namespace ferry

#endif  // FERRY_AGENT_ENGINE_WRITE_OP_H_
