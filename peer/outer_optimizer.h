// DiLoCo's outer step (Douillard et al., 2023) for the local algorithm (peer/peer_engine.h):
// after H inner steps the peers all-reduce the pseudo-gradient d = x_prev - x_i and every peer
// applies, to its copy of x_prev, Nesterov momentum as torch.optim.SGD(nesterov=True) does:
//   v = m v + mean(d);   x = x_prev - lr (mean(d) + m v).
// lr 0.7 and m 0.9 are DiLoCo's; lr 1 and m 0 make x the plain average of the peers' models
// (FedAvg's periodic averaging).
#pragma once

#include <cstddef>
#include <vector>

namespace fedfleet::peer {

class NesterovOuter {
 public:
  NesterovOuter(size_t n, double lr, double momentum);
  // x -= lr (d + m v) after v = m v + d; x and d of the size given at construction (checked).
  void step(std::vector<float>& x, const std::vector<float>& mean_pseudo_gradient);
  const std::vector<float>& velocity() const { return v_; }

 private:
  double lr_, momentum_;
  std::vector<float> v_;
};

}  // namespace fedfleet::peer
