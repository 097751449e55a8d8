#include "common/model/model.h"

#include <ATen/CPUGeneratorImpl.h>
#include <dlfcn.h>
#include <torch/cuda.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <sstream>

#include "common/check.h"

namespace fedfleet::model {
namespace {

namespace nn = torch::nn;

// A built-in network: a named Sequential, so parameter names read "conv1.weight".
class BuiltinModel final : public Model {
 public:
  BuiltinModel(std::string name, nn::Sequential net)
      : name_(std::move(name)), net_(std::move(net)) {}

  at::Tensor forward(const at::Tensor& x) override { return net_->forward(x); }
  std::vector<at::Tensor> parameters() override { return net_->parameters(); }
  std::vector<std::string> parameterNames() override { return net_->named_parameters().keys(); }
  std::vector<at::Tensor> buffers() override {
    std::vector<at::Tensor> out;
    for (const auto& b : net_->named_buffers()) {
      if (b.value().is_floating_point()) out.push_back(b.value());
    }
    return out;
  }
  std::vector<std::string> bufferNames() override {
    std::vector<std::string> out;
    for (const auto& b : net_->named_buffers()) {
      if (b.value().is_floating_point()) out.push_back(b.key());
    }
    return out;
  }
  void train(bool on) override { net_->train(on); }
  bool isTraining() override { return net_->is_training(); }
  void to(const c10::Device& device) override { net_->to(device); }
  std::string name() const override { return name_; }
  Result<std::string> exportBytes() override {
    try {
      c10::Dict<std::string, at::Tensor> state;
      for (const auto& p : net_->named_parameters()) {
        state.insert(p.key(), p.value().detach().to(torch::kCPU).clone());
      }
      for (const auto& b : net_->named_buffers()) {
        state.insert(b.key(), b.value().detach().to(torch::kCPU).clone());
      }
      const std::vector<char> bytes = torch::pickle_save(state);
      return std::string(bytes.begin(), bytes.end());
    } catch (const c10::Error& e) {
      return internalError("writing the state_dict of model '" + name_ +
                           "': " + e.what_without_backtrace());
    }
  }

  // PyTorch's default init for Linear and Conv2d (kaiming_uniform with a = sqrt(5), and the
  // bias rule) is uniform in +-1/sqrt(fan_in) for weight and bias alike; redrawn here from a
  // local generator so that the weights do not depend on the global one (which the module
  // constructors draw from, under its own lock).
  void initialise(uint64_t seed) {
    torch::NoGradGuard no_grad;
    at::Generator gen = at::detail::createCPUGenerator(seed);
    double bound = 0;
    for (auto& p : net_->parameters()) {
      if (p.dim() >= 2) bound = 1.0 / std::sqrt(static_cast<double>(p.numel() / p.size(0)));
      FEDFLEET_CHECK_MSG(bound > 0, "a bias before its weight");
      p.uniform_(-bound, bound, gen);
    }
  }

 private:
  std::string name_;
  nn::Sequential net_;
};

// The network `name` for `shape` (already checked for a sane sample shape and classes); a null
// Sequential for an unknown name.
nn::Sequential buildNet(const std::string& name, const InputShape& shape) {
  int64_t in = 1;
  for (int64_t d : shape.sample) in *= d;
  const int64_t classes = shape.classes;
  using nn::Conv2dOptions;
  if (name == "logreg") {
    return nn::Sequential({{"flatten", nn::Flatten()}, {"fc", nn::Linear(in, classes)}});
  }
  if (name == "mlp") {
    return nn::Sequential({{"flatten", nn::Flatten()},
                           {"fc1", nn::Linear(in, 200)},
                           {"relu1", nn::ReLU()},
                           {"fc2", nn::Linear(200, 200)},
                           {"relu2", nn::ReLU()},
                           {"fc3", nn::Linear(200, classes)}});
  }
  if (name == "cnn") {  // the CNN of McMahan et al. (FedAvg), 'same' padding
    return nn::Sequential({{"conv1", nn::Conv2d(Conv2dOptions(1, 32, 5).padding(2))},
                           {"relu1", nn::ReLU()},
                           {"pool1", nn::MaxPool2d(2)},
                           {"conv2", nn::Conv2d(Conv2dOptions(32, 64, 5).padding(2))},
                           {"relu2", nn::ReLU()},
                           {"pool2", nn::MaxPool2d(2)},
                           {"flatten", nn::Flatten()},
                           {"fc1", nn::Linear(7 * 7 * 64, 512)},
                           {"relu3", nn::ReLU()},
                           {"fc2", nn::Linear(512, classes)}});
  }
  if (name == "lenet") {  // LeNet-5 with ReLU; padding 2 keeps 28x28 -> 5x5x16 = 400 features
    return nn::Sequential({{"conv1", nn::Conv2d(Conv2dOptions(1, 6, 5).padding(2))},
                           {"relu1", nn::ReLU()},
                           {"pool1", nn::MaxPool2d(2)},
                           {"conv2", nn::Conv2d(Conv2dOptions(6, 16, 5))},
                           {"relu2", nn::ReLU()},
                           {"pool2", nn::MaxPool2d(2)},
                           {"flatten", nn::Flatten()},
                           {"fc1", nn::Linear(400, 120)},
                           {"relu3", nn::ReLU()},
                           {"fc2", nn::Linear(120, 84)},
                           {"relu4", nn::ReLU()},
                           {"fc3", nn::Linear(84, classes)}});
  }
  return nullptr;
}

// A TorchScript module exported from Python (examples/models/export_torchscript.py).
class TorchScriptModel final : public Model {
 public:
  explicit TorchScriptModel(torch::jit::script::Module module) : module_(std::move(module)) {}

