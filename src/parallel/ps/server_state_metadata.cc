// The metadata check of a parameter server's checkpoint (server_state.h): the file's bytes
// come from disk, so every field is checked before it is used.
#include <charconv>

#include "kolo/error.h"
#include "parallel/ps/server_state.h"

namespace kolo::parallel::ps::detail {
namespace {

const std::string& field(const std::map<std::string, std::string>& metadata, const std::string& key,
                         const std::string& path) {
  const auto it = metadata.find(key);
  if (it == metadata.end())
    KOLO_THROW(FormatError, path, ": no '", key, "' in the metadata of a server checkpoint");
  return it->second;
}

/// The field as a non-negative decimal int64, the whole text and nothing else.
int64_t count(const std::map<std::string, std::string>& metadata, const std::string& key,
              const std::string& path) {
  const std::string& text = field(metadata, key, path);
  int64_t value = -1;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || value < 0)
    KOLO_THROW(FormatError, path, ": the '", key, "' of a server checkpoint is '", text,
               "', not a count (a non-negative integer)");
  return value;
}

}  // namespace

ServerStateFacts checkServerStateMetadata(const std::map<std::string, std::string>& metadata,
                                          const std::string& path, int index,
                                          const std::string& optimizer) {
  const std::string& server = field(metadata, "server", path);
  if (server != std::to_string(index))
    KOLO_THROW(Mismatch, path, " was written by parameter server ", server, ", not ", index);
  const std::string& kind = field(metadata, "optimizer", path);
  if (kind != optimizer)
    KOLO_THROW(Mismatch, path, " holds ", kind, " state, this job uses ", optimizer);
  return {count(metadata, "version", path), count(metadata, "step", path)};
}

}  // namespace kolo::parallel::ps::detail
