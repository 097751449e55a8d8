// How much work one training sample is, per model: the simulator turns a device's speed into
// seconds with it, and the CPU benchmark turns measured time into achieved FLOP/s.
#pragma once

#include <cstdint>
#include <string>

namespace fedfleet::sim {

// Multiply-adds of one forward pass. Built-in convolutional models are counted layer by layer
// (FedAvg CNN: 12.27 M; LeNet: 0.42 M); for fully connected models ("logreg", "mlp") and
// TorchScript modules it is the parameter count (one multiply-add per weight, biases included:
// exact up to the biases for fully connected layers, a lower bound for convolutions).
double forwardMacsPerSample(const std::string& model_name, uint64_t num_parameters);

// Training FLOPs of one sample: forward + backward = 3 x forward multiply-adds x 2 FLOPs.
inline double trainFlopsPerSample(const std::string& model_name, uint64_t num_parameters) {
  return 6.0 * forwardMacsPerSample(model_name, num_parameters);
}

}  // namespace fedfleet::sim
