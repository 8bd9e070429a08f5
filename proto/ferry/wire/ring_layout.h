// The shared-memory transfer queue: the layout both the client library and the agent
// map. It is the fast path for many small writes, where a gRPC call per transfer would
// cost more than moving the bytes (see tools/bench/RESULTS.md).
//
//   Client                                    Agent (QueuePoller: a NIC worker)
//   write SubmitEntry at sq[tail % n]
//   sq_tail.store(tail + 1)          ──────►  copies entries out, validates each exactly
//   (submit eventfd if agent_sleeping)        like a Write RPC, starts the transfers
//                                             ...
//   reads cq[head % n]               ◄──────  CompletionEntry at cq[cq_tail % n]
//   cq_head.store(head + 1)                   (doorbell socket if client_waiting and at
//                                              least that many are unreaped)
//
// The memory is the client's (a memfd passed on the session socket), so the agent
// treats every byte of it as untrusted: it copies an entry before looking at it, trusts
// no cursor beyond its own bookkeeping, and never writes more completions than there
// are free slots. A client that corrupts its queue hurts only itself.
//
// Cursors are free-running uint32 counters (index = counter % entries). Each cursor has
// one writer and sits on its own cache line.
//
// A queue may also hold a block table after its completion ring (CreateQueueRequest
// table_ids): uint32 block ids that paged entries name by position, so a KV-cache
// handoff of thousands of blocks per layer is one entry per layer and no RPC. The client
// writes the ids before posting the entries that name them and leaves them alone until
// those entries completed; the agent copies them out when it takes the entry.
#ifndef FERRY_PROTO_FERRY_WIRE_RING_LAYOUT_H_
#define FERRY_PROTO_FERRY_WIRE_RING_LAYOUT_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace ferry::queue {

inline constexpr uint32_t kRingMagic = 0x31515246;  // "FRQ1"
inline constexpr uint32_t kMinEntries = 8;
inline constexpr uint32_t kMaxEntries = 4096;
// The largest block table: 4 Mi ids (16 MiB), a 16,384-block mapping 128 times over.
inline constexpr uint32_t kMaxTableIds = 4u << 20;

// SubmitEntry.flags
inline constexpr uint32_t kFlagNotify = 1;
inline constexpr uint32_t kFlagPaged = 2;
inline constexpr uint32_t kFlagBatch = 4;
inline constexpr uint32_t kFlagMessage = 8;
inline constexpr uint32_t kFlagWindow = 16;        // with kFlagBatch: see WindowRef
inline constexpr uint32_t kFlagOpenWindow = 32;    // alone: see WindowOpen
inline constexpr uint32_t kFlagCloseWindow = 64;   // alone
inline constexpr uint32_t kFlagWindowSpans = 128;  // with kFlagBatch: see WindowSpan
// The most parts of a batch entry (as ferry.v1.WriteBatchRequest's).
inline constexpr uint32_t kMaxBatchParts = 1024;

struct alignas(64) Cursor {
  std::atomic<uint32_t> value;
};
static_assert(std::atomic<uint32_t>::is_always_lock_free, "cursors are shared between processes");

struct RingHeader {
  uint32_t magic;         // kRingMagic, written by the client before CreateQueue
  uint32_t entries;       // power of two in [kMinEntries, kMaxEntries]
  Cursor sq_tail;         // client: entries submitted
  Cursor sq_head;         // agent: entries consumed (their slots may be reused)
  Cursor cq_tail;         // agent: completions written
  Cursor cq_head;         // client: completions consumed
  Cursor agent_sleeping;  // agent: 1 while blocked on the submit doorbell
  Cursor client_waiting;  // client: while blocked on the completion doorbell, how many
                          // unreaped completions it waits for (>= 1); else 0
};

