#include "engine/block_models.h"

#include <cmath>
#include <cstring>

#include "common/check.h"

namespace fedfleet::engine {
namespace {

uint64_t splitmix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Blob: "FFB1", mode (u8), blocks (u32), then per block: visits (u32), choice (u8: 0 none,
// 1 + Served), average length (u64) and values, chain length (u64) and values.
constexpr std::string_view kMagic = "FFB1";

template <typename T>
void put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}
void putFloats(std::string* out, const std::vector<float>& v) {
  put<uint64_t>(out, v.size());
  out->append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}
template <typename T>
bool take(std::string_view* in, T* v) {
  if (in->size() < sizeof(T)) return false;
  std::memcpy(v, in->data(), sizeof(T));
  in->remove_prefix(sizeof(T));
  return true;
}
bool takeFloats(std::string_view* in, std::vector<float>* v) {
  uint64_t n = 0;
  if (!take(in, &n) || n > in->size() / sizeof(float)) return false;
  v->resize(n);
  // An empty vector's data() may be null, and memcpy's pointers must not be, even for 0 bytes
  // (UndefinedBehaviorSanitizer's finding; a model of no block yet is saved empty).
  if (n > 0) std::memcpy(v->data(), in->data(), n * sizeof(float));
  in->remove_prefix(n * sizeof(float));
  return true;
}

}  // namespace

Result<BlockMode> parseBlockMode(std::string_view name) {
  if (name == "single") return BlockMode::kSingle;
  if (name == "pluralistic") return BlockMode::kPluralistic;
  if (name == "multichain") return BlockMode::kMultichain;
  return invalidArgument("block mode must be one of single, pluralistic, multichain; got \"" +
                         std::string(name) + "\"");
}

const char* blockModeName(BlockMode mode) {
  switch (mode) {
    case BlockMode::kSingle:
      return "single";
    case BlockMode::kPluralistic:
      return "pluralistic";
    case BlockMode::kMultichain:
      return "multichain";
  }
  return "?";
}

BlockSchedule::BlockSchedule(BlockScheduleOptions options) : options_(options) {
  FEDFLEET_CHECK(options_.count >= 1);
  FEDFLEET_CHECK((options_.rounds_per_block > 0) != (options_.block_s > 0));
}

uint32_t BlockSchedule::blockAt(uint32_t round, double now) const {
  if (byRounds()) return ((std::max(round, 1u) - 1) / options_.rounds_per_block) % options_.count;
  const double k = std::floor((now - options_.anchor_s) / options_.block_s);
  const double m = std::fmod(k, static_cast<double>(options_.count));
  return static_cast<uint32_t>(m < 0 ? m + options_.count : m);
}

int64_t BlockSchedule::visitAt(uint32_t round, double now) const {
  if (byRounds()) return (std::max(round, 1u) - 1) / options_.rounds_per_block;
  return static_cast<int64_t>(std::floor((now - options_.anchor_s) / options_.block_s));
}

bool BlockSchedule::endsAfter(uint32_t round, int64_t visit, double now) const {
  return visitAt(round + 1, now) != visit;
}

std::optional<double> BlockSchedule::nextBoundary(double now) const {
  if (byRounds()) return std::nullopt;
  const double k = std::floor((now - options_.anchor_s) / options_.block_s);
  return options_.anchor_s + (k + 1) * options_.block_s;
}

bool BlockSchedule::available(uint32_t partition, uint32_t block) const {
  const uint32_t home = partition % options_.count;
  if (home == block) return true;
  if (options_.overlap <= 0 || (home + 1) % options_.count != block) return false;
  const uint64_t h = splitmix(options_.seed ^ splitmix(0x6f7665726c6170ull + partition));
  return static_cast<double>(h >> 11) * 0x1.0p-53 < options_.overlap;
}

const char* BlockModels::servedName(Served s) {
  switch (s) {
    case Served::kShared:
      return "shared";
    case Served::kPluralistic:
      return "pluralistic";
    case Served::kChain:
      return "chain";
  }
  return "?";
}

BlockModels::BlockModels(BlockMode mode, uint32_t blocks) : mode_(mode), slots_(blocks) {
  FEDFLEET_CHECK(blocks >= 1);
}

void BlockModels::endVisit(uint32_t m, const std::vector<float>& x) {
  if (mode_ == BlockMode::kSingle) return;
  Slot& s = slots_.at(m);
  if (s.visits == 0) {
    s.average = x;
  } else {
    FEDFLEET_CHECK(s.average.size() == x.size());
    const double r = s.visits;
    for (size_t i = 0; i < x.size(); ++i) {
      s.average[i] = static_cast<float>((r * s.average[i] + x[i]) / (r + 1));
    }
  }
  ++s.visits;
}

std::vector<float>& BlockModels::chain(uint32_t m, const std::vector<float>& start) {
  Slot& s = slots_.at(m);
  if (s.chain.empty()) s.chain = start;
  return s.chain;
}

BlockModels::Served BlockModels::choose(uint32_t m, std::optional<double> average_loss,
                                        std::optional<double> chain_loss) {
  Slot& s = slots_.at(m);
  if (average_loss && (!chain_loss || *average_loss <= *chain_loss)) {
    s.choice = Served::kPluralistic;
  } else if (chain_loss) {
    s.choice = Served::kChain;
  }
  return served(m);
}

BlockModels::Served BlockModels::served(uint32_t m) const {
  const Slot& s = slots_.at(m);
  if (mode_ == BlockMode::kSingle) return Served::kShared;
  if (mode_ == BlockMode::kMultichain && s.choice) {
    if (*s.choice == Served::kChain && !s.chain.empty()) return Served::kChain;
    if (*s.choice == Served::kPluralistic && s.visits > 0) return Served::kPluralistic;
  }
  return s.visits > 0 ? Served::kPluralistic : Served::kShared;
}

const std::vector<float>& BlockModels::servedParams(uint32_t m,
                                                    const std::vector<float>& shared) const {
  switch (served(m)) {
    case Served::kPluralistic:
      return slots_.at(m).average;
    case Served::kChain:
      return slots_.at(m).chain;
    case Served::kShared:
      break;
  }
  return shared;
}

std::string BlockModels::save() const {
  std::string out(kMagic);
  put<uint8_t>(&out, static_cast<uint8_t>(mode_));
  put<uint32_t>(&out, blocks());
  for (const Slot& s : slots_) {
    put<uint32_t>(&out, s.visits);
    put<uint8_t>(&out, s.choice ? static_cast<uint8_t>(1 + static_cast<int>(*s.choice)) : 0);
    putFloats(&out, s.average);
    putFloats(&out, s.chain);
  }
  return out;
}

Status BlockModels::load(std::string_view blob, size_t n_params) {
  if (blob.substr(0, kMagic.size()) != kMagic) return corrupt("block models: bad magic");
  blob.remove_prefix(kMagic.size());
  uint8_t mode = 0;
  uint32_t blocks = 0;
  if (!take(&blob, &mode) || !take(&blob, &blocks)) return corrupt("block models: truncated");
  if (mode != static_cast<uint8_t>(mode_) || blocks != this->blocks()) {
    return corrupt("block models: saved for mode " +
                   std::string(mode <= 2 ? blockModeName(static_cast<BlockMode>(mode)) : "?") +
                   " with " + std::to_string(blocks) + " blocks, this run has " +
                   blockModeName(mode_) + " with " + std::to_string(this->blocks()));
  }
  std::vector<Slot> slots(blocks);
  for (Slot& s : slots) {
    uint8_t choice = 0;
    if (!take(&blob, &s.visits) || !take(&blob, &choice) || !takeFloats(&blob, &s.average) ||
        !takeFloats(&blob, &s.chain)) {
      return corrupt("block models: truncated");
    }
    if (choice > 3) return corrupt("block models: bad choice");
    if (choice > 0) s.choice = static_cast<Served>(choice - 1);
    if ((!s.average.empty() && s.average.size() != n_params) ||
        (!s.chain.empty() && s.chain.size() != n_params)) {
      return corrupt("block models: a model of another size (the run's has " +
                     std::to_string(n_params) + " values)");
    }
    if ((s.visits > 0) != !s.average.empty()) return corrupt("block models: visits disagree");
  }
  if (!blob.empty()) return corrupt("block models: trailing bytes");
  slots_ = std::move(slots);
  return Status::ok();
}

}  // namespace fedfleet::engine
