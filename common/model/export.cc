#include "common/model/export.h"

#include <torch/script.h>
#include <torch/serialize.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/atomic_file.h"

namespace fedfleet::model {
namespace {

using json = nlohmann::ordered_json;

Status badField(const std::string& field, const std::string& want) {
  return corrupt("model description: \"" + field + "\" is missing or not " + want);
}

Result<std::vector<int64_t>> dims(const json& j, const std::string& field, bool allow_empty) {
  if (!j.is_array() || (!allow_empty && j.empty())) return badField(field, "a list of sizes");
  std::vector<int64_t> out;
  for (const json& d : j) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0) {
      return badField(field, "a list of sizes >= 0");
    }
    out.push_back(d.get<int64_t>());
  }
  return out;
}

// The file's tensors by name, in whichever of loadWeights' formats it is.
Result<std::map<std::string, at::Tensor>> tensorsOf(const std::string& path) {
  std::map<std::string, at::Tensor> out;
  std::error_code ec;
  if (std::filesystem::exists(path + ".json", ec)) {
    FEDFLEET_ASSIGN_OR_RETURN(std::string text, readWholeFile(path + ".json"));
    FEDFLEET_ASSIGN_OR_RETURN(ModelDescription d, parseModelDescription(text));
    FEDFLEET_ASSIGN_OR_RETURN(std::string bytes, readWholeFile(path));
    if (bytes.size() != d.layout.total * sizeof(float)) {
      return invalidArgument(path + " holds " + std::to_string(bytes.size()) + " bytes, " + path +
                             ".json describes " + std::to_string(d.layout.total) +
                             " float32 values");
    }
    const at::Tensor flat =
        torch::from_blob(bytes.data(), {static_cast<int64_t>(d.layout.total)}, torch::kFloat32)
            .clone();
    for (const TensorSpec& t : d.layout.tensors) {
      out[t.name] = flat.narrow(0, static_cast<int64_t>(t.offset), static_cast<int64_t>(t.numel))
                        .view(t.shape);
    }
    return out;
  }
  FEDFLEET_ASSIGN_OR_RETURN(std::string bytes, readWholeFile(path));
  std::string why;
  try {
    const c10::IValue v = torch::pickle_load(std::vector<char>(bytes.begin(), bytes.end()));
    if (v.isGenericDict()) {
      for (const auto& entry : v.toGenericDict()) {
        if (!entry.key().isString() || !entry.value().isTensor()) {
          return invalidArgument(path +
                                 " holds a dictionary that is not a state_dict (names "
                                 "to tensors)");
        }
        out[entry.key().toStringRef()] = entry.value().toTensor();
      }
      return out;
    }
    why = "it holds a " + v.tagKind() + ", not a state_dict";
  } catch (const c10::Error& e) {
    why = e.what_without_backtrace();
  }
  try {
    std::istringstream in(bytes);
    torch::jit::script::Module module = torch::jit::load(in, torch::kCPU);
    for (const auto& p : module.named_parameters()) out[p.name] = p.value;
    for (const auto& b : module.named_buffers()) out[b.name] = b.value;
    return out;
  } catch (const c10::Error& e) {
    return invalidArgument(
        path + " is neither a state_dict (" + why + ") nor a TorchScript module (" +
        e.what_without_backtrace() + ") nor a flat export (no " + path +
        ".json beside it). A state_dict saved in Python must be a plain dict, "
        "torch.save(dict(net.state_dict()), path): LibTorch cannot read Python's OrderedDict");
  }
}

}  // namespace

Status loadWeights(Model& model, const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return notFound("model.init: no such file " + path);
  }
  auto read = tensorsOf(path);
  if (!read.isOk()) return Status(read.status().code(), "model.init: " + read.status().message());
  auto tensors = std::move(read).value();
  const Layout layout = model.layout();
  std::vector<float> flat(layout.total);
  for (const TensorSpec& t : layout.tensors) {
    auto it = tensors.find(t.name);
    if (it == tensors.end()) {
      return invalidArgument("model.init: " + path + " has no tensor " + t.name + " (model '" +
                             model.name() + "' needs it, " + shapeText(t.shape) + ")");
    }
    const at::Tensor& v = it->second;
    if (v.sizes().vec() != t.shape || !v.is_floating_point()) {
      return invalidArgument("model.init: " + path + " has " + t.name + " as " +
                             shapeText(v.sizes().vec()) + " " + std::string(v.dtype().name()) +
                             ", model '" + model.name() + "' as " + shapeText(t.shape) +
                             " floating point");
    }
    const at::Tensor c = v.detach().to(torch::kCPU, torch::kFloat32).contiguous();
    if (!torch::isfinite(c).all().item<bool>()) {
      return invalidArgument("model.init: " + path + ": tensor " + t.name +
                             " holds a NaN or infinite value");
    }
    std::memcpy(flat.data() + t.offset, c.data_ptr<float>(), t.numel * sizeof(float));
    tensors.erase(it);
  }
  // Integer buffers (BatchNorm's num_batches_tracked) are each copy's own: not weights.
  for (auto it = tensors.begin(); it != tensors.end();) {
    it = it->second.is_floating_point() ? std::next(it) : tensors.erase(it);
  }
  if (!tensors.empty()) {
    return invalidArgument("model.init: " + path + " has tensor " + tensors.begin()->first +
                           ", which model '" + model.name() +
                           "' lacks: it is not a model of this architecture");
  }
  return model.setFlatParameters(flat);
}

