#include "client/cpp/ferry_client.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "proto/ferry/wire/session_wire.h"

namespace ferry {
namespace {

// Reads one frame, waiting at most `timeout`.
// `refusal`, when given, receives the reason a REFUSED frame carries after it.
absl::StatusOr<SessionFrame> ReadFrame(int fd, absl::Duration timeout, std::string* refusal = nullptr) {
  pollfd p{fd, POLLIN, 0};
  int r = poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout)));
  if (r == 0) return absl::DeadlineExceededError("the agent did not answer on the session socket");
  char packet[sizeof(SessionFrame) + kMaxRefusalBytes];
  ssize_t n = recv(fd, packet, sizeof(packet), 0);
  SessionFrame f{};
  if (n >= static_cast<ssize_t>(sizeof(f))) memcpy(&f, packet, sizeof(f));
  const size_t extra = n > static_cast<ssize_t>(sizeof(f)) ? static_cast<size_t>(n) - sizeof(f) : 0;
  const bool refused = f.type == static_cast<uint32_t>(SessionFrameType::kRefused) && f.b == extra;
  if (n < static_cast<ssize_t>(sizeof(f)) || f.magic != kSessionMagic || (extra > 0 && !refused)) {
    return absl::UnavailableError("the session socket closed or sent a malformed frame");
  }
  if (refused && refusal != nullptr) refusal->assign(packet + sizeof(f), extra);
  return f;
}

// Ends a session and waits, up to `wait`, for the agent to close its end, which it does
// only after releasing everything registered in it: a process that destroys one Client
// and connects another finds the session's room given back.
void EndSession(int fd, absl::Duration wait = absl::Seconds(2)) {
  if (fd < 0) return;
  if (shutdown(fd, SHUT_WR) == 0) {
    const absl::Time deadline = absl::Now() + wait;
    char frame[sizeof(SessionFrame)];
    for (absl::Time now = absl::Now(); now < deadline; now = absl::Now()) {
      pollfd p{fd, POLLIN, 0};
      const int left_ms = static_cast<int>(absl::ToInt64Milliseconds(deadline - now)) + 1;
      const int ready = poll(&p, 1, left_ms);
      if (ready < 0 && errno == EINTR) continue;
      if (ready <= 0) break;
      const ssize_t n = recv(fd, frame, sizeof(frame), MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) break;  // released, or gone
    }
  }
  close(fd);
}

}  // namespace

void SetBlockIds(const std::vector<uint64_t>& src_blocks, const std::vector<uint64_t>& dst_blocks,
                 v1::PagedChunks* paged) {
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the packed ids are host uint32s");
  auto set = [](const std::vector<uint64_t>& ids, std::string* packed,
                google::protobuf::RepeatedField<uint64_t>* wide) {
    if (!std::all_of(ids.begin(), ids.end(), [](uint64_t id) { return id <= UINT32_MAX; })) {
      wide->Add(ids.begin(), ids.end());
      return;
    }
    packed->resize(4 * ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      const uint32_t id = static_cast<uint32_t>(ids[i]);
      memcpy(&(*packed)[4 * i], &id, sizeof(id));
    }
  };
  set(src_blocks, paged->mutable_src_blocks_le32(), paged->mutable_src_blocks());
  set(dst_blocks, paged->mutable_dst_blocks_le32(), paged->mutable_dst_blocks());
}

absl::Status ResultStatus(const v1::TransferResult& r) {
  return r.code() == 0 ? absl::OkStatus() : absl::Status(static_cast<absl::StatusCode>(r.code()), r.message());
}

// ---------------------------------------------------------------- HostBuffer

absl::StatusOr<HostBuffer> HostBuffer::Create(uint64_t size) {
  if (size == 0) return absl::InvalidArgumentError("HostBuffer size must be >= 1");
  // The agent seals what it maps against shrinking, which needs MFD_ALLOW_SEALING.
  int fd = memfd_create("ferry-host-buffer", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return absl::InternalError(absl::StrCat("memfd_create: ", strerror(errno)));
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    close(fd);
    return absl::ResourceExhaustedError(absl::StrCat("ftruncate(", size, "): ", strerror(errno)));
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    close(fd);
    return absl::ResourceExhaustedError(absl::StrCat("mmap(", size, "): ", strerror(errno)));
  }
  return HostBuffer(fd, static_cast<uint8_t*>(p), size);
}

