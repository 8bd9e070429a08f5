#include "agent/local/host_copier.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "agent/common/status_macros.h"
#include "agent/common/thread_name.h"
#include "agent/memory/region_copy.h"

namespace ferry {

HostCopier::HostCopier(int threads) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Work(); });
}

HostCopier::~HostCopier() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void HostCopier::Submit(std::shared_ptr<Transfer> t, Done done) {
  if (t->plan.total_bytes <= kInlineBytes && t->plan.size() <= kInlineChunks) {
    done(Run(*t));  // a few microseconds: less than waking a copier thread
    return;
  }
  absl::MutexLock lock(&mu_);
  queue_.emplace_back(std::move(t), std::move(done));
}

absl::Status HostCopier::Run(const Transfer& t) {
  FERRY_RETURN_IF_ERROR(t.Stopped(absl::Now(), " before it started"));
  return Copy(t);
}

absl::Status HostCopier::Copy(const Transfer& t) {
  uint8_t* src = t.src->data();
  uint8_t* dst = t.dst->data();
  // Check the clock (and the writer's session) every 16 MiB or 1024 chunks: cheap, and
  // bounds the overrun.
  uint64_t since_check = 0;
  size_t chunks_since_check = 0;
  for (size_t i = 0; i < t.plan.size(); ++i) {
    const CopyChunk c = t.plan.chunk(i);
    CopyRegionBytes(dst + c.dst_offset, src + c.src_offset, c.length);
    since_check += c.length;
    if (since_check >= (16u << 20) || ++chunks_since_check >= 1024) {
      since_check = 0;
      chunks_since_check = 0;
      FERRY_RETURN_IF_ERROR(t.Stopped(absl::Now()));
    }
  }
  return absl::OkStatus();
}

void HostCopier::Work() {
  NameThisThread("ferry-hostcopy");
  for (;;) {
    std::pair<std::shared_ptr<Transfer>, Done> job;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // stopping and drained
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    job.second(Run(*job.first));
  }
}

}  // namespace ferry
