// Attack: what an attacking virtual client does to the update it uploads (sim.attackers,
// sim.attack). A testing and benchmark feature, not a model of any real client: it lets a test
// or bench/poisoning.sh run persistent model-poisoning attacks through the coordinator's own
// engine and measure what the norm bound, the quarantine and the robust aggregators leave of
// the model. The attackers are the first round(sim.attackers x sim.clients) virtual clients;
// each replaces or alters the update it trained, every time it uploads, before the client's
// encoder sees it (so compression and error feedback apply to it as to an honest update):
//   constant:V    V in every value (constant:1e20, constant:1e3)
//   scaled:F      the honest update x F
//   signflip:F    the honest update x -F
//   inside_bound  one constant value in every coordinate, with an L2 norm of 0.99 x the norm
//                 bound the coordinator will judge it by (RoundEngine::normBound(), read when the
//                 task is received); before that bound is known (the first round), or with the
//                 bound off, the norm of its own honest update
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "common/status.h"

namespace fedfleet::sim {

struct Attack {
  enum class Kind { kConstant, kScaled, kInsideBound };
  Kind kind = Kind::kConstant;
  double value = 0;  // kConstant: the value; kScaled: the factor (signflip: negative)
};

// Parses sim.attack; kInvalidArgument naming the key and the forms it takes.
Result<Attack> parseAttack(const std::string& spec);

// The attack on `delta`[0, n): the update an attacking client uploads instead. `bound` is the
// norm bound it aims inside (kInsideBound only; none: unknown).
void applyAttack(const Attack& attack, std::optional<double> bound, float* delta, size_t n);

}  // namespace fedfleet::sim
