// The GPU suite: real ferryd processes importing real GPU memory.
//
// Runs on a CUDA host (tests/gpu/run.sh carries the binaries there); on a machine
// without a driver every case says SKIPPED and passes, so `bazel test //...` stays
// meaningful on CPU-only CI. Pod stand-ins that must live in their own PID and IPC
// namespaces are this binary re-executed with --pod (see PodMain).
#define CATCH_CONFIG_RUNNER
#include <fcntl.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/cpp/cuda_buffer.h"
#include "client/cpp/ferry_client.h"
#include "proto/ferry/cuda/cuda_driver.h"
#include "tests/testing/agent_process.h"
#include "tests/testing/fabric_agent.h"
#include "tests/testing/fake_sysfs.h"
#include "tests/testing/netns.h"
#include "tests/testing/test_pod.h"

namespace ferry {
namespace {

using testing::AgentProcess;
using testing::ChildProcess;
using testing::FillRandom;

std::string g_self;  // this binary, for --pod children

// The driver, or nullptr after printing why the case is skipped.
const CudaDriver* GpuOrSkip() {
  absl::StatusOr<const CudaDriver*> cu = CudaDriver::Load();
  if (!cu.ok() || (*cu)->device_count == 0) {
    std::string why = cu.ok() ? "no CUDA devices" : std::string(cu.status().message());
    printf("SKIPPED %s (needs a GPU): %s\n", Catch::getResultCapture().getCurrentTestName().c_str(), why.c_str());
    return nullptr;
  }
  return *cu;
}

const char* KindName(CudaExport k) {
  switch (k) {
    case CudaExport::kIpc:
      return "ipc";
    case CudaExport::kPosixFd:
      return "fd";
    case CudaExport::kDmaBuf:
      return "dmabuf";
  }
  return "?";
}

// "" when equal, else where they differ (Catch would print 8 MiB vectors byte by byte).
std::string Diff(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want) {
  if (got.size() != want.size()) return absl::StrCat("sizes differ: ", got.size(), " vs ", want.size());
  size_t first = got.size(), count = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) {
      first = std::min(first, i);
      ++count;
    }
  }
  if (count == 0) return "";
  return absl::StrCat(count, " bytes differ, first at ", first, " (got ", got[first], ", want ", want[first], ")");
}

std::vector<uint8_t> Download(const CudaDriver* cu, const CudaBuffer& b) {
  std::vector<uint8_t> out(b.size());
  REQUIRE(UseDevice(*cu, b.device()).ok());
  REQUIRE(cu->cuMemcpyDtoH(out.data(), b.ptr(), b.size()) == CUDA_SUCCESS);
  return out;
}

void Upload(const CudaDriver* cu, const CudaBuffer& b, const std::vector<uint8_t>& data) {
  REQUIRE(UseDevice(*cu, b.device()).ok());
  REQUIRE(cu->cuMemcpyHtoD(b.ptr(), data.data(), data.size()) == CUDA_SUCCESS);
}

CudaBuffer Allocate(int device, uint64_t size, CudaExport kind) {
  absl::StatusOr<CudaBuffer> b = CudaBuffer::Allocate(device, size, kind);
  INFO(b.status().ToString());
  REQUIRE(b.ok());
  return std::move(*b);
}

v1::RegisterMemoryResponse Register(Client& c, const CudaBuffer& b) {
  absl::StatusOr<v1::RegisterMemoryResponse> r = RegisterCuda(c, b);
  INFO(KindName(b.kind()) << ": " << r.status().ToString());
  REQUIRE(r.ok());
  return *r;
}

std::unique_ptr<AgentProcess> StartAgent(const std::vector<std::string>& flags = {}) {
  auto a = AgentProcess::Start(flags);
  INFO(a.status().ToString());
  REQUIRE(a.ok());
  return std::move(*a);
}

std::unique_ptr<Client> Connect(const AgentProcess& agent) {
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(agent.socket());
  REQUIRE(c.ok());
  return std::move(*c);
}

// Two buffers on GPU 0 (one GPU: its kernel reaches both) registered by two sessions: the
// source filled with random bytes (`data`), the destination poisoned (`expect` holds
// its bytes, for the test to apply its writes to).
struct GpuPair {
  std::unique_ptr<Client> writer, reader;
  CudaBuffer src, dst;
  std::vector<uint8_t> data, expect;
  v1::RegisterMemoryResponse s, d;
};

GpuPair MakeGpuPair(const CudaDriver* cu, const AgentProcess& agent, uint64_t src_bytes, uint64_t dst_bytes,
                    uint64_t seed) {
  GpuPair p{Connect(agent), Connect(agent), Allocate(0, src_bytes, CudaExport::kPosixFd),
            Allocate(0, dst_bytes, CudaExport::kPosixFd)};
  p.data.resize(p.src.size());
  FillRandom(p.data.data(), p.data.size(), seed);
  Upload(cu, p.src, p.data);
  p.expect.assign(p.dst.size(), 0xA5);
  Upload(cu, p.dst, p.expect);
  p.s = Register(*p.writer, p.src);
  p.d = Register(*p.reader, p.dst);
  return p;
}

// Applies `chunks` to `expect` as the agent should to the destination.
void ApplyChunks(const std::vector<uint8_t>& src, std::vector<uint8_t>& expect, const v1::WriteRequest& req) {
  if (req.has_paged()) {
    const v1::PagedChunks& bl = req.paged();
    for (int i = 0; i < bl.src_blocks_size(); ++i) {
      memcpy(expect.data() + bl.dst_blocks(i) * bl.block_size(), src.data() + bl.src_blocks(i) * bl.block_size(),
             bl.block_size());
    }
    return;
  }
  for (const v1::Chunk& c : req.chunks().chunks()) {
    memcpy(expect.data() + c.dst_offset(), src.data() + c.src_offset(), c.length());
  }
}