// One contiguous write: [src_offset, +length) of a region the session registered to
// [dst_offset, +length) of destination `dst_index` (given at CreateQueue).
//
// With kFlagPaged, a paged write (ferry.v1.PagedChunks): `blocks` blocks of `length`
// bytes; block i copies from src_offset + table[table_index + i] * length to
// dst_offset + table[table_index + blocks + i] * length (the source ids, then the
// destination ids, in the queue's block table). Entries may share table ids (one
// mapping for every layer of a request). Without it, table_index and blocks are 0.
//
// With kFlagBatch, one block mapping over several regions as one transfer (ferry.v1.
// WriteBatchRequest: a KV request's layers, one completion and at most one
// notification): dst_index parts (TablePart, kPartIds ids each) at table[table_index],
// then the blocks source ids, then the blocks destination ids, then src_offset bytes of
// notification payload (at most 4 KiB, padded to whole ids; with kFlagNotify only);
// `length` is the block size; src_region and dst_offset are 0. Part p's block i copies from
// parts[p].src_base + src_id[i] * length of region parts[p].src_region to
// parts[p].dst_base + dst_id[i] * length of destination parts[p].dst_index. With
// kFlagNotify the owner of part 0's destination is notified (tag, payload, every part's
// bytes) once every part has landed.
//
// With kFlagBatch | kFlagWindow, every part writes through one write window of its
// destination's owner (ferry.v1.OpenWriteWindow): a WindowRef (kWindowIds ids) at
// table[table_index], then the batch's table as above, from table_index + kWindowIds.
// Each part's destination is then the queue's descriptor with the window's id and token
// in place of the region's.
//
// With kFlagBatch | kFlagWindowSpans, runs of the mapping's blocks go through different
// write windows of their destinations' owner (a decode step's requests of one consumer in
// one write, each through the window its consumer opened for it): a WindowSpans head at
// table[table_index], then `spans` WindowSpans (kWindowSpanIds ids each), then the batch's
// table as above. Span s covers the next spans[s].blocks blocks of the mapping (at least 1
// each, `blocks` together): each part's copies of those blocks go to its destination
// through window s. A span refused (its window closed, expired, or the blocks outside it)
// fails the whole entry, and nothing lands in its blocks: refused before any byte moves,
// except where the writer's agent learns of a closed window on the fabric only as its
// revoked keys, and other spans' bytes land inside their own open windows. Not with
// kFlagWindow.
//
// With kFlagMessage, a message (ferry.v1.SendMessageRequest: no bytes written): the
// owner of destination `dst_index` gets a notification of kind MESSAGE with `tag` and
// the src_offset bytes (at most 4 KiB) at table[table_index]; every other field is 0.
// It completes once the destination's agent has queued it for its owner, as the RPC
// returns; a queue's messages to one destination arrive in the order they were posted.
//
// With kFlagOpenWindow, ferry.v1.OpenWriteWindow without an RPC: a window over some of
// the session's own regions for the owner of destination `dst_index` alone (its writer),
// as a WindowOpen at table[table_index], then its regions' ids (uint64 each), then its
// ranges (uint64 offset, uint64 length each). Every other field is 0. A successful
// completion carries the window's id in `transfer_id` and its 16-byte token in the first
// bytes of `message` (what a writer's descriptor needs: the owner hands id and token on).
// Entries of one queue are taken in order: a message posted after the open's completion
// reaches the writer after the window is open.
//
// With kFlagCloseWindow, ferry.v1.CloseWriteWindow without an RPC: window `src_offset`,
// waiting up to `length` ms (0..--max_wait_ms) for writes still moving through it; the
// same statuses. Every other field is 0.
struct SubmitEntry {
  uint64_t user_data;  // returned in the completion, opaque to the agent
  uint64_t src_region;
  uint64_t src_offset;  // paged: the source base
  uint64_t dst_offset;  // paged: the destination base
  uint64_t length;      // paged: the block size
  uint64_t tag;         // passed to the receiver's notification
  uint32_t dst_index;
  uint32_t flags;
  uint32_t table_index;
  uint32_t blocks;
};
static_assert(sizeof(SubmitEntry) == 64, "ABI");

