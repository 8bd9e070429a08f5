// Fuzz target: a shared-memory write queue written by an untrusted pod.
//
// Input: 4 bytes selecting the entry count (and whether to keep the given header), then
// the bytes of the ring (header, submissions, completions) as the client left them. The agent's side must refuse a bad
// header with a reason, and on a mapped queue never read or write outside the ring, whatever the cursors say: Take()
// copies out at most what exists, then the queue either works or reports itself broken.
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "agent/queue/transfer_queue.h"
#include "proto/ferry/wire/ring_layout.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  uint32_t entries;
  memcpy(&entries, data, 4);
  entries = 8u << (entries % 4);  // 8 .. 64: valid sizes, keeps the ring small
  const size_t bytes = ferry::queue::RingBytes(entries);
  int ring = memfd_create("fuzz-ring", MFD_CLOEXEC);
  if (ring < 0 || ftruncate(ring, static_cast<off_t>(bytes)) != 0) abort();
  size_t body = std::min(size - 4, bytes);
  if (body > 0 && pwrite(ring, data + 4, body, 0) != static_cast<ssize_t>(body)) abort();
  // Mostly a well-formed header, so the fuzzer spends its time on cursors and entries;
  // the selector's top bit leaves the header as given (bad magic, wrong entry count).
  if ((data[3] & 0x80) == 0) {
    const uint32_t header[2] = {ferry::queue::kRingMagic, entries};
    if (pwrite(ring, header, sizeof(header), 0) != sizeof(header)) abort();
  }
  absl::StatusOr<std::shared_ptr<ferry::TransferQueue>> q =
      ferry::TransferQueue::Open(1, 1, ferry::UniqueFd(ring), ferry::UniqueFd(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
                                 ferry::UniqueFd(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)), entries, {});
  if (!q.ok()) {
    if (q.status().message().empty()) abort();
    return 0;
  }
  ferry::queue::SubmitEntry out[16];
  for (int round = 0; round < 8 && !(*q)->broken(); ++round) {
    size_t n = (*q)->Take(out, 16);
    if (n > 16) abort();
    for (size_t i = 0; i < n; ++i) {
      ferry::queue::CompletionEntry c{};
      c.user_data = out[i].user_data;
      (*q)->Complete(c);
    }
    (*q)->HasSubmissions();
  }
  return 0;
}