// Random paged write: `n` distinct source blocks to `n` distinct destination blocks.
v1::WriteRequest PagedWrite(uint64_t src_region, const v1::RegionDescriptor& dst, uint64_t block, uint64_t region_bytes,
                            size_t n, uint64_t seed) {
  const std::vector<uint64_t> s = testing::ShuffledIds<uint64_t>(region_bytes / block, seed),
                              d = testing::ShuffledIds<uint64_t>(region_bytes / block, seed + 1);
  v1::WriteRequest req;
  req.set_src_region_id(src_region);
  *req.mutable_dst() = dst;
  req.mutable_paged()->set_block_size(block);
  for (size_t i = 0; i < n; ++i) {
    req.mutable_paged()->add_src_blocks(s[i]);
    req.mutable_paged()->add_dst_blocks(d[i]);
  }
  return req;
}

v1::WriteRequest Contiguous(uint64_t src_region, const v1::RegionDescriptor& dst,
                            std::vector<std::array<uint64_t, 3>> chunks) {
  v1::WriteRequest req;
  req.set_src_region_id(src_region);
  *req.mutable_dst() = dst;
  for (const auto& [s, d, n] : chunks) {
    v1::Chunk* c = req.mutable_chunks()->add_chunks();
    c->set_src_offset(s);
    c->set_dst_offset(d);
    c->set_length(n);
  }
  return req;
}

void WriteOk(Client& c, const v1::WriteRequest& req) {
  absl::StatusOr<v1::TransferResult> r = c.WriteAndWait(req, absl::Seconds(30));
  INFO(r.status().ToString());
  REQUIRE(r.ok());
}

v1::GetStatusResponse Status(Client& c) {
  absl::StatusOr<v1::GetStatusResponse> s = c.GetStatus();
  REQUIRE(s.ok());
  return *s;
}

// Polls GetStatus until `pred` holds or 10 s pass.
template <typename Pred>
bool Eventually(Client& c, Pred pred) {
  absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    if (pred(Status(c))) return true;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return false;
}

TEST_CASE("node-local writes between GPUs, every handle kind, contiguous and paged") {
  const CudaDriver* cu = GpuOrSkip();
  if (cu == nullptr) return;
  std::unique_ptr<AgentProcess> agent = StartAgent();
  constexpr uint64_t kBytes = 8 << 20;
  const int last = cu->device_count - 1;
  uint64_t seed = 1;
  for (CudaExport sk : {CudaExport::kIpc, CudaExport::kPosixFd}) {
    for (CudaExport dk : {CudaExport::kIpc, CudaExport::kPosixFd}) {
      for (auto [sd, dd] : {std::pair<int, int>{0, last}, {last, 0}, {0, 0}}) {
        DYNAMIC_SECTION(KindName(sk) << " gpu" << sd << " -> " << KindName(dk) << " gpu" << dd) {
          auto writer = Connect(*agent);
          auto reader = Connect(*agent);  // a second pod owns the destination
          CudaBuffer src = Allocate(sd, kBytes, sk);
          CudaBuffer dst = Allocate(dd, kBytes, dk);
          std::vector<uint8_t> data(src.size());
          FillRandom(data.data(), data.size(), ++seed);
          Upload(cu, src, data);
          std::vector<uint8_t> expect(dst.size(), 0xA5);
          Upload(cu, dst, expect);  // poisoned
          v1::RegisterMemoryResponse s = Register(*writer, src);
          v1::RegisterMemoryResponse d = Register(*reader, dst);

          // One big chunk (copy engine), odd offsets and a misaligned short chunk.
          v1::WriteRequest big = Contiguous(s.region_id(), d.region(), {{0, 0, 4 << 20}});
          v1::WriteRequest odd =
              Contiguous(s.region_id(), d.region(),
                         {{(4 << 20) + 3, (5 << 20) + 7, 100001}, {(6 << 20) + 16, (7 << 20) + 32, 65536 + 48}});
          v1::WriteRequest paged = PagedWrite(s.region_id(), d.region(), 512, 4 << 20, 4096, seed);
          for (const v1::WriteRequest* w : {&big, &odd}) {
            WriteOk(*writer, *w);
            ApplyChunks(data, expect, *w);
          }
          // The paged write fills blocks of the first 4 MiB again, from scattered sources.
          WriteOk(*writer, paged);
          ApplyChunks(data, expect, paged);
          REQUIRE(Diff(Download(cu, dst), expect) == "");
        }
      }
    }
  }
  REQUIRE(agent->Stop() == 0);
}

