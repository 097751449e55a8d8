// A TorchScript module with a batch norm, built in C++ as Python's torch.jit.script would build
// it (no Python needed): BatchNorm1d(features) without affine weights (momentum 0.1, eps 1e-5),
// then Linear(features -> classes) with every weight 0.1 and bias 0. Parameters w, b; buffers
// running_mean (0), running_var (1) and num_batches_tracked (an int64 count).
#pragma once

#include <torch/script.h>
#include <torch/torch.h>

#include <string>

namespace fedfleet::testing {

inline std::string writeBatchNormModule(const std::string& path, int64_t features,
                                        int64_t classes) {
  torch::jit::Module m("BatchNormNet");
  m.register_attribute("training", c10::BoolType::get(), true);
  m.register_parameter("w", torch::full({features, classes}, 0.1).requires_grad_(true), false);
  m.register_parameter("b", torch::zeros({classes}).requires_grad_(true), false);
  m.register_buffer("running_mean", torch::zeros({features}));
  m.register_buffer("running_var", torch::ones({features}));
  m.register_buffer("num_batches_tracked", torch::zeros({}, torch::kLong));
  m.define(R"(
def forward(self, x):
    if self.training:
        self.num_batches_tracked += 1
    y = torch.batch_norm(x, None, None, self.running_mean, self.running_var, self.training,
                         0.1, 1e-5, False)
    return y.matmul(self.w) + self.b
)");
  m.save(path);
  return path;
}

}  // namespace fedfleet::testing
