#include "agent/fabric/fabric_nic.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_errno.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "agent/common/log.h"
#include "agent/common/status_macros.h"

namespace ferry {
namespace {

constexpr uint32_t kFiVersion = FI_VERSION(1, 9);

absl::Status FiError(const std::string& what, int rc) {
  return absl::UnavailableError(absl::StrCat(what, ": ", fi_strerror(-rc), " (", rc, ")"));
}

// What --fabric_iface names: an IPv4 address or a netdev with one (tcp, verbs), or else a
// libfabric domain / RDMA device that has no IP (efa: "rdmap16s27" or "rdmap16s27-rdm").
struct Iface {
  std::string address;  // IPv4; empty for a domain
  std::string name;     // interface holding it; empty if none does (e.g. a remote address)
  std::string domain;   // set when the name is no interface: matched against fi_info domains
};

// Resolves an interface name to its IPv4 address, or an address to its interface.
Iface ResolveIface(const std::string& iface) {
  in_addr want;
  const bool is_address = inet_pton(AF_INET, iface.c_str(), &want) == 1;
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) != 0) return Iface{"", "", iface};
  absl::Cleanup free_ifs = [ifs] { freeifaddrs(ifs); };
  for (ifaddrs* i = ifs; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    const in_addr have = reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr;
    if (is_address ? have.s_addr == want.s_addr : iface == i->ifa_name) {
      char buf[INET_ADDRSTRLEN];
      inet_ntop(AF_INET, &have, buf, sizeof(buf));
      return Iface{buf, i->ifa_name, ""};
    }
  }
  if (is_address) return Iface{iface, "", ""};
  return Iface{"", "", iface};
}

bool DomainMatches(const char* domain, const std::string& want) {
  return domain != nullptr && (want == domain || absl::StrCat(want, "-rdm") == domain);
}

// Asks libfabric for an RDM endpoint with RMA writes (and device memory, with `hmem`;
// messages, with `msg`) from `provider` bound to the address, or on the domain, `where`
// names.
absl::StatusOr<fi_info*> GetInfo(const std::string& provider, const Iface& where, size_t tx_size, bool hmem, bool msg) {
  fi_info* hints = fi_allocinfo();
  absl::Cleanup free_hints = [hints] { fi_freeinfo(hints); };
  hints->ep_attr->type = FI_EP_RDM;
  hints->caps = FI_RMA | FI_WRITE | FI_REMOTE_WRITE | (hmem ? FI_HMEM : 0) | (msg ? FI_MSG | FI_SEND | FI_RECV : 0);
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  // The modes ferry can honour; the provider keeps the ones it needs.
  hints->domain_attr->mr_mode =
      FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT | (hmem ? FI_MR_HMEM : 0);
  hints->domain_attr->threading = FI_THREAD_SAFE;
  hints->tx_attr->op_flags = FI_DELIVERY_COMPLETE;
  if (tx_size > 0) hints->tx_attr->size = tx_size;
  hints->fabric_attr->prov_name = strdup(provider.c_str());
  fi_info* info = nullptr;
  const bool by_domain = where.address.empty();
  const std::string& what = by_domain ? where.domain : where.address;
  int rc = by_domain ? fi_getinfo(kFiVersion, nullptr, nullptr, 0, hints, &info)
                     : fi_getinfo(kFiVersion, where.address.c_str(), nullptr, FI_SOURCE, hints, &info);
  if (rc != 0 || info == nullptr)
    return FiError(absl::StrCat("no ", provider, " endpoint on ", what), rc ? rc : -FI_ENODATA);
  if (!by_domain) return info;
  fi_info* match = nullptr;
  for (fi_info* i = info; i != nullptr && match == nullptr; i = i->next) {
    if (DomainMatches(i->domain_attr->name, where.domain)) match = fi_dupinfo(i);
  }
  fi_freeinfo(info);
  if (match == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("--fabric_iface '", where.domain,
                                                   "' is neither an IPv4 address, an interface with one, nor a ",
                                                   provider, " domain (e.g. an EFA device)"));
  }
  return match;
}

}  // namespace

std::string LibfabricVersion() {
  uint32_t v = fi_version();
  return absl::StrCat(FI_MAJOR(v), ".", FI_MINOR(v));
}