TEST_CASE("small GPU writes queued together share a kernel launch; every byte lands where its entry says") {
  const CudaDriver* cu = GpuOrSkip();
  if (cu == nullptr) return;
  std::unique_ptr<AgentProcess> agent = StartAgent();
  constexpr uint64_t kSrcBytes = 64 << 20, kDstBytes = 256 << 20;
  constexpr size_t kWrites = 300;
  GpuPair p = MakeGpuPair(cu, *agent, kSrcBytes, kDstBytes, 77);
  std::vector<uint8_t>& data = p.data;
  std::vector<uint8_t>& expect = p.expect;
  absl::StatusOr<std::unique_ptr<WriteQueue>> q = WriteQueue::Create(*p.writer, {p.d.region()}, 128);
  REQUIRE(q.ok());
  // Writes of 1 B .. 256 KiB and of 4 MiB + 3 (over the batch limit) at odd offsets, each
  // to its own destination range, 64 in flight: batches mix lengths and alignments.
  std::mt19937_64 rng(5);
  std::vector<uint64_t> lengths;  // by entry
  uint64_t next_dst = 0;
  std::vector<WriteQueue::Completion> done;
  size_t posted = 0, reaped = 0;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (reaped < kWrites && absl::Now() < deadline) {
    while (posted < kWrites && (*q)->inflight() < 64) {
      const uint64_t length = posted % 7 == 0 ? (4 << 20) + 3 : 1 + rng() % (256 << 10);
      const uint64_t dst_offset = next_dst + rng() % 64;
      REQUIRE(dst_offset + length <= kDstBytes);
      const uint64_t src_offset = rng() % (kSrcBytes - length);
      REQUIRE((*q)->Post({p.s.region_id(), 0, src_offset, dst_offset, length, posted}).ok());
      lengths.push_back(length);
      memcpy(expect.data() + dst_offset, data.data() + src_offset, length);
      next_dst = dst_offset + length;
      ++posted;
    }
    done.clear();
    (*q)->Reap(&done, 64, absl::Seconds(10), 16);
    for (const WriteQueue::Completion& c : done) {
      INFO("entry " << c.user_data << ": " << c.status.ToString());
      REQUIRE(c.status.ok());
      CHECK(c.bytes == lengths[c.user_data]);
    }
    reaped += done.size();
  }
  REQUIRE(reaped == kWrites);
  REQUIRE(Diff(Download(cu, p.dst), expect) == "");
  absl::StatusOr<std::string> m = testing::HttpGet(agent->metrics_port(), "/metrics");
  REQUIRE(m.ok());
  const std::string device = R"(device="0",)";
  const double batched = testing::MetricValue(*m, "ferry_gpu_transfers_total", device + R"(method="kernel_batched")");
  const double single = testing::MetricValue(*m, "ferry_gpu_transfers_total", device + R"(method="copy_engine")") +
                        testing::MetricValue(*m, "ferry_gpu_transfers_total", device + R"(method="kernel")");
  INFO(*m);
  CHECK(batched > 0);                          // bursts went in shared launches
  CHECK(batched + single == double(kWrites));  // every write counted once
  REQUIRE(agent->Stop() == 0);
}

TEST_CASE("paged and batch queue entries move a KV mapping for every layer on the GPU, byte for byte") {
  const CudaDriver* cu = GpuOrSkip();
  if (cu == nullptr) return;
  std::unique_ptr<AgentProcess> agent = StartAgent();
  // 8 layers of 512 blocks of 32 KiB in each buffer (layer l at l * kLayer); 300 blocks
  // of each layer move, scattered, by one table mapping named by 8 entries.
  constexpr uint64_t kBlock = 32 << 10, kLayerBlocks = 512, kLayer = kBlock * kLayerBlocks, kLayers = 8;
  constexpr uint32_t kMoved = 300;
  GpuPair p = MakeGpuPair(cu, *agent, kLayer * kLayers, kLayer * kLayers, 78);
  std::vector<uint8_t>& data = p.data;
  std::vector<uint8_t>& expect = p.expect;
  absl::StatusOr<std::unique_ptr<WriteQueue>> q =
      WriteQueue::Create(*p.writer, {p.d.region()}, 16, 0, v1::TRAFFIC_CLASS_UNSPECIFIED, 4 * kMoved + 8 * kLayers);
  REQUIRE(q.ok());
  const std::vector<uint32_t> sb = testing::ShuffledIds(kLayerBlocks, 1), db = testing::ShuffledIds(kLayerBlocks, 2);
  std::copy(sb.begin(), sb.begin() + kMoved, (*q)->table());
  std::copy(db.begin(), db.begin() + kMoved, (*q)->table() + kMoved);
  for (uint64_t l = 0; l < kLayers; ++l) {
    WriteQueue::PagedEntry e;
    e.src_region = p.s.region_id();
    e.src_base = e.dst_base = l * kLayer;
    e.block_size = kBlock;
    e.blocks = kMoved;
    e.user_data = l;
    REQUIRE((*q)->PostPaged(e).ok());
    for (uint32_t i = 0; i < kMoved; ++i) {
      memcpy(expect.data() + l * kLayer + db[i] * kBlock, data.data() + l * kLayer + sb[i] * kBlock, kBlock);
    }
  }
  std::vector<WriteQueue::Completion> done;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (done.size() < kLayers && absl::Now() < deadline) (*q)->Reap(&done, 16, absl::Seconds(1));
  REQUIRE(done.size() == kLayers);
  for (const WriteQueue::Completion& c : done) {
    INFO("layer " << c.user_data << ": " << c.status.ToString());
    CHECK(c.status.ok());
    CHECK(c.bytes == kMoved * kBlock);
  }
  REQUIRE(Diff(Download(cu, p.dst), expect) == "");

  // The same layers as one batch entry (one completion for every part), another mapping;
  // then blocks of an odd size (two pieces each, the second short, none 16-byte aligned).
  std::vector<queue::TablePart> parts;
  for (uint32_t l = 0; l < kLayers; ++l) parts.push_back({p.s.region_id(), l * kLayer, l * kLayer, 0, 0});
  for (const auto& [block, moved, seed] : {std::tuple<uint64_t, uint32_t, uint32_t>{kBlock, kMoved, 3},
                                           std::tuple<uint64_t, uint32_t, uint32_t>{(32 << 10) + 4101, 200, 5}}) {
    INFO("batch of " << moved << " blocks of " << block << " bytes per layer");
    std::vector<uint32_t> src = testing::ShuffledIds(kLayer / block, seed);
    std::vector<uint32_t> dst = testing::ShuffledIds(kLayer / block, seed + 1);
    src.resize(moved);
    dst.resize(moved);
    REQUIRE((*q)->PostBatch(2 * kMoved, parts, src, dst, {block, /*user_data=*/99}).ok());
    for (uint64_t l = 0; l < kLayers; ++l) {
      for (uint32_t i = 0; i < moved; ++i) {
        memcpy(expect.data() + l * kLayer + dst[i] * block, data.data() + l * kLayer + src[i] * block, block);
      }
    }
    done.clear();
    while (done.empty() && absl::Now() < deadline) (*q)->Reap(&done, 1, absl::Seconds(1));
    REQUIRE(done.size() == 1);
    INFO(done[0].status.ToString());
    CHECK(done[0].status.ok());
    CHECK(done[0].bytes == kLayers * moved * block);
    REQUIRE(Diff(Download(cu, p.dst), expect) == "");
  }

  // Many requests at once, as a KV producer answers a decode step's pulls: batch entries
  // of the same layers, each with its own blocks, posted back to back into disjoint
  // destination blocks; some of 17 blocks, some of one.
  constexpr uint32_t kRequests = 12;
  absl::StatusOr<std::unique_ptr<WriteQueue>> many =
      WriteQueue::Create(*p.writer, {p.d.region()}, 16, 0, v1::TRAFFIC_CLASS_UNSPECIFIED,
                         kRequests * (kLayers * queue::kPartIds + 2 * 17));
  REQUIRE(many.ok());
  const std::vector<uint32_t> free_dst = testing::ShuffledIds(kLayerBlocks, 7);
  uint32_t table = 0, used = 0;
  for (uint32_t r = 0; r < kRequests; ++r) {
    const uint32_t moved = r % 3 == 2 ? 1 : 17;
    std::vector<uint32_t> src = testing::ShuffledIds(kLayerBlocks, 100 + r);
    src.resize(moved);
    const std::vector<uint32_t> dst(free_dst.begin() + used, free_dst.begin() + used + moved);
    used += moved;
    REQUIRE((*many)->PostBatch(table, parts, src, dst, {kBlock, /*user_data=*/r}).ok());
    table += kLayers * queue::kPartIds + 2 * moved;
    for (uint64_t l = 0; l < kLayers; ++l) {
      for (uint32_t i = 0; i < moved; ++i) {
        memcpy(expect.data() + l * kLayer + dst[i] * kBlock, data.data() + l * kLayer + src[i] * kBlock, kBlock);
      }
    }
  }
  done.clear();
  while (done.size() < kRequests && absl::Now() < deadline) (*many)->Reap(&done, 16, absl::Seconds(1));
  REQUIRE(done.size() == kRequests);
  for (const WriteQueue::Completion& c : done) {
    INFO("request " << c.user_data << ": " << c.status.ToString());
    CHECK(c.status.ok());
    CHECK(c.bytes == kLayers * (c.user_data % 3 == 2 ? 1 : 17) * kBlock);
  }
  REQUIRE(Diff(Download(cu, p.dst), expect) == "");
  REQUIRE(agent->Stop() == 0);
}

