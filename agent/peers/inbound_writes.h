// InboundWrites: the notified writes other agents are making into this agent's regions,
// so that a receiver is never left waiting for one whose writer's agent died.
//
// A writer's agent announces each notified write as it starts (a NotifyRequest with
// `begin`: a fabric message posted ahead of the data, or a Notify call); the write's own
// notification (any code) ends it. While writes from an agent are in flight for longer
// than `probe_after`, this agent pings it; once it fails `lost_after_failures` pings in a
// row, or answers with another incarnation (it restarted), every write of its still in
// flight ends for its receiver with an UNAVAILABLE notification. A write whose writer
// answers but never says how it ended is ended DEADLINE_EXCEEDED `grace` after its
// deadline. Before its receiver is told, the writer is fenced, so that no further
// operation of the write lands: its write window closes, or (without one) its agent's
// keys of the region close and it is refused new ones until the write's deadline has
// passed (Region::writers).
//
//   InboundWrites inbound(options, &transfers);    // before the peer API serves
//   inbound.StartProbing(ping);                     // once agents can be pinged
//   inbound.Begin(request, region);                 // PeerService, on `begin`
//   inbound.End(source_incarnation, transfer_id);   // PeerService, on the end
//
// An end may overtake its begin (nothing orders the two): the begin that comes after is
// then dropped. Thread-safe.
#ifndef FERRY_AGENT_PEERS_INBOUND_WRITES_H_
#define FERRY_AGENT_PEERS_INBOUND_WRITES_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/common/clock.h"
#include "agent/memory/region.h"
#include "agent/transfer/transfer.h"
#include "proto/ferry/v1/peer.pb.h"

namespace ferry {

struct InboundWritesOptions {
  absl::Duration probe_after = absl::Milliseconds(300);  // a write older than this gets its writer pinged
  absl::Duration probe_every = absl::Milliseconds(200);  // per writing agent
  absl::Duration probe_timeout = absl::Milliseconds(400);
  int lost_after_failures = 2;              // pings in a row
  absl::Duration grace = absl::Seconds(2);  // past a write's deadline
  size_t max_writes = 1 << 16;              // held at once; a begin beyond is refused
  bool run_thread = true;                   // false: the caller runs Check (tests)
  const Clock* clock = Clock::Real();       // when a write began, and its writer was last heard
};

class InboundWrites {
 public:
  // The incarnation of the agent at `address` (its Peer.Ping), or why it did not answer.
  using Ping = std::function<absl::StatusOr<uint64_t>(const std::string& address, absl::Duration timeout)>;

  InboundWrites(InboundWritesOptions options, TransferManager* transfers);
  ~InboundWrites();  // StopProbing; the writes still held end unreported

  // Starts the checking thread (unless options.run_thread is false). Until then writes
  // are held, not checked. Call once.
  void StartProbing(Ping ping);
  // Stops it (before what `ping` uses goes away); Begin and End still work.
  void StopProbing();
  // Closes write window `id` (true if it was open): a lost write through a window is
  // fenced before its receiver is told. Set before StartProbing.
  void set_fence(std::function<bool(uint64_t window_id)> fence) { fence_ = std::move(fence); }

  // A begin (req.begin(), for `region`, already authorized by its token). RESOURCE_EXHAUSTED
  // past max_writes; INVALID_ARGUMENT without a transfer id or source.
  absl::Status Begin(const v1::NotifyRequest& req, const std::shared_ptr<Region>& region);
  // The write's own notification arrived (delivered by the caller).
  void End(uint64_t source_incarnation, uint64_t transfer_id);

  // One round: pings the agents whose writes are due, ends the writes of those lost or
  // past their grace. The thread calls it every probe_every / 2.
  void Check(absl::Time now);

  // Writes held that go through write window `window_id` (NotifyRequest.window_id): a
  // window's Close waits for them.
  size_t InWindow(uint64_t window_id) const;
  size_t size() const;  // writes held
  size_t sources() const;

 private:
  struct Write {
    std::weak_ptr<Region> region;
    uint64_t tag = 0;
    std::string payload;
    absl::Time begun;
    absl::Time deadline;
    uint64_t window_id = 0;
  };
  struct Source {
    std::string address;
    std::map<uint64_t, Write> writes;  // by transfer id
    // Ends that came before their begins (bounded, oldest first out).
    absl::flat_hash_set<uint64_t> ended_early;
    std::deque<uint64_t> ended_order;
    absl::Time last_probe = absl::InfinitePast();
    absl::Time last_activity;
    int failed_pings = 0;
  };
  struct Lost {
    Write write;
    uint64_t transfer_id = 0;
    uint64_t source_incarnation = 0;
    absl::Status status;
  };

  void Run();
  // Counts a held write out (the caller erases it).
  void Forget(const Write& w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends `lost` for their receivers (outside the lock), found lost at `now`.
  void Tell(std::vector<Lost> lost, absl::Time now);

  const InboundWritesOptions options_;
  TransferManager* const transfers_;
  Ping ping_;  // set once by StartProbing, before the thread starts
  std::function<bool(uint64_t)> fence_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Source> sources_ ABSL_GUARDED_BY(mu_);  // by incarnation
  size_t writes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<uint64_t, size_t> per_window_ ABSL_GUARDED_BY(mu_);  // window id -> writes held
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool probing_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace ferry

#endif  // FERRY_AGENT_PEERS_INBOUND_WRITES_H_
