// TransferWatch: the fabric transfers in flight (and the notification messages sent for
// them), held weakly, so that each ends by its deadline however its peer behaves.
//
// The engine adds every TransferState it posts ops for; its watchdog thread sweeps the
// list every few milliseconds. A sweep forgets the finished, stops those whose writing
// pod is gone (no op posted after; they end once the posted ones are done, by the
// deadline at the latest, so they stay watched) and hands back those past their
// deadline for the caller to finish. A restarted peer's transfers, and at shutdown all
// of them, are failed through Fail.
//
//   watch.Add(state);                           // as its ops are posted
//   while (watch.AwaitWork(absl::Seconds(1))) {  // false once stopped
//     for (auto& [state, why] : watch.Sweep(clock->Now())) state->Finish(...);
//   }
//   watch.Fail(&peer, absl::UnavailableError("agent restarted"));
//
// Thread-safe.
#ifndef FERRY_AGENT_ENGINE_TRANSFER_WATCH_H_
#define FERRY_AGENT_ENGINE_TRANSFER_WATCH_H_

#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/engine/write_op.h"

namespace ferry {

class TransferWatch {
 public:
  struct Expired {
    std::shared_ptr<TransferState> state;
    absl::Status why;  // DEADLINE_EXCEEDED, saying which transfer
  };

  void Add(const std::shared_ptr<TransferState>& state);
  // Waits up to `timeout` for a transfer to watch (an idle agent stays asleep). False
  // once Stop was called.
  bool AwaitWork(absl::Duration timeout);
  // Wakes AwaitWork for good.
  void Stop();

  // One round at `now`: see above. The expired are no longer watched.
  std::vector<Expired> Sweep(absl::Time now);
  // Finishes with `status` every transfer to `peer` (null: every one) not finished yet.
  void Fail(const PeerConnection* peer, const absl::Status& status);

  size_t size() const;  // held, finished or not, until the next sweep

 private:
  mutable absl::Mutex mu_;
  std::vector<std::weak_ptr<TransferState>> active_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ferry

#endif  // FERRY_AGENT_ENGINE_TRANSFER_WATCH_H_