std::string shapeText(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

std::string descriptionJson(const ModelDescription& d) {
  json tensors = json::array();
  for (const TensorSpec& t : d.layout.tensors) {
    json entry = {{"name", t.name}, {"shape", t.shape}, {"offset", t.offset}};
    if (t.buffer) entry["buffer"] = true;
    tensors.push_back(std::move(entry));
  }
  const json j = {{"name", d.name},          {"path", d.path},
                  {"input", d.shape.sample}, {"classes", d.shape.classes},
                  {"dtype", "float32"},      {"byte_order", "little"},
                  {"total", d.layout.total}, {"tensors", tensors}};
  return j.dump();
}

std::string describeModel(Model& model, const InputShape& shape, const std::string& path) {
  ModelDescription d;
  d.name = model.name();
  std::error_code ec;
  d.path = d.name == "torchscript" ? std::filesystem::absolute(path, ec).string() : std::string();
  d.shape = shape;
  d.layout = model.layout();
  return descriptionJson(d);
}

Result<ModelDescription> parseModelDescription(const std::string& text) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return corrupt("model description: not a JSON object");
  }
  ModelDescription d;
  auto str = [&j](const char* field, std::string& out) -> Status {
    auto it = j.find(field);
    if (it == j.end() || !it->is_string()) return badField(field, "a string");
    out = it->get<std::string>();
    return Status::ok();
  };
  FEDFLEET_RETURN_IF_ERROR(str("name", d.name));
  FEDFLEET_RETURN_IF_ERROR(str("path", d.path));
  std::string dtype;
  FEDFLEET_RETURN_IF_ERROR(str("dtype", dtype));
  if (dtype != "float32") return badField("dtype", "\"float32\"");
  // A TorchScript model's input may be unknown (a coordinator without data): an empty list.
  FEDFLEET_ASSIGN_OR_RETURN(d.shape.sample,
                            dims(j.value("input", json()), "input", d.name == "torchscript"));
  if (!j.contains("classes") || !j["classes"].is_number_integer()) {
    return badField("classes", "a whole number");
  }
  d.shape.classes = j["classes"].get<int64_t>();
  if (!j.contains("total") || !j["total"].is_number_unsigned()) {
    return badField("total", "a count");
  }
  d.layout.total = j["total"].get<size_t>();
  const json tensors = j.value("tensors", json());
  if (!tensors.is_array() || tensors.empty()) return badField("tensors", "a list of tensors");
  size_t next = 0;
  for (const json& t : tensors) {
    if (!t.is_object() || !t.contains("name") || !t["name"].is_string() || !t.contains("offset") ||
        !t["offset"].is_number_unsigned()) {
      return badField("tensors", "a list of {name, shape, offset}");
    }
    TensorSpec spec;
    spec.name = t["name"].get<std::string>();
    spec.buffer = t.value("buffer", false) == true;
    FEDFLEET_ASSIGN_OR_RETURN(spec.shape,
                              dims(t.value("shape", json()), "tensors." + spec.name + ".shape",
                                   /*allow_empty=*/true));
    spec.numel = 1;
    for (int64_t s : spec.shape) spec.numel *= static_cast<size_t>(s);
    spec.offset = t["offset"].get<size_t>();
    if (spec.offset != next) {
      return corrupt("model description: tensor " + spec.name + " starts at " +
                     std::to_string(spec.offset) + ", not where the one before it ends (" +
                     std::to_string(next) + ")");
    }
    next += spec.numel;
    d.layout.tensors.push_back(std::move(spec));
  }
  if (next != d.layout.total) {
    return corrupt("model description: the tensors hold " + std::to_string(next) +
                   " elements, \"total\" says " + std::to_string(d.layout.total));
  }
  return d;
}

Result<std::unique_ptr<Model>> rebuildModel(const ModelDescription& d,
                                            const std::string& module_path) {
  const std::string path = module_path.empty() ? d.path : module_path;
  FEDFLEET_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, createModel(d.name, 0, path, d.shape));
  const Layout have = model->layout();
  const std::string what =
      d.name == "torchscript" ? "the TorchScript file " + path : "model '" + d.name + "'";
  for (size_t i = 0; i < std::max(have.tensors.size(), d.layout.tensors.size()); ++i) {
    if (i >= have.tensors.size()) {
      return failedPrecondition(what + " lacks tensor " + d.layout.tensors[i].name +
                                " of the run's model: it is not the model the run trained");
    }
    if (i >= d.layout.tensors.size()) {
      return failedPrecondition(what + " has tensor " + have.tensors[i].name +
                                ", which the run's model lacks: it is not the model the run "
                                "trained");
    }
    const TensorSpec& a = have.tensors[i];
    const TensorSpec& b = d.layout.tensors[i];
    if (a.name != b.name || a.shape != b.shape) {
      return failedPrecondition(what + " has " + a.name + " " + shapeText(a.shape) +
                                " where the run's model has " + b.name + " " + shapeText(b.shape) +
                                ": it is not the model the run trained");
    }
  }
  return model;
}

}  // namespace fedfleet::model
