// Counter-based randomness for the simulator: a value drawn from (seed, a, b) by hashing, so a
// million clients' profiles need no stored state and do not depend on the order they are asked
// for in.
#pragma once

#include <cmath>
#include <cstdint>

namespace fedfleet::sim {

// splitmix64's finaliser over the three inputs.
inline uint64_t mix(uint64_t seed, uint64_t a, uint64_t b) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * (a + 1) + 0xbf58476d1ce4e5b9ull * (b + 1);
  for (int i = 0; i < 2; ++i) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
  }
  return z;
}

// Uniform in [0, 1) from the top 53 bits.
inline double unitInterval(uint64_t h) { return static_cast<double>(h >> 11) * 0x1.0p-53; }

// Standard normal by Box-Muller from one hash (two 26-bit uniforms would be coarse: use two
// derived hashes).
inline double standardNormal(uint64_t h) {
  const double u1 = (static_cast<double>(mix(h, 11, 0) >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
  const double u2 = unitInterval(mix(h, 12, 0));
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

}  // namespace fedfleet::sim