  at::Tensor forward(const at::Tensor& x) override { return module_.forward({x}).toTensor(); }
  std::vector<at::Tensor> parameters() override {
    std::vector<at::Tensor> out;
    for (const auto& p : module_.parameters()) out.push_back(p);
    return out;
  }
  std::vector<std::string> parameterNames() override {
    std::vector<std::string> out;
    for (const auto& np : module_.named_parameters()) out.push_back(np.name);
    return out;
  }
  std::vector<at::Tensor> buffers() override {
    std::vector<at::Tensor> out;
    for (const auto& nb : module_.named_buffers()) {
      if (nb.value.is_floating_point()) out.push_back(nb.value);
    }
    return out;
  }
  std::vector<std::string> bufferNames() override {
    std::vector<std::string> out;
    for (const auto& nb : module_.named_buffers()) {
      if (nb.value.is_floating_point()) out.push_back(nb.name);
    }
    return out;
  }
  bool hasMethod(const std::string& name) override { return module_.find_method(name).has_value(); }
  at::Tensor callLoss(const at::Tensor& output, const at::Tensor& target) override {
    const c10::IValue v = module_.get_method("loss")({output, target});
    TORCH_CHECK(v.isTensor(), "the module's loss(output, target) returned a ", v.tagKind(),
                ", not a tensor");
    return v.toTensor();
  }
  std::vector<std::pair<std::string, at::Tensor>> callMetrics(const at::Tensor& output,
                                                              const at::Tensor& target) override {
    const c10::IValue v = module_.get_method("metrics")({output, target});
    TORCH_CHECK(v.isGenericDict(), "the module's metrics(output, target) returned a ", v.tagKind(),
                ", not a Dict[str, Tensor]");
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (const auto& entry : v.toGenericDict()) {
      TORCH_CHECK(entry.key().isString() && entry.value().isTensor(),
                  "the module's metrics(output, target) must return a Dict[str, Tensor]");
      const at::Tensor t = entry.value().toTensor();
      TORCH_CHECK(t.numel() == 1, "metric '", entry.key().toStringRef(), "' has ", t.numel(),
                  " values; each metric is one number (the batch's sum)");
      out.emplace_back(entry.key().toStringRef(), t.reshape({}));
    }
    std::sort(out.begin(), out.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    return out;
  }
  void train(bool on) override { module_.train(on); }
  bool isTraining() override { return module_.is_training(); }
  void to(const c10::Device& device) override { module_.to(device); }
  std::string name() const override { return "torchscript"; }
  Result<std::string> exportBytes() override {
    try {
      std::ostringstream out;
      module_.save(out);
      return std::move(out).str();
    } catch (const c10::Error& e) {
      return internalError(std::string("saving the TorchScript module: ") +
                           e.what_without_backtrace());
    }
  }

 private:
  torch::jit::script::Module module_;
};

Result<std::unique_ptr<Model>> loadTorchScript(const std::string& path) {
  if (path.empty()) return invalidArgument("model 'torchscript' needs a TorchScript file path");
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return notFound("TorchScript model file not found: " + path);
  }
  torch::jit::script::Module module;
  try {
    module = torch::jit::load(path, torch::kCPU);
  } catch (const c10::Error& e) {
    return invalidArgument("cannot load TorchScript model " + path + ": " +
                           e.what_without_backtrace());
  } catch (const std::exception& e) {
    return invalidArgument("cannot load TorchScript model " + path + ": " + e.what());
  }
  if (!module.find_method("forward")) {
    return invalidArgument("TorchScript model " + path + " has no forward method");
  }
  auto model = std::make_unique<TorchScriptModel>(std::move(module));
  if (model->parameters().empty()) {
    return invalidArgument("TorchScript model " + path + " has no parameters to train");
  }
  return std::unique_ptr<Model>(std::move(model));
}

std::string shapeString(const std::vector<int64_t>& sample) {
  std::string out = "{";
  for (size_t i = 0; i < sample.size(); ++i) out += (i ? ", " : "") + std::to_string(sample[i]);
  return out + "}";
}

// The shape rules of the built-in models (see createModel).
Status checkShape(const std::string& name, const InputShape& shape) {
  constexpr int64_t kMaxInputs = int64_t{1} << 31;
  if (shape.sample.empty()) return invalidArgument("model '" + name + "': empty sample shape");
  int64_t in = 1;
  for (int64_t d : shape.sample) {
    if (d < 1) {
      return invalidArgument("model '" + name + "': sample shape " + shapeString(shape.sample) +
                             " has a dimension < 1");
    }
    if (in > kMaxInputs / d) {
      return invalidArgument("model '" + name + "': sample shape " + shapeString(shape.sample) +
                             " has more than 2^31 values");
    }
    in *= d;
  }
  if (shape.classes < 1) {
    return invalidArgument("model '" + name + "': outputs (classes) must be >= 1, got " +
                           std::to_string(shape.classes));
  }
  if ((name == "cnn" || name == "lenet") && shape.sample != std::vector<int64_t>{1, 28, 28}) {
    return invalidArgument("model '" + name + "' takes 1x28x28 images, not sample shape " +
                           shapeString(shape.sample) + " (use logreg or mlp)");
  }
  return Status::ok();
}

std::string joinedBuiltinNames() {
  std::string out;
  for (const auto& n : builtinModelNames()) out += (out.empty() ? "" : ", ") + n;
  return out + ", torchscript";
}

// The CUDA driver's name for a device, asked through libcuda.so.1 at run time so that this
// library needs neither CUDA headers nor a CUDA build of LibTorch. Empty if unavailable.
std::string cudaDriverDeviceName(int ordinal) {
  using CuInit = int (*)(unsigned);
  using CuDeviceGet = int (*)(int*, int);
  using CuDeviceGetName = int (*)(char*, int, int);
  static void* lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (lib == nullptr) return "";
  auto init = reinterpret_cast<CuInit>(dlsym(lib, "cuInit"));
  auto get = reinterpret_cast<CuDeviceGet>(dlsym(lib, "cuDeviceGet"));
  auto get_name = reinterpret_cast<CuDeviceGetName>(dlsym(lib, "cuDeviceGetName"));
  if (init == nullptr || get == nullptr || get_name == nullptr || init(0) != 0) return "";
  int dev = 0;
  char name[256] = {0};
  if (get(&dev, ordinal) != 0 || get_name(name, sizeof(name) - 1, dev) != 0) return "";
  return name;
}

}  // namespace

at::Tensor Model::callLoss(const at::Tensor&, const at::Tensor&) {
  TORCH_CHECK(false, "model ", name(), " has no loss(output, target) method");
  return {};
}

std::vector<std::pair<std::string, at::Tensor>> Model::callMetrics(const at::Tensor&,
                                                                   const at::Tensor&) {
  TORCH_CHECK(false, "model ", name(), " has no metrics(output, target) method");
  return {};
}

c10::Device Model::device() {
  const auto params = parameters();
  return params.empty() ? c10::Device(c10::kCPU) : params.front().device();
}

std::vector<at::Tensor> Model::stateTensors() {
  std::vector<at::Tensor> out = parameters();
  for (auto& b : buffers()) out.push_back(std::move(b));
  return out;
}

Layout Model::layout() {
  Layout out;
  const auto params = parameters();
  const auto names = parameterNames();
  const auto bufs = buffers();
  const auto buf_names = bufferNames();
  FEDFLEET_CHECK_MSG(params.size() == names.size(), "parameter names do not match parameters");
  FEDFLEET_CHECK_MSG(bufs.size() == buf_names.size(), "buffer names do not match buffers");
  out.tensors.reserve(params.size() + bufs.size());
  const auto add = [&out](const std::string& name, const at::Tensor& t, bool buffer) {
    TensorSpec spec;
    spec.name = name;
    spec.shape = t.sizes().vec();
    spec.numel = static_cast<size_t>(t.numel());
    spec.offset = out.total;
    spec.buffer = buffer;
    out.total += spec.numel;
    out.tensors.push_back(std::move(spec));
  };
  for (size_t i = 0; i < params.size(); ++i) add(names[i], params[i], false);
  for (size_t i = 0; i < bufs.size(); ++i) add(buf_names[i], bufs[i], true);
  return out;
}

size_t Model::numParameters() {
  size_t total = 0;
  for (const auto& p : stateTensors()) total += static_cast<size_t>(p.numel());
  return total;
}

std::vector<float> Model::flatParameters() {
  std::vector<float> out;
  flatParameters(out);
  return out;
}

void Model::flatParameters(std::vector<float>& out) {
  try {
    torch::NoGradGuard no_grad;
    const auto params = stateTensors();
    size_t total = 0;
    bool all_cpu_float = true;
    for (const auto& p : params) {
      total += static_cast<size_t>(p.numel());
      all_cpu_float = all_cpu_float && p.is_cpu() && p.scalar_type() == at::kFloat;
    }
    out.resize(total);
    if (all_cpu_float) {
      size_t offset = 0;
      for (const auto& p : params) {
        const at::Tensor c = p.contiguous();
        std::memcpy(out.data() + offset, c.data_ptr<float>(), c.numel() * sizeof(float));
        offset += static_cast<size_t>(c.numel());
      }
      return;
    }
    // One concatenation on the device, then one transfer.
    std::vector<at::Tensor> flat;
    flat.reserve(params.size());
    for (const auto& p : params) flat.push_back(p.detach().reshape({-1}).to(at::kFloat));
    const at::Tensor all = torch::cat(flat).to(torch::kCPU).contiguous();
    std::memcpy(out.data(), all.data_ptr<float>(), total * sizeof(float));
  } catch (const c10::Error& e) {
    // Copying parameters out cannot fail in a sound process: treat it as a broken invariant.
    FEDFLEET_CHECK_MSG(false, e.what_without_backtrace());
  } catch (const std::exception& e) {
    FEDFLEET_CHECK_MSG(false, e.what());
  }
}

at::Tensor Model::flatParametersOnDevice() {
  try {
    torch::NoGradGuard no_grad;
    const auto params = stateTensors();
    if (params.empty()) return torch::zeros({0}, torch::kFloat);
    std::vector<at::Tensor> flat;
    flat.reserve(params.size());
    for (const auto& p : params) flat.push_back(p.detach().reshape({-1}).to(at::kFloat));
    return torch::cat(flat).contiguous();
  } catch (const c10::Error& e) {
    FEDFLEET_CHECK_MSG(false, e.what_without_backtrace());
  } catch (const std::exception& e) {
    FEDFLEET_CHECK_MSG(false, e.what());
  }
  return {};
}

Status Model::setFlatParameters(const float* data, size_t n) {
  try {
    const auto params = stateTensors();
    size_t total = 0;
    bool all_cpu = true;
    for (const auto& p : params) {
      total += static_cast<size_t>(p.numel());
      all_cpu = all_cpu && p.is_cpu();
    }
    if (n != total) {
      return invalidArgument("setFlatParameters: got " + std::to_string(n) + " values, model '" +
                             name() + "' has " + std::to_string(total));
    }
    torch::NoGradGuard no_grad;
    at::Tensor src =
        torch::from_blob(const_cast<float*>(data), {static_cast<int64_t>(n)}, torch::kFloat);
    if (!all_cpu && !params.empty()) src = src.to(params.front().device());  // one transfer
    int64_t offset = 0;
    for (auto& p : params) {
      const int64_t k = p.numel();
      p.detach().copy_(src.narrow(0, offset, k).view(p.sizes()));
      offset += k;
    }
    return Status::ok();
  } catch (const c10::Error& e) {
    return internalError(std::string("setFlatParameters: ") + e.what_without_backtrace());
  } catch (const std::exception& e) {
    return internalError(std::string("setFlatParameters: ") + e.what());
  }
}

std::string errorCause(const std::string& what) {
  const size_t end = what.find_last_not_of("\n ");
  if (end == std::string::npos) return what;
  const size_t newline = what.rfind('\n', end);
  const size_t start = newline == std::string::npos ? 0 : newline + 1;
  return what.substr(start, end + 1 - start);
}

std::vector<std::string> builtinModelNames() { return {"logreg", "mlp", "cnn", "lenet"}; }

InputShape inputShapeOf(const data::Dataset& ds) {
  InputShape shape;
  if (!ds.sample_shape.empty()) {
    shape.sample.assign(ds.sample_shape.begin(), ds.sample_shape.end());
  } else if (ds.hasFeatures()) {
    shape.sample = {static_cast<int64_t>(ds.feature_dim)};
  } else {
    shape.sample = {1, static_cast<int64_t>(ds.rows), static_cast<int64_t>(ds.cols)};
  }
  shape.classes = ds.hasTargets() ? static_cast<int64_t>(ds.target_dim) : ds.num_classes;
  return shape;
}

Result<std::unique_ptr<Model>> createModel(const std::string& name, uint64_t seed,
                                           const std::string& torchscript_path) {
  return createModel(name, seed, torchscript_path, InputShape());
}

Result<std::unique_ptr<Model>> createModel(const std::string& name, uint64_t seed,
                                           const std::string& torchscript_path,
                                           const InputShape& shape) {
  if (name == "torchscript") return loadTorchScript(torchscript_path);
  const auto builtin = builtinModelNames();
  if (std::find(builtin.begin(), builtin.end(), name) == builtin.end()) {
    return invalidArgument("unknown model '" + name + "' (valid: " + joinedBuiltinNames() + ")");
  }
  FEDFLEET_RETURN_IF_ERROR(checkShape(name, shape));
  try {
    nn::Sequential net = buildNet(name, shape);
    FEDFLEET_CHECK_MSG(!net.is_empty(), "builtinModelNames() names a model buildNet() lacks");
    auto model = std::make_unique<BuiltinModel>(name, std::move(net));
    model->initialise(seed);
    return std::unique_ptr<Model>(std::move(model));
  } catch (const c10::Error& e) {
    return internalError("building model '" + name + "': " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    return internalError("building model '" + name + "': " + e.what());
  }
}

Result<c10::Device> resolveDevice(const std::string& spec) {
  try {
    if (spec == "cpu") return c10::Device(c10::kCPU);
    if (spec == "auto") {
      return torch::cuda::is_available() ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
    }
    if (spec == "cuda" || spec.rfind("cuda:", 0) == 0) {
      int index = 0;
      if (spec != "cuda") {
        const std::string digits = spec.substr(5);
        if (digits.empty() || digits.size() > 3 ||
            digits.find_first_not_of("0123456789") != std::string::npos) {
          return invalidArgument("bad device '" + spec + "' (valid: auto, cpu, cuda, cuda:N)");
        }
        index = std::stoi(digits);
      }
      if (!torch::cuda::is_available()) {
        return unavailable("device '" + spec + "' requested but CUDA is not available" +
                           " (LibTorch built without CUDA, or no GPU/driver)");
      }
      if (index >= static_cast<int>(torch::cuda::device_count())) {
        return unavailable("device '" + spec + "' requested but only " +
                           std::to_string(torch::cuda::device_count()) + " CUDA device(s) exist");
      }
      return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
    }
    return invalidArgument("bad device '" + spec + "' (valid: auto, cpu, cuda, cuda:N)");
  } catch (const c10::Error& e) {
    return internalError("resolving device '" + spec + "': " + e.what_without_backtrace());
  }
}

std::string deviceName(const c10::Device& device) {
  if (device.is_cpu()) return "cpu";
  if (device.is_cuda()) {
    const int index = device.has_index() ? device.index() : 0;
    std::string name = cudaDriverDeviceName(index);
    return name.empty() ? "cuda:" + std::to_string(index) : name;
  }
  return device.str();
}

}  // namespace fedfleet::model
