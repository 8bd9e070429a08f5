#include "agent/common/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "agent/common/check.h"

namespace ferry {
namespace {
std::atomic<int> g_min_level{static_cast<int>(LogLevel::kInfo)};
constexpr const char* kLevelNames[] = {"D", "I", "W", "E"};
}  // namespace

void SetMinLogLevel(LogLevel level) { g_min_level.store(static_cast<int>(level)); }
bool LogEnabled(LogLevel level) { return static_cast<int>(level) >= g_min_level.load(); }

LogLine::LogLine(LogLevel level, const char* file, int line) : level_(level) {
  const char* base = strrchr(file, '/');
  stream_ << kLevelNames[static_cast<int>(level_)] << absl::FormatTime(" %H:%M:%E6S ", absl::Now(), absl::UTCTimeZone())
          << "ferryd " << (base ? base + 1 : file) << ":" << line << "] ";
}

LogLine::~LogLine() {
  stream_ << '\n';
  std::string s = stream_.str();
  ssize_t ignored = write(STDERR_FILENO, s.data(), s.size());
  (void)ignored;
}

CheckFailure::CheckFailure(const char* file, int line, const char* condition) : file_(file), line_(line) {
  message_ << "check failed: " << condition << ": ";
}

CheckFailure::~CheckFailure() {
  LogLine(LogLevel::kError, file_, line_).stream() << message_.str();  // written before abort()
  abort();
}

}  // namespace ferry