// One part of a batch entry, as it lies in the block table (copied byte for byte: the
// table is uint32 ids, so a part may sit at any 4-byte boundary).
struct TablePart {
  uint64_t src_region;
  uint64_t src_base;
  uint64_t dst_base;
  uint32_t dst_index;
  uint32_t reserved;  // 0
};
static_assert(sizeof(TablePart) == 32, "ABI");
inline constexpr uint32_t kPartIds = sizeof(TablePart) / sizeof(uint32_t);

// The write window a kFlagWindow batch entry writes through, as it lies in the table.
struct WindowRef {
  uint64_t window_id;
  uint8_t token[16];
};
static_assert(sizeof(WindowRef) == 24, "ABI");
inline constexpr uint32_t kWindowIds = sizeof(WindowRef) / sizeof(uint32_t);

// The head of a kFlagWindowSpans batch entry's table words, and each span after it.
struct WindowSpans {
  uint32_t spans;     // 1..kMaxWindowSpans
  uint32_t reserved;  // 0
};
static_assert(sizeof(WindowSpans) == 8, "ABI");
inline constexpr uint32_t kWindowSpansIds = sizeof(WindowSpans) / sizeof(uint32_t);
struct WindowSpan {
  WindowRef window;   // window_id >= 1
  uint32_t blocks;    // >= 1
  uint32_t reserved;  // 0
};
static_assert(sizeof(WindowSpan) == 32, "ABI");
inline constexpr uint32_t kWindowSpanIds = sizeof(WindowSpan) / sizeof(uint32_t);
// The most spans of one entry, and of its parts times its spans (each a part of the write).
inline constexpr uint32_t kMaxWindowSpans = 256;
inline constexpr uint32_t kMaxWindowSpanParts = 16384;

// The head of a kFlagOpenWindow entry's table words.
struct WindowOpen {
  uint64_t timeout_ms;  // 1..--max_transfer_timeout_ms
  uint32_t regions;     // 1..256
  uint32_t ranges;      // 1..65,536
};
static_assert(sizeof(WindowOpen) == 16, "ABI");
inline constexpr uint32_t kWindowOpenIds = sizeof(WindowOpen) / sizeof(uint32_t);

struct CompletionEntry {
  uint64_t user_data;
  uint64_t transfer_id;  // 0 when the entry was refused before it started
  uint64_t bytes;
  uint64_t duration_ns;
  int32_t code;       // absl / gRPC status code; 0 = OK
  uint32_t path;      // ferry.v1.TransferPath
  char message[216];  // NUL-terminated error message (truncated)
};
static_assert(sizeof(CompletionEntry) == 256, "ABI");

inline constexpr size_t kSubmitOffset = sizeof(RingHeader);
inline size_t CompletionOffset(uint32_t entries) { return kSubmitOffset + size_t{entries} * sizeof(SubmitEntry); }
// Where the block table starts (64-byte aligned), and the ring's size with `table_ids`.
inline size_t TableOffset(uint32_t entries) {
  return CompletionOffset(entries) + size_t{entries} * sizeof(CompletionEntry);
}
inline size_t RingBytes(uint32_t entries, uint32_t table_ids = 0) {
  return TableOffset(entries) + size_t{table_ids} * sizeof(uint32_t);
}
static_assert(sizeof(RingHeader) % 64 == 0 && sizeof(SubmitEntry) % 64 == 0 && sizeof(CompletionEntry) % 64 == 0,
              "the table starts 64-byte aligned");
inline bool ValidEntries(uint32_t n) { return n >= kMinEntries && n <= kMaxEntries && (n & (n - 1)) == 0; }

}  // namespace ferry::queue

#endif  // FERRY_PROTO_FERRY_WIRE_RING_LAYOUT_H_
