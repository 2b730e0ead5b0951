// ProgressBar (redrawn line on a terminal, plain lines elsewhere) and the structured Logger.
#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <mutex>

#include "kolo/error.h"
#include "kolo/observe.h"

namespace kolo::observe {

ProgressBar::ProgressBar(std::string label, int64_t total, std::FILE* out, int64_t plainEvery,
                         int interactive)
    : label_(std::move(label)),
      total_(std::max<int64_t>(total, 0)),
      out_(out),
      plainEvery_(std::max<int64_t>(plainEvery, 1)) {
  interactive_ = interactive < 0 ? ::isatty(::fileno(out_)) != 0 : interactive != 0;
}

void ProgressBar::update(int64_t done, const std::string& suffix) {
  if (finished_) return;
  if (interactive_) {
    const auto now = std::chrono::steady_clock::now();
    if (done < total_ && now - lastDraw_ < std::chrono::milliseconds(100)) return;
    lastDraw_ = now;
    draw(done, suffix, false);
  } else if (done % plainEvery_ == 0 && done < total_) {
    draw(done, suffix, false);
  }
}

void ProgressBar::finish(const std::string& suffix) {
  if (finished_) return;
  draw(total_, suffix, true);
  finished_ = true;
}

void ProgressBar::draw(int64_t done, const std::string& suffix, bool final) {
  const std::string counter = std::to_string(done) + "/" + std::to_string(total_);
  if (!interactive_) {
    std::fprintf(out_, "%s %s %s\n", label_.c_str(), counter.c_str(), suffix.c_str());
    std::fflush(out_);
    return;
  }
  constexpr int kWidth = 30;
  const int filled =
      total_ > 0 ? static_cast<int>(kWidth * std::min(done, total_) / total_) : kWidth;
  std::string bar(kWidth, ' ');
  for (int i = 0; i < filled; ++i) bar[i] = '=';
  if (filled < kWidth) bar[filled] = '>';
  // \r returns to the line start; \033[K clears what a longer previous line left.
  std::fprintf(out_, "\r%s [%s] %s %s\033[K%s", label_.c_str(), bar.c_str(), counter.c_str(),
               suffix.c_str(), final ? "\n" : "");
  std::fflush(out_);
}

LogLevel parseLogLevel(const std::string& name) {
  if (name == "debug") return LogLevel::Debug;
  if (name == "info") return LogLevel::Info;
  if (name == "warn" || name == "warning") return LogLevel::Warn;
  if (name == "error") return LogLevel::Error;
  KOLO_THROW(InvalidArgument, "unknown log level '", name, "' (debug, info, warn, error)");
}

Logger::Logger(std::FILE* out, LogLevel level, int rank) : out_(out), level_(level), rank_(rank) {}

void Logger::log(LogLevel level, const std::string& message, const Fields& fields) {
  if (level < level_) return;
  static const char* const kNames[] = {"DEBUG", "INFO", "WARN", "ERROR"};
  const auto now = std::chrono::system_clock::now();
  const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  const int millis = static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm utc{};
  ::gmtime_r(&seconds, &utc);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &utc);
  std::string line = std::string(stamp) + "." + (millis < 100 ? (millis < 10 ? "00" : "0") : "") +
                     std::to_string(millis) + "Z " + kNames[static_cast<int>(level)];
  if (rank_ >= 0) line += " [rank " + std::to_string(rank_) + "]";
  line += " " + message;
  for (const auto& [key, value] : fields.items()) line += " " + key + "=" + value.text();
  line += "\n";
  // One fwrite per line: stdio locks the stream per call, so concurrent lines never mix.
  std::fwrite(line.data(), 1, line.size(), out_);
  std::fflush(out_);
}

}  // namespace kolo::observe
