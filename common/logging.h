// The one logging header: SHOAL_LOG(INFO) << "..."; lines go to stderr with a
// timestamp, level and the process's name. VLOG-style detail is enabled with
// the SHOAL_VERBOSE environment variable (SHOAL_VLOG(1)).
#ifndef SHOAL_COMMON_LOGGING_H_
#define SHOAL_COMMON_LOGGING_H_

#include <sstream>
#include <string>

namespace shoal {

enum class LogLevel { kInfo, kWarning, kError, kFatal };

// Sets the name printed on each line ("coordinator", "worker w2", ...).
void SetLogTag(const std::string& tag);
// The current tag (what this process is: "worker w2", "checkpoint", ...).
std::string LogTag();
int VerboseLevel();

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();  // writes the line; aborts for kFatal
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

}  // namespace shoal

#define SHOAL_LOG_INFO ::shoal::LogLevel::kInfo
#define SHOAL_LOG_WARNING ::shoal::LogLevel::kWarning
#define SHOAL_LOG_ERROR ::shoal::LogLevel::kError
#define SHOAL_LOG_FATAL ::shoal::LogLevel::kFatal
#define SHOAL_LOG(severity) ::shoal::LogMessage(SHOAL_LOG_##severity, __FILE__, __LINE__).stream()
#define SHOAL_VLOG(n) \
  if (::shoal::VerboseLevel() >= (n)) SHOAL_LOG(INFO)

#endif  // SHOAL_COMMON_LOGGING_H_
