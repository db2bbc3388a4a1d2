#include "common/logging.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <utility>

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
std::shared_ptr<const LogSink>& Sink() {
  static std::shared_ptr<const LogSink> sink;
  return sink;
}
}  // namespace

void SetLogSink(LogSink sink) {
  std::lock_guard<std::mutex> lock(TagMutex());
  Sink() = sink ? std::make_shared<const LogSink>(std::move(sink)) : nullptr;
}

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
  prefix_ = stream_.str().size();
}

LogMessage::~LogMessage() {
  std::shared_ptr<const LogSink> sink;
  {
    std::lock_guard<std::mutex> lock(TagMutex());
    sink = Sink();
  }
  if (sink != nullptr && level_ != LogLevel::kFatal) {
    (*sink)(level_, stream_.str().substr(prefix_));
    return;
  }
  stream_ << '\n';
  const std::string line = stream_.str();
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
  if (level_ == LogLevel::kFatal) std::abort();
}

}  // namespace shoal
