// ferry C++ client: a session with the local agent, host buffers, writes.
//
//   absl::StatusOr<std::unique_ptr<ferry::Client>> c = ferry::Client::Connect("/run/ferry/ferry.sock");
//   absl::StatusOr<ferry::HostBuffer> buf = ferry::HostBuffer::Create(1 << 20);
//   absl::StatusOr<ferry::v1::RegisterMemoryResponse> reg = (*c)->RegisterHost(*buf);
//   std::string wire = reg->region().SerializeAsString();   // hand to another pod
//
//   // In the other pod:
//   ferry::v1::RegionDescriptor dst;
//   dst.ParseFromString(wire);
//   absl::StatusOr<uint64_t> id = (*c)->Write(src_region, dst, {{0, 0, 4096}}, /*notify=*/true, /*tag=*/7);
//   absl::StatusOr<ferry::v1::TransferResult> r = (*c)->Wait(*id, absl::Seconds(10));
//
// The session lasts as long as the Client: destroying it (or the process dying) makes
// the agent reclaim every region the session registered. The destructor waits (up to
// 2 s) until the agent has, so the next Client of this process finds the room given back.
#ifndef FERRY_CLIENT_CPP_FERRY_CLIENT_H_
#define FERRY_CLIENT_CPP_FERRY_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "proto/ferry/v1/ferry.grpc.pb.h"
#include "proto/ferry/v1/grpc_status.h"

namespace ferry {

// Host memory the agent can map: a memfd of `size` bytes, mapped read-write here.
class HostBuffer {
 public:
  static absl::StatusOr<HostBuffer> Create(uint64_t size);
  HostBuffer(HostBuffer&& o) noexcept;
  HostBuffer& operator=(HostBuffer&& o) noexcept;
  ~HostBuffer();

  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  int fd() const { return fd_; }

 private:
  HostBuffer(int fd, uint8_t* data, uint64_t size) : fd_(fd), data_(data), size_(size) {}
  int fd_ = -1;
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

// Puts a paged layout's ids into `paged`, each side packed (src_blocks_le32 /
// dst_blocks_le32: a few microseconds for 16,384 blocks) when its ids fit 32 bits, else
// as varints (~0.5 ms to write and read 32,768 of them). What Client::WriteBlocks sends.
void SetBlockIds(const std::vector<uint64_t>& src_blocks, const std::vector<uint64_t>& dst_blocks,
                 v1::PagedChunks* paged);

// A host buffer together with its registration (see Client::AllocateHost).
struct HostRegion {
  HostBuffer buffer;
  v1::RegisterMemoryResponse registration;

  uint64_t id() const { return registration.region_id(); }
  // What to hand to a pod that should write into this region.
  const v1::RegionDescriptor& descriptor() const { return registration.region(); }
};

struct ChunkSpec {
  uint64_t src_offset;
  uint64_t dst_offset;
  uint64_t length;
};

struct ByteRange {
  uint64_t offset;
  uint64_t length;
};

class Client {
 public:
  // Opens a session (session socket beside `socket`) and a gRPC channel on `socket`.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const std::string& socket);
  ~Client();

  uint64_t session_id() const { return session_id_; }

  // After the agent restarted, calls fail with UNAVAILABLE ("call Reconnect()"). This
  // opens a new session, waiting up to `timeout` for the agent; the caller registers its
  // memory again (a HostBuffer can be registered again as is) and hands out the new
  // descriptors. Writes in flight when the agent died are lost.
  absl::Status Reconnect(absl::Duration timeout = absl::Seconds(30));

  // Sends `fd` (a dup of it) on the session socket; returns the agent's fd handle.
  absl::StatusOr<uint64_t> SendFd(int fd);

