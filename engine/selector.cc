#include "engine/selector.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

namespace fedfleet::engine {
namespace {

// ---- Saved state ----------------------------------------------------------------------------
// Layout: "FFSL", version byte, selector name (varint length + bytes), the selector's fields,
// then the FNV-1a 64 of everything before it (8 bytes, little-endian). Integers are varints,
// doubles their 8 IEEE bytes little-endian (bit-exact, so a restored selector computes the same
// utilities), strings a varint length and their bytes.
constexpr char kMagic[4] = {'F', 'F', 'S', 'L'};
constexpr uint8_t kStateVersion = 1;

uint64_t fnv1a64(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

class StateWriter {
 public:
  explicit StateWriter(const char* selector) {
    out_.append(kMagic, sizeof kMagic);
    out_.push_back(static_cast<char>(kStateVersion));
    putString(selector);
  }
  void putVarint(uint64_t v) {
    while (v >= 0x80) {
      out_.push_back(static_cast<char>((v & 0x7f) | 0x80));
      v >>= 7;
    }
    out_.push_back(static_cast<char>(v));
  }
  void putFixed64(uint64_t v) {
    for (int i = 0; i < 8; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  void putDouble(double d) {
    uint64_t bits;
    std::memcpy(&bits, &d, sizeof bits);
    putFixed64(bits);
  }
  void putString(std::string_view s) {
    putVarint(s.size());
    out_.append(s);
  }
  std::string finish() && {
    putFixed64(fnv1a64(out_));
    return std::move(out_);
  }

 private:
  std::string out_;
};

// Reads what StateWriter wrote. Every get returns false when the blob ends early or a value is
// malformed; the caller turns that into kCorrupt.
class StateReader {
 public:
  explicit StateReader(std::string_view body) : in_(body) {}
  bool getVarint(uint64_t* v) {
    uint64_t r = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (in_.empty()) return false;
      const auto b = static_cast<uint8_t>(in_.front());
      in_.remove_prefix(1);
      if (shift == 63 && b > 1) return false;
      r |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) {
        *v = r;
        return true;
      }
    }
    return false;
  }
  bool getU32(uint32_t* v) {
    uint64_t w;
    if (!getVarint(&w) || w > std::numeric_limits<uint32_t>::max()) return false;
    *v = static_cast<uint32_t>(w);
    return true;
  }
  bool getFixed64(uint64_t* v) {
    if (in_.size() < 8) return false;
    uint64_t r = 0;
    for (int i = 0; i < 8; ++i) r |= static_cast<uint64_t>(static_cast<uint8_t>(in_[i])) << (8 * i);
    in_.remove_prefix(8);
    *v = r;
    return true;
  }
  // A finite double >= 0: the only kind selectors store.
  bool getNonNegative(double* d) {
    uint64_t bits;
    if (!getFixed64(&bits)) return false;
    std::memcpy(d, &bits, sizeof bits);
    return std::isfinite(*d) && *d >= 0;
  }
  bool getString(std::string* s) {
    uint64_t n;
    if (!getVarint(&n) || n > in_.size()) return false;
    s->assign(in_.substr(0, n));
    in_.remove_prefix(n);
    return true;
  }
  // A count of items each at least `min_bytes` long, so a corrupt count cannot make the
  // caller reserve more than the blob could hold.
  bool getCount(uint64_t* n, size_t min_bytes) {
    return getVarint(n) && *n <= in_.size() / min_bytes;
  }
  bool atEnd() const { return in_.empty(); }

 private:
  std::string_view in_;
};

// Checks the frame and returns a reader over the selector's fields.
Result<StateReader> openState(std::string_view blob, const char* selector) {
  if (blob.size() < sizeof kMagic + 1 + 1 + 8 ||
      std::memcmp(blob.data(), kMagic, sizeof kMagic) != 0) {
    return corrupt("selector state: not a selector state blob");
  }
  const std::string_view body = blob.substr(0, blob.size() - 8);
  StateReader tail(blob.substr(blob.size() - 8));
  uint64_t sum;
  if (!tail.getFixed64(&sum) || sum != fnv1a64(body)) {
    return corrupt("selector state: checksum mismatch");
  }
  if (static_cast<uint8_t>(body[sizeof kMagic]) != kStateVersion) {
    return corrupt("selector state: unknown version " +
                   std::to_string(static_cast<uint8_t>(body[sizeof kMagic])));
  }
  StateReader r(body.substr(sizeof kMagic + 1));
  std::string name;
  if (!r.getString(&name)) return corrupt("selector state: truncated header");
  if (name != selector) {
    return invalidArgument("selector state was saved by selector '" + name + "', not '" + selector +
                           "'");
  }
  return r;
}

Status truncated(const char* selector) {
  return corrupt(std::string("selector state of '") + selector +
                 "': truncated or out-of-range field");
}

// ---- Sampling helpers -----------------------------------------------------------------------

// Uniform in (0, 1] from 53 bits of one draw; defined here (not by the standard library's
// distribution) so saved sequences stay the same across library versions.
double unitOpenClosed(std::mt19937_64& rng) {
  return static_cast<double>((rng() >> 11) + 1) * 0x1.0p-53;
}

// Moves a uniform sample without replacement of min(k, v.size()) elements to the front of v
// and drops the rest (partial Fisher-Yates, one draw per element taken: the engine's draw).
template <typename T>
void partialFisherYates(std::vector<T>& v, size_t k, std::mt19937_64& rng) {
  const size_t take = std::min(k, v.size());
  for (size_t i = 0; i < take; ++i) {
    std::uniform_int_distribution<size_t> pick(i, v.size() - 1);
    std::swap(v[i], v[pick(rng)]);
  }
  v.resize(take);
}

// Keeps the k elements that come first under `before` (a strict weak order that must break
// every tie, so the answer does not depend on nth_element's internals), in no set order. O(n).
template <typename T, typename Less>
void keepFirst(std::vector<T>& v, size_t k, Less before) {
  if (k < v.size()) {
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end(), before);
    v.resize(k);
  }
}

std::vector<std::string> idsOf(const std::vector<std::string>& candidates,
                               const std::vector<size_t>& picked) {
  std::vector<size_t> order = picked;
  std::sort(order.begin(), order.end());  // candidates are sorted by id
  std::vector<std::string> out;
  out.reserve(order.size());
  for (size_t i : order) out.push_back(candidates[i]);
  return out;
}

double nonNegativeOrZero(double d) { return std::isfinite(d) && d > 0 ? d : 0; }

Status checkUnit(const char* key, double v) {
  if (!(v >= 0 && v <= 1)) {
    return invalidArgument(std::string("'selector.") + key + "' must be in [0, 1], got " +
                           std::to_string(v));
  }
  return Status::ok();
}

Status checkNonNegative(const char* key, double v) {
  if (!(std::isfinite(v) && v >= 0)) {
    return invalidArgument(std::string("'selector.") + key +
                           "' must be finite and not negative, got " + std::to_string(v));
  }
  return Status::ok();
}

}  // namespace

// ---- Selector -------------------------------------------------------------------------------

Selector::~Selector() = default;
void Selector::feedback(const ParticipationFeedback&) {}
void Selector::setSpeedHint(SpeedHint) {}
void Selector::setAvailabilityHint(AvailabilityHint) {}

Result<SelectorKind> parseSelectorKind(std::string_view name) {
  for (SelectorKind k :
       {SelectorKind::kUniform, SelectorKind::kOort, SelectorKind::kAvailability}) {
    if (name == selectorName(k)) return k;
  }
  return invalidArgument(
      "'selector.name' must be \"uniform\", \"oort\" or \"availability\", "
      "got \"" +
      std::string(name) + "\"");
}

const char* selectorName(SelectorKind kind) {
  switch (kind) {
    case SelectorKind::kUniform:
      return "uniform";
    case SelectorKind::kOort:
      return "oort";
    case SelectorKind::kAvailability:
      return "availability";
  }
  return "unknown";
}

Status validateSelectorOptions(const SelectorOptions& o) {
  FEDFLEET_RETURN_IF_ERROR(checkUnit("explore_initial", o.explore_initial));
  FEDFLEET_RETURN_IF_ERROR(checkUnit("explore_min", o.explore_min));
  if (!(o.explore_decay > 0 && o.explore_decay <= 1)) {
    return invalidArgument("'selector.explore_decay' must be in (0, 1], got " +
                           std::to_string(o.explore_decay));
  }
  FEDFLEET_RETURN_IF_ERROR(checkNonNegative("alpha", o.alpha));
  FEDFLEET_RETURN_IF_ERROR(checkNonNegative("preferred_duration_s", o.preferred_duration_s));
  if (!(o.cutoff > 0 && o.cutoff <= 1)) {
    return invalidArgument("'selector.cutoff' must be in (0, 1], got " + std::to_string(o.cutoff));
  }
  if (o.pacer_window == 0) return invalidArgument("'selector.pacer_window' must be at least 1");
  FEDFLEET_RETURN_IF_ERROR(checkNonNegative("pacer_step_s", o.pacer_step_s));
  FEDFLEET_RETURN_IF_ERROR(checkNonNegative("expected_round_s", o.expected_round_s));
  return Status::ok();
}

Result<std::unique_ptr<Selector>> Selector::create(const SelectorOptions& o) {
  FEDFLEET_RETURN_IF_ERROR(validateSelectorOptions(o));
  std::unique_ptr<Selector> s;
  switch (o.kind) {
    case SelectorKind::kUniform:
      s = std::make_unique<UniformSelector>();
      break;
    case SelectorKind::kOort:
      s = std::make_unique<OortSelector>(o);
      break;
    case SelectorKind::kAvailability:
      s = std::make_unique<AvailabilitySelector>(o);
      break;
  }
  return s;
}

// ---- UniformSelector ------------------------------------------------------------------------

std::vector<std::string> UniformSelector::select(const std::vector<std::string>& candidates,
                                                 size_t k, uint32_t, double, std::mt19937_64& rng) {
  std::vector<std::string> out = candidates;
  partialFisherYates(out, k, rng);
  std::sort(out.begin(), out.end());
  return out;
}

std::string UniformSelector::saveState() const { return StateWriter(name()).finish(); }

Status UniformSelector::loadState(std::string_view blob) {
  FEDFLEET_ASSIGN_OR_RETURN(StateReader r, openState(blob, name()));
  return r.atEnd() ? Status::ok() : truncated(name());
}

// ---- OortSelector ---------------------------------------------------------------------------

namespace {
constexpr double kStalenessWeight = 0.1;       // sqrt(0.1 * ln(round) / last_round)
constexpr double kPacerDefaultFraction = 0.1;  // T grows by 10% when pacer_step_s is 0
}  // namespace

OortSelector::OortSelector(const SelectorOptions& o)
    : options_(o), eps_(o.explore_initial), preferred_s_(o.preferred_duration_s) {}

double OortSelector::statisticalUtility(const Record& r) const {
  if (r.n_samples == 0) return 0;
  const double n = static_cast<double>(r.n_samples);
  return n * std::sqrt(r.sum_sq_loss / n);
}

double OortSelector::utilityOf(const Record& r, uint32_t round) const {
  double u = statisticalUtility(r);
  if (preferred_s_ > 0 && r.duration_s > preferred_s_) {
    u *= std::pow(preferred_s_ / r.duration_s, options_.alpha);
  }
  if (round > 1) {
    const double last = std::max<uint32_t>(r.last_round, 1);
    u += std::sqrt(kStalenessWeight * std::log(static_cast<double>(round)) / last);
  }
  return u;
}

double OortSelector::utility(const std::string& client, uint32_t round) const {
  auto it = records_.find(client);
  return it == records_.end() ? -1 : utilityOf(it->second, round);
}

void OortSelector::initPreferredDuration() {
  if (preferred_s_ > 0 || records_.empty()) return;
  std::vector<double> d;
  d.reserve(records_.size());
  for (const auto& [id, r] : records_) d.push_back(r.duration_s);
  // Lower median: an element of the set whatever the iteration order of records_.
  const size_t mid = (d.size() - 1) / 2;
  std::nth_element(d.begin(), d.begin() + static_cast<std::ptrdiff_t>(mid), d.end());
  preferred_s_ = d[mid];
}

void OortSelector::feedback(const ParticipationFeedback& f) {
  Record& r = records_[f.client];
  if (f.round < r.last_round) return;  // older than what we know
  r.last_round = f.round;
  r.duration_s = nonNegativeOrZero(f.duration_s);
  if (f.completed) {
    r.n_samples = f.n_samples;
    r.sum_sq_loss = nonNegativeOrZero(f.sum_sq_loss);
  }
}

std::vector<std::string> OortSelector::select(const std::vector<std::string>& candidates, size_t k,
                                              uint32_t round, double, std::mt19937_64& rng) {
  k = std::min(k, candidates.size());
  if (k == 0) return {};
  initPreferredDuration();

  struct Tried {
    size_t index;  // into candidates
    double utility;
    double statistical;
  };
  std::vector<Tried> tried;
  std::vector<size_t> never_tried;
  for (size_t i = 0; i < candidates.size(); ++i) {
    auto it = records_.find(candidates[i]);
    if (it == records_.end()) {
      never_tried.push_back(i);
    } else {
      tried.push_back({i, utilityOf(it->second, round), statisticalUtility(it->second)});
    }
  }

  // Step 4: slots.
  const auto exploit_target =
      static_cast<size_t>(std::floor((1.0 - eps_) * static_cast<double>(k) + 1e-9));
  size_t n_explore = std::min(k - std::min(exploit_target, k), never_tried.size());
  const size_t n_exploit = std::min(k - n_explore, tried.size());
  n_explore = std::min(k - n_exploit, never_tried.size());

  std::vector<size_t> picked;
  picked.reserve(k);
  double exploited_statistical = 0;

  // Step 5, exploit.
  if (n_exploit > 0) {
    auto better = [](const Tried& a, const Tried& b) {
      return a.utility != b.utility ? a.utility > b.utility : a.index < b.index;
    };
    std::vector<Tried> ranked = tried;
    std::nth_element(ranked.begin(), ranked.begin() + static_cast<std::ptrdiff_t>(n_exploit - 1),
                     ranked.end(), better);
    const double floor_utility = options_.cutoff * ranked[n_exploit - 1].utility;

    struct Keyed {
      double key;   // log(u) / U: the largest keys are a successive sample proportional to U
      size_t slot;  // into tried
    };
    std::vector<Keyed> pool;
    for (size_t j = 0; j < tried.size(); ++j) {
      if (tried[j].utility < floor_utility) continue;
      const double u = unitOpenClosed(rng);
      const double key = tried[j].utility > 0 ? std::log(u) / tried[j].utility
                                              : -std::numeric_limits<double>::infinity();
      pool.push_back({key, j});
    }
    keepFirst(pool, n_exploit, [](const Keyed& a, const Keyed& b) {
      return a.key != b.key ? a.key > b.key : a.slot < b.slot;
    });
    for (const Keyed& p : pool) {
      picked.push_back(tried[p.slot].index);
      exploited_statistical += tried[p.slot].statistical;
    }
  }

  // Step 5, explore.
  if (n_explore > 0) {
    if (speed_hint_) {
      std::vector<std::pair<double, size_t>> by_speed;  // (expected duration, index)
      by_speed.reserve(never_tried.size());
      for (size_t i : never_tried) {
        const double d = speed_hint_(candidates[i]);
        by_speed.emplace_back(
            std::isfinite(d) && d >= 0 ? d : std::numeric_limits<double>::infinity(), i);
      }
      keepFirst(by_speed, n_explore, std::less<>());
      for (const auto& [d, i] : by_speed) picked.push_back(i);
    } else {
      partialFisherYates(never_tried, n_explore, rng);
      picked.insert(picked.end(), never_tried.begin(), never_tried.end());
    }
  }

  // Step 6.
  eps_ = std::max(eps_ * options_.explore_decay, options_.explore_min);
  ++selections_;
  const size_t w = options_.pacer_window;
  pacer_history_.push_back(exploited_statistical);
  if (pacer_history_.size() > 2 * w) pacer_history_.erase(pacer_history_.begin());
  if (pacer_history_.size() == 2 * w && selections_ % w == 0 && preferred_s_ > 0) {
    double previous = 0, last = 0;
    for (size_t i = 0; i < w; ++i) previous += pacer_history_[i];
    for (size_t i = w; i < 2 * w; ++i) last += pacer_history_[i];
    if (!(last > previous)) {
      preferred_s_ +=
          options_.pacer_step_s > 0 ? options_.pacer_step_s : kPacerDefaultFraction * preferred_s_;
    }
  }
  return idsOf(candidates, picked);
}

std::string OortSelector::saveState() const {
  StateWriter w(name());
  w.putDouble(eps_);
  w.putDouble(preferred_s_);
  w.putVarint(selections_);
  w.putVarint(pacer_history_.size());
  for (double h : pacer_history_) w.putDouble(h);
  std::vector<const std::pair<const std::string, Record>*> sorted;
  sorted.reserve(records_.size());
  for (const auto& entry : records_) sorted.push_back(&entry);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->first < b->first; });
  w.putVarint(sorted.size());
  for (const auto* entry : sorted) {
    w.putString(entry->first);
    w.putVarint(entry->second.last_round);
    w.putVarint(entry->second.n_samples);
    w.putDouble(entry->second.sum_sq_loss);
    w.putDouble(entry->second.duration_s);
  }
  return std::move(w).finish();
}

