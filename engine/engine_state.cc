#include "engine/engine_state.h"

#include <cstring>

namespace fedfleet::engine {
namespace {

constexpr std::string_view kStateMagic = "FFE1";

}  // namespace

EngineStateWriter::EngineStateWriter() : out_(kStateMagic) {}

void EngineStateWriter::section(std::string_view bytes) {
  const uint64_t n = bytes.size();
  char len[8];
  std::memcpy(len, &n, 8);
  out_.append(len, 8);
  out_.append(bytes);
}

Result<EngineStateReader> EngineStateReader::open(std::string_view blob) {
  if (blob.substr(0, kStateMagic.size()) != kStateMagic) {
    return corrupt("engine state: not a fedfleet engine state");
  }
  blob.remove_prefix(kStateMagic.size());
  return EngineStateReader(blob);
}

Result<std::string_view> EngineStateReader::section(const char* what) {
  uint64_t n = 0;
  if (in_.size() < 8) return corrupt(std::string("engine state: truncated before ") + what);
  std::memcpy(&n, in_.data(), 8);
  in_.remove_prefix(8);
  if (n > in_.size()) return corrupt(std::string("engine state: truncated ") + what);
  std::string_view s = in_.substr(0, n);
  in_.remove_prefix(n);
  return s;
}

bool EngineStateReader::nextStartsWith(std::string_view prefix) const {
  uint64_t n = 0;
  if (in_.size() < 8) return false;
  std::memcpy(&n, in_.data(), 8);
  return n >= prefix.size() && in_.size() - 8 >= prefix.size() && in_.substr(8, prefix.size()) == prefix;
}

std::string encodePartitions(const std::vector<std::pair<std::string, int32_t>>& assigned) {
  std::string parts(8, '\0');
  uint64_t n = 0;
  for (const auto& [id, partition] : assigned) {
    const uint32_t len = static_cast<uint32_t>(id.size());
    parts.append(reinterpret_cast<const char*>(&len), 4);
    parts.append(id);
    parts.append(reinterpret_cast<const char*>(&partition), 4);
    ++n;
  }
  std::memcpy(parts.data(), &n, 8);
  return parts;
}

Result<std::map<std::string, int32_t>> parsePartitions(std::string_view s,
                                                       uint32_t num_partitions) {
  std::map<std::string, int32_t> out;
  uint64_t n = 0;
  if (s.size() < 8) return corrupt("engine state: truncated partitions");
  std::memcpy(&n, s.data(), 8);
  s.remove_prefix(8);
  for (uint64_t i = 0; i < n; ++i) {
    uint32_t len = 0;
    int32_t partition = 0;
    if (s.size() < 4) return corrupt("engine state: truncated partitions");
    std::memcpy(&len, s.data(), 4);
    s.remove_prefix(4);
    if (len == 0 || len > 128 || s.size() < uint64_t{len} + 4) {
      return corrupt("engine state: bad client id in partitions");
    }
    std::string id(s.substr(0, len));
    s.remove_prefix(len);
    std::memcpy(&partition, s.data(), 4);
    s.remove_prefix(4);
    if (partition < 0 || static_cast<uint32_t>(partition) >= num_partitions) {
      return corrupt("engine state: client " + id + " holds partition " +
                     std::to_string(partition) + " of a run with " +
                     std::to_string(num_partitions) +
                     " (data.partitions changed since the checkpoint?)");
    }
    out[id] = partition;
  }
  if (!s.empty()) return corrupt("engine state: trailing bytes after partitions");
  return out;
}

}  // namespace fedfleet::engine
