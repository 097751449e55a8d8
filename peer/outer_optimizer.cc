#include "peer/outer_optimizer.h"

#include "common/check.h"

namespace fedfleet::peer {

NesterovOuter::NesterovOuter(size_t n, double lr, double momentum)
    : lr_(lr), momentum_(momentum), v_(n, 0.0f) {}

void NesterovOuter::step(std::vector<float>& x, const std::vector<float>& d) {
  FEDFLEET_CHECK(x.size() == v_.size() && d.size() == v_.size());
  const float m = static_cast<float>(momentum_), lr = static_cast<float>(lr_);
  for (size_t i = 0; i < x.size(); ++i) {
    v_[i] = m * v_[i] + d[i];
    x[i] -= lr * (d[i] + m * v_[i]);
  }
}

}  // namespace fedfleet::peer