absl::StatusOr<std::unique_ptr<FabricNic>> FabricNic::Open(const FabricNicOptions& options) {
  const Iface iface = ResolveIface(options.iface);
  std::vector<std::string> candidates;
  if (options.provider == "auto") {
    candidates = {"efa", "verbs;ofi_rxm", "tcp;ofi_rxm"};
  } else {
    candidates = {options.provider};
  }
  fi_info* info = nullptr;
  std::string tried;
  for (const std::string& p : candidates) {
    // With FI_HMEM where the provider has it, else without (GPU memory is then staged);
    // with messages where it has them, else without (notifications then go by RPC).
    absl::StatusOr<fi_info*> i = absl::NotFoundError("not asked");
    for (bool hmem : {true, false}) {
      if (hmem && !options.hmem) continue;
      for (bool msg : {true, false}) {
        if (!i.ok()) i = GetInfo(p, iface, options.tx_size, hmem, msg);
      }
    }
    if (i.ok()) {
      info = *i;
      break;
    }
    absl::StrAppend(&tried, tried.empty() ? "" : "; ", i.status().message());
  }
  if (info == nullptr) return absl::FailedPreconditionError(absl::StrCat("no usable fabric provider: ", tried));

  std::unique_ptr<FabricNic> nic(new FabricNic());
  nic->info_ = info;
  nic->latency_lane_of_ = options.latency_lane_of;
  nic->name_ = options.latency_lane_of >= 0 ? absl::StrCat("nic", options.latency_lane_of, "-latency")
                                            : absl::StrCat("nic", options.index);
  nic->provider_ = info->fabric_attr->prov_name;
  nic->iface_ = iface.address.empty() ? iface.domain : iface.address;
  nic->netdev_ = iface.name;
  if (info->domain_attr->name != nullptr) nic->domain_name_ = info->domain_attr->name;
  nic->mr_mode_ = info->domain_attr->mr_mode;
  nic->hmem_ = (info->caps & FI_HMEM) != 0;
  nic->max_msg_size_ = info->ep_attr->max_msg_size;
  nic->tx_size_ = info->tx_attr->size;

  int rc = fi_fabric(info->fabric_attr, &nic->fabric_, nullptr);
  if (rc) return FiError("fi_fabric", rc);
  rc = fi_domain(nic->fabric_, info, &nic->domain_, nullptr);
  if (rc) return FiError("fi_domain", rc);
  fi_av_attr av_attr{};
  av_attr.type = FI_AV_TABLE;
  rc = fi_av_open(nic->domain_, &av_attr, &nic->av_, nullptr);
  if (rc) return FiError("fi_av_open", rc);
  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_MSG;  // a received message's length
  cq_attr.size = std::max<size_t>(nic->tx_size_ * 2, 1024);
  cq_attr.wait_obj = FI_WAIT_FD;
  rc = fi_cq_open(nic->domain_, &cq_attr, &nic->cq_, nullptr);
  if (rc) {
    // No wait object: the worker falls back to polling with backoff.
    cq_attr.wait_obj = FI_WAIT_NONE;
    rc = fi_cq_open(nic->domain_, &cq_attr, &nic->cq_, nullptr);
    if (rc) return FiError("fi_cq_open", rc);
  } else if (fi_control(&nic->cq_->fid, FI_GETWAIT, &nic->wait_fd_) != 0) {
    nic->wait_fd_ = -1;
  }
  rc = fi_endpoint(nic->domain_, info, &nic->ep_, nullptr);
  if (rc) return FiError("fi_endpoint", rc);
  rc = fi_ep_bind(nic->ep_, &nic->av_->fid, 0);
  if (rc) return FiError("fi_ep_bind(av)", rc);
  rc = fi_ep_bind(nic->ep_, &nic->cq_->fid, FI_TRANSMIT | FI_RECV);
  if (rc) return FiError("fi_ep_bind(cq)", rc);
  rc = fi_enable(nic->ep_);
  if (rc) return FiError("fi_enable", rc);
  if ((info->caps & FI_MSG) && options.on_message) {
    nic->on_message_ = options.on_message;
    FERRY_RETURN_IF_ERROR(nic->OpenMessageBuffers());
  }

  char name[256];
  size_t len = sizeof(name);
  rc = fi_getname(&nic->ep_->fid, name, &len);
  if (rc) return FiError("fi_getname", rc);
  nic->address_.assign(name, len);
  FERRY_LOG(INFO) << nic->name_ << ": " << nic->provider_ << " on " << nic->iface_ << " address "
                  << nic->address_string() << " (netdev " << nic->netdev_ << ", domain " << nic->domain_name_
                  << ") mr_mode 0x" << std::hex << nic->mr_mode_ << std::dec << " tx_size " << nic->tx_size_
                  << (nic->wait_fd_ >= 0 ? " (wait fd)" : " (polling)")
                  << (nic->hmem_ ? ", FI_HMEM" : ", no FI_HMEM (GPU memory will be staged)")
                  << (nic->messages_ ? ", messages" : ", no messages (notifications go by RPC)");
  return nic;
}

