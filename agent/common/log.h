// Minimal leveled logging to stderr (this Abseil release has no absl/log).
//
//   FERRY_LOG(INFO) << "listening on " << path;
//
// One line per statement, written with a single write(2) so lines from threads do not
// interleave. Never log tokens or raw addresses of client memory.
#ifndef FERRY_AGENT_COMMON_LOG_H_
#define FERRY_AGENT_COMMON_LOG_H_

#include <sstream>

namespace ferry {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// Messages below this level are dropped (set from --log_level).
void SetMinLogLevel(LogLevel level);
bool LogEnabled(LogLevel level);

class LogLine {
 public:
  LogLine(LogLevel level, const char* file, int line);
  ~LogLine();
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

}  // namespace ferry

#define FERRY_LOG_LEVEL_DEBUG ::ferry::LogLevel::kDebug
#define FERRY_LOG_LEVEL_INFO ::ferry::LogLevel::kInfo
#define FERRY_LOG_LEVEL_WARNING ::ferry::LogLevel::kWarning
#define FERRY_LOG_LEVEL_ERROR ::ferry::LogLevel::kError
#define FERRY_LOG(level)                               \
  if (!::ferry::LogEnabled(FERRY_LOG_LEVEL_##level)) { \
  } else                                               \
    ::ferry::LogLine(FERRY_LOG_LEVEL_##level, __FILE__, __LINE__).stream()

#endif  // FERRY_AGENT_COMMON_LOG_H_
