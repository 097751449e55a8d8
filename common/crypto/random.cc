#include "common/crypto/random.h"

#include <openssl/rand.h>

#include <cstring>

#include "common/check.h"

namespace fedfleet::crypto {

uint64_t randomToken() {
  uint64_t t = 0;
  while (t == 0) {
    unsigned char bytes[sizeof(t)];
    FEDFLEET_CHECK(RAND_bytes(bytes, sizeof(bytes)) == 1);
    std::memcpy(&t, bytes, sizeof(t));
  }
  return t;
}

}  // namespace fedfleet::crypto
