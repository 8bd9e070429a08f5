// copy_kernel_bench: the gather/scatter kernel alone (agent/cuda/copy_kernel.h), on one
// GPU, against a raw contiguous cuMemcpyAsync of the same bytes in the same run.
//
//   copy_kernel_bench [--device=0]
//
// For each row, N blocks are drawn at random from 1 GiB on each side (as gpu_bench's
// paged rows, and a KV cache's block table) and cut into pieces as the agent's GPU
// copier cuts them. The kernel is launched back to back with the piece list (or, in the
// blocks form, the block offsets it expands itself) already on the GPU, timed with CUDA
// events: what the GPU can do, apart from everything the agent does per request on the
// host (gpu_bench's paged rows measure that end to end). Every row's destination is
// checked byte for byte against the source once per form.
//
// A second table times one launch from the host's side, from the launch call until its
// event reads complete, right after this context's own work and right after another
// context's work on the GPU: what the agent's node-local copy pays when a pod's process
// (a context of its own) used the GPU last, a switch between contexts.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "agent/cuda/copy_kernel.h"
#include "proto/ferry/cuda/cuda_driver.h"

ABSL_FLAG(int, device, 0, "GPU");

namespace ferry {
namespace {

constexpr uint64_t kSpan = 1ull << 30;

int Fail(const absl::Status& s) {
  fprintf(stderr, "copy_kernel_bench: %s\n", s.ToString().c_str());
  return 1;
}

struct Kernel {
  CUfunction fn = nullptr;
  uint64_t resident_ctas = 1;  // from the occupancy API, as the copier sizes its grid
};

absl::StatusOr<Kernel> LoadKernel(const CudaDriver* cu, int sms) {
  Kernel k;
  CUmodule m;
  FERRY_RETURN_IF_CU_ERROR(cu, cu->cuModuleLoadData(&m, kCopyPiecesPtx), "loading the copy kernel");
  FERRY_RETURN_IF_CU_ERROR(cu, cu->cuModuleGetFunction(&k.fn, m, kCopyPiecesKernel), "cuModuleGetFunction");
  int per_sm = 0;
  FERRY_RETURN_IF_CU_ERROR(cu, cu->cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k.fn, kCopyPiecesThreads, 0),
                           "cuOccupancyMaxActiveBlocksPerMultiprocessor");
  k.resident_ctas = static_cast<uint64_t>(std::max(1, sms * per_sm));
  return k;
}

std::vector<CopyPiece> Pieces(CUdeviceptr src, CUdeviceptr dst, const std::vector<uint64_t>& sb,
                              const std::vector<uint64_t>& db, uint64_t block) {
  std::vector<CopyPiece> out;
  for (size_t i = 0; i < sb.size(); ++i) {
    for (uint64_t off = 0; off < block; off += kCopyPieceBytes) {
      out.push_back(
          CopyPiece{src + sb[i] * block + off, dst + db[i] * block + off, std::min(kCopyPieceBytes, block - off)});
    }
  }
  return out;
}

absl::Status Launch(const CudaDriver* cu, const Kernel& k, CopyKernelArgs args, CUstream s) {
  unsigned ctas = static_cast<unsigned>(std::min<uint64_t>(args.count, k.resident_ctas));
  return cu->Check(cu->cuLaunchKernel(k.fn, ctas, 1, 1, kCopyPiecesThreads, 1, 1, 0, s, args.params().data(), nullptr),
                   "cuLaunchKernel");
}

// Seconds per launch of `k`, `reps` launches, with `bytes` of `upload` on the GPU and
// the arguments `args` makes for its address.
absl::StatusOr<double> TimeKernel(const CudaDriver* cu, const Kernel& k, const void* upload, size_t bytes,
                                  absl::FunctionRef<CopyKernelArgs(CUdeviceptr)> args, int reps, CUstream s, CUevent a,
                                  CUevent b) {
  CUdeviceptr list;
  FERRY_RETURN_IF_CU_ERROR(cu, cu->cuMemAlloc(&list, bytes), "cuMemAlloc");
  FERRY_RETURN_IF_CU_ERROR(cu, cu->cuMemcpyHtoD(list, upload, bytes), "the kernel's list");
  absl::Status st = Launch(cu, k, args(list), s);  // warm-up
  cu->cuEventRecord(a, s);
  for (int i = 0; i < reps && st.ok(); ++i) st = Launch(cu, k, args(list), s);
  cu->cuEventRecord(b, s);
  FERRY_RETURN_IF_CU_ERROR(cu, cu->cuEventSynchronize(b), "the kernel");
  cu->cuMemFree(list);
  if (!st.ok()) return st;
  float ms = 0;
  cu->cuEventElapsedTime(&ms, a, b);
  return ms / 1e3 / reps;
}

absl::Status CheckBlocks(const CudaDriver* cu, CUdeviceptr dst, const std::vector<uint8_t>& host_src,
                         const std::vector<uint64_t>& sb, const std::vector<uint64_t>& db, uint64_t block) {
  std::vector<uint8_t> got(kSpan);
  FERRY_RETURN_IF_CU_ERROR(cu, cu->cuMemcpyDtoH(got.data(), dst, kSpan), "cuMemcpyDtoH");
  for (size_t i = 0; i < sb.size(); ++i) {
    if (memcmp(&got[db[i] * block], &host_src[sb[i] * block], block) != 0) {
      return absl::InternalError(absl::StrCat("block ", i, " (", sb[i], " -> ", db[i], ") differs"));
    }
  }
  return absl::OkStatus();
}

// Microseconds from the launch `put` makes on `s` until the event after it reads
// complete (spinning on cuEventQuery), after `before` ran; median, p10 and p90 of `reps`.
struct Spread {
  double p10, p50, p90;
};
absl::StatusOr<Spread> TimeToComplete(const CudaDriver* cu, CUstream s, CUevent done, int reps,
                                      absl::FunctionRef<void()> before, absl::FunctionRef<CUresult()> put) {
  std::vector<double> us;
  for (int i = 0; i <= reps; ++i) {
    before();
    const absl::Time t0 = absl::Now();
    FERRY_RETURN_IF_CU_ERROR(cu, put(), "the timed launch");
    FERRY_RETURN_IF_CU_ERROR(cu, cu->cuEventRecord(done, s), "cuEventRecord");
    CUresult r;
    while ((r = cu->cuEventQuery(done)) == CUDA_ERROR_NOT_READY) {
    }
    FERRY_RETURN_IF_CU_ERROR(cu, r, "the timed launch");
    if (i > 0) us.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));  // the first warms up
  }
  std::sort(us.begin(), us.end());
  return Spread{us[us.size() / 10], us[us.size() / 2], us[us.size() * 9 / 10]};
}

