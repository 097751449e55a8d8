// Models: a trainable network with a fixed, ordered parameter list, and its view as one flat
// fp32 buffer.
//
// The flat buffer is what travels: the coordinator aggregates flat vectors, codecs compress
// them, checkpoints store them. Layout() fixes the order (parameters() order) and the offset of
// every tensor in it. Built-in models ("logreg", "mlp", "cnn", "lenet") and TorchScript modules
// exported from Python implement the same interface. Built-in models are built for an input
// shape (InputShape): Fashion-MNIST's 1x28x28 images by default, or feature vectors.
//
// This header includes only the light ATen/c10 headers (at::Tensor is torch::Tensor, c10::Device
// is torch::Device), so files that merely pass models around compile quickly; code that builds
// tensors includes <torch/torch.h> itself.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/data/dataset.h"
#include "common/status.h"
#include "common/wire/messages.h"

namespace fedfleet::model {

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  size_t numel = 0;
  size_t offset = 0;    // in elements, within the flat buffer
  bool buffer = false;  // a floating-point buffer (BatchNorm statistics), not a parameter
};

struct Layout {
  std::vector<TensorSpec> tensors;
  size_t total = 0;  // elements in the flat buffer
};

// The training objective, train.loss (common/model/loss.h says what each computes): the
// wire's enum, as the optimiser's is, so that a task names it without a translation table.
using LossKind = wire::Loss;

// A trainable network. Not thread-safe: one thread uses a Model at a time.
class Model {
 public:
  virtual ~Model() = default;

  // x: [N, sample...] float on the model's device ([N, 1, 28, 28] for Fashion-MNIST, [N, d] for
  // feature vectors) -> logits [N, classes]. May throw c10::Error (callers such as Trainer and
  // evaluate() catch it).
  virtual at::Tensor forward(const at::Tensor& x) = 0;
  // The trainable parameters, the same tensors in the same order on every call.
  virtual std::vector<at::Tensor> parameters() = 0;
  // Names matching parameters() one to one ("fc1.weight", ...).
  virtual std::vector<std::string> parameterNames() = 0;
  // The floating-point buffers (BatchNorm's running_mean and running_var), the same tensors in
  // the same order on every call, and their names ("bn1.running_mean", ...). They travel after
  // the parameters in the flat buffer, so they are set, averaged and checkpointed as parameters
  // are, but no optimiser touches them: training in train mode updates them as the module says.
  // Integer buffers (BatchNorm's num_batches_tracked) are not among them: every copy of the
  // model keeps its own count (it only matters to a BatchNorm with momentum None).
  virtual std::vector<at::Tensor> buffers() { return {}; }
  virtual std::vector<std::string> bufferNames() { return {}; }
  // The loss the model trains with and is evaluated by (train.loss; default cross-entropy). It
  // travels with the model so that every trainer and evaluator of it agrees.
  LossKind loss() const { return loss_; }
  void setLoss(LossKind loss) { loss_ = loss; }
  // A TorchScript module's own methods beside forward (train.loss = "module" and custom
  // metrics): `loss(output, target) -> Tensor` and `metrics(output, target) -> Dict[str, Tensor]`
  // (each value a sum over the batch's samples). Built-in models have neither. The calls may
  // throw c10::Error; a value of `metrics` that is not a one-element tensor throws too.
  virtual bool hasMethod(const std::string& /*name*/) { return false; }
  virtual at::Tensor callLoss(const at::Tensor& output, const at::Tensor& target);
  virtual std::vector<std::pair<std::string, at::Tensor>> callMetrics(const at::Tensor& output,
                                                                      const at::Tensor& target);
  virtual void train(bool on) = 0;
  virtual bool isTraining() = 0;
  // Moves the parameters (in place: tensors from parameters() stay valid handles) to `device`.
  virtual void to(const c10::Device& device) = 0;
  // "logreg", "mlp", "cnn", "lenet" or "torchscript".
  virtual std::string name() const = 0;
  // The model with its current weights as the bytes of a file PyTorch loads: a TorchScript
  // module (torch.jit.load) for "torchscript", the state_dict (torch.load: a dict of
  // parameterNames() to CPU tensors) for a built-in model. kInternal if LibTorch fails.
  virtual Result<std::string> exportBytes() = 0;

