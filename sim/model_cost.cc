#include "sim/model_cost.h"

namespace fedfleet::sim {

double forwardMacsPerSample(const std::string& model_name, uint64_t num_parameters) {
  if (model_name == "cnn") {
    // conv1 5x5, 1 -> 32 on 28x28 ('same'), pool; conv2 5x5, 32 -> 64 on 14x14, pool;
    // fc 3136 -> 512; fc 512 -> 10.
    return 28.0 * 28 * 32 * 25 + 14.0 * 14 * 64 * 32 * 25 + 3136.0 * 512 + 512.0 * 10;
  }
  if (model_name == "lenet") {
    // conv1 5x5, 1 -> 6 on 28x28 ('same'), pool; conv2 5x5, 6 -> 16 on 14x14 -> 10x10, pool;
    // fc 400 -> 120 -> 84 -> 10.
    return 28.0 * 28 * 6 * 25 + 10.0 * 10 * 16 * 150 + 400.0 * 120 + 120.0 * 84 + 84.0 * 10;
  }
  return static_cast<double>(num_parameters);
}

}  // namespace fedfleet::sim
