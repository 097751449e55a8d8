// Gaussian noise drawn from a keyed AES-CTR stream (common/crypto/keyed_stream.h): the
// Box-Muller transform of pairs of uniform doubles in (0, 1). The same key and stream id give the
// same noise; clients, who lack the key, cannot predict it.
//
// Known limitation: noise in floating point is not exactly the Gaussian the accountant assumes
// (the low-order bits of the noised values carry a little information about the values before
// the noise; Mironov, CCS 2012, showed this for Laplace noise). The accountant's guarantee is
// that of the ideal mechanism.
#pragma once

#include <cstddef>

#include "common/crypto/keyed_stream.h"

namespace fedfleet::privacy {

class GaussianStream {
 public:
  explicit GaussianStream(crypto::KeyedStream stream) : stream_(std::move(stream)) {}
  // A standard normal draw.
  double next();
  // values[i] += stddev * next(), for i in [0, n), in order.
  void addTo(float* values, size_t n, double stddev);

 private:
  crypto::KeyedStream stream_;
  bool has_spare_ = false;
  double spare_ = 0;
};

}  // namespace fedfleet::privacy