  // `write_windows`: the region takes writes only through write windows this client
  // opens (OpenWriteWindow), never with its own descriptor.
  absl::StatusOr<v1::RegisterMemoryResponse> RegisterHost(const HostBuffer& buffer, bool write_windows = false);
  // HostBuffer::Create(size) and RegisterHost in one step.
  absl::StatusOr<HostRegion> AllocateHost(uint64_t size, bool write_windows = false);
  // Opens `ranges` of `regions` (this session's, in window mode) to the writer owning the
  // region `writer` describes (null: any holder), for `timeout`; hand the response's
  // descriptors to the writer. CloseWriteWindow returns once nothing can land through it.
  absl::StatusOr<v1::OpenWriteWindowResponse> OpenWriteWindow(const std::vector<uint64_t>& regions,
                                                              const std::vector<ByteRange>& ranges,
                                                              const v1::RegionDescriptor* writer,
                                                              absl::Duration timeout);
  absl::Status CloseWriteWindow(uint64_t window_id, absl::Duration wait = absl::Seconds(1));
  absl::Status Deregister(uint64_t region_id);

  absl::StatusOr<uint64_t> Write(uint64_t src_region, const v1::RegionDescriptor& dst,
                                 const std::vector<ChunkSpec>& chunks, bool notify = false, uint64_t tag = 0);
  absl::StatusOr<uint64_t> WriteBlocks(uint64_t src_region, const v1::RegionDescriptor& dst, uint64_t block_size,
                                       const std::vector<uint64_t>& src_blocks, const std::vector<uint64_t>& dst_blocks,
                                       bool notify = false, uint64_t tag = 0);
  absl::StatusOr<uint64_t> Write(const v1::WriteRequest& request);
  // One transfer of several parts (e.g. one block mapping over every layer's region);
  // Wait and WatchCompletions see it as one transfer.
  absl::StatusOr<uint64_t> WriteBatch(const v1::WriteBatchRequest& request);
  // Waits for a transfer; returns its result (whose code may be an error), or
  // DEADLINE_EXCEEDED if it is still running after `timeout`.
  absl::StatusOr<v1::TransferResult> Wait(uint64_t transfer_id, absl::Duration timeout);
  // Write + Wait in one round trip: the Write call waits for the transfer
  // (WriteRequest.wait_ms) and answers with its result; the transfer's own error
  // becomes the returned status.
  absl::StatusOr<v1::TransferResult> WriteAndWait(const v1::WriteRequest& request, absl::Duration timeout);

  // Sends `payload` (at most 4 KiB) with `tag` to the owner of `dst`'s region, which
  // receives it on WatchNotifications as a Notification of kind MESSAGE. Returns once
  // the region's agent has queued it.
  absl::Status SendMessage(const v1::RegionDescriptor& dst, uint64_t tag, absl::string_view payload,
                           absl::Duration timeout = absl::Seconds(30));

  absl::StatusOr<v1::GetStatusResponse> GetStatus();
  // GPUs, NICs, NUMA nodes, their links and the rails (what `ferryctl topology` prints).
  absl::StatusOr<v1::GetTopologyResponse> GetTopology();

  // A context carrying this session's metadata, for calls on stub() directly.
  std::unique_ptr<grpc::ClientContext> NewContext(absl::Duration timeout = absl::Seconds(30)) const;
  v1::Agent::Stub* stub() const { return stub_.get(); }

 private:
  Client() = default;
  absl::Status Open();
  bool SessionAlive() const;
  // FromGrpcStatus, but UNAVAILABLE with a hint when the agent has closed the session.
  absl::Status Checked(const grpc::Status& s) const;
  absl::StatusOr<v1::WriteResponse> WriteCall(const v1::WriteRequest& request);

  std::string socket_;
  int session_fd_ = -1;
  uint64_t session_id_ = 0;
  std::string token_hex_;
  uint64_t next_request_ = 1;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Agent::Stub> stub_;
};

// A TransferResult's code and message as a status.
absl::Status ResultStatus(const v1::TransferResult& r);

}  // namespace ferry

#endif  // FERRY_CLIENT_CPP_FERRY_CLIENT_H_