Status OortSelector::loadState(std::string_view blob) {
  FEDFLEET_ASSIGN_OR_RETURN(StateReader r, openState(blob, name()));
  double eps, preferred;
  uint64_t selections, n_history, n_records;
  if (!r.getNonNegative(&eps) || eps > 1 || !r.getNonNegative(&preferred) ||
      !r.getVarint(&selections) || !r.getCount(&n_history, 8)) {
    return truncated(name());
  }
  std::vector<double> history(n_history);
  for (double& h : history) {
    if (!r.getNonNegative(&h)) return truncated(name());
  }
  // Saved with a longer pacer window: keep what this one looks at.
  const size_t keep = 2 * static_cast<size_t>(options_.pacer_window);
  if (history.size() > keep) history.erase(history.begin(), history.end() - keep);
  if (!r.getCount(&n_records, 1 + 1 + 1 + 8 + 8)) return truncated(name());
  std::unordered_map<std::string, Record> records;
  records.reserve(n_records);
  for (uint64_t i = 0; i < n_records; ++i) {
    std::string id;
    Record rec;
    if (!r.getString(&id) || !r.getU32(&rec.last_round) || !r.getVarint(&rec.n_samples) ||
        !r.getNonNegative(&rec.sum_sq_loss) || !r.getNonNegative(&rec.duration_s) ||
        !records.emplace(std::move(id), rec).second) {
      return truncated(name());
    }
  }
  if (!r.atEnd()) return truncated(name());
  eps_ = eps;
  preferred_s_ = preferred;
  selections_ = selections;
  pacer_history_ = std::move(history);
  records_ = std::move(records);
  return Status::ok();
}

