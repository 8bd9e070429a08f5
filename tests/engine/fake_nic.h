// FakeNic: a NicInterface that records posts and completes them as a test scripts it,
// for unit tests of RailWorker (tests/engine/rail_worker_test.cc).
//
//   FakeNic nic;
//   nic.set_capacity(1);                          // -FI_EAGAIN past one op in flight
//   nic.FailNextCompletion(peer, FI_ECONNRESET);  // that peer's next post completes in error
//   RailWorker worker(&nic, &metrics, absl::ZeroDuration());
//   ... worker.Submit(ops) ...
//   std::vector<FakeNic::Post> posts = nic.posts();
//
// Every successful post completes on the worker's next read, which frees its place in
// the provider's queue. Thread-safe: the worker posts and reads, the test inspects.
#ifndef FERRY_TESTS_ENGINE_FAKE_NIC_H_
#define FERRY_TESTS_ENGINE_FAKE_NIC_H_

#include <rdma/fi_errno.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <deque>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "agent/fabric/nic_interface.h"

namespace ferry {
namespace testing {

class FakeNic : public NicInterface {
 public:
  struct Post {
    fi_addr_t peer;
    uint64_t remote_addr;
    uint64_t key;
    size_t length;
    absl::Time at;
    bool message = false;  // PostMessage rather than PostWrite
  };

  FakeNic() : fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}
  ~FakeNic() override { close(fd_); }

  // Ops the provider accepts before it answers -FI_EAGAIN (posted, not yet read back).
  void set_capacity(size_t ops) {
    absl::MutexLock lock(&mu_);
    capacity_ = ops;
  }
  // PostWrite to `peer` fails with -err (0: posts succeed again).
  void FailPosts(fi_addr_t peer, int err) {
    absl::MutexLock lock(&mu_);
    post_error_[peer] = err;
  }
  // The next post to `peer` completes with error `err` (a positive fi_errno).
  void FailNextCompletion(fi_addr_t peer, int err, std::string detail = "injected by the test") {
    absl::MutexLock lock(&mu_);
    next_error_[peer] = {err, std::move(detail)};
  }
  std::vector<Post> posts() const {
    absl::MutexLock lock(&mu_);
    return posts_;
  }
  size_t eagains() const {
    absl::MutexLock lock(&mu_);
    return eagains_;
  }

  const std::string& name() const override { return name_; }

  ssize_t PostWrite(const void* local, size_t len, void* desc, fi_addr_t peer, uint64_t remote_addr, uint64_t key,
                    void* context) override {
    return Accept(peer, remote_addr, key, len, context, /*message=*/false);
  }
  ssize_t PostMessage(const void* data, size_t len, fi_addr_t peer, void* context) override {
    return Accept(peer, 0, 0, len, context, /*message=*/true);
  }

  ssize_t ReadCompletions(void** contexts, size_t max) override {
    absl::MutexLock lock(&mu_);
    size_t n = 0;
    while (n < max && !ready_.empty() && ready_.front().err == 0) {
      contexts[n++] = ready_.front().context;
      ready_.pop_front();
      --outstanding_;
    }
    if (n == 0 && !ready_.empty()) return -FI_EAVAIL;
    if (ready_.empty()) Drain();
    return static_cast<ssize_t>(n);
  }

  bool ReadError(ErrorCompletion* out) override {
    absl::MutexLock lock(&mu_);
    if (ready_.empty() || ready_.front().err == 0) return false;
    out->context = ready_.front().context;
    out->err = ready_.front().err;
    out->detail = ready_.front().detail;
    ready_.pop_front();
    --outstanding_;
    if (ready_.empty()) Drain();
    return true;
  }

  int wait_fd() const override { return fd_; }
  bool TryWait() override {
    absl::MutexLock lock(&mu_);
    return ready_.empty();
  }

 private:
  // A post of either kind: recorded, completed on the next read (or refused).
  ssize_t Accept(fi_addr_t peer, uint64_t remote_addr, uint64_t key, size_t len, void* context, bool message) {
    absl::MutexLock lock(&mu_);
    auto failing = post_error_.find(peer);
    if (failing != post_error_.end() && failing->second != 0) return -failing->second;
    if (outstanding_ >= capacity_) {
      ++eagains_;
      return -FI_EAGAIN;
    }
    ++outstanding_;
    posts_.push_back({peer, remote_addr, key, len, absl::Now(), message});
    Completion c{context, 0, ""};
    auto error = next_error_.find(peer);
    if (error != next_error_.end()) {
      c.err = error->second.first;
      c.detail = error->second.second;
      next_error_.erase(error);
    }
    ready_.push_back(std::move(c));
    Signal();
    return 0;
  }

  struct Completion {
    void* context;
    int err;
    std::string detail;
  };
  void Signal() {
    uint64_t one = 1;
    ssize_t ignored = write(fd_, &one, sizeof(one));
    (void)ignored;
  }
  void Drain() {
    uint64_t n;
    ssize_t ignored = read(fd_, &n, sizeof(n));
    (void)ignored;
  }

  const std::string name_ = "fake0";
  const int fd_;
  mutable absl::Mutex mu_;
  size_t capacity_ ABSL_GUARDED_BY(mu_) = std::numeric_limits<size_t>::max();
  size_t outstanding_ ABSL_GUARDED_BY(mu_) = 0;
  size_t eagains_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<fi_addr_t, int> post_error_ ABSL_GUARDED_BY(mu_);
  std::map<fi_addr_t, std::pair<int, std::string>> next_error_ ABSL_GUARDED_BY(mu_);
  std::vector<Post> posts_ ABSL_GUARDED_BY(mu_);
  std::deque<Completion> ready_ ABSL_GUARDED_BY(mu_);
};

}  // namespace testing
}  // namespace ferry

#endif  // FERRY_TESTS_ENGINE_FAKE_NIC_H_
