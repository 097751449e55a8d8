#include "engine/server_optimizer.h"

#include <bit>
#include <cmath>
#include <cstring>

#include "common/check.h"
#include "kernels/accumulate.h"

namespace fedfleet::engine {
namespace {

constexpr char kMagic[4] = {'F', 'F', 'S', 'O'};
constexpr uint32_t kFormatVersion = 1;
constexpr uint32_t kMaxNameBytes = 64;

// ---- little-endian encoding ----------------------------------------------------------------

void putU32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void putU64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void putFloats(std::string& out, const std::vector<float>& v) {
  size_t at = out.size();
  out.resize(at + v.size() * sizeof(float));
  if constexpr (std::endian::native == std::endian::little) {
    if (!v.empty()) std::memcpy(out.data() + at, v.data(), v.size() * sizeof(float));
  } else {
    for (float f : v) {
      uint32_t bits = std::bit_cast<uint32_t>(f);
      for (int i = 0; i < 4; ++i) out[at++] = static_cast<char>((bits >> (8 * i)) & 0xff);
    }
  }
}

// Reads from a blob front to back; every read checks the bytes are there.
class Reader {
 public:
  explicit Reader(std::string_view b) : b_(b) {}
  bool u32(uint32_t& v) {
    if (b_.size() < 4) return false;
    v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t(static_cast<unsigned char>(b_[i])) << (8 * i);
    b_.remove_prefix(4);
    return true;
  }
  bool u64(uint64_t& v) {
    if (b_.size() < 8) return false;
    v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t(static_cast<unsigned char>(b_[i])) << (8 * i);
    b_.remove_prefix(8);
    return true;
  }
  bool bytes(size_t n, std::string_view& out) {
    if (b_.size() < n) return false;
    out = b_.substr(0, n);
    b_.remove_prefix(n);
    return true;
  }
  size_t left() const { return b_.size(); }

 private:
  std::string_view b_;
};

void getFloats(std::string_view bytes, std::vector<float>& v) {
  v.resize(bytes.size() / sizeof(float));
  if constexpr (std::endian::native == std::endian::little) {
    if (!v.empty()) std::memcpy(v.data(), bytes.data(), bytes.size());
  } else {
    for (size_t i = 0; i < v.size(); ++i) {
      uint32_t bits = 0;
      for (int j = 0; j < 4; ++j) {
        bits |= uint32_t(static_cast<unsigned char>(bytes[4 * i + j])) << (8 * j);
      }
      v[i] = std::bit_cast<float>(bits);
    }
  }
}

// ---- the rules -----------------------------------------------------------------------------

class FedAvg final : public ServerOptimizer {
 public:
  explicit FedAvg(ServerOptimizerOptions o) : ServerOptimizer(std::move(o), 0) {}

 private:
  void step(float* x, const float* g, size_t n) override {
    // The same fused multiply-add as the round engine's plain FedAvg step.
    kernels::weightedAccumulate(x, g, static_cast<float>(options_.lr), n);
  }
};

class FedAvgM final : public ServerOptimizer {
 public:
  explicit FedAvgM(ServerOptimizerOptions o) : ServerOptimizer(std::move(o), 1) {}

 private:
  void step(float* __restrict x, const float* __restrict g, size_t n) override {
    const float beta = static_cast<float>(options_.momentum);
    const float lr = static_cast<float>(options_.lr);
    float* __restrict m = buffers_[0].data();
    for (size_t i = 0; i < n; ++i) {
      m[i] = beta * m[i] + g[i];
      x[i] += lr * m[i];
    }
  }
};

enum class SecondMoment { kAdagrad, kAdam, kYogi };

// FedAdagrad, FedAdam and FedYogi: they differ only in how v moves.
template <SecondMoment kRule>
class Adaptive final : public ServerOptimizer {
 public:
  explicit Adaptive(ServerOptimizerOptions o) : ServerOptimizer(std::move(o), 2) {}