// ---- AvailabilitySelector -------------------------------------------------------------------

namespace {
constexpr double kDurationEwmaWeight = 0.2;
}  // namespace

AvailabilitySelector::AvailabilitySelector(const SelectorOptions& o) : options_(o) {}

double AvailabilitySelector::requiredOnlineSeconds() const {
  return options_.expected_round_s > 0 ? options_.expected_round_s : mean_duration_s_;
}

void AvailabilitySelector::feedback(const ParticipationFeedback& f) {
  if (!f.completed) {
    uint32_t& last = last_failure_[f.client];
    last = std::max(last, std::max<uint32_t>(f.round, 1));
    return;
  }
  auto it = last_failure_.find(f.client);
  if (it != last_failure_.end() && it->second <= f.round) last_failure_.erase(it);
  const double d = nonNegativeOrZero(f.duration_s);
  mean_duration_s_ = mean_duration_s_ == 0
                         ? d
                         : (1 - kDurationEwmaWeight) * mean_duration_s_ + kDurationEwmaWeight * d;
}

std::vector<std::string> AvailabilitySelector::select(const std::vector<std::string>& candidates,
                                                      size_t k, uint32_t round, double now,
                                                      std::mt19937_64& rng) {
  k = std::min(k, candidates.size());
  if (k == 0) return {};
  const double required = requiredOnlineSeconds();

  std::vector<size_t> preferred;
  struct Fallback {
    double priority;  // higher first
    size_t index;
  };
  std::vector<Fallback> rest;
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (hint_) {
      double online = hint_(candidates[i], now);
      if (!(std::isfinite(online) && online >= 0)) online = -1;
      if (online >= required) {
        preferred.push_back(i);
      } else {
        rest.push_back({online, i});
      }
    } else {
      auto it = last_failure_.find(candidates[i]);
      const bool recent = it != last_failure_.end() && round > it->second &&
                          round - it->second <= options_.recent_failure_rounds;
      if (recent) {
        rest.push_back({-static_cast<double>(it->second), i});
      } else {
        preferred.push_back(i);
      }
    }
  }

  if (preferred.size() >= k) {
    partialFisherYates(preferred, k, rng);
    return idsOf(candidates, preferred);
  }
  // Too few: all preferred, then the best of the rest; ties broken by a random draw each.
  struct Ranked {
    double priority;
    uint64_t tie;
    size_t index;
  };
  std::vector<Ranked> ranked;
  ranked.reserve(rest.size());
  for (const Fallback& f : rest) ranked.push_back({f.priority, rng(), f.index});
  keepFirst(ranked, k - preferred.size(), [](const Ranked& a, const Ranked& b) {
    if (a.priority != b.priority) return a.priority > b.priority;
    return a.tie != b.tie ? a.tie < b.tie : a.index < b.index;
  });
  for (const Ranked& r : ranked) preferred.push_back(r.index);
  return idsOf(candidates, preferred);
}

