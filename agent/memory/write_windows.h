// WriteWindows: the write windows of regions in window mode (RegisterMemoryRequest.
// write_windows), the receiving agent's guard against late writes.
//
// A region's owner opens a window over byte ranges of some of its regions, for one
// writer, until a deadline; it hands the window's descriptors (its id and token) to
// that writer. A write into a region in window mode passes only through an open window
// of that region, from its writer, with every chunk inside its ranges. The agent guards
// the bytes it moves itself (local copies, staged commits) with an Admission held while
// they move; Close waits for those. Fabric writes move without the agent: they get keys
// registered over the window's extent alone (Keys), which Close and expiry revoke.
//
//   WriteWindows windows(&regions, refused);
//   absl::StatusOr<std::shared_ptr<const WriteWindow>> w = windows.Open(session_id, spec);
//   absl::StatusOr<WindowAdmission> a = windows.Admit(window_id, token, region_id);
//   if (!a.ok()) return a.status();          // closed, expired, wrong token, not its region
//   if (!a->window().Covers(offset, length)) ...  // the caller checks its chunks
//   windows.Close(window_id, session_id, absl::Seconds(1));  // after it, nothing lands
//
// Thread-safe; a thread revokes expired windows' keys.
#ifndef FERRY_AGENT_MEMORY_WRITE_WINDOWS_H_
#define FERRY_AGENT_MEMORY_WRITE_WINDOWS_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/common/token.h"
#include "agent/memory/region.h"
#include "agent/memory/region_table.h"

namespace ferry {

struct ByteSpan {
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t end() const { return offset + length; }
};

// Whether [offset, offset + length) (length >= 1) lies inside one of `ranges` (sorted,
// merged).
bool SpansCover(const std::vector<ByteSpan>& ranges, uint64_t offset, uint64_t length);

// Who may write through a window: the session owning region `region_id` on the agent
// of `incarnation`. incarnation 0: anyone holding the window's descriptors.
struct WindowWriter {
  uint64_t incarnation = 0;
  uint64_t region_id = 0;
  bool any() const { return incarnation == 0; }
};

struct WindowSpec {
  std::vector<uint64_t> region_ids;
  std::vector<ByteSpan> ranges;  // applied to every region
  WindowWriter writer;
  absl::Duration timeout;
};

// What a write with the own descriptor of a region in window mode is refused with: a
// FAILED_PRECONDITION carrying kWindowModePayload, which crosses agents (grpc_status.h).
inline constexpr char kWindowModePayload[] = "ferry.dev/window-mode";
absl::Status WindowModeError(uint64_t region_id);
inline bool IsWindowModeError(const absl::Status& s) { return s.GetPayload(kWindowModePayload).has_value(); }

// Bounds on what one window and one session may hold.
inline constexpr size_t kMaxWindowRegions = 256;
inline constexpr size_t kMaxWindowRanges = 1 << 16;
inline constexpr size_t kMaxWindowsPerSession = 4096;

class WriteWindow {
 public:
  uint64_t id() const { return id_; }
  uint64_t owner_session() const { return owner_session_; }
  const Token& token() const { return token_; }
  const WindowWriter& writer() const { return writer_; }
  absl::Time deadline() const { return deadline_; }
  // Sorted, merged: no two touch.
  const std::vector<ByteSpan>& ranges() const { return ranges_; }
  const std::vector<std::shared_ptr<Region>>& regions() const { return regions_; }
  // Whether [offset, offset + length) lies inside one of the ranges (length >= 1).
  bool Covers(uint64_t offset, uint64_t length) const { return SpansCover(ranges_, offset, length); }
  bool HasRegion(uint64_t region_id) const;

 private:
  friend class WriteWindows;
  friend class WindowAdmission;
  WriteWindow(uint64_t id, uint64_t owner_session, Token token, WindowWriter writer, absl::Time deadline,
              std::vector<std::shared_ptr<Region>> regions, std::vector<ByteSpan> ranges)
      : id_(id),
        owner_session_(owner_session),
        token_(token),
        writer_(writer),
        deadline_(deadline),
        regions_(std::move(regions)),
        ranges_(std::move(ranges)) {}
  void Release();

  const uint64_t id_;
  const uint64_t owner_session_;
  const Token token_;
  const WindowWriter writer_;
  const absl::Time deadline_;
  // Held so that fabric keys over them stay valid memory until they are revoked.
  const std::vector<std::shared_ptr<Region>> regions_;
  const std::vector<ByteSpan> ranges_;