TEST_CASE("host <-> GPU node-local writes; 10,000 blocks in one request") {
  const CudaDriver* cu = GpuOrSkip();
  if (cu == nullptr) return;
  std::unique_ptr<AgentProcess> agent = StartAgent();
  auto c = Connect(*agent);
  constexpr uint64_t kBytes = 16 << 20;
  CudaBuffer gpu = Allocate(0, kBytes, CudaExport::kPosixFd);
  CudaBuffer gpu2 = Allocate(cu->device_count - 1, kBytes, CudaExport::kPosixFd);
  absl::StatusOr<HostRegion> host = c->AllocateHost(kBytes);
  REQUIRE(host.ok());
  std::vector<uint8_t> data(kBytes);
  FillRandom(data.data(), kBytes, 99);
  memcpy(host->buffer.data(), data.data(), kBytes);
  Upload(cu, gpu, std::vector<uint8_t>(kBytes, 0xA5));
  v1::RegisterMemoryResponse g = Register(*c, gpu);
  v1::RegisterMemoryResponse g2 = Register(*c, gpu2);

  // host -> GPU, all of it, then GPU -> GPU as 10,000 scattered 1 KiB blocks, then back
  // to host over a poisoned buffer.
  WriteOk(*c, Contiguous(host->id(), g.region(), {{0, 0, kBytes}}));
  REQUIRE(Diff(Download(cu, gpu), data) == "");
  std::vector<uint8_t> expect(kBytes, 0xA5);
  Upload(cu, gpu2, expect);
  v1::WriteRequest paged = PagedWrite(g.region_id(), g2.region(), 1024, kBytes, 10000, 5);
  WriteOk(*c, paged);
  ApplyChunks(data, expect, paged);
  REQUIRE(Diff(Download(cu, gpu2), expect) == "");
  memset(host->buffer.data(), 0xA5, kBytes);
  WriteOk(*c, Contiguous(g2.region_id(), host->descriptor(), {{0, 0, kBytes}}));
  REQUIRE(memcmp(host->buffer.data(), expect.data(), kBytes) == 0);
  REQUIRE(agent->Stop() == 0);
}

// Two agents on loopback addresses. Over tcp;ofi_rxm (no FI_HMEM) GPU memory crosses
// "nodes" through host staging buffers on both sides (agent/staged), in 1 MiB stages
// through 4 MiB buffers; over a provider with FI_HMEM for CUDA the NICs register GPU
// memory and write it directly.
std::unique_ptr<AgentProcess> FabricAgent(const std::string& addr, const std::string& provider = "tcp;ofi_rxm") {
  return StartAgent({"--peer_address=" + addr + ":0", "--fabric_iface=" + addr, "--fabric_provider=" + provider,
                     "--staging_buffer_bytes=4194304", "--stage_bytes=1048576"});
}