std::string AvailabilitySelector::saveState() const {
  StateWriter w(name());
  w.putDouble(mean_duration_s_);
  std::vector<std::pair<std::string, uint32_t>> sorted(last_failure_.begin(), last_failure_.end());
  std::sort(sorted.begin(), sorted.end());
  w.putVarint(sorted.size());
  for (const auto& [id, round] : sorted) {
    w.putString(id);
    w.putVarint(round);
  }
  return std::move(w).finish();
}

Status AvailabilitySelector::loadState(std::string_view blob) {
  FEDFLEET_ASSIGN_OR_RETURN(StateReader r, openState(blob, name()));
  double mean;
  uint64_t n;
  if (!r.getNonNegative(&mean) || !r.getCount(&n, 2)) return truncated(name());
  std::unordered_map<std::string, uint32_t> failures;
  failures.reserve(n);
  for (uint64_t i = 0; i < n; ++i) {
    std::string id;
    uint32_t round;
    if (!r.getString(&id) || !r.getU32(&round) || !failures.emplace(std::move(id), round).second) {
      return truncated(name());
    }
  }
  if (!r.atEnd()) return truncated(name());
  mean_duration_s_ = mean;
  last_failure_ = std::move(failures);
  return Status::ok();
}

}  // namespace fedfleet::engine
