#include "engine/norm_reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/update_weights.h"

namespace fedfleet::engine {
namespace {

template <typename T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

template <typename T>
bool get(std::string_view& in, T* v) {
  if (in.size() < sizeof(T)) return false;
  std::memcpy(v, in.data(), sizeof(T));
  in.remove_prefix(sizeof(T));
  return true;
}

bool usable(double v) { return std::isfinite(v) && v >= 0; }

}  // namespace

NormReference::NormReference(uint32_t window, double growth)
    : window_(std::max<uint32_t>(window, 1)), growth_(std::max(growth, 1.0)) {}

void NormReference::observe(const std::vector<double>& norms) {
  std::vector<double> finite;
  finite.reserve(norms.size());
  for (double n : norms) {
    if (usable(n)) finite.push_back(n);
  }
  if (finite.empty()) return;
  medians_.push_back(lowerMedian(std::move(finite)));
  while (medians_.size() > window_) medians_.pop_front();
  double next = lowerMedian({medians_.begin(), medians_.end()});
  if (reference_) next = std::min(next, growth_ * *reference_);
  reference_ = next;
}

std::string NormReference::save() const {
  std::string out(kNormReferenceMagic);
  put<uint8_t>(out, reference_ ? 1 : 0);
  put<double>(out, reference_.value_or(0));
  put<uint32_t>(out, static_cast<uint32_t>(medians_.size()));
  for (double m : medians_) put<double>(out, m);
  return out;
}

Status NormReference::load(std::string_view in) {
  if (in.substr(0, kNormReferenceMagic.size()) != kNormReferenceMagic) {
    return corrupt("engine state: not a norm reference section");
  }
  in.remove_prefix(kNormReferenceMagic.size());
  uint8_t has = 0;
  double reference = 0;
  uint32_t n = 0;
  if (!get(in, &has) || !get(in, &reference) || !get(in, &n) || has > 1 || !usable(reference) ||
      in.size() != uint64_t{n} * sizeof(double)) {
    return corrupt("engine state: bad norm reference section");
  }
  std::deque<double> medians;
  for (uint32_t i = 0; i < n; ++i) {
    double m = 0;
    get(in, &m);
    if (!usable(m)) return corrupt("engine state: bad norm reference section");
    medians.push_back(m);
  }
  while (medians.size() > window_) medians.pop_front();
  medians_ = std::move(medians);
  reference_ = has ? std::optional<double>(reference) : std::nullopt;
  return Status::ok();
}

}  // namespace fedfleet::engine
