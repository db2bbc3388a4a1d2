#include "common/logging.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "absl/time/time.h"
#include "common/clock.h"

namespace shoal {
namespace {
std::mutex& TagMutex() {
  static std::mutex mu;
  return mu;
}
std::string& Tag() {
  static std::string tag = "shoal";
  return tag;
}
}  // namespace

void SetLogTag(const std::string& tag) {
  std::lock_guard<std::mutex> lock(TagMutex());
  Tag() = tag;
}

std::string LogTag() {
  std::lock_guard<std::mutex> lock(TagMutex());
  return Tag();
}

int VerboseLevel() {
  static const int level = [] {
    const char* v = std::getenv("SHOAL_VERBOSE");
    return v == nullptr ? 0 : std::atoi(v);
  }();
  return level;
}

LogMessage::LogMessage(LogLevel level, const char* file, int line) : level_(level) {
  static const char kLetters[] = {'I', 'W', 'E', 'F'};
  const char* base = std::strrchr(file, '/');
  std::string tag;
  {
    std::lock_guard<std::mutex> lock(TagMutex());
    tag = Tag();
  }
  stream_ << kLetters[static_cast<int>(level)]
          << absl::FormatTime("%H:%M:%E3S", RealClock::Get()->Now(), absl::LocalTimeZone()) << " ["
          << tag << "] " << (base ? base + 1 : file) << ":" << line << "] ";
}

LogMessage::~LogMessage() {
  stream_ << '\n';
  const std::string line = stream_.str();
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
  if (level_ == LogLevel::kFatal) std::abort();
}

}  // namespace shoal