// GPU to GPU, GPU to host and host to GPU between two agents; every write must take `path`.
void CrossAgentWrites(const CudaDriver* cu, const std::string& provider, v1::TransferPath path) {
  auto a = FabricAgent("127.0.0.1", provider);
  auto b = FabricAgent("127.0.0.2", provider);
  auto writer = Connect(*a);
  auto reader = Connect(*b);
  constexpr uint64_t kBytes = 16 << 20;
  CudaBuffer src = Allocate(0, kBytes, CudaExport::kPosixFd);
  CudaBuffer dst = Allocate(cu->device_count - 1, kBytes, CudaExport::kPosixFd);
  std::vector<uint8_t> data(kBytes);
  FillRandom(data.data(), kBytes, 77);
  Upload(cu, src, data);
  std::vector<uint8_t> expect(kBytes, 0xA5);
  Upload(cu, dst, expect);
  v1::RegisterMemoryResponse s = Register(*writer, src);
  v1::RegisterMemoryResponse d = Register(*reader, dst);
  auto ctx = reader->NewContext(absl::Seconds(60));
  auto stream = reader->stub()->WatchNotifications(ctx.get(), v1::WatchNotificationsRequest());

  // GPU -> GPU: 13 MiB in one chunk (staged: 13 stages, up to 4 in flight), an odd
  // chunk, then 2,000 scattered 4 KiB blocks; notified once, after the data.
  v1::WriteRequest big =
      Contiguous(s.region_id(), d.region(), {{0, 0, 13 << 20}, {(14 << 20) + 3, (15 << 20) + 1, 999}});
  big.set_notify(true);
  big.set_tag(5);
  absl::StatusOr<v1::TransferResult> r = writer->WriteAndWait(big, absl::Seconds(60));
  INFO(r.status().ToString() << "\n" << a->Log() << "\n" << b->Log());
  REQUIRE(r.ok());
  CHECK(r->path() == path);
  ApplyChunks(data, expect, big);
  REQUIRE(Diff(Download(cu, dst), expect) == "");
  v1::Notification n;
  REQUIRE(stream->Read(&n));
  CHECK(n.tag() == 5);
  CHECK(n.bytes() == (13 << 20) + 999);
  v1::WriteRequest paged = PagedWrite(s.region_id(), d.region(), 4096, kBytes, 2000, 8);
  WriteOk(*writer, paged);
  ApplyChunks(data, expect, paged);
  REQUIRE(Diff(Download(cu, dst), expect) == "");

  // GPU -> host and host -> GPU.
  absl::StatusOr<HostRegion> host_b = reader->AllocateHost(kBytes);
  REQUIRE(host_b.ok());
  memset(host_b->buffer.data(), 0xA5, kBytes);
  WriteOk(*writer, Contiguous(s.region_id(), host_b->descriptor(), {{0, 0, kBytes}}));
  CHECK(memcmp(host_b->buffer.data(), data.data(), kBytes) == 0);
  absl::StatusOr<HostRegion> host_a = writer->AllocateHost(kBytes);
  REQUIRE(host_a.ok());
  FillRandom(host_a->buffer.data(), kBytes, 78);
  WriteOk(*writer, Contiguous(host_a->id(), d.region(), {{0, 0, kBytes}}));
  std::vector<uint8_t> from_host(host_a->buffer.data(), host_a->buffer.data() + kBytes);
  REQUIRE(Diff(Download(cu, dst), from_host) == "");
  ctx->TryCancel();
  REQUIRE(a->Stop() == 0);
  REQUIRE(b->Stop() == 0);
}

// FERRY_TEST_STAGED_PROVIDER: another provider without CUDA FI_HMEM, e.g. Debian's shm,
// whose FI_HMEM covers host memory only (the agent must fall back to staging).
TEST_CASE("staged cross-agent writes: GPU to GPU, GPU to host, host to GPU") {
  const CudaDriver* cu = GpuOrSkip();
  if (cu == nullptr) return;
  const char* provider = getenv("FERRY_TEST_STAGED_PROVIDER");
  CrossAgentWrites(cu, provider != nullptr && *provider != 0 ? provider : "tcp;ofi_rxm", v1::TRANSFER_PATH_STAGED);
}

// FERRY_TEST_HMEM_PROVIDER names a libfabric provider with FI_HMEM for CUDA in the
// libfabric on LD_LIBRARY_PATH (tests/gpu/run_hmem.sh builds one and sets it to shm).
TEST_CASE("FI_HMEM cross-agent writes: GPU memory registered with the NICs and written directly") {
  const CudaDriver* cu = GpuOrSkip();
  if (cu == nullptr) return;
  const char* provider = getenv("FERRY_TEST_HMEM_PROVIDER");
  if (provider == nullptr || *provider == 0) {
    printf("SKIPPED %s: set FERRY_TEST_HMEM_PROVIDER to a provider with CUDA FI_HMEM (tests/gpu/run_hmem.sh)\n",
           Catch::getResultCapture().getCurrentTestName().c_str());
    return;
  }
  CrossAgentWrites(cu, provider, v1::TRANSFER_PATH_FABRIC);
}