  // The device of the first parameter (CPU for a model without parameters).
  c10::Device device();
  // The tensors of the flat buffer: parameters(), then buffers().
  std::vector<at::Tensor> stateTensors();
  // The names, shapes and offsets of stateTensors() in the flat buffer (parameters first, each
  // buffer marked as one).
  Layout layout();
  // Number of elements in the flat buffer (layout().total), buffers included.
  size_t numParameters();
  // Copies all parameters and buffers (from any device, any floating dtype) into one fp32 CPU
  // buffer in layout order. A LibTorch failure here (device lost) is a broken invariant: it
  // aborts.
  std::vector<float> flatParameters();
  // As flatParameters(), into `out` (resized to the total).
  void flatParameters(std::vector<float>& out);
  // The same values as one contiguous fp32 tensor on the parameters' device (a copy; no
  // autograd history). Aborts as flatParameters() on a LibTorch failure.
  at::Tensor flatParametersOnDevice();
  // Copies `n` floats into the parameters and buffers (on their device), without recording
  // autograd.
  // kInvalidArgument if n != layout().total; kInternal if LibTorch fails.
  Status setFlatParameters(const float* data, size_t n);
  Status setFlatParameters(const std::vector<float>& flat) {
    return setFlatParameters(flat.data(), flat.size());
  }

 private:
  LossKind loss_ = LossKind::kCrossEntropy;
};

// The line of a LibTorch error message that says what went wrong: the last non-empty one (a
// TorchScript interpreter error ends its two tracebacks with "RuntimeError: ..." or
// "builtins.ValueError: ..."); the message itself when it is one line.
std::string errorCause(const std::string& what);

// {"logreg", "mlp", "cnn", "lenet"}.
std::vector<std::string> builtinModelNames();

// The shape of one input sample (without the batch dimension) and the number of classes a
// built-in model is built for. The default is Fashion-MNIST's.
struct InputShape {
  std::vector<int64_t> sample = {1, 28, 28};
  int64_t classes = 10;
};

// The input shape of samples of `ds` as common/model/batch.h batches them: ds.sample_shape where
// set, else {feature_dim} for a feature-vector set, else {1, rows, cols}; classes =
// ds.num_classes (a regression set: its target_dim, the model's outputs).
InputShape inputShapeOf(const data::Dataset& ds);

// Builds a model on the CPU. Built-in models get PyTorch's default initialisation (every weight
// and bias uniform in +-1/sqrt(fan_in)) drawn from a local generator seeded with `seed`: the
// same seed gives the same weights on any thread, whatever the state of LibTorch's global
// generator (torch::manual_seed is neither needed nor consulted). Safe to call concurrently.
// name == "torchscript" loads `torchscript_path` with torch::jit::load (weights from the file;
// `seed` is unused).
// Failures: unknown name -> kInvalidArgument listing the valid names; torchscript file missing
// -> kNotFound with the path; not a loadable TorchScript module, no forward method or no
// parameters -> kInvalidArgument with the path.
// Equivalent to createModel(name, seed, torchscript_path, InputShape()): Fashion-MNIST's shape.
Result<std::unique_ptr<Model>> createModel(const std::string& name, uint64_t seed,
                                           const std::string& torchscript_path = "");

// As above, for inputs of `shape`: "logreg" (Linear in -> classes) and "mlp" (in -> 200 -> 200 ->
// classes, ReLU) take in = the product of shape.sample's dimensions (the input is flattened);
// "cnn" and "lenet" take only shape.sample == {1, 28, 28} (any classes). With the default shape
// every model is exactly the one the three-argument overload builds (same seed, same weights).
// TorchScript modules carry their own shape: `shape` is not consulted for them.
// Failures, in addition: an empty sample shape, a dimension < 1, more than 2^31 input values, or
// classes < 1 (one output: a regression) -> kInvalidArgument; "cnn"/"lenet" with another sample
// shape -> kInvalidArgument
// naming the shape they accept.
Result<std::unique_ptr<Model>> createModel(const std::string& name, uint64_t seed,
                                           const std::string& torchscript_path,
                                           const InputShape& shape);

// "auto": cuda if torch::cuda::is_available() else cpu; "cpu"; "cuda" or "cuda:N".
// Failures: cuda (or device N) not available -> kUnavailable; anything else -> kInvalidArgument.
Result<c10::Device> resolveDevice(const std::string& spec);

// "cpu", or for CUDA the device's product name as the driver reports it (e.g. "NVIDIA H200"),
// falling back to "cuda:N" when the driver cannot be asked.
std::string deviceName(const c10::Device& device);

}  // namespace fedfleet::model
