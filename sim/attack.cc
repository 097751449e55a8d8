#include "sim/attack.h"

#include <cmath>
#include <cstdlib>

#include "engine/update_weights.h"

namespace fedfleet::sim {
namespace {

// The number after "prefix:", when `spec` starts with it and the rest is a finite number.
std::optional<double> numberAfter(const std::string& spec, const std::string& prefix) {
  if (spec.rfind(prefix, 0) != 0 || spec.size() == prefix.size()) return std::nullopt;
  const char* text = spec.c_str() + prefix.size();
  char* end = nullptr;
  const double v = std::strtod(text, &end);
  if (end == text || *end != '\0' || !std::isfinite(v)) return std::nullopt;
  return v;
}

}  // namespace

Result<Attack> parseAttack(const std::string& spec) {
  if (spec == "inside_bound") return Attack{Attack::Kind::kInsideBound, 0};
  if (auto v = numberAfter(spec, "constant:")) return Attack{Attack::Kind::kConstant, *v};
  if (auto v = numberAfter(spec, "scaled:")) return Attack{Attack::Kind::kScaled, *v};
  if (auto v = numberAfter(spec, "signflip:")) return Attack{Attack::Kind::kScaled, -*v};
  return invalidArgument("'sim.attack' must be \"constant:V\", \"scaled:F\", \"signflip:F\" (V, F "
                         "finite numbers) or \"inside_bound\", got \"" +
                         spec + "\"");
}

void applyAttack(const Attack& attack, std::optional<double> bound, float* delta, size_t n) {
  if (n == 0) return;
  switch (attack.kind) {
    case Attack::Kind::kConstant:
      for (size_t i = 0; i < n; ++i) delta[i] = static_cast<float>(attack.value);
      return;
    case Attack::Kind::kScaled:
      for (size_t i = 0; i < n; ++i) delta[i] = static_cast<float>(delta[i] * attack.value);
      return;
    case Attack::Kind::kInsideBound: {
      const double norm = bound ? 0.99 * *bound : engine::l2Norm(delta, n);
      const auto v = static_cast<float>(norm / std::sqrt(static_cast<double>(n)));
      for (size_t i = 0; i < n; ++i) delta[i] = v;
      return;
    }
  }
}

}  // namespace fedfleet::sim
