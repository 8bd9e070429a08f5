// gpu_bench: the ferry side of `tools/bench.sh gpu` (run on a GPU host).
//
//   gpu_bench --socket=S [--src_device=0 --dst_device=1]   (on one GPU: --dst_device=0)
//
// Prints two tables, each with a baseline measured in the same run:
//  1. contiguous GPU->GPU writes through ferry (Write + Wait, 8 in flight; and the
//     shared-memory write queue, 16 in flight) vs raw
//     cuMemcpyAsync between the same kind of buffers (this process, peer access on);
//  2. paged KV blocks scattered at random on both sides (one Write of all blocks, from
//     one client and from four; and paged entries through a write queue's block table)
//     vs the raw contiguous copy of the same number of bytes.
// Buffers are cuMemCreate allocations exported as POSIX fds, as pods would register.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <deque>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/cuda_buffer.h"
#include "client/cpp/ferry_client.h"
#include "client/cpp/write_queue.h"
#include "proto/ferry/cuda/cuda_driver.h"

ABSL_FLAG(std::string, socket, "/run/ferry/ferry.sock", "agent socket");
ABSL_FLAG(int, src_device, 0, "source GPU");
ABSL_FLAG(int, dst_device, 1, "destination GPU");
ABSL_FLAG(bool, paged_only, false, "only the paged table");
ABSL_FLAG(bool, contiguous_only, false, "only the contiguous table");
ABSL_FLAG(int, queue_window, 16, "write-queue entries in flight in the contiguous table");
ABSL_FLAG(int, paged_queue_window, 4, "paged write-queue entries in flight in the paged table");
ABSL_FLAG(bool, varint_ids, false, "paged table: the Write RPCs carry their block ids as varints, not packed");
ABSL_FLAG(int, rounds, 3,
          "contiguous table: the queue and raw copies alternate this many times; q_ratio is the median of the "
          "rounds' ratios");
ABSL_FLAG(uint64_t, span_mib, 1024,
          "contiguous table: write i of the queue and raw rows copies at offset (i mod span/size) * size of both "
          "buffers, so that the bytes come from and land in memory (0: every write at offset 0, the same bytes, "
          "which a 50 MiB L2 keeps at 1-4 MiB)");
ABSL_FLAG(int, reap_spin_us, 0,
          "the queue rows' client polls its completions this long before sleeping (as a CUDA stream sync spins)");
ABSL_FLAG(std::string, transport, "staged over tcp;ofi_rxm (127.0.0.1 -> 127.0.0.2)",
          "cross-agent mode: how the agents were started, for the table's header");
ABSL_FLAG(std::string, dst_socket, "",
          "staged mode: the destination agent's socket (another agent with the fabric); the source agent is --socket");