// The second table: a blocks-form launch of N layers x 64 blocks of 32 KiB, and a
// raw copy of as many bytes, after this context idled 300 us ("own") and right after
// another context of this process wrote 1 MiB and waited for it ("other").
absl::Status ContextSwitchRows(const CudaDriver* cu, CUdevice dev, const Kernel& k, CUdeviceptr src, CUdeviceptr dst,
                               CUstream s, CUevent done) {
  CUcontext mine, other;
  FERRY_RETURN_IF_CU_ERROR(cu, cu->cuCtxGetCurrent(&mine), "cuCtxGetCurrent");
  FERRY_RETURN_IF_CU_ERROR(cu, cu->cuCtxCreate(&other, 0, dev), "cuCtxCreate");  // also makes it current
  CUdeviceptr other_buf = 0;
  absl::Status st = cu->Check(cu->cuMemAlloc(&other_buf, 1 << 20), "cuMemAlloc in the other context");
  cu->cuCtxSetCurrent(mine);
  if (!st.ok()) return st;
  auto idle = [] {
    for (const absl::Time until = absl::Now() + absl::Microseconds(300); absl::Now() < until;) {
    }
  };
  auto other_worked = [&] {
    cu->cuCtxSetCurrent(other);
    cu->cuMemsetD8(other_buf, 1, 1 << 20);
    cu->cuStreamSynchronize(nullptr);
    cu->cuCtxSetCurrent(mine);
  };
  printf(
      "\n# one launch timed from the host: from the call until its event reads complete (us, median [p10-p90] of\n"
      "# 30), after this context idled 300 us (own) and right after another context's work (other: the GPU switches\n"
      "# contexts, as for the agent's copy after a pod's kernels); kernel = blocks form, N layers x 64 blocks of\n"
      "# 32 KiB scattered over 1 GiB; raw = one cuMemcpyAsync of as many contiguous bytes\n");
  printf("%6s %6s %22s %22s %22s %22s\n", "layers", "MiB", "kernel_own", "kernel_other", "raw_own", "raw_other");
  constexpr uint64_t kBlock = 32 << 10, kBlocks = 64, kLayerStride = 16 << 20;
  std::mt19937_64 rng(5);
  for (uint64_t layers : {2, 64}) {
    std::vector<uint64_t> ids(kLayerStride / kBlock);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    std::vector<uint64_t> words;
    for (uint64_t l = 0; l < layers; ++l) {
      words.push_back(src + l * kLayerStride);
      words.push_back(dst + l * kLayerStride);
    }
    for (uint64_t b = 0; b < kBlocks; ++b) {
      words.push_back(ids[b] * kBlock);
      words.push_back(ids[ids.size() - 1 - b] * kBlock);
    }
    CUdeviceptr table;
    FERRY_RETURN_IF_CU_ERROR(cu, cu->cuMemAlloc(&table, words.size() * 8), "cuMemAlloc");
    FERRY_RETURN_IF_CU_ERROR(cu, cu->cuMemcpyHtoD(table, words.data(), words.size() * 8), "the block table");
    const uint64_t bytes = layers * kBlocks * kBlock;
    CopyKernelArgs args = CopyKernelArgs::Blocks(table, static_cast<uint32_t>(layers), table + layers * 16,
                                                 static_cast<uint32_t>(kBlocks), kBlock);
    const unsigned ctas = static_cast<unsigned>(std::min<uint64_t>(args.count, k.resident_ctas));
    auto kernel = [&] {
      return cu->cuLaunchKernel(k.fn, ctas, 1, 1, kCopyPiecesThreads, 1, 1, 0, s, args.params().data(), nullptr);
    };
    auto raw = [&] { return cu->cuMemcpyAsync(dst, src, bytes, s); };
    printf("%6lu %6lu", layers, bytes >> 20);
    for (auto [before, put] : {std::pair<absl::FunctionRef<void()>, absl::FunctionRef<CUresult()>>{idle, kernel},
                               {other_worked, kernel},
                               {idle, raw},
                               {other_worked, raw}}) {
      absl::StatusOr<Spread> x = TimeToComplete(cu, s, done, 30, before, put);
      if (!x.ok()) return x.status();
      printf(" %8.1f [%5.1f-%6.1f]", x->p50, x->p10, x->p90);
    }
    printf("\n");
    cu->cuMemFree(table);
  }
  cu->cuCtxDestroy(other);
  return cu->Check(cu->cuCtxSetCurrent(mine), "cuCtxSetCurrent");
}