// Rails on a real GPU host: two agents in network namespaces, each with one stand-in
// NIC per GPU (veth ethN) that a fake sysfs tree puts behind GPU N's PCIe switch (the
// GPUs' real PCI addresses). A staged write from GPU N's memory goes over nic N only.
TEST_CASE("staged writes go over the source GPU's rail") {
  const CudaDriver* cu = GpuOrSkip();
  if (cu == nullptr) return;
  const int gpus = std::min(cu->device_count, 2);
  testing::TestNetwork net = testing::TestNetwork::Create(2, gpus);
  if (!net.namespaces()) {
    printf("SKIPPED %s: needs network namespaces (root and iproute2)\n",
           Catch::getResultCapture().getCurrentTestName().c_str());
    return;
  }
  std::string spec = "node 0 0-1023\n";
  for (int g = 0; g < gpus; ++g) {
    char bus[32] = {0};
    CUdevice dev;
    REQUIRE(cu->cuDeviceGet(&dev, g) == CUDA_SUCCESS);
    REQUIRE(cu->cuDeviceGetPCIBusId(bus, sizeof(bus), dev) == CUDA_SUCCESS);
    const std::string sw = absl::StrFormat("pci0000:%02x/0000:%02x:01.0/0000:%02x:00.0", 0x10 * (g + 1), 0x10 * (g + 1),
                                           0x10 * (g + 1) + 1);
    absl::StrAppend(&spec, "gpu ", sw, "/0000:00:00.0/", absl::AsciiStrToLower(bus), " numa 0\n");
    absl::StrAppend(&spec, "net eth", g, " ", sw, absl::StrFormat("/0000:00:01.0/0000:%02x:00.0", 0x10 * (g + 1) + 3),
                    " numa 0\n");
  }
  const std::string root = testing::MakeTempDir("sysfs");
  REQUIRE(testing::WriteFakeSysfs(spec, root).ok());
  const std::vector<std::string> flags = {"--sysfs_root=" + root, "--staging_buffer_bytes=4194304"};
  auto a = testing::StartFabricAgent(net.host(0), flags);
  auto b = testing::StartFabricAgent(net.host(1), flags);
  auto writer = Connect(*a);
  auto reader = Connect(*b);
  absl::StatusOr<v1::GetTopologyResponse> topo = writer->GetTopology();
  REQUIRE(topo.ok());
  REQUIRE(topo->rails_size() == gpus);
  constexpr uint64_t kBytes = 8 << 20;
  absl::StatusOr<HostRegion> sink = reader->AllocateHost(kBytes);
  REQUIRE(sink.ok());
  for (int g = 0; g < gpus; ++g) {
    INFO("GPU " << g << ", rail " << topo->rails(g).DebugString());
    CHECK(topo->rails(g).link() == "PIX");
    CudaBuffer src = Allocate(g, kBytes, CudaExport::kPosixFd);
    std::vector<uint8_t> data(kBytes);
    FillRandom(data.data(), kBytes, 90 + g);
    Upload(cu, src, data);
    v1::RegisterMemoryResponse s = Register(*writer, src);
    auto before = writer->GetStatus();
    REQUIRE(before.ok());
    WriteOk(*writer, Contiguous(s.region_id(), sink->descriptor(), {{0, 0, kBytes}}));
    CHECK(memcmp(sink->buffer.data(), data.data(), kBytes) == 0);
    auto after = writer->GetStatus();
    REQUIRE(after.ok());
    for (int n = 0; n < gpus; ++n) {
      INFO("nic" << n);
      CHECK(after->nics(n).tx_bytes() - before->nics(n).tx_bytes() == (n == g ? kBytes : 0));
    }
  }
  REQUIRE(a->Stop() == 0);
  REQUIRE(b->Stop() == 0);
  std::filesystem::remove_all(root);
}

// A request altered by `mutate` must fail with `code` and the agent must carry on.
void ExpectRefused(Client& c, v1::RegisterMemoryRequest req, absl::StatusCode code, const std::string& what) {
  auto ctx = c.NewContext();
  v1::RegisterMemoryResponse resp;
  absl::Status s = FromGrpcStatus(c.stub()->RegisterMemory(ctx.get(), req, &resp));
  INFO(what << ": " << s.ToString());
  CHECK(s.code() == code);
  CHECK(!s.message().empty());
}

