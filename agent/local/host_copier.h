// HostCopier: node-local transfers between host regions, by memcpy on a small pool.
//
//   HostCopier copier(/*threads=*/2);
//   copier.Submit(transfer, done);   // done(OK) once every chunk is in the destination
//
// Source and destination are both mapped in the agent, so one pass copies each chunk
// directly: no bounce, no NIC. Deadlines are checked between chunks. A small transfer
// (kInlineBytes, kInlineChunks) is copied inside Submit, on the caller's thread, and
// `done` runs there: waking a copier thread would cost more than the copy (a Write RPC
// or a queue entry of a few KiB).
#ifndef FERRY_AGENT_LOCAL_HOST_COPIER_H_
#define FERRY_AGENT_LOCAL_HOST_COPIER_H_

#include <deque>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "agent/transfer/executor.h"

namespace ferry {

class HostCopier : public TransferExecutor {
 public:
  explicit HostCopier(int threads);
  // Finishes every queued transfer, then joins the workers.
  ~HostCopier() override;

  void Submit(std::shared_ptr<Transfer> t, Done done) override;

 private:
  static constexpr uint64_t kInlineBytes = 64 << 10;
  static constexpr size_t kInlineChunks = 64;

  void Work();
  // Copies `t` unless its deadline has already passed.
  static absl::Status Run(const Transfer& t);
  static absl::Status Copy(const Transfer& t);

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<std::pair<std::shared_ptr<Transfer>, Done>> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_;
};

}  // namespace ferry

#endif  // FERRY_AGENT_LOCAL_HOST_COPIER_H_
