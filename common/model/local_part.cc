#include "common/model/local_part.h"

#include <fnmatch.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/atomic_file.h"
#include "common/check.h"
#include "common/crypto/sha256.h"

namespace fedfleet::model {
namespace {

constexpr char kMagic[8] = {'F', 'F', 'L', 'O', 'C', 'A', 'L', '1'};
constexpr size_t kHeader = sizeof(kMagic) + sizeof(uint64_t);
constexpr size_t kDigest = 32;

}  // namespace

Result<LocalPart> LocalPart::of(const Layout& layout, const std::vector<std::string>& patterns) {
  LocalPart part;
  if (patterns.empty()) return part;
  std::vector<bool> used(patterns.size(), false);
  for (const TensorSpec& t : layout.tensors) {
    bool local = false;
    for (size_t i = 0; i < patterns.size(); ++i) {
      if (fnmatch(patterns[i].c_str(), t.name.c_str(), 0) == 0) used[i] = local = true;
    }
    if (!local) continue;
    part.names_.push_back(t.name);
    if (!part.ranges_.empty() &&
        part.ranges_.back().first + part.ranges_.back().second == t.offset) {
      part.ranges_.back().second += t.numel;  // adjacent tensors: one range
    } else {
      part.ranges_.emplace_back(t.offset, t.numel);
    }
    part.values_ += t.numel;
  }
  for (size_t i = 0; i < patterns.size(); ++i) {
    if (used[i]) continue;
    std::string names;
    for (const TensorSpec& t : layout.tensors) names += (names.empty() ? "" : ", ") + t.name;
    return invalidArgument("model.local: pattern \"" + patterns[i] +
                           "\" matches no tensor of the model (its tensors: " + names + ")");
  }
  if (part.values_ == layout.total) {
    return invalidArgument(
        "model.local: every tensor of the model is local, so nothing would be federated");
  }
  return part;
}

bool LocalPart::isLocal(const std::string& name) const {
  for (const std::string& n : names_) {
    if (n == name) return true;
  }
  return false;
}

std::vector<float> LocalPart::gather(const std::vector<float>& flat) const {
  std::vector<float> out;
  out.reserve(values_);
  for (const auto& [offset, count] : ranges_) {
    FEDFLEET_CHECK_MSG(offset + count <= flat.size(), "a flat model shorter than its layout");
    out.insert(out.end(), flat.begin() + offset, flat.begin() + offset + count);
  }
  return out;
}

void LocalPart::scatter(const std::vector<float>& local, std::vector<float>& flat) const {
  FEDFLEET_CHECK_MSG(local.size() == values_, "local values of another model");
  size_t pos = 0;
  for (const auto& [offset, count] : ranges_) {
    FEDFLEET_CHECK_MSG(offset + count <= flat.size(), "a flat model shorter than its layout");
    std::memcpy(flat.data() + offset, local.data() + pos, count * sizeof(float));
    pos += count;
  }
}

void LocalPart::zero(std::vector<float>& flat) const {
  for (const auto& [offset, count] : ranges_) {
    FEDFLEET_CHECK_MSG(offset + count <= flat.size(), "a flat model shorter than its layout");
    std::fill(flat.begin() + offset, flat.begin() + offset + count, 0.0f);
  }
}

Status saveLocalValues(const std::string& path, const std::vector<float>& values) {
  std::string bytes(kHeader + values.size() * sizeof(float), '\0');
  std::memcpy(bytes.data(), kMagic, sizeof(kMagic));
  const uint64_t n = values.size();
  std::memcpy(bytes.data() + sizeof(kMagic), &n, sizeof(n));
  if (!values.empty()) {
    std::memcpy(bytes.data() + kHeader, values.data(), values.size() * sizeof(float));
  }
  const crypto::Digest digest = crypto::sha256(bytes);
  bytes.append(reinterpret_cast<const char*>(digest.data()), digest.size());
  Status st = writeFileAtomically(path, bytes);
  if (!st.isOk()) return ioError("model.local: saving the local part: " + st.message());
  return Status::ok();
}

Result<std::vector<float>> loadLocalValues(const std::string& path, size_t expected) {
  FEDFLEET_ASSIGN_OR_RETURN(const std::string bytes, readWholeFile(path));
  const auto bad = [&path](const std::string& why) {
    return corrupt("local part file " + path + ": " + why +
                   "; move it away to start this client's local part from the global model");
  };
  if (bytes.size() < kHeader + kDigest || std::memcmp(bytes.data(), kMagic, sizeof(kMagic))) {
    return bad("not a local part file (bad magic number or too short)");
  }
  uint64_t n = 0;
  std::memcpy(&n, bytes.data() + sizeof(kMagic), sizeof(n));
  if (n > (bytes.size() - kHeader - kDigest) / sizeof(float) ||
      kHeader + n * sizeof(float) + kDigest != bytes.size()) {
    return bad("its size does not match its count of " + std::to_string(n) + " values");
  }
  const crypto::Digest digest = crypto::sha256(bytes.data(), bytes.size() - kDigest);
  if (std::memcmp(digest.data(), bytes.data() + bytes.size() - kDigest, kDigest) != 0) {
    return bad("checksum mismatch (the file is damaged)");
  }
  if (n != expected) {
    return bad("it holds " + std::to_string(n) + " values, the model's local part " +
               std::to_string(expected) + " (another model or another model.local)");
  }
  std::vector<float> values(n);
  if (n > 0) std::memcpy(values.data(), bytes.data() + kHeader, n * sizeof(float));
  for (float v : values) {
    if (!std::isfinite(v)) return bad("it holds a NaN or infinite value");
  }
  return values;
}

Result<LocalState> LocalState::open(LocalPart part, const std::string& path) {
  LocalState s;
  s.part = std::move(part);
  s.path = path;
  if (path.empty() || s.part.empty()) return s;
  auto loaded = loadLocalValues(path, s.part.values());
  if (loaded.isOk()) {
    s.values = std::move(loaded).value();
  } else if (loaded.status().code() != StatusCode::kNotFound) {
    return loaded.status();
  }
  return s;
}

void LocalState::applyTo(std::vector<float>& start) const {
  if (!values.empty()) part.scatter(values, start);
}

Status LocalState::absorb(const std::vector<float>& start, std::vector<float>& delta) {
  if (part.empty()) return Status::ok();
  FEDFLEET_CHECK_MSG(start.size() == delta.size(), "a delta of another model");
  std::vector<float> trained = part.gather(start);
  const std::vector<float> d = part.gather(delta);
  for (size_t i = 0; i < trained.size(); ++i) trained[i] += d[i];
  part.zero(delta);
  values = std::move(trained);
  if (!path.empty()) return saveLocalValues(path, values);
  return Status::ok();
}

}  // namespace fedfleet::model
