// FuzzInput: a libFuzzer input read as a few leading fields and then the rest, as the harnesses
// in fuzz/ lay out theirs. Reading past the end never fails: missing bytes read as zero and
// take() returns what is left, so every input, however short, is a valid layout.
// FUZZ_CHECK(cond, what): a contract the code under test broke; prints and aborts, which
// libFuzzer records as a crash with the input that caused it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

#define FUZZ_CHECK(cond, what)                                                                     \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      std::fprintf(stderr, "fuzz: contract broken at %s:%d: %s (%s)\n", __FILE__, __LINE__, #cond, \
                   (what));                                                                        \
      std::abort();                                                                                \
    }                                                                                              \
  } while (0)

namespace fedfleet::fuzz {

class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size) : rest_(reinterpret_cast<const char*>(data), size) {}

  uint8_t u8() {
    if (rest_.empty()) return 0;
    const auto v = static_cast<uint8_t>(rest_[0]);
    rest_.remove_prefix(1);
    return v;
  }

  // Little endian; missing bytes are zero.
  uint32_t u32() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t{u8()} << (8 * i);
    return v;
  }

  float f32() {
    const uint32_t bits = u32();
    float v;
    std::memcpy(&v, &bits, sizeof(v));
    return v;
  }

  // The next min(n, left) bytes.
  std::string_view take(size_t n) {
    const std::string_view head = rest_.substr(0, n);
    rest_.remove_prefix(head.size());
    return head;
  }

  size_t left() const { return rest_.size(); }
  std::string_view rest() { return take(rest_.size()); }

 private:
  std::string_view rest_;
};

}  // namespace fedfleet::fuzz