HostBuffer::HostBuffer(HostBuffer&& o) noexcept : fd_(o.fd_), data_(o.data_), size_(o.size_) {
  o.fd_ = -1;
  o.data_ = nullptr;
}

HostBuffer& HostBuffer::operator=(HostBuffer&& o) noexcept {
  std::swap(fd_, o.fd_);
  std::swap(data_, o.data_);
  std::swap(size_, o.size_);
  return *this;
}

HostBuffer::~HostBuffer() {
  if (data_ != nullptr) munmap(data_, size_);
  if (fd_ >= 0) close(fd_);
}

// ---------------------------------------------------------------- Client

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const std::string& socket) {
  std::unique_ptr<Client> c(new Client());
  c->socket_ = socket;
  absl::Status opened = c->Open();
  if (!opened.ok()) return opened;
  return c;
}

absl::Status Client::Open() {
  const std::string session_path = SessionSocketPath(socket_);
  sockaddr_un addr{};
  if (session_path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path too long: ", session_path));
  }
  addr.sun_family = AF_UNIX;
  memcpy(addr.sun_path, session_path.c_str(), session_path.size() + 1);
  session_fd_ = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (session_fd_ < 0 || connect(session_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot connect to the ferry agent at ", session_path, ": ",
                                               strerror(errno), " (is ferryd running?)"));
  }
  std::string refusal;
  absl::StatusOr<SessionFrame> hello = ReadFrame(session_fd_, absl::Seconds(10), &refusal);
  if (!hello.ok()) return hello.status();
  if (hello->type == static_cast<uint32_t>(SessionFrameType::kRefused)) {
    const auto code = hello->a <= 16 ? static_cast<absl::StatusCode>(hello->a) : absl::StatusCode::kUnavailable;
    return absl::Status(code, absl::StrCat("the ferry agent refused a session: ", refusal));
  }
  if (hello->type != static_cast<uint32_t>(SessionFrameType::kHello))
    return absl::UnavailableError("the agent did not greet the session");
  session_id_ = hello->a;
  char token[16];
  memcpy(token, &hello->b, 8);
  memcpy(token + 8, &hello->c, 8);
  token_hex_ = absl::BytesToHexString(absl::string_view(token, 16));

  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  channel_ = grpc::CreateCustomChannel("unix:" + socket_, grpc::InsecureChannelCredentials(), args);
  stub_ = v1::Agent::NewStub(channel_);
  return absl::OkStatus();
}

absl::Status Client::Reconnect(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    EndSession(session_fd_);
    session_fd_ = -1;
    absl::Status s = Open();
    if (s.ok() || absl::Now() >= deadline) return s;
    absl::SleepFor(absl::Milliseconds(100));
  }
}

bool Client::SessionAlive() const {
  char buf[sizeof(SessionFrame)];
  ssize_t n = recv(session_fd_, buf, sizeof(buf), MSG_PEEK | MSG_DONTWAIT);
  return n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));
}

absl::Status Client::Checked(const grpc::Status& s) const {
  absl::Status st = FromGrpcStatus(s);
  // This client never cancels its calls: a CANCELLED comes from the agent's server as it
  // shuts down (a call that raced the shutdown), which is the agent going away.
  if (st.code() == absl::StatusCode::kCancelled) {
    return absl::UnavailableError(
        "the agent cancelled the call as it shut down: call Reconnect() (it waits for the agent) and register "
        "again");
  }
  if ((st.code() == absl::StatusCode::kUnauthenticated || st.code() == absl::StatusCode::kUnavailable) &&
      !SessionAlive()) {
    return absl::UnavailableError(
        "the agent closed this session (it exited or restarted): call Reconnect() and register again");
  }
  return st;
}

Client::~Client() { EndSession(session_fd_); }

std::unique_ptr<grpc::ClientContext> Client::NewContext(absl::Duration timeout) const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->AddMetadata("ferry-session", token_hex_);
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return ctx;
}

absl::StatusOr<uint64_t> Client::SendFd(int fd) {
  SessionFrame f{kSessionMagic, static_cast<uint32_t>(SessionFrameType::kAddFd), next_request_++, 0, 0};
  iovec iov{&f, sizeof(f)};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(c), &fd, sizeof(int));
  if (sendmsg(session_fd_, &msg, MSG_NOSIGNAL) != sizeof(f)) {
    return absl::UnavailableError(absl::StrCat("sending the fd to the agent failed: ", strerror(errno)));
  }
  absl::StatusOr<SessionFrame> reply = ReadFrame(session_fd_, absl::Seconds(10));
  if (!reply.ok()) return reply.status();
  if (reply->type != static_cast<uint32_t>(SessionFrameType::kFdAdded) || reply->a != f.a)
    return absl::InternalError("unexpected session frame");
  if (reply->b == 0 && reply->c == ENFILE) {
    return absl::ResourceExhaustedError("the agent refused the fd: it is out of file descriptors; try again later");
  }
  if (reply->b == 0) {
    return absl::ResourceExhaustedError(
        "the agent refused the fd: this session holds too many unused fds (the agent's --max_pending_fds)");
  }
  return reply->b;
}

