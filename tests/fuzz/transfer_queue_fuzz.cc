// Fuzz target: a shared-memory write queue written by an untrusted pod.
//
// Input: 4 bytes selecting the entry count (and whether to keep the given header), then
// the bytes of the ring (header, submissions, completions, a 64-id block table) as the client left them. The agent's
// side must refuse a bad header with a reason, and on a mapped queue never read or write outside the ring, whatever
// the cursors say: Take() copies out at most what exists, then the queue either works or reports itself broken; a
// paged entry's block ids are copied only from inside the table.
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "agent/queue/transfer_queue.h"
#include "proto/ferry/wire/ring_layout.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  uint32_t entries;
  memcpy(&entries, data, 4);
  entries = 8u << (entries % 4);  // 8 .. 64: valid sizes, keeps the ring small
  constexpr uint32_t kTableIds = 64;
  const size_t bytes = ferry::queue::RingBytes(entries, kTableIds);
  int ring = memfd_create("fuzz-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (ring < 0 || ftruncate(ring, static_cast<off_t>(bytes)) != 0) abort();
  size_t body = std::min(size - 4, bytes);
  if (body > 0 && pwrite(ring, data + 4, body, 0) != static_cast<ssize_t>(body)) abort();
  // Mostly a well-formed header, so the fuzzer spends its time on cursors and entries;
  // the selector's top bit leaves the header as given (bad magic, wrong entry count).
  if ((data[3] & 0x80) == 0) {
    const uint32_t header[2] = {ferry::queue::kRingMagic, entries};
    if (pwrite(ring, header, sizeof(header), 0) != sizeof(header)) abort();
  }
  int doorbell[2];  // the completion doorbell: the agent's end, and the client's
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, doorbell) != 0) abort();
  const ferry::UniqueFd client_end(doorbell[1]);
  absl::StatusOr<std::shared_ptr<ferry::TransferQueue>> q =
      ferry::TransferQueue::Open(1, 1, ferry::UniqueFd(ring), ferry::UniqueFd(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
                                 ferry::UniqueFd(doorbell[0]), entries, kTableIds, {});
  if (!q.ok()) {
    if (q.status().message().empty()) abort();
    return 0;
  }
  ferry::queue::SubmitEntry out[16];
  std::vector<uint64_t> src_ids, dst_ids;
  for (int round = 0; round < 8 && !(*q)->broken(); ++round) {
    size_t n = (*q)->Take(out, 16);
    if (n > 16) abort();
    for (size_t i = 0; i < n; ++i) {
      if ((*q)->CopyBlockIds(out[i].table_index, out[i].blocks, &src_ids, &dst_ids).ok()) {
        const uint64_t end = uint64_t{out[i].table_index} + 2 * uint64_t{out[i].blocks};
        if (out[i].blocks == 0 || end > kTableIds || src_ids.size() != out[i].blocks ||
            dst_ids.size() != out[i].blocks) {
          abort();
        }
      }
      ferry::queue::CompletionEntry c{};
      c.user_data = out[i].user_data;
      (*q)->Complete(c);
    }
    (*q)->HasSubmissions();
  }
  return 0;
}