  mutable absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  int active_ ABSL_GUARDED_BY(mu_) = 0;  // admissions alive
  // Fabric keys over the ranges' extent, per region, made by the first remote opener.
  absl::flat_hash_map<uint64_t, RegionRegistration> keys_ ABSL_GUARDED_BY(mu_);
  // The last WriteWindows::Open that compared it with its window (under WriteWindows::mu_).
  mutable uint64_t compared_in_open_ = 0;
};

// A write moving bytes through a window: while one lives, Close waits. Move-only.
class WindowAdmission {
 public:
  explicit WindowAdmission(std::shared_ptr<WriteWindow> w) : window_(std::move(w)) {}
  WindowAdmission(WindowAdmission&&) = default;
  WindowAdmission& operator=(WindowAdmission&&) = default;
  ~WindowAdmission() {
    if (window_ != nullptr) window_->Release();
  }
  const WriteWindow& window() const { return *window_; }

 private:
  std::shared_ptr<WriteWindow> window_;
};

class WriteWindows {
 public:
  // Tells a region's owner that a write into it was refused (NOTIFICATION_KIND_WINDOW_REFUSED).
  using Refused = std::function<void(const Region& region, uint64_t window_id, const absl::Status& why)>;

  WriteWindows(RegionTable* regions, Refused refused);
  ~WriteWindows();
  // What makes fabric keys (without one Keys fails). Set before the peer API serves.
  void set_registrar(RegionRegistrar* registrar) { registrar_ = registrar; }
  // How many writes other agents announced through a window are still moving (their
  // agents' NotifyRequest.begin, not yet ended): Close waits for those too. Set before
  // the peer API serves.
  void set_announced(std::function<size_t(uint64_t window_id)> announced) { announced_ = std::move(announced); }

  // Opens a window of `session` (the owner of every region named). INVALID_ARGUMENT /
  // NOT_FOUND / PERMISSION_DENIED / FAILED_PRECONDITION name the field; RESOURCE_EXHAUSTED
  // past kMaxWindowsPerSession.
  absl::StatusOr<std::shared_ptr<const WriteWindow>> Open(uint64_t session, const WindowSpec& spec);
  // See CloseWriteWindow in ferry.proto. NOT_FOUND when `session` has no such window open
  // or recently closed. Closing a window closed already (by its owner, its deadline or
  // the agent) waits, up to `wait`, for the writes through it that are still moving:
  // after a DEADLINE_EXCEEDED, close it again to wait on.
  absl::Status Close(uint64_t window_id, uint64_t session, absl::Duration wait);
  // A session ended: its windows close (nothing waits).
  void CloseSession(uint64_t session);
  // Closes window `id` for the agent itself (`why`: "closed when ..."), nothing waiting;
  // true if it was open.
  bool Revoke(uint64_t window_id, const char* why);

  // A write through window `id` into region `region_id`, presenting `token`. Refusals
  // say which (closed and when, expired, not this region, wrong token); a refusal by
  // someone holding the window's token is told to the region's owner too.
  absl::StatusOr<WindowAdmission> Admit(uint64_t id, const Token& token, uint64_t region_id);
  // Whether `token` is window `id`'s and the window is of region `region_id`, open or
  // among the recently closed: for what a write's notifications may say after it.
  absl::Status Verify(uint64_t id, const Token& token, uint64_t region_id) const;
  // Tells `region`'s owner that a write through window `id` was refused for `why`
  // (the caller checked the chunks or the writer).
  void Refuse(const Region& region, uint64_t window_id, const absl::Status& why) const;
  // Fabric keys, one per NIC, that reach the window's extent in `region` alone; made once
  // per window and region, revoked when the window closes.
  absl::StatusOr<std::vector<NicRegistration>> Keys(const WriteWindow& w, const Region& region);

  size_t open() const;

 private:
  struct Closed {
    Token token;
    absl::Time when;
    const char* why;
    uint64_t owner_session;
    // Alive while writes through it are (their admissions hold it): a later Close waits on it.
    std::weak_ptr<WriteWindow> window;
  };
  // Takes `w` out (under mu_) and closes it: admissions refused, keys revoked.
  void CloseLocked(const std::shared_ptr<WriteWindow>& w, const char* why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Run();

  RegionTable* const regions_;
  RegionRegistrar* registrar_ = nullptr;
  std::function<size_t(uint64_t)> announced_;
  const Refused refused_;

  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, std::shared_ptr<WriteWindow>> open_ ABSL_GUARDED_BY(mu_);
  uint64_t opens_ ABSL_GUARDED_BY(mu_) = 0;  // Open calls: each one's stamp
  absl::flat_hash_map<uint64_t, size_t> per_session_ ABSL_GUARDED_BY(mu_);
  // The open windows over each region, so that Open compares a new window with those
  // only (a region belongs to one session, which holds at most kMaxWindowsPerSession).
  absl::flat_hash_map<uint64_t, std::vector<const WriteWindow*>> over_region_ ABSL_GUARDED_BY(mu_);
  // The most recent closes (bounded), so a late write hears why.
  absl::flat_hash_map<uint64_t, Closed> closed_ ABSL_GUARDED_BY(mu_);
  std::deque<uint64_t> closed_order_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace ferry

#endif  // FERRY_AGENT_MEMORY_WRITE_WINDOWS_H_