absl::StatusOr<v1::RegisterMemoryResponse> Client::RegisterHost(const HostBuffer& buffer, bool write_windows) {
  absl::StatusOr<uint64_t> handle = SendFd(buffer.fd());
  if (!handle.ok()) return handle.status();
  v1::RegisterMemoryRequest req;
  req.set_size(buffer.size());
  req.mutable_host()->set_fd_handle(*handle);
  req.set_write_windows(write_windows);
  v1::RegisterMemoryResponse resp;
  auto ctx = NewContext();
  absl::Status s = Checked(stub_->RegisterMemory(ctx.get(), req, &resp));
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<HostRegion> Client::AllocateHost(uint64_t size, bool write_windows) {
  absl::StatusOr<HostBuffer> buffer = HostBuffer::Create(size);
  if (!buffer.ok()) return buffer.status();
  absl::StatusOr<v1::RegisterMemoryResponse> reg = RegisterHost(*buffer, write_windows);
  if (!reg.ok()) return reg.status();
  return HostRegion{std::move(*buffer), std::move(*reg)};
}

absl::StatusOr<v1::OpenWriteWindowResponse> Client::OpenWriteWindow(const std::vector<uint64_t>& regions,
                                                                    const std::vector<ByteRange>& ranges,
                                                                    const v1::RegionDescriptor* writer,
                                                                    absl::Duration timeout) {
  v1::OpenWriteWindowRequest req;
  for (uint64_t id : regions) req.add_region_ids(id);
  for (const ByteRange& r : ranges) {
    v1::ByteRange* out = req.add_ranges();
    out->set_offset(r.offset);
    out->set_length(r.length);
  }
  if (writer != nullptr) *req.mutable_writer() = *writer;
  req.set_timeout_ms(static_cast<uint32_t>(std::max<int64_t>(1, absl::ToInt64Milliseconds(timeout))));
  v1::OpenWriteWindowResponse resp;
  auto ctx = NewContext();
  absl::Status s = Checked(stub_->OpenWriteWindow(ctx.get(), req, &resp));
  if (!s.ok()) return s;
  return resp;
}

absl::Status Client::CloseWriteWindow(uint64_t window_id, absl::Duration wait) {
  v1::CloseWriteWindowRequest req;
  req.set_window_id(window_id);
  req.set_wait_ms(static_cast<uint32_t>(std::max<int64_t>(0, absl::ToInt64Milliseconds(wait))));
  v1::CloseWriteWindowResponse resp;
  auto ctx = NewContext(wait + absl::Seconds(30));
  return Checked(stub_->CloseWriteWindow(ctx.get(), req, &resp));
}

absl::Status Client::Deregister(uint64_t region_id) {
  v1::DeregisterMemoryRequest req;
  req.set_region_id(region_id);
  v1::DeregisterMemoryResponse resp;
  auto ctx = NewContext();
  return Checked(stub_->DeregisterMemory(ctx.get(), req, &resp));
}

absl::StatusOr<uint64_t> Client::Write(const v1::WriteRequest& request) {
  absl::StatusOr<v1::WriteResponse> resp = WriteCall(request);
  if (!resp.ok()) return resp.status();
  return resp->transfer_id();
}

absl::StatusOr<v1::WriteResponse> Client::WriteCall(const v1::WriteRequest& request) {
  v1::WriteResponse resp;
  auto ctx = NewContext(absl::Seconds(30) + absl::Milliseconds(request.wait_ms()));
  absl::Status s = Checked(stub_->Write(ctx.get(), request, &resp));
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<uint64_t> Client::WriteBatch(const v1::WriteBatchRequest& request) {
  v1::WriteResponse resp;
  auto ctx = NewContext();
  absl::Status s = Checked(stub_->WriteBatch(ctx.get(), request, &resp));
  if (!s.ok()) return s;
  return resp.transfer_id();
}

absl::StatusOr<uint64_t> Client::Write(uint64_t src_region, const v1::RegionDescriptor& dst,
                                       const std::vector<ChunkSpec>& chunks, bool notify, uint64_t tag) {
  v1::WriteRequest req;
  req.set_src_region_id(src_region);
  *req.mutable_dst() = dst;
  for (const ChunkSpec& c : chunks) {
    v1::Chunk* pc = req.mutable_chunks()->add_chunks();
    pc->set_src_offset(c.src_offset);
    pc->set_dst_offset(c.dst_offset);
    pc->set_length(c.length);
  }
  req.set_notify(notify);
  req.set_tag(tag);
  return Write(req);
}

absl::StatusOr<uint64_t> Client::WriteBlocks(uint64_t src_region, const v1::RegionDescriptor& dst, uint64_t block_size,
                                             const std::vector<uint64_t>& src_blocks,
                                             const std::vector<uint64_t>& dst_blocks, bool notify, uint64_t tag) {
  v1::WriteRequest req;
  req.set_src_region_id(src_region);
  *req.mutable_dst() = dst;
  req.mutable_paged()->set_block_size(block_size);
  SetBlockIds(src_blocks, dst_blocks, req.mutable_paged());
  req.set_notify(notify);
  req.set_tag(tag);
  return Write(req);
}

absl::StatusOr<v1::TransferResult> Client::Wait(uint64_t transfer_id, absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  // Wait in slices: one Wait call blocks at most the agent's --max_wait_ms.
  for (;;) {
    absl::Duration left = deadline - absl::Now();
    v1::WaitRequest req;
    req.set_transfer_id(transfer_id);
    req.set_timeout_ms(static_cast<uint32_t>(std::max<int64_t>(0, absl::ToInt64Milliseconds(left))));
    v1::WaitResponse resp;
    auto ctx = NewContext(left + absl::Seconds(5));
    absl::Status s = Checked(stub_->Wait(ctx.get(), req, &resp));
    if (!s.ok()) return s;
    if (resp.done()) return resp.result();
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("transfer ", transfer_id, " still running"));
    }
  }
}