absl::Status FabricNic::OpenMessageBuffers() {
  const size_t n = 2 * kMessageBuffers;
  message_memory_.reset(new uint8_t[n * kMaxFabricMessageBytes]);
  iovec iov{message_memory_.get(), n * kMaxFabricMessageBytes};
  fi_mr_attr attr{};
  attr.mr_iov = &iov;
  attr.iov_count = 1;
  attr.access = FI_SEND | FI_RECV;
  attr.requested_key = (mr_mode_ & FI_MR_PROV_KEY) ? 0 : next_key_.fetch_add(1);
  attr.iface = FI_HMEM_SYSTEM;
  int rc = fi_mr_regattr(domain_, &attr, 0, &message_mr_);
  if (rc) return FiError(absl::StrCat(name_, ": registering message buffers"), rc);
  if (mr_mode_ & FI_MR_ENDPOINT) {
    rc = fi_mr_bind(message_mr_, &ep_->fid, 0);
    if (rc == 0) rc = fi_mr_enable(message_mr_);
    if (rc) return FiError(absl::StrCat(name_, ": binding the message buffers to the endpoint"), rc);
  }
  message_desc_ = fi_mr_desc(message_mr_);
  slots_.resize(n);
  for (size_t i = 0; i < n; ++i) slots_[i].buf = message_memory_.get() + i * kMaxFabricMessageBytes;
  for (size_t i = kMessageBuffers; i < n; ++i) slots_[i].next_free = i + 1 < n ? &slots_[i + 1] : nullptr;
  free_send_ = &slots_[kMessageBuffers];
  for (size_t i = 0; i < kMessageBuffers; ++i) PostReceive(&slots_[i]);
  if (!unposted_.empty()) {
    return FiError(absl::StrCat(name_, ": posting receive buffers"), -FI_EAGAIN);
  }
  messages_ = true;
  return absl::OkStatus();
}

fi_msg FabricNic::SlotMessage(MessageSlot* s, iovec* iov, fi_addr_t peer) {
  fi_msg msg{};
  msg.msg_iov = iov;
  msg.desc = &message_desc_;
  msg.iov_count = 1;
  msg.addr = peer;
  msg.context = &s->context;
  return msg;
}

void FabricNic::PostReceive(MessageSlot* s) {
  iovec iov{s->buf, kMaxFabricMessageBytes};
  const fi_msg msg = SlotMessage(s, &iov, FI_ADDR_UNSPEC);
  if (fi_recvmsg(ep_, &msg, 0) != 0) unposted_.push_back(s);
}

FabricNic::MessageSlot* FabricNic::SlotOf(void* context) {
  const auto at = reinterpret_cast<uintptr_t>(context);  // &slot->context, its first member
  const auto first = reinterpret_cast<uintptr_t>(slots_.data());
  if (slots_.empty() || at < first || at >= first + slots_.size() * sizeof(MessageSlot)) return nullptr;
  return reinterpret_cast<MessageSlot*>(context);
}

FabricNic::~FabricNic() {
  if (ep_) fi_close(&ep_->fid);
  if (message_mr_) fi_close(&message_mr_->fid);
  if (cq_) fi_close(&cq_->fid);
  if (av_) fi_close(&av_->fid);
  if (domain_) fi_close(&domain_->fid);
  if (fabric_) fi_close(&fabric_->fid);
  if (info_) fi_freeinfo(info_);
}

std::string FabricNic::address_string() const {
  char buf[256];
  size_t len = sizeof(buf);
  fi_av_straddr(av_, address_.data(), buf, &len);
  return std::string(buf);
}

absl::StatusOr<NicRegistration> FabricNic::Register(void* buf, uint64_t len, fid_mr** mr_out, int cuda_device) {
  if (cuda_device >= 0 && !hmem_) {
    return absl::FailedPreconditionError(absl::StrCat(name_, ": ", provider_, " has no FI_HMEM for GPU memory"));
  }
  iovec iov{buf, len};
  fi_mr_attr attr{};
  attr.mr_iov = &iov;
  attr.iov_count = 1;
  attr.access = FI_WRITE | FI_REMOTE_WRITE;
  attr.requested_key = (mr_mode_ & FI_MR_PROV_KEY) ? 0 : next_key_.fetch_add(1);
  attr.iface = cuda_device >= 0 ? FI_HMEM_CUDA : FI_HMEM_SYSTEM;
  attr.device.cuda = cuda_device >= 0 ? cuda_device : 0;
  fid_mr* mr = nullptr;
  int rc = fi_mr_regattr(domain_, &attr, 0, &mr);
  if (rc) {
    return FiError(absl::StrCat(name_, ": fi_mr_regattr of ", len, " bytes", cuda_device >= 0 ? " of GPU memory" : ""),
                   rc);
  }
  if (mr_mode_ & FI_MR_ENDPOINT) {
    rc = fi_mr_bind(mr, &ep_->fid, 0);
    if (rc == 0) rc = fi_mr_enable(mr);
    if (rc) {
      fi_close(&mr->fid);
      return FiError(absl::StrCat(name_, ": binding the MR to the endpoint"), rc);
    }
  }
  NicRegistration reg;
  reg.key = fi_mr_key(mr);
  reg.local_desc = fi_mr_desc(mr);
  reg.remote_base = (mr_mode_ & FI_MR_VIRT_ADDR) ? reinterpret_cast<uint64_t>(buf) : 0;
  *mr_out = mr;
  return reg;
}