namespace ferry {
namespace {

int Fail(const absl::Status& s) {
  fprintf(stderr, "gpu_bench: %s\n", s.ToString().c_str());
  return 1;
}

// Where write i of `bytes` goes in the contiguous table's buffers (--span_mib).
uint64_t SpanOffset(uint64_t i, uint64_t bytes) {
  const uint64_t slots = std::max<uint64_t>(1, (absl::GetFlag(FLAGS_span_mib) << 20) / bytes);
  return (i % slots) * bytes;
}

// Seconds per copy of `bytes` with cuMemcpyAsync, `count` back to back on one stream;
// with `spread`, copy i at SpanOffset(i) of both buffers.
absl::StatusOr<double> RawCopy(const CudaDriver* cu, CUdeviceptr dst, CUdeviceptr src, uint64_t bytes, int count,
                               bool spread = false) {
  CUstream s;
  FERRY_RETURN_IF_CU_ERROR(cu, cu->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  CUevent a, b;
  cu->cuEventCreate(&a, 0);
  cu->cuEventCreate(&b, 0);
  FERRY_RETURN_IF_CU_ERROR(cu, cu->cuMemcpyAsync(dst, src, bytes, s), "warmup");
  cu->cuEventRecord(a, s);
  for (int i = 0; i < count; ++i) {
    const uint64_t off = spread ? SpanOffset(i, bytes) : 0;
    FERRY_RETURN_IF_CU_ERROR(cu, cu->cuMemcpyAsync(dst + off, src + off, bytes, s), "cuMemcpyAsync");
  }
  cu->cuEventRecord(b, s);
  cu->cuEventSynchronize(b);
  float ms = 0;
  cu->cuEventElapsedTime(&ms, a, b);
  cu->cuEventDestroy(a);
  cu->cuEventDestroy(b);
  cu->cuStreamDestroy(s);
  return ms / 1e3 / count;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 == 1 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// Fills `bytes` at `p` (device memory) with random data.
absl::Status FillRandom(const CudaDriver* cu, CUdeviceptr p, uint64_t bytes) {
  std::vector<uint64_t> host(bytes / 8);
  std::mt19937_64 rng(bytes);
  for (uint64_t& v : host) v = rng();
  return cu->Check(cu->cuMemcpyHtoD(p, host.data(), bytes), "filling the source");
}

// Reads `bytes` at `p` back from GPU `device`, in that GPU's context: an allocation made
// with cuMemCreate is mapped for its own GPU only, so another GPU's context cannot copy it.
absl::Status ReadBack(const CudaDriver* cu, int device, CUdeviceptr p, uint64_t bytes, uint8_t* out) {
  absl::Status s = UseDevice(*cu, device);
  return s.ok() ? cu->Check(cu->cuMemcpyDtoH(out, p, bytes), "reading back") : s;
}

// "verified" if every (src, dst) block pair of `block` bytes matches (device memory
// read back), "MISMATCH" if one differs, "UNREADABLE" if either could not be read.
const char* CheckBlocks(const CudaDriver* cu, int src_device, CUdeviceptr src, int dst_device, CUdeviceptr dst,
                        uint64_t span, const std::vector<uint64_t>& sb, const std::vector<uint64_t>& db, uint64_t n,
                        uint64_t block) {
  std::vector<uint8_t> s(span), d(span);
  absl::Status read = ReadBack(cu, src_device, src, span, s.data());
  if (read.ok()) read = ReadBack(cu, dst_device, dst, span, d.data());
  if (!read.ok()) {
    fprintf(stderr, "gpu_bench: %s\n", read.ToString().c_str());
    return "UNREADABLE";
  }
  for (uint64_t i = 0; i < n; ++i) {
    if (memcmp(&s[sb[i] * block], &d[db[i] * block], block) != 0) return "MISMATCH";
  }
  return "verified";
}

// Seconds per write: `count` writes of `req`, `window` in flight. `submit`, if set,
// gets the mean time a Write RPC took (the request's host-side cost, seen by the pod).
absl::StatusOr<double> FerryWrites(Client& c, const v1::WriteRequest& req, int count, int window,
                                   double* submit = nullptr) {
  absl::StatusOr<v1::TransferResult> warm = c.WriteAndWait(req, absl::Seconds(60));
  if (!warm.ok()) return warm.status();
  std::deque<uint64_t> inflight;
  absl::Duration submitting;
  absl::Time start = absl::Now();
  for (int i = 0; i < count || !inflight.empty();) {
    if (i < count && static_cast<int>(inflight.size()) < window) {
      absl::Time t0 = absl::Now();
      absl::StatusOr<uint64_t> id = c.Write(req);
      submitting += absl::Now() - t0;
      if (!id.ok()) return id.status();
      inflight.push_back(*id);
      ++i;
      continue;
    }
    absl::StatusOr<v1::TransferResult> r = c.Wait(inflight.front(), absl::Seconds(60));
    if (!r.ok()) return r.status();
    absl::Status s = ResultStatus(*r);
    if (!s.ok()) return s;
    inflight.pop_front();
  }
  if (submit != nullptr) *submit = absl::ToDoubleSeconds(submitting) / count;
  return absl::ToDoubleSeconds(absl::Now() - start) / count;
}

// Seconds per write with `clients` pods submitting at once (each its own session, its
// own registration of `src`, `count` writes of `req` with 2 in flight), as a serving
// engine with several requests in flight would.
absl::StatusOr<double> ParallelWrites(const CudaBuffer& src, const v1::WriteRequest& req, int clients, int count) {
  std::vector<std::unique_ptr<Client>> cs;
  std::vector<v1::WriteRequest> reqs;
  for (int i = 0; i < clients; ++i) {
    absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(absl::GetFlag(FLAGS_socket));
    if (!c.ok()) return c.status();
    absl::StatusOr<v1::RegisterMemoryResponse> r = RegisterCuda(**c, src);
    if (!r.ok()) return r.status();
    cs.push_back(std::move(*c));
    reqs.push_back(req);
    reqs.back().set_src_region_id(r->region_id());
  }
  std::vector<absl::Status> status(clients);
  std::vector<std::thread> threads;
  absl::Time start = absl::Now();
  for (int i = 0; i < clients; ++i) {
    threads.emplace_back([&, i] { status[i] = FerryWrites(*cs[i], reqs[i], count, 2).status(); });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : status) {
    if (!s.ok()) return s;
  }
  return absl::ToDoubleSeconds(absl::Now() - start) / (clients * count);
}

// Seconds per write: `count` single-chunk writes of `bytes` from the start of `src`
// region to the start of `dst` through a shared-memory WriteQueue, `window` in flight,
// reaping half a window at a time.
absl::StatusOr<double> FerryQueueWrites(Client& c, uint64_t src, const v1::RegionDescriptor& dst, uint64_t bytes,
                                        int count, int window) {
  absl::StatusOr<std::unique_ptr<WriteQueue>> q = WriteQueue::Create(c, {dst}, 2 * window, /*timeout_ms=*/60000);
  if (!q.ok()) return q.status();
  std::vector<WriteQueue::Completion> done;
  const absl::Duration spin = absl::Microseconds(absl::GetFlag(FLAGS_reap_spin_us));
  absl::Time start;
  for (int round = 0; round < 2; ++round) {  // round 0 warms up
    const int n = round == 0 ? window : count;
    start = absl::Now();
    for (int posted = 0, reaped = 0; reaped < n;) {
      while (posted < n && static_cast<int>((*q)->inflight()) < window) {
        const uint64_t off = SpanOffset(posted, bytes);
        if (absl::Status st = (*q)->Post({src, 0, off, off, bytes, static_cast<uint64_t>(posted)}); !st.ok()) {
          return st;
        }
        ++posted;
      }
      done.clear();
      const size_t want = std::min<size_t>(std::max(window / 2, 1), n - reaped);
      if ((*q)->Reap(&done, window, absl::Seconds(60), want, spin) == 0) {
        return absl::DeadlineExceededError("queue stuck");
      }
      for (const auto& d : done) {
        if (!d.status.ok()) return d.status;
      }
      reaped += static_cast<int>(done.size());
    }
  }
  return absl::ToDoubleSeconds(absl::Now() - start) / count;
}

// Seconds per write: `count` paged writes of `req`'s mapping through a WriteQueue's
// block table (the ids written once, every entry naming them), `window` in flight.
absl::StatusOr<double> FerryPagedQueueWrites(Client& c, const v1::WriteRequest& req, const std::vector<uint64_t>& sb,
                                             const std::vector<uint64_t>& db, int count, int window) {
  const uint32_t n = static_cast<uint32_t>(sb.size());
  absl::StatusOr<std::unique_ptr<WriteQueue>> q = WriteQueue::Create(
      c, {req.dst()}, std::max(8, 2 * window), /*timeout_ms=*/60000, v1::TRAFFIC_CLASS_UNSPECIFIED, 2 * n);
  if (!q.ok()) return q.status();
  std::copy(sb.begin(), sb.end(), (*q)->table());
  std::copy(db.begin(), db.end(), (*q)->table() + n);
  WriteQueue::PagedEntry e;
  e.src_region = req.src_region_id();
  e.block_size = req.paged().block_size();
  e.blocks = n;
  std::vector<WriteQueue::Completion> done;
  const absl::Duration spin = absl::Microseconds(absl::GetFlag(FLAGS_reap_spin_us));
  absl::Time start;
  for (int round = 0; round < 2; ++round) {  // round 0 warms up
    const int total = round == 0 ? window : count;
    start = absl::Now();
    for (int posted = 0, reaped = 0; reaped < total;) {
      while (posted < total && static_cast<int>((*q)->inflight()) < window) {
        e.user_data = posted++;
        if (absl::Status st = (*q)->PostPaged(e); !st.ok()) return st;
      }
      done.clear();
      if ((*q)->Reap(&done, window, absl::Seconds(60), 1, spin) == 0) return absl::DeadlineExceededError("queue stuck");
      for (const auto& d : done) {
        if (!d.status.ok()) return d.status;
      }
      reaped += static_cast<int>(done.size());
    }
  }
  return absl::ToDoubleSeconds(absl::Now() - start) / count;
}

// Staged cross-agent writes GPU0 (agent --socket) -> GPU1 (agent --dst_socket) vs the
// PCIe ceiling: a raw GPU -> pinned host copy of the same size.
int Staged(const CudaDriver* cu, int sd, int dd) {
  absl::StatusOr<std::unique_ptr<Client>> a = Client::Connect(absl::GetFlag(FLAGS_socket));
  absl::StatusOr<std::unique_ptr<Client>> b = Client::Connect(absl::GetFlag(FLAGS_dst_socket));
  if (!a.ok()) return Fail(a.status());
  if (!b.ok()) return Fail(b.status());
  constexpr uint64_t kMax = 256 << 20;
  absl::StatusOr<CudaBuffer> src = CudaBuffer::Allocate(sd, kMax, CudaExport::kPosixFd);
  absl::StatusOr<CudaBuffer> dst = CudaBuffer::Allocate(dd, kMax, CudaExport::kPosixFd);
  if (!src.ok()) return Fail(src.status());
  if (!dst.ok()) return Fail(dst.status());
  absl::StatusOr<v1::RegisterMemoryResponse> s = RegisterCuda(**a, *src);
  absl::StatusOr<v1::RegisterMemoryResponse> d = RegisterCuda(**b, *dst);
  if (!s.ok()) return Fail(s.status());
  if (!d.ok()) return Fail(d.status());
  void* pinned = nullptr;
  absl::Status use = UseDevice(*cu, sd);
  if (!use.ok()) return Fail(use);
  if (cu->cuMemHostAlloc(&pinned, kMax, 0) != CUDA_SUCCESS) return Fail(absl::ResourceExhaustedError("pinned"));
  if (absl::Status f = FillRandom(cu, src->ptr(), kMax); !f.ok()) return Fail(f);
  printf(
      "# cross-agent: GPU%d on agent A -> GPU%d on agent B, %s; one Write at a time (time, algbw) and 4 in "
      "flight (algbw_4); check: the destination read back and compared\n",
      sd, dd, absl::GetFlag(FLAGS_transport).c_str());
  printf("# pcie: raw cuMemcpyDtoH GPU%d -> pinned host of the same size (the staged path's first hop)\n", sd);
  printf("%12s %6s %12s %12s %12s %12s  %s\n", "size(B)", "count", "time(us)", "algbw(GB/s)", "algbw_4(GB/s)",
         "pcie(GB/s)", "check");
  for (uint64_t size = 4 << 20; size <= kMax; size *= 4) {
    const int count = static_cast<int>(std::clamp<uint64_t>((1ull << 30) / size, 4, 64));
    v1::WriteRequest req;
    req.set_src_region_id(s->region_id());
    *req.mutable_dst() = d->region();
    req.mutable_chunks()->add_chunks()->set_length(size);
    req.set_timeout_ms(120000);
    absl::StatusOr<double> f = FerryWrites(**a, req, count, 1);
    if (!f.ok()) return Fail(f.status());
    absl::StatusOr<double> f4 = FerryWrites(**a, req, count, 4);
    if (!f4.ok()) return Fail(f4.status());
    const char* check = CheckBlocks(cu, sd, src->ptr(), dd, dst->ptr(), size, {0}, {0}, 1, size);
    if (absl::Status back = UseDevice(*cu, sd); !back.ok()) return Fail(back);
    absl::Time t0 = absl::Now();
    for (int i = 0; i < count; ++i) cu->cuMemcpyDtoH(pinned, src->ptr(), size);
    double pcie = size * count / absl::ToDoubleSeconds(absl::Now() - t0) / 1e9;
    printf("%12lu %6d %12.1f %12.2f %12.2f %12.1f  %s\n", size, count, *f * 1e6, size / *f / 1e9, size / *f4 / 1e9,
           pcie, check);
  }
  cu->cuMemFreeHost(pinned);
  return 0;
}

// The node-local tables' buffers: 2 * kMaxNodeLocal bytes on each side.
constexpr uint64_t kMaxNodeLocal = 1ull << 30;

int Main() {
  if (absl::GetFlag(FLAGS_span_mib) > (2 * kMaxNodeLocal) >> 20) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--span_mib must be at most ", (2 * kMaxNodeLocal) >> 20, " (the size of each buffer)")));
  }
  absl::StatusOr<const CudaDriver*> cu = CudaDriver::Load();
  if (!cu.ok()) return Fail(cu.status());
  const int sd = absl::GetFlag(FLAGS_src_device), dd = absl::GetFlag(FLAGS_dst_device);
  if (std::max(sd, dd) >= (*cu)->device_count) return Fail(absl::FailedPreconditionError("not enough GPUs"));
  if (!absl::GetFlag(FLAGS_dst_socket).empty()) return Staged(*cu, sd, dd);
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(absl::GetFlag(FLAGS_socket));
  if (!c.ok()) return Fail(c.status());

  constexpr uint64_t kMax = kMaxNodeLocal;
  absl::StatusOr<CudaBuffer> src = CudaBuffer::Allocate(sd, 2 * kMax, CudaExport::kPosixFd);
  absl::StatusOr<CudaBuffer> dst = CudaBuffer::Allocate(dd, 2 * kMax, CudaExport::kPosixFd);
  if (!src.ok()) return Fail(src.status());
  if (!dst.ok()) return Fail(dst.status());
  absl::StatusOr<v1::RegisterMemoryResponse> s = RegisterCuda(**c, *src);
  absl::StatusOr<v1::RegisterMemoryResponse> d = RegisterCuda(**c, *dst);
  if (!s.ok()) return Fail(s.status());
  if (!d.ok()) return Fail(d.status());
  // The raw baseline copies between this process's own mappings, with peer access.
  absl::Status use = UseDevice(**cu, sd);
  if (!use.ok()) return Fail(use);
  absl::StatusOr<int> peers = EnablePeerAccess(**cu, sd);
  if (!peers.ok()) return Fail(peers.status());
  // VMM buffers are mapped for their own device only: let the source GPU reach dst.
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = sd;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  (*cu)->cuMemSetAccess(dst->ptr(), dst->size(), &access, 1);

  const int rounds = std::max(1, absl::GetFlag(FLAGS_rounds));
  printf("# ferry GPU benchmark: node-local GPU%d -> GPU%d, %d peers reachable from GPU%d\n", sd, dd, *peers, sd);
  if (!absl::GetFlag(FLAGS_paged_only)) {
    printf(
        "# contiguous: ferry Write+Wait with 8 in flight, and the write queue with %d in flight (queue; the client\n"
        "# polls %d us before sleeping), vs raw cuMemcpyAsync back to back (CUDA events); time and algbw are the\n"
        "# Write rows'; the queue and raw copies alternate %d times: their medians, and q_ratio = the median of\n"
        "# the rounds' queue / raw (q_range: the lowest and highest); the queue's and raw's write i copies at\n"
        "# offset (i mod slots) * size of both buffers, slots = %lu MiB / size (--span_mib; 0: all at offset 0)\n",
        absl::GetFlag(FLAGS_queue_window), absl::GetFlag(FLAGS_reap_spin_us), rounds,
        static_cast<unsigned long>(absl::GetFlag(FLAGS_span_mib)));
    printf("%12s %6s %12s %12s %12s %8s %12s %8s %12s\n", "size(B)", "count", "time(us)", "algbw(GB/s)", "raw(GB/s)",
           "ratio", "queue(GB/s)", "q_ratio", "q_range");
  }
  for (uint64_t size = 1 << 20; size <= kMax && !absl::GetFlag(FLAGS_paged_only); size *= 4) {
    // Enough copies for tens of milliseconds of GPU time at every size.
    int count = static_cast<int>(std::clamp<uint64_t>((16ull << 30) / size, 16, 5000));
    v1::WriteRequest req;
    req.set_src_region_id(s->region_id());
    *req.mutable_dst() = d->region();
    v1::Chunk* ch = req.mutable_chunks()->add_chunks();
    ch->set_length(size);
    absl::StatusOr<double> f = FerryWrites(**c, req, count, 8);
    if (!f.ok()) return Fail(f.status());
    // One round is tens of milliseconds, where this host's copy rate at 1-4 MiB swings by
    // tens of percent from one moment to the next: the queue and raw copies alternate,
    // and each round's ratio compares two runs made back to back.
    std::vector<double> qbw, rbw, ratio;
    for (int r = 0; r < rounds; ++r) {
      absl::StatusOr<double> fq =
          FerryQueueWrites(**c, s->region_id(), d->region(), size, count, absl::GetFlag(FLAGS_queue_window));
      if (!fq.ok()) return Fail(fq.status());
      absl::StatusOr<double> raw = RawCopy(*cu, dst->ptr(), src->ptr(), size, count, /*spread=*/true);
      if (!raw.ok()) return Fail(raw.status());
      qbw.push_back(size / *fq / 1e9);
      rbw.push_back(size / *raw / 1e9);
      ratio.push_back(qbw.back() / rbw.back());
    }
    const double bw = size / *f / 1e9, raw_median = Median(rbw);
    const auto [lo, hi] = std::minmax_element(ratio.begin(), ratio.end());
    printf("%12lu %6d %12.1f %12.1f %12.1f %8.2f %12.1f %8.2f %6.2f-%.2f\n", size, count, *f * 1e6, bw, raw_median,
           bw / raw_median, Median(qbw), Median(ratio), *lo, *hi);
  }

  if (absl::GetFlag(FLAGS_contiguous_only)) return 0;
  if (absl::Status f = FillRandom(*cu, src->ptr(), kMax); !f.ok()) return Fail(f);
  constexpr int kClients = 4;
  printf(
      "# paged: one Write of N blocks scattered at random over 1 GiB on both sides vs raw contiguous copy of N*block "
      "bytes;\n"
      "# one client, 2 writes in flight (time, algbw, ratio; submit = mean time of one Write RPC), %d clients\n"
      "# submitting at once, 2 in flight each (algbw_%dc, ratio_%dc), and one client posting paged entries to a\n"
      "# write queue whose block table holds the mapping, %d in flight (algbw_q, ratio_q); check: the one-client\n"
      "# writes' blocks read back\n",
      kClients, kClients, kClients, absl::GetFlag(FLAGS_paged_queue_window));
  printf("%8s %10s %12s %12s %12s %12s %8s %12s %8s %12s %8s  %s\n", "blocks", "block(B)", "time(us)", "submit(us)",
         "algbw(GB/s)", "raw(GB/s)", "ratio", "algbw_4c", "ratio_4c", "algbw_q", "ratio_q", "check");
  for (auto [n, block] :
       {std::pair<uint64_t, uint64_t>{16384, 4 << 10}, {16384, 16 << 10}, {16384, 32 << 10}, {4096, 128 << 10}}) {
    std::mt19937_64 rng(n);
    std::vector<uint64_t> sb(kMax / block), db(kMax / block);
    std::iota(sb.begin(), sb.end(), 0);
    std::iota(db.begin(), db.end(), 0);
    std::shuffle(sb.begin(), sb.end(), rng);
    std::shuffle(db.begin(), db.end(), rng);
    sb.resize(n);
    db.resize(n);
    v1::WriteRequest req;
    req.set_src_region_id(s->region_id());
    *req.mutable_dst() = d->region();
    req.mutable_paged()->set_block_size(block);
    if (absl::GetFlag(FLAGS_varint_ids)) {
      req.mutable_paged()->mutable_src_blocks()->Add(sb.begin(), sb.end());
      req.mutable_paged()->mutable_dst_blocks()->Add(db.begin(), db.end());
    } else {
      SetBlockIds(sb, db, req.mutable_paged());
    }
    const int count = 20;
    double submit = 0;
    absl::StatusOr<double> f = FerryWrites(**c, req, count, 2, &submit);
    if (!f.ok()) return Fail(f.status());
    const char* check = CheckBlocks(*cu, sd, src->ptr(), dd, dst->ptr(), kMax, sb, db, n, block);
    if (absl::Status back = UseDevice(**cu, sd); !back.ok()) return Fail(back);
    absl::StatusOr<double> fc = ParallelWrites(*src, req, kClients, count);
    if (!fc.ok()) return Fail(fc.status());
    absl::StatusOr<double> fq = FerryPagedQueueWrites(**c, req, sb, db, count, absl::GetFlag(FLAGS_paged_queue_window));
    if (!fq.ok()) return Fail(fq.status());
    absl::StatusOr<double> raw = RawCopy(*cu, dst->ptr(), src->ptr(), n * block, count);
    if (!raw.ok()) return Fail(raw.status());
    double bw = n * block / *f / 1e9, rbw = n * block / *raw / 1e9, cbw = n * block / *fc / 1e9,
           qbw = n * block / *fq / 1e9;
    printf("%8lu %10lu %12.1f %12.1f %12.1f %12.1f %8.2f %12.1f %8.2f %12.1f %8.2f  %s\n", n, block, *f * 1e6,
           submit * 1e6, bw, rbw, bw / rbw, cbw, cbw / rbw, qbw, qbw / rbw, check);
  }
  return 0;
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ferry::Main();
}