TEST_CASE("bad GPU handles get a clear status and no crash") {
  const CudaDriver* cu = GpuOrSkip();
  if (cu == nullptr) return;
  std::unique_ptr<AgentProcess> agent = StartAgent();
  auto c = Connect(*agent);
  CudaBuffer ipc = Allocate(0, 1 << 20, CudaExport::kIpc);
  absl::StatusOr<v1::RegisterMemoryRequest> good = CudaRegistration(*c, ipc);
  REQUIRE(good.ok());

  v1::RegisterMemoryRequest r = *good;
  r.mutable_cuda_ipc()->set_ipc_handle(std::string(64, '\x5a'));
  ExpectRefused(*c, r, absl::StatusCode::kInvalidArgument, "garbage IPC handle");
  r = *good;
  r.mutable_cuda_ipc()->set_ipc_handle(good->cuda_ipc().ipc_handle().substr(0, 63));
  ExpectRefused(*c, r, absl::StatusCode::kInvalidArgument, "truncated IPC handle");
  r = *good;
  r.set_size(2 << 20);
  ExpectRefused(*c, r, absl::StatusCode::kOutOfRange, "size past the allocation");
  r = *good;
  r.mutable_cuda_ipc()->set_offset(1 << 20);
  ExpectRefused(*c, r, absl::StatusCode::kOutOfRange, "offset at the end");
  r = *good;
  r.mutable_cuda_ipc()->clear_pci_bus_id();
  r.mutable_cuda_ipc()->set_device(cu->device_count + 3);
  ExpectRefused(*c, r, absl::StatusCode::kInvalidArgument, "device that does not exist");
  r.mutable_cuda_ipc()->set_pci_bus_id("0000:ff:1f.7");
  ExpectRefused(*c, r, absl::StatusCode::kInvalidArgument, "unknown PCI bus id");

  // Freed memory: the handle names an allocation its owner has freed. The driver may
  // refuse it, or (seen with small allocations it keeps pooled) still map memory the
  // exporting process owns; either way the agent answers and stays up.
  {
    CudaBuffer gone = Allocate(0, 64 << 20, CudaExport::kIpc);
    absl::StatusOr<v1::RegisterMemoryRequest> stale = CudaRegistration(*c, gone);
    REQUIRE(stale.ok());
    gone.Free();
    auto ctx = c->NewContext();
    v1::RegisterMemoryResponse resp;
    absl::Status s = FromGrpcStatus(c->stub()->RegisterMemory(ctx.get(), *stale, &resp));
    printf("finding: IPC handle of freed memory -> %s\n", s.ToString().c_str());
    CHECK((s.ok() || s.code() == absl::StatusCode::kInvalidArgument));
    if (s.ok()) REQUIRE(c->Deregister(resp.region_id()).ok());
  }

  // fd kinds: a pipe, a wrong allocation size, a dma-buf (no FI_HMEM provider here).
  CudaBuffer vmm = Allocate(0, 2 << 20, CudaExport::kPosixFd);
  absl::StatusOr<v1::RegisterMemoryRequest> fd_req = CudaRegistration(*c, vmm);
  REQUIRE(fd_req.ok());
  int pipe_fds[2];
  REQUIRE(pipe(pipe_fds) == 0);
  absl::StatusOr<uint64_t> pipe_handle = c->SendFd(pipe_fds[0]);
  REQUIRE(pipe_handle.ok());
  r = *fd_req;
  r.mutable_cuda_fd()->set_fd_handle(*pipe_handle);
  ExpectRefused(*c, r, absl::StatusCode::kInvalidArgument, "a pipe as cuda_fd");
  close(pipe_fds[0]);
  close(pipe_fds[1]);
  absl::StatusOr<v1::RegisterMemoryRequest> big = CudaRegistration(*c, vmm);
  REQUIRE(big.ok());
  big->mutable_cuda_fd()->set_allocation_size(vmm.size() * 4);
  big->set_size(vmm.size() * 4);
  ExpectRefused(*c, *big, absl::StatusCode::kInvalidArgument, "allocation_size larger than the allocation");
  if (cu->device_count > 1) {  // fd handles carry their real device; IPC handles do not
    absl::StatusOr<v1::RegisterMemoryRequest> wrong = CudaRegistration(*c, vmm);
    REQUIRE(wrong.ok());
    wrong->mutable_cuda_fd()->clear_pci_bus_id();
    wrong->mutable_cuda_fd()->set_device(1);
    ExpectRefused(*c, *wrong, absl::StatusCode::kInvalidArgument, "wrong device");
  }
  absl::StatusOr<v1::RegisterMemoryRequest> unknown = CudaRegistration(*c, vmm);
  REQUIRE(unknown.ok());
  unknown->mutable_cuda_fd()->set_fd_kind(static_cast<v1::CudaFdMemory::FdKind>(9));
  ExpectRefused(*c, *unknown, absl::StatusCode::kInvalidArgument, "unknown fd_kind");
  CudaBuffer dmabuf = Allocate(0, 2 << 20, CudaExport::kDmaBuf);
  absl::StatusOr<v1::RegisterMemoryRequest> dma = CudaRegistration(*c, dmabuf);
  INFO(dma.status().ToString());
  if (dma.ok()) {
    ExpectRefused(*c, *dma, absl::StatusCode::kFailedPrecondition, "dma-buf without an FI_HMEM provider");
  } else {
    WARN("this GPU or driver exports no dma-buf: " << dma.status());
  }

  // The agent is unharmed: a good registration still works, nothing leaked.
  v1::GetStatusResponse st = Status(*c);
  CHECK(st.regions() == 0);
  CHECK(st.cuda_imports() == 0);
  Register(*c, ipc);
  REQUIRE(agent->Stop() == 0);
}

TEST_CASE("regions on one allocation share one import, released with the last region") {
  const CudaDriver* cu = GpuOrSkip();
  if (cu == nullptr) return;
  std::unique_ptr<AgentProcess> agent = StartAgent();
  auto c = Connect(*agent);
  for (CudaExport kind : {CudaExport::kIpc, CudaExport::kPosixFd}) {
    CudaBuffer b = Allocate(0, 4 << 20, kind);
    std::vector<uint64_t> ids;
    for (uint64_t off : {0, 1 << 20, 2 << 20}) {
      absl::StatusOr<v1::RegisterMemoryResponse> r = RegisterCuda(*c, b, off, 1 << 20);
      INFO(r.status().ToString());
      REQUIRE(r.ok());
      ids.push_back(r->region_id());
    }
    INFO(KindName(kind));
    CHECK(Status(*c).cuda_imports() == 1);
    REQUIRE(c->Deregister(ids[0]).ok());
    REQUIRE(c->Deregister(ids[1]).ok());
    CHECK(Status(*c).cuda_imports() == 1);
    REQUIRE(c->Deregister(ids[2]).ok());
    CHECK(Eventually(*c, [](const v1::GetStatusResponse& s) { return s.cuda_imports() == 0; }));
  }
  REQUIRE(agent->Stop() == 0);
}

TEST_CASE("memory a pod frees while registered stays valid for the agent") {
  const CudaDriver* cu = GpuOrSkip();
  if (cu == nullptr) return;
  std::unique_ptr<AgentProcess> agent = StartAgent();
  auto c = Connect(*agent);
  for (CudaExport kind : {CudaExport::kIpc, CudaExport::kPosixFd}) {
    CudaBuffer src = Allocate(0, 1 << 20, kind);
    std::vector<uint8_t> data(src.size());
    FillRandom(data.data(), data.size(), 7);
    Upload(cu, src, data);
    v1::RegisterMemoryResponse s = Register(*c, src);
    src.Free();  // the pod frees it; the agent's import still holds it
    absl::StatusOr<HostRegion> host = c->AllocateHost(data.size());
    REQUIRE(host.ok());
    WriteOk(*c, Contiguous(s.region_id(), host->descriptor(), {{0, 0, data.size()}}));
    INFO(KindName(kind));
    CHECK(memcmp(host->buffer.data(), data.data(), data.size()) == 0);
    REQUIRE(c->Deregister(s.region_id()).ok());
  }
  REQUIRE(agent->Stop() == 0);
}