int Main() {
  absl::StatusOr<const CudaDriver*> loaded = CudaDriver::Load();
  if (!loaded.ok()) return Fail(loaded.status());
  const CudaDriver* cu = *loaded;
  const int device = absl::GetFlag(FLAGS_device);
  if (absl::Status s = UseDevice(*cu, device); !s.ok()) return Fail(s);
  CUdevice dev;
  int sms = 0;
  cu->cuDeviceGet(&dev, device);
  cu->cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);

  absl::StatusOr<Kernel> kernel = LoadKernel(cu, sms);
  if (!kernel.ok()) return Fail(kernel.status());

  CUdeviceptr src, dst;
  if (absl::Status s = cu->Check(cu->cuMemAlloc(&src, kSpan), "cuMemAlloc"); !s.ok()) return Fail(s);
  if (absl::Status s = cu->Check(cu->cuMemAlloc(&dst, kSpan), "cuMemAlloc"); !s.ok()) return Fail(s);
  std::vector<uint8_t> host_src(kSpan);
  std::mt19937_64 fill(7);
  for (size_t i = 0; i < kSpan; i += 8) {
    const uint64_t v = fill();
    memcpy(&host_src[i], &v, 8);
  }
  cu->cuMemcpyHtoD(src, host_src.data(), kSpan);
  CUstream s;
  CUevent a, b;
  cu->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
  cu->cuEventCreate(&a, 0);
  cu->cuEventCreate(&b, 0);

  printf(
      "# copy kernel alone, GPU %d (%d SMs): N blocks scattered at random over 1 GiB on both sides;\n"
      "# raw = one cuMemcpyAsync of N*block contiguous bytes; pieces = one launch over a piece list already on\n"
      "# the GPU; blocks = one launch in the blocks form (the kernel expands the block offsets)\n",
      device, sms);
  printf("%8s %10s %10s %12s %12s %8s %12s %8s\n", "blocks", "block(B)", "pieces", "raw(GB/s)", "pieces(GB/s)", "ratio",
         "blocks(GB/s)", "ratio");
  const std::pair<uint64_t, uint64_t> rows[] = {{16384, 4 << 10},  {16384, 16 << 10}, {16384, 32 << 10},
                                                {4096, 128 << 10}, {1024, 512 << 10}, {512, 1 << 20},
                                                {2048, 36869}};  // odd: pieces of two lengths, unaligned
  for (auto [n, block] : rows) {
    std::mt19937_64 rng(n * block);
    std::vector<uint64_t> sb(kSpan / block), db(kSpan / block);
    std::iota(sb.begin(), sb.end(), 0);
    std::iota(db.begin(), db.end(), 0);
    std::shuffle(sb.begin(), sb.end(), rng);
    std::shuffle(db.begin(), db.end(), rng);
    sb.resize(n);
    db.resize(n);
    const uint64_t bytes = n * block;
    const int reps = static_cast<int>(std::clamp<uint64_t>((32ull << 30) / bytes, 20, 2000));

    // Raw: the same bytes as one contiguous copy, back to back.
    cu->cuMemcpyAsync(dst, src, bytes, s);
    cu->cuEventRecord(a, s);
    for (int i = 0; i < reps; ++i) cu->cuMemcpyAsync(dst, src, bytes, s);
    cu->cuEventRecord(b, s);
    cu->cuEventSynchronize(b);
    float ms = 0;
    cu->cuEventElapsedTime(&ms, a, b);
    const double raw = bytes / (ms / 1e3 / reps) / 1e9;

    std::vector<CopyPiece> pieces = Pieces(src, dst, sb, db, block);
    const uint32_t count = static_cast<uint32_t>(pieces.size());
    cu->cuMemsetD8(dst, 0, kSpan);
    absl::StatusOr<double> t = TimeKernel(
        cu, *kernel, pieces.data(), pieces.size() * sizeof(CopyPiece),
        [&](CUdeviceptr list) { return CopyKernelArgs::Pieces(list, count); }, reps, s, a, b);
    if (!t.ok()) return Fail(t.status());
    if (absl::Status c = CheckBlocks(cu, dst, host_src, sb, db, block); !c.ok()) return Fail(c);
    // The blocks form: one part (the buffers' bases), then each block's offsets.
    std::vector<uint64_t> words = {src, dst};
    for (size_t i = 0; i < n; ++i) {
      words.push_back(sb[i] * block);
      words.push_back(db[i] * block);
    }
    cu->cuMemsetD8(dst, 0, kSpan);
    absl::StatusOr<double> tb = TimeKernel(
        cu, *kernel, words.data(), words.size() * sizeof(uint64_t),
        [blocks = static_cast<uint32_t>(n), block_size = block](CUdeviceptr list) {
          return CopyKernelArgs::Blocks(list, 1, list + sizeof(CopyBlockPart), blocks, block_size);
        },
        reps, s, a, b);
    if (!tb.ok()) return Fail(tb.status());
    if (absl::Status c = CheckBlocks(cu, dst, host_src, sb, db, block); !c.ok()) return Fail(c);
    const double bw = bytes / *t / 1e9, bwb = bytes / *tb / 1e9;
    printf("%8lu %10lu %10zu %12.1f %12.1f %8.2f %12.1f %8.2f\n", n, block, pieces.size(), raw, bw, bw / raw, bwb,
           bwb / raw);
  }
  if (absl::Status c = ContextSwitchRows(cu, dev, *kernel, src, dst, s, a); !c.ok()) return Fail(c);
  return 0;
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return ferry::Main();
}
