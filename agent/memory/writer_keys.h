// WriterKeys: a region's fabric keys, one set per writing agent, so that this agent can
// take one writer's access away without touching the others'.
//
// Every agent that opens a region for fabric writes (Peer.OpenRegion, which names the
// writer's incarnation) gets keys of its own, registered over the whole region. Fence
// closes a writer's keys, so the NIC refuses its later operations, and refuses it new
// keys (and staged commits) until a time. A notified write its receiver was told will
// not complete is fenced so before the receiver hears of it (InboundWrites): a writer's
// agent that was only stopped, and resumes, lands no further operation of that write.
// Write windows fence the writes through them the same way, with keys of their own.
//
//   absl::StatusOr<std::vector<NicRegistration>> keys =
//       region->writers().Keys(incarnation, region->backing(), registrar);
//   region->writers().Fence(incarnation, absl::Now() + absl::Seconds(30), "its write 7 was declared lost");
//   absl::Status ok = region->writers().Admit(incarnation);  // before a staged commit
//
// At most kMaxWriters writers hold keys at once: a new one closes the keys of the writer
// whose keys are oldest (its next operation fails, its connection is made again and it
// opens the region afresh, as after any revoked key); fenced writers hold none and stay
// until their fence ends. Thread-safe.
#ifndef FERRY_AGENT_MEMORY_WRITER_KEYS_H_
#define FERRY_AGENT_MEMORY_WRITER_KEYS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/memory/registration.h"

namespace ferry {

class WriterKeys {
 public:
  static constexpr size_t kMaxWriters = 256;

  // Writer `incarnation`'s keys, one per NIC, made with `registrar` on its first open.
  // FAILED_PRECONDITION while it is fenced (saying why and for how long);
  // INVALID_ARGUMENT for incarnation 0.
  absl::StatusOr<std::vector<NicRegistration>> Keys(uint64_t incarnation, const MemoryBacking& backing,
                                                    RegionRegistrar& registrar);
  // Closes writer `incarnation`'s keys and refuses it until `until` (a later fence of the
  // same writer extends it, never shortens it). `why` ends the refusals' message.
  void Fence(uint64_t incarnation, absl::Time until, std::string why);
  // OK unless writer `incarnation` is fenced now.
  absl::Status Admit(uint64_t incarnation) const;

  size_t writers() const;  // with keys or fenced

 private:
  struct Writer {
    RegionRegistration keys;  // empty while fenced
    absl::Time opened;        // its keys were made
    absl::Time fenced_until = absl::InfinitePast();
    std::string why;
  };
  absl::Status Refusal(uint64_t incarnation, const Writer& w, absl::Time now) const;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Writer> writers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry

#endif  // FERRY_AGENT_MEMORY_WRITER_KEYS_H_