absl::StatusOr<fi_addr_t> FabricNic::InsertPeer(const std::string& raw_address) {
  fi_addr_t addr = FI_ADDR_UNSPEC;
  int n = fi_av_insert(av_, raw_address.data(), 1, &addr, 0, nullptr);
  if (n != 1) return absl::UnavailableError(absl::StrCat(name_, ": fi_av_insert of a peer address failed"));
  return addr;
}

void FabricNic::RemovePeer(fi_addr_t addr) { fi_av_remove(av_, &addr, 1, 0); }

ssize_t FabricNic::PostWrite(const void* local, size_t len, void* desc, fi_addr_t peer, uint64_t remote_addr,
                             uint64_t key, void* context) {
  iovec iov{const_cast<void*>(local), len};
  fi_rma_iov rma{remote_addr, len, key};
  fi_msg_rma msg{};
  msg.msg_iov = &iov;
  msg.desc = &desc;
  msg.iov_count = 1;
  msg.addr = peer;
  msg.rma_iov = &rma;
  msg.rma_iov_count = 1;
  msg.context = context;
  return fi_writemsg(ep_, &msg, FI_DELIVERY_COMPLETE | FI_COMPLETION);
}

ssize_t FabricNic::PostMessage(const void* data, size_t len, fi_addr_t peer, void* context) {
  if (!messages_) return -FI_ENOSYS;
  if (len > kMaxFabricMessageBytes) return -FI_EMSGSIZE;
  if (free_send_ == nullptr) return -FI_EAGAIN;
  MessageSlot* s = free_send_;
  std::memcpy(s->buf, data, len);
  iovec iov{s->buf, len};
  const fi_msg msg = SlotMessage(s, &iov, peer);
  const ssize_t rc = fi_sendmsg(ep_, &msg, FI_DELIVERY_COMPLETE | FI_COMPLETION);
  if (rc == 0) {
    free_send_ = s->next_free;
    s->op_context = context;
  }
  return rc;
}

ssize_t FabricNic::ReadCompletions(void** contexts, size_t max) {
  constexpr size_t kBatch = 64;
  fi_cq_msg_entry entries[kBatch];
  if (!unposted_.empty()) {
    for (MessageSlot* s : std::exchange(unposted_, {})) PostReceive(s);
  }
  // A batch of nothing but received messages is read past, so the worker's answer is
  // about its own ops.
  for (;;) {
    const ssize_t n = fi_cq_read(cq_, entries, std::min(max, kBatch));
    if (n <= 0) return n == -FI_EAGAIN ? 0 : n;
    ssize_t ops = 0;
    for (ssize_t i = 0; i < n; ++i) {
      MessageSlot* s = SlotOf(entries[i].op_context);
      if (s == nullptr) {
        contexts[ops++] = entries[i].op_context;
      } else if (IsReceive(s)) {
        on_message_(absl::string_view(reinterpret_cast<const char*>(s->buf), entries[i].len));
        PostReceive(s);
      } else {
        contexts[ops++] = s->op_context;
        s->next_free = free_send_;
        free_send_ = s;
      }
    }
    if (ops > 0) return ops;
  }
}

bool FabricNic::ReadError(ErrorCompletion* out) {
  fi_cq_err_entry err{};
  if (fi_cq_readerr(cq_, &err, 0) != 1) return false;
  char buf[256];
  const char* detail = fi_cq_strerror(cq_, err.prov_errno, err.err_data, buf, sizeof(buf));
  out->context = err.op_context;
  out->err = err.err;
  out->detail = detail != nullptr ? detail : "";
  if (MessageSlot* s = SlotOf(err.op_context)) {
    if (IsReceive(s)) {
      // No op of the worker's: count it, and keep the buffer posted (unless the endpoint
      // is closing, which cancels every receive).
      out->context = nullptr;
      out->detail = absl::StrCat("receiving a message: ", out->detail);
      if (err.err != FI_ECANCELED) PostReceive(s);
    } else {
      out->context = s->op_context;
      s->next_free = free_send_;
      free_send_ = s;
    }
  }
  return true;
}

bool FabricNic::TryWait() {
  if (wait_fd_ < 0) return false;
  fid* f = &cq_->fid;
  return fi_trywait(fabric_, &f, 1) == FI_SUCCESS;
}

FabricRegistrations::~FabricRegistrations() {
  for (fid_mr* mr : mrs_) fi_close(&mr->fid);
}

}  // namespace ferry
