// fi_write_bench: the raw libfabric baseline for tools/bench.sh cross-node.
//
//   fi_write_bench target    --iface=A --dir=D --size=BYTES
//   fi_write_bench initiator --iface=B --dir=D --sizes=... --count=N --window=W --lat_iters=K [--row_bytes=B]
//                            [--span=BYTES]
//
// The same provider (tcp;ofi_rxm), endpoint type (RDM), flags (FI_DELIVERY_COMPLETE) and
// window as ferry's engine, without the agent: the target registers a buffer and
// progresses its CQ until D/stop appears (one target serves any number of initiator
// runs, so tools/bench.sh can alternate them with ferry's); the initiator posts `count`
// writes of each size (at most --row_bytes, default 1 GiB, per size) with `window` in
// flight after an untimed warm-up (2 * `window` writes or 64 MiB, whichever is less),
// prints "size count time_us algbw_GBps", then 8-byte write latencies when --lat_iters
// > 0. Addresses and keys are exchanged through files in --dir. Controls: --memory=memfd (buffers in a shared memfd
// mapping, as pods hand the agent), --threading=safe and --cq_wait=fd (ferry's endpoint settings).
// By default every write goes from the start of the initiator's buffer to the start of
// the target's, so both stay in the CPUs' caches (as ib_write_bw's do); --span=BYTES
// (at most the target's --size) moves distinct memory instead: the writes of a size walk
// a random permutation of the span's blocks of that size on each side, as a mover of
// scattered KV blocks does.
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace {

std::string Arg(int argc, char** argv, const std::string& name, const std::string& def) {
  std::string prefix = "--" + name + "=";
  for (int i = 2; i < argc; ++i) {
    if (strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) return argv[i] + prefix.size();
  }
  return def;
}

#define CHECK_FI(call)                                                 \
  do {                                                                 \
    int rc_ = (call);                                                  \
    if (rc_) {                                                         \
      fprintf(stderr, "%s: %s (%d)\n", #call, fi_strerror(-rc_), rc_); \
      exit(1);                                                         \
    }                                                                  \
  } while (0)

struct Endpoint {
  fi_info* info;
  fid_fabric* fabric;
  fid_domain* domain;
  fid_av* av;
  fid_cq* cq;
  fid_ep* ep;
};

// --threading=safe asks for FI_THREAD_SAFE and --cq_wait=fd for a CQ with a wait fd, as
// ferry's agent does (it registers memory from other threads and sleeps on the CQ);
// the defaults leave both to the provider.
Endpoint Open(int argc, char** argv) {
  const std::string iface = Arg(argc, argv, "iface", "127.0.0.1");
  Endpoint e{};
  fi_info* hints = fi_allocinfo();
  hints->ep_attr->type = FI_EP_RDM;
  hints->caps = FI_RMA | FI_WRITE | FI_REMOTE_WRITE;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
  hints->tx_attr->op_flags = FI_DELIVERY_COMPLETE;
  hints->fabric_attr->prov_name = strdup("tcp;ofi_rxm");
  if (Arg(argc, argv, "threading", "") == "safe") hints->domain_attr->threading = FI_THREAD_SAFE;
  CHECK_FI(fi_getinfo(FI_VERSION(1, 9), iface.c_str(), nullptr, FI_SOURCE, hints, &e.info));
  fi_freeinfo(hints);
  CHECK_FI(fi_fabric(e.info->fabric_attr, &e.fabric, nullptr));
  CHECK_FI(fi_domain(e.fabric, e.info, &e.domain, nullptr));
  fi_av_attr av_attr{};
  av_attr.type = FI_AV_TABLE;
  CHECK_FI(fi_av_open(e.domain, &av_attr, &e.av, nullptr));
  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_CONTEXT;
  cq_attr.size = 4096;
  if (Arg(argc, argv, "cq_wait", "none") == "fd") cq_attr.wait_obj = FI_WAIT_FD;
  CHECK_FI(fi_cq_open(e.domain, &cq_attr, &e.cq, nullptr));
  CHECK_FI(fi_endpoint(e.domain, e.info, &e.ep, nullptr));
  CHECK_FI(fi_ep_bind(e.ep, &e.av->fid, 0));
  CHECK_FI(fi_ep_bind(e.ep, &e.cq->fid, FI_TRANSMIT | FI_RECV));
  CHECK_FI(fi_enable(e.ep));
  return e;
}

void WriteFile(const std::string& path, const std::string& data) {
  { std::ofstream(path + ".tmp", std::ios::binary) << data; }
  rename((path + ".tmp").c_str(), path.c_str());
}

std::string ReadFileWait(const std::string& path) {
  for (int i = 0; i < 2000 && access(path.c_str(), R_OK) != 0; ++i) usleep(5000);
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The buffers: anonymous memory, or (--memory=memfd) a shared memfd mapping, the kind
// of memory pods hand the agent.
char* Buffer(int argc, char** argv, size_t size) {
  if (Arg(argc, argv, "memory", "anon") == "memfd") {
    int fd = memfd_create("fi_write_bench", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(size)) != 0) exit(1);
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) exit(1);
    memset(p, 'x', size);
    return static_cast<char*>(p);
  }
  return static_cast<char*>(memset(new char[size], 'x', size));
}

double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

int Target(int argc, char** argv) {
  const std::string dir = Arg(argc, argv, "dir", "/tmp");
  const size_t size = std::stoull(Arg(argc, argv, "size", "67108864"));
  Endpoint e = Open(argc, argv);
  char* buf = Buffer(argc, argv, size);
  fid_mr* mr;
  CHECK_FI(fi_mr_reg(e.domain, buf, size, FI_REMOTE_WRITE, 0, 7, 0, &mr, nullptr));
  char name[256];
  size_t len = sizeof(name);
  CHECK_FI(fi_getname(&e.ep->fid, name, &len));
  uint64_t key = fi_mr_key(mr);
  uint64_t base = (e.info->domain_attr->mr_mode & FI_MR_VIRT_ADDR) ? reinterpret_cast<uint64_t>(buf) : 0;
  std::string info(name, len);
  info.append(reinterpret_cast<char*>(&key), 8);
  info.append(reinterpret_cast<char*>(&base), 8);
  WriteFile(dir + "/target.addr", info);
  // Progress until told to stop (the target posts nothing), an hour at most.
  const std::string stop = dir + "/stop";
  const double deadline = Now() + 3600;
  fi_cq_entry entry;
  for (long i = 0;; ++i) {
    fi_cq_read(e.cq, &entry, 1);
    if (i % 4096 == 0 && (access(stop.c_str(), F_OK) == 0 || Now() > deadline)) return 0;
  }
}

int Initiator(int argc, char** argv) {
  const std::string dir = Arg(argc, argv, "dir", "/tmp");
  const int count = std::stoi(Arg(argc, argv, "count", "50"));
  const uint64_t row_bytes = std::stoull(Arg(argc, argv, "row_bytes", std::to_string(1ull << 30)));
  const int window = std::stoi(Arg(argc, argv, "window", "16"));
  const int lat_iters = std::stoi(Arg(argc, argv, "lat_iters", "1000"));
  const uint64_t span = std::stoull(Arg(argc, argv, "span", "0"));
  std::vector<size_t> sizes;
  std::string s = Arg(argc, argv, "sizes", "4096,65536,1048576,16777216,67108864");
  for (size_t p = 0; p != std::string::npos;) {
    size_t q = s.find(',', p);
    sizes.push_back(std::stoull(s.substr(p, q == std::string::npos ? q : q - p)));
    p = q == std::string::npos ? q : q + 1;
  }
  Endpoint e = Open(argc, argv);
  std::string info = ReadFileWait(dir + "/target.addr");
  if (info.size() < 17) return 1;
  uint64_t key, base;
  memcpy(&key, info.data() + info.size() - 16, 8);
  memcpy(&base, info.data() + info.size() - 8, 8);
  fi_addr_t peer;
  if (fi_av_insert(e.av, info.data(), 1, &peer, 0, nullptr) != 1) return 1;
  const size_t max_size = *std::max_element(sizes.begin(), sizes.end());
  const size_t buf_size = std::max<size_t>(max_size, span);
  char* buf = Buffer(argc, argv, buf_size);
  fid_mr* mr;
  CHECK_FI(fi_mr_reg(e.domain, buf, buf_size, FI_WRITE, 0, 9, 0, &mr, nullptr));
  void* desc = fi_mr_desc(mr);
  std::vector<fi_context2> ctx(window);
  // With --span: each side's block of write i (a random permutation per size); else {0}.
  std::vector<uint64_t> src_block{0}, dst_block{0};
  std::mt19937_64 rng(1);
  auto scatter = [&](size_t size) {
    const size_t blocks = span >= size ? span / size : 1;
    src_block.resize(blocks);
    std::iota(src_block.begin(), src_block.end(), 0);
    dst_block = src_block;
    std::shuffle(src_block.begin(), src_block.end(), rng);
    std::shuffle(dst_block.begin(), dst_block.end(), rng);
  };

  auto run = [&](size_t size, int n) {
    int posted = 0, done = 0;
    fi_cq_entry entries[64];
    const size_t blocks = src_block.size();
    while (done < n) {
      while (posted < n && posted - done < window) {
        const size_t b = static_cast<size_t>(posted) % blocks;
        ssize_t rc = fi_write(e.ep, buf + src_block[b] * size, size, desc, peer, base + dst_block[b] * size, key,
                              &ctx[posted % window]);
        if (rc == -FI_EAGAIN) break;
        if (rc) {
          fprintf(stderr, "fi_write: %s\n", fi_strerror(-rc));
          exit(1);
        }
        ++posted;
      }
      ssize_t c = fi_cq_read(e.cq, entries, 64);
      if (c > 0) done += c;
      if (c == -FI_EAVAIL) {
        fi_cq_err_entry err{};
        fi_cq_readerr(e.cq, &err, 0);
        fprintf(stderr, "write failed: %s\n", fi_strerror(err.err));
        exit(1);
      }
    }
  };
  run(8, 10);  // connect
  for (size_t size : sizes) {
    int n = std::max(4, static_cast<int>(std::min<uint64_t>(count, row_bytes / size)));
    if (span > 0) scatter(size);
    run(size, static_cast<int>(std::clamp<size_t>((64u << 20) / size, 1, 2 * window)));  // warm-up
    double t0 = Now();
    run(size, n);
    double us = (Now() - t0) * 1e6;
    printf("%zu %d %.1f %.3f\n", size, n, us / n, size * n / us / 1e3);
    fflush(stdout);
  }
  std::vector<double> lat;
  src_block.assign(1, 0);  // the latency rows write one block, with or without --span
  dst_block.assign(1, 0);
  for (int i = 0; i < lat_iters; ++i) {
    double t0 = Now();
    run(8, 1);
    lat.push_back((Now() - t0) * 1e6);
  }
  std::sort(lat.begin(), lat.end());
  if (!lat.empty()) printf("lat8 %.1f %.1f\n", lat[lat.size() / 2], lat[lat.size() * 99 / 100]);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: fi_write_bench target|initiator --iface=ADDR --dir=D ...\n");
    return 2;
  }
  std::string mode = argv[1];
  return mode == "target" ? Target(argc, argv) : Initiator(argc, argv);
}
