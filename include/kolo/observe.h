// kolo::observe: what a training run tells the outside world — per-step metrics as JSON
// lines, a progress bar on a terminal (plain lines when output is a file or pipe), and a
// small structured logger.
#pragma once

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace kolo::observe {

class Fields;

/// One value of a metrics record or log line: null, a boolean, an integer, a number, text,
/// a list of values, or a nested record (Fields).
class Value {
 public:
  using Array = std::vector<Value>;
  using Object = std::vector<std::pair<std::string, Value>>;
  using Variant = std::variant<std::monostate, bool, int64_t, double, std::string, Array, Object>;

  Value() = default;  // null
  Value(std::nullptr_t) {}
  Value(bool value) : value_(value) {}
  template <std::integral T>
    requires(!std::same_as<T, bool>)
  Value(T value) : value_(static_cast<int64_t>(value)) {}
  template <std::floating_point T>
  Value(T value) : value_(static_cast<double>(value)) {}
  Value(std::string value) : value_(std::move(value)) {}
  Value(std::string_view value) : value_(std::string(value)) {}
  Value(const char* value) : value_(std::string(value)) {}
  Value(Array items) : value_(std::move(items)) {}
  Value(const Fields& record);

  const Variant& get() const { return value_; }
  /// The value as JSON ("3", "0.5", "true", "null", "\"text\"", "[1,2]", "{\"a\":1}"; NaN and
  /// infinities are null).
  std::string json() const;
  /// The value as a log line shows it: text as it is, everything else as JSON.
  std::string text() const;

 private:
  Variant value_;
};

/// Key/value fields of a metrics record or a log line, kept in insertion order:
/// `{{"epoch", 1}, {"loss", 0.41}}`.
class Fields {
 public:
  Fields() = default;
  Fields(std::initializer_list<std::pair<std::string, Value>> items);
  /// Sets `key`, replacing an earlier value of the same key in its place.
  Fields& set(const std::string& key, Value value);
  /// Sets every field of `other`, as set() does.
  Fields& update(const Fields& other);
  const std::vector<std::pair<std::string, Value>>& items() const { return items_; }
  bool empty() const { return items_.empty(); }
  /// The fields as one JSON object: {"epoch":1,"loss":0.41}.
  std::string json() const;

 private:
  std::vector<std::pair<std::string, Value>> items_;
};

/// Appends one JSON object per line to a file, flushing after each, so a crashed run
/// leaves every record it wrote readable.
class MetricsWriter {
 public:
  /// Opens (truncates, or appends with `append`) `path`; throws IoError naming it on failure.
  explicit MetricsWriter(const std::string& path, bool append = false);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  /// Writes `record` as one JSON object on one line and flushes.
  void write(const Fields& record);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

/// Progress of a loop with a known number of steps. On a terminal it redraws one line
/// ("epoch 1 [=====>    ] 230/469 loss 0.412 12.3k samples/s"); otherwise it prints a plain
/// line every `plainEvery` steps and at the end, so logs stay readable.
class ProgressBar {
 public:
  /// `out` is not owned. `interactive` defaults to isatty(fileno(out)).
  ProgressBar(std::string label, int64_t total, std::FILE* out = stderr, int64_t plainEvery = 100,
              int interactive = -1);
  /// Reports `done` of `total` steps with a free-form suffix (loss, rate...). Cheap when
  /// called every step: a terminal is redrawn at most ~10 times a second.
  void update(int64_t done, const std::string& suffix = "");
  /// Draws the final state and ends the line.
  void finish(const std::string& suffix = "");
  bool interactive() const { return interactive_; }

 private:
  void draw(int64_t done, const std::string& suffix, bool final);
  std::string label_;
  int64_t total_;
  std::FILE* out_;
  int64_t plainEvery_;
  bool interactive_;
  bool finished_ = false;
  std::chrono::steady_clock::time_point lastDraw_{};
};

enum class LogLevel { Debug = 0, Info = 1, Warn = 2, Error = 3 };

/// Parses "debug", "info", "warn", "error"; throws InvalidArgument for anything else.
LogLevel parseLogLevel(const std::string& name);

/// Writes "2026-11-21T19:03:42.123Z INFO [rank 0] message key=value ..." lines to a stream.
/// Thread-safe (one line per call, never interleaved).
class Logger {
 public:
  /// `out` is not owned; `rank` < 0 omits the rank tag.
  explicit Logger(std::FILE* out = stderr, LogLevel level = LogLevel::Info, int rank = -1);
  void log(LogLevel level, const std::string& message, const Fields& fields = {});
  void debug(const std::string& message, const Fields& fields = {}) {
    log(LogLevel::Debug, message, fields);
  }
  void info(const std::string& message, const Fields& fields = {}) {
    log(LogLevel::Info, message, fields);
  }
  void warn(const std::string& message, const Fields& fields = {}) {
    log(LogLevel::Warn, message, fields);
  }
  void error(const std::string& message, const Fields& fields = {}) {
    log(LogLevel::Error, message, fields);
  }
  LogLevel level() const { return level_; }

 private:
  std::FILE* out_;
  LogLevel level_;
  int rank_;
};

}  // namespace kolo::observe
