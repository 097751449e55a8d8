// splitmix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number generators", 2014):
// a stateless 64-bit mixer, for seeded values derived from a counter (dither seeds of upload
// chunks, the load client's fake updates). Not for anything a peer must not guess
// (common/crypto/random.h).
#pragma once

#include <cstdint>

namespace fedfleet {

inline uint64_t splitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace fedfleet
