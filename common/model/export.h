// A run's model as the history describes it (runs.model_json) and as a user takes it out: the
// model's name, the input it was built for and the layout of its flat buffer, enough to turn a
// checkpoint's flat buffer back into a model file PyTorch loads (Model::exportBytes).
//
// The description is JSON:
//   {"name": "mlp", "path": "", "input": [1, 28, 28], "classes": 10, "dtype": "float32",
//    "byte_order": "little", "total": 199210,
//    "tensors": [{"name": "fc1.weight", "shape": [200, 784], "offset": 0}, ...]}
// "path" is the TorchScript file the run loaded ("" for a built-in model); offsets and "total"
// count float32 elements of the flat buffer. The same JSON sits beside a flat export
// (`fedfleet model export --format flat`) to say what the raw buffer holds.
#pragma once

#include <memory>
#include <string>

#include "common/model/model.h"
#include "common/status.h"

namespace fedfleet::model {

struct ModelDescription {
  std::string name;  // createModel's name: "logreg", "mlp", "cnn", "lenet", "torchscript"
  std::string path;  // the TorchScript file the run loaded; "" for a built-in model
  InputShape shape;  // the sample shape (without the batch dimension) and classes of the data
  Layout layout;
};

// The description of `model`, built for `shape` (from `path` when it is TorchScript), as JSON.
std::string describeModel(Model& model, const InputShape& shape, const std::string& path);
// `description` as JSON (describeModel's form).
std::string descriptionJson(const ModelDescription& description);

// Parses describeModel's JSON. kCorrupt naming the field that is missing or of the wrong kind,
// or when the offsets do not tile the buffer (each tensor starts where the one before ends, and
// the last ends at "total").
Result<ModelDescription> parseModelDescription(const std::string& json);

// Builds the described model, a built-in one from its name and input shape, a TorchScript one
// from `module_path` (the description's path when empty), and checks that its layout is the
// description's, tensor by tensor: kFailedPrecondition naming the first tensor whose name or
// shape differs (the file is not the one the run trained). createModel's failures otherwise.
Result<std::unique_ptr<Model>> rebuildModel(const ModelDescription& description,
                                            const std::string& module_path = "");

// Sets `model`'s weights from a file `fedfleet model export` wrote (model.init): a state_dict
// (torch.load's format; also one saved in Python as a plain dict with
// torch.save(dict(net.state_dict()), path): LibTorch 1.13 cannot read an OrderedDict), a
// TorchScript module (its parameters), or a flat export (`path` and `path`.json). Every tensor
// of the model must be in the file under its name with its shape: kInvalidArgument naming the
// file and the first tensor missing, of another shape, or left over; kNotFound for no file;
// kInvalidArgument for a file of none of these formats.
Status loadWeights(Model& model, const std::string& path);

// "[200, 784]" for messages and `fedfleet model info`.
std::string shapeText(const std::vector<int64_t>& shape);

}  // namespace fedfleet::model
