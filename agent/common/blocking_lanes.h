// BlockingLanes: runs work that may block (a handshake with a peer, an RPC to another
// agent) off a polling thread, in lanes: one per key (a pod's uid), so that one pod's
// blocked work never delays another pod's.
//
//   BlockingLanes lanes(/*max_threads=*/8, "ferry-slowlane");
//   lanes.Post(/*key=*/uid, [=] { SendToOtherAgent(entry); });  // never blocks
//   lanes.Stop();   // runs what was posted, then joins
//
// A lane's work runs in the order posted, one item at a time; different lanes run at
// once on up to `max_threads` threads, started as they are needed, and taken round-robin
// over the lanes with work. So a key blocks at most one thread: another key waits only
// when `max_threads` keys are blocked at once.
#ifndef FERRY_AGENT_COMMON_BLOCKING_LANES_H_
#define FERRY_AGENT_COMMON_BLOCKING_LANES_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"

namespace ferry {

class BlockingLanes {
 public:
  using Work = std::function<void()>;

  BlockingLanes(size_t max_threads, std::string thread_name);
  ~BlockingLanes();  // Stop()
  BlockingLanes(const BlockingLanes&) = delete;
  BlockingLanes& operator=(const BlockingLanes&) = delete;

  // Queues `work` on `key`'s lane. After Stop(), runs it on the caller's thread.
  void Post(uint64_t key, Work work);
  // Runs everything posted, then joins the threads. Idempotent.
  void Stop();
  // Items posted and not yet finished, over all lanes.
  size_t pending() const;

 private:
  void Run();

  const size_t max_threads_;
  const std::string thread_name_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, std::deque<Work>> lanes_ ABSL_GUARDED_BY(mu_);  // keys with work
  std::deque<uint64_t> ready_ ABSL_GUARDED_BY(mu_);                             // keys with work and no thread on them
  absl::flat_hash_set<uint64_t> running_ ABSL_GUARDED_BY(mu_);                  // keys a thread is on
  size_t idle_ ABSL_GUARDED_BY(mu_) = 0;
  size_t pending_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry

#endif  // FERRY_AGENT_COMMON_BLOCKING_LANES_H_