 private:
  void step(float* __restrict x, const float* __restrict g, size_t n) override {
    const float lr = static_cast<float>(options_.lr);
    const float b1 = static_cast<float>(options_.beta1);
    const float one_minus_b1 = static_cast<float>(1.0 - options_.beta1);
    const float b2 = static_cast<float>(options_.beta2);
    const float one_minus_b2 = static_cast<float>(1.0 - options_.beta2);
    const float tau = static_cast<float>(options_.tau);
    float* __restrict m = buffers_[0].data();
    float* __restrict v = buffers_[1].data();
    for (size_t i = 0; i < n; ++i) {
      const float gi = g[i];
      const float g2 = gi * gi;
      m[i] = b1 * m[i] + one_minus_b1 * gi;
      if constexpr (kRule == SecondMoment::kAdagrad) {
        v[i] += g2;
      } else if constexpr (kRule == SecondMoment::kAdam) {
        v[i] = b2 * v[i] + one_minus_b2 * g2;
      } else {
        // sign(v - G^2) in {-1, 0, 1}. v stays >= 0: it only shrinks (by (1 - beta2) G^2 <= G^2)
        // when v > G^2.
        const float d = v[i] - g2;
        const float sign = static_cast<float>((d > 0.0f) - (d < 0.0f));
        v[i] = v[i] - one_minus_b2 * g2 * sign;
      }
      x[i] += lr * m[i] / (std::sqrt(v[i]) + tau);
    }
  }
};

Status checkUnit(const char* key, double value) {
  if (!std::isfinite(value) || value < 0.0 || value >= 1.0) {
    return invalidArgument(std::string("server optimizer: ") + key + " must be in [0, 1), got " +
                           std::to_string(value));
  }
  return Status::ok();
}

Status checkPositive(const char* key, double value) {
  if (!std::isfinite(value) || value <= 0.0) {
    return invalidArgument(std::string("server optimizer: ") + key +
                           " must be a finite number > 0, got " + std::to_string(value));
  }
  return Status::ok();
}

}  // namespace

Result<ServerOptimizerKind> parseServerOptimizerKind(std::string_view name) {
  for (ServerOptimizerKind k : {ServerOptimizerKind::kFedAvg, ServerOptimizerKind::kFedAvgM,
                                ServerOptimizerKind::kFedAdagrad, ServerOptimizerKind::kFedAdam,
                                ServerOptimizerKind::kFedYogi}) {
    if (name == serverOptimizerName(k)) return k;
  }
  return invalidArgument("server optimizer: unknown name '" + std::string(name) +
                         "' (expected fedavg, fedavgm, fedadagrad, fedadam or fedyogi)");
}

const char* serverOptimizerName(ServerOptimizerKind kind) {
  switch (kind) {
    case ServerOptimizerKind::kFedAvg:
      return "fedavg";
    case ServerOptimizerKind::kFedAvgM:
      return "fedavgm";
    case ServerOptimizerKind::kFedAdagrad:
      return "fedadagrad";
    case ServerOptimizerKind::kFedAdam:
      return "fedadam";
    case ServerOptimizerKind::kFedYogi:
      return "fedyogi";
  }
  return "unknown";
}

Result<std::unique_ptr<ServerOptimizer>> ServerOptimizer::create(const ServerOptimizerOptions& o) {
  FEDFLEET_RETURN_IF_ERROR(checkPositive("lr", o.lr));
  FEDFLEET_RETURN_IF_ERROR(checkUnit("beta1", o.beta1));
  FEDFLEET_RETURN_IF_ERROR(checkUnit("beta2", o.beta2));
  FEDFLEET_RETURN_IF_ERROR(checkPositive("tau", o.tau));
  FEDFLEET_RETURN_IF_ERROR(checkUnit("momentum", o.momentum));
  std::unique_ptr<ServerOptimizer> opt;
  switch (o.kind) {
    case ServerOptimizerKind::kFedAvg:
      opt = std::make_unique<FedAvg>(o);
      break;
    case ServerOptimizerKind::kFedAvgM:
      opt = std::make_unique<FedAvgM>(o);
      break;
    case ServerOptimizerKind::kFedAdagrad:
      opt = std::make_unique<Adaptive<SecondMoment::kAdagrad>>(o);
      break;
    case ServerOptimizerKind::kFedAdam:
      opt = std::make_unique<Adaptive<SecondMoment::kAdam>>(o);
      break;
    case ServerOptimizerKind::kFedYogi:
      opt = std::make_unique<Adaptive<SecondMoment::kYogi>>(o);
      break;
  }
  if (!opt) return invalidArgument("server optimizer: unknown kind");
  return opt;
}

void ServerOptimizer::apply(float* params, const float* pseudo_grad, size_t n) {
  if (state_size_ == 0 && n > 0) {
    for (auto& b : buffers_) b.assign(n, 0.0f);
    state_size_ = n;
  }
  FEDFLEET_CHECK_MSG(n == state_size_ || n == 0,
                     "server optimizer: the model changed size since the first step");
  if (n == 0) return;
  step(params, pseudo_grad, n);
}

std::string ServerOptimizer::saveState() const {
  const std::string_view own = name();
  std::string out;
  out.reserve(4 + 4 + 4 + own.size() + 8 + 4 + buffers_.size() * state_size_ * sizeof(float));
  out.append(kMagic, sizeof(kMagic));
  putU32(out, kFormatVersion);
  putU32(out, static_cast<uint32_t>(own.size()));
  out.append(own);
  putU64(out, state_size_);
  putU32(out, static_cast<uint32_t>(buffers_.size()));
  for (const auto& b : buffers_) {
    if (state_size_ > 0) putFloats(out, b);
  }
  return out;
}

Status ServerOptimizer::loadState(std::string_view blob) {
  auto bad = [](const std::string& why) { return corrupt("server optimizer state: " + why); };
  Reader r(blob);
  std::string_view magic, name;
  uint32_t version = 0, name_bytes = 0, buffers = 0;
  uint64_t n = 0;
  if (!r.bytes(sizeof(kMagic), magic) || std::memcmp(magic.data(), kMagic, sizeof(kMagic)) != 0) {
    return bad("bad magic (not a server optimizer state)");
  }
  if (!r.u32(version)) return bad("truncated header");
  if (version != kFormatVersion) return bad("unknown format version " + std::to_string(version));
  if (!r.u32(name_bytes) || name_bytes > kMaxNameBytes || !r.bytes(name_bytes, name)) {
    return bad("bad or truncated optimizer name");
  }
  // The blob names the optimiser that saved it (a field of the state format).
  if (name != this->name()) {
    return invalidArgument("server optimizer state: saved by '" + std::string(name) +
                           "', cannot be loaded into '" + this->name() + "'");
  }
  if (!r.u64(n) || !r.u32(buffers)) return bad("truncated header");
  if (buffers != buffers_.size()) {
    return bad(std::to_string(buffers) + " state buffers where " + this->name() + " has " +
               std::to_string(buffers_.size()));
  }
  // n floats per buffer must be exactly what is left (checked by division: no overflow).
  const uint64_t left = r.left();
  if (buffers == 0 ? left != 0
                   : (left % (uint64_t(buffers) * sizeof(float)) != 0 ||
                      left / (uint64_t(buffers) * sizeof(float)) != n)) {
    return bad("state size " + std::to_string(n) + " does not match the " + std::to_string(left) +
               " bytes that follow");
  }
  std::vector<std::vector<float>> loaded(buffers);
  for (auto& b : loaded) {
    std::string_view bytes;
    if (!r.bytes(n * sizeof(float), bytes)) return bad("truncated state");
    getFloats(bytes, b);
  }
  buffers_ = std::move(loaded);
  // A stateless optimiser keeps its size from the blob too, so that apply() checks it.
  state_size_ = n;
  return Status::ok();
}

}  // namespace fedfleet::engine