TEST_CASE("a pod killed while its GPU memory is registered is reclaimed") {
  const CudaDriver* cu = GpuOrSkip();
  if (cu == nullptr) return;
  std::unique_ptr<AgentProcess> agent = StartAgent();
  auto c = Connect(*agent);
  std::string ready = agent->dir() + "/pod.ready";
  auto pod = ChildProcess::Spawn({g_self, "--pod=hold", "--socket=" + agent->socket(), "--ready=" + ready},
                                 agent->dir() + "/pod.log");
  REQUIRE(pod.ok());
  absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (access(ready.c_str(), R_OK) != 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  REQUIRE(access(ready.c_str(), R_OK) == 0);
  CHECK(Status(*c).regions() == 3);
  CHECK(Status(*c).cuda_imports() == 2);
  (*pod)->Kill(9);
  CHECK(Eventually(*c, [](const v1::GetStatusResponse& s) { return s.regions() == 0 && s.cuda_imports() == 0; }));
  REQUIRE(agent->Stop() == 0);
}

// Which handle kinds cross a PID + IPC namespace boundary (two pods on one node).
TEST_CASE("handle kinds across PID and IPC namespaces") {
  const CudaDriver* cu = GpuOrSkip();
  if (cu == nullptr) return;
  if (geteuid() != 0) {
    printf("SKIPPED (needs root for unshare --pid --ipc)\n");
    return;
  }
  std::unique_ptr<AgentProcess> agent = StartAgent();
  std::string report;
  int fd_status = -1;
  for (const char* kind : {"ipc", "fd", "dmabuf"}) {
    std::string log = agent->dir() + "/ns-" + kind + ".log";
    // As two pods on a node: own PID namespace (with its own /proc), own IPC namespace.
    auto pod = ChildProcess::Spawn({"/usr/bin/unshare", "--pid", "--ipc", "--mount", "--mount-proc", "--fork", g_self,
                                    "--pod=cross-ns", std::string("--kind=") + kind, "--socket=" + agent->socket()},
                                   log);
    REQUIRE(pod.ok());
    int st = (*pod)->Wait(absl::Seconds(60));
    std::ifstream in(log + ".out");  // the pod's stdout
    std::string out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    absl::StrAppend(&report, kind, ": exit ", st, "  ", out.substr(0, 400), "\n");
    if (std::string(kind) == "fd") fd_status = st;
  }
  printf("handle kinds across PID+IPC namespaces:\n%s", report.c_str());
  if (const char* f = getenv("FERRY_FINDINGS")) std::ofstream(f) << report;
  // The preferred path (POSIX fd over the session socket) must work between pods.
  REQUIRE(fd_status == 0);
  REQUIRE(agent->Stop() == 0);
}

// ---------------------------------------------------------------- pod stand-ins

std::string Flag(int argc, char** argv, const std::string& name) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--" + name + "=", 0) == 0) return a.substr(name.size() + 3);
  }
  return "";
}

// --pod=hold: registers GPU memory (two allocations, three regions) and sleeps.
// --pod=cross-ns --kind=K: registers 1 MiB of GPU memory exported as K, has the agent
// copy it into a host region, checks every byte. Exit 0: works; 2: the agent refused
// the registration (message printed); 1: anything else.
int PodMain(int argc, char** argv) {
  std::string mode = Flag(argc, argv, "pod");
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(Flag(argc, argv, "socket"));
  if (!c.ok()) {
    printf("connect: %s\n", c.status().ToString().c_str());
    return 1;
  }
  if (mode == "hold") {
    auto a = CudaBuffer::Allocate(0, 2 << 20, CudaExport::kPosixFd);
    auto b = CudaBuffer::Allocate(0, 2 << 20, CudaExport::kIpc);
    if (!a.ok() || !b.ok()) return 1;
    if (!RegisterCuda(**c, *a, 0, 1 << 20).ok() || !RegisterCuda(**c, *a, 1 << 20, 1 << 20).ok() ||
        !RegisterCuda(**c, *b).ok()) {
      return 1;
    }
    std::ofstream(Flag(argc, argv, "ready")) << "ok";
    for (;;) pause();
  }
  std::string kind = Flag(argc, argv, "kind");
  CudaExport k = kind == "ipc" ? CudaExport::kIpc : kind == "fd" ? CudaExport::kPosixFd : CudaExport::kDmaBuf;
  absl::StatusOr<CudaBuffer> b = CudaBuffer::Allocate(0, 1 << 20, k);
  if (!b.ok()) {
    printf("allocate: %s\n", b.status().ToString().c_str());
    return 1;
  }
  const CudaDriver* cu = *CudaDriver::Load();
  std::vector<uint8_t> data(b->size());
  FillRandom(data.data(), data.size(), 3);
  cu->cuMemcpyHtoD(b->ptr(), data.data(), data.size());
  absl::StatusOr<v1::RegisterMemoryResponse> reg = RegisterCuda(**c, *b);
  if (!reg.ok()) {
    printf("refused: %s\n", reg.status().ToString().c_str());
    return 2;
  }
  absl::StatusOr<HostRegion> host = (*c)->AllocateHost(data.size());
  if (!host.ok()) return 1;
  v1::WriteRequest w = Contiguous(reg->region_id(), host->descriptor(), {{0, 0, data.size()}});
  absl::StatusOr<v1::TransferResult> r = (*c)->WriteAndWait(w, absl::Seconds(20));
  if (!r.ok()) {
    printf("write: %s\n", r.status().ToString().c_str());
    return 1;
  }
  bool same = memcmp(host->buffer.data(), data.data(), data.size()) == 0;
  printf("%s\n", same ? "works: registered and copied by the agent, every byte checked" : "data mismatch");
  return same ? 0 : 1;
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  ferry::g_self = argv[0];
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]).rfind("--pod=", 0) == 0) {
      setvbuf(stdout, nullptr, _IONBF, 0);
      return ferry::PodMain(argc, argv);
    }
  }
  return Catch::Session().run(argc, argv);
}
