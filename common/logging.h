// The one logging header: SHOAL_LOG(INFO) << "..."; lines go to stderr with a
// timestamp, level and the process's name. VLOG-style detail is enabled with
// the SHOAL_VERBOSE environment variable (SHOAL_VLOG(1)).
#ifndef SHOAL_COMMON_LOGGING_H_
#define SHOAL_COMMON_LOGGING_H_

#include <cstddef>
#include <functional>
#include <sstream>
#include <string>

namespace shoal {

enum class LogLevel { kInfo, kWarning, kError, kFatal };

// Sets the name printed on each line ("coordinator", "worker w2", ...).
void SetLogTag(const std::string& tag);
// The current tag (what this process is: "worker w2", "checkpoint", ...).
std::string LogTag();
int VerboseLevel();

// Where lines go instead of stderr: the message (without the time, tag and
// source prefix) and its level; FATAL lines still go to stderr. An empty
// sink restores stderr. Called on the logging thread, under no lock of
// logging's. The Python module hands lines to Python's `logging` this way.
using LogSink = std::function<void(LogLevel level, const std::string& message)>;
void SetLogSink(LogSink sink);

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();  // writes the line; aborts for kFatal
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
  size_t prefix_ = 0;  // the time, tag and source
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