absl::StatusOr<v1::TransferResult> Client::WriteAndWait(const v1::WriteRequest& request, absl::Duration timeout) {
  // One round trip: the call waits for the transfer (WriteRequest.wait_ms) and answers
  // with its result; a Wait only for what is left of `timeout` past the agent's
  // --max_wait_ms.
  const absl::Time deadline = absl::Now() + timeout;
  v1::WriteRequest waiting = request;
  waiting.set_wait_ms(static_cast<uint32_t>(std::clamp<int64_t>(absl::ToInt64Milliseconds(timeout), 0, UINT32_MAX)));
  absl::StatusOr<v1::WriteResponse> resp = WriteCall(waiting);
  if (!resp.ok()) return resp.status();
  absl::StatusOr<v1::TransferResult> r = resp->has_result() ? absl::StatusOr<v1::TransferResult>(resp->result())
                                                            : Wait(resp->transfer_id(), deadline - absl::Now());
  if (!r.ok()) return r.status();
  absl::Status s = ResultStatus(*r);
  if (!s.ok()) return s;
  return r;
}

absl::Status Client::SendMessage(const v1::RegionDescriptor& dst, uint64_t tag, absl::string_view payload,
                                 absl::Duration timeout) {
  v1::SendMessageRequest req;
  *req.mutable_dst() = dst;
  req.set_tag(tag);
  req.set_payload(std::string(payload));
  req.set_timeout_ms(static_cast<uint32_t>(std::max<int64_t>(1, absl::ToInt64Milliseconds(timeout))));
  v1::SendMessageResponse resp;
  auto ctx = NewContext(timeout + absl::Seconds(1));
  return Checked(stub_->SendMessage(ctx.get(), req, &resp));
}

absl::StatusOr<v1::GetStatusResponse> Client::GetStatus() {
  v1::GetStatusResponse resp;
  auto ctx = NewContext();
  absl::Status s = Checked(stub_->GetStatus(ctx.get(), v1::GetStatusRequest(), &resp));
  if (!s.ok()) return s;
  return resp;
}

absl::StatusOr<v1::GetTopologyResponse> Client::GetTopology() {
  v1::GetTopologyResponse resp;
  auto ctx = NewContext();
  absl::Status s = Checked(stub_->GetTopology(ctx.get(), v1::GetTopologyRequest(), &resp));
  if (!s.ok()) return s;
  return resp;
}

}  // namespace ferry
