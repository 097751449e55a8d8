// `fedfleet model info` and `fedfleet model export`: a run's model out of its history.
//
// info prints the run's model (name, input, classes), its checkpoints (round, test accuracy, the
// best marked) and the layout of its flat buffer (each tensor's name, shape, elements, offset).
// export turns one checkpoint (--round R, --best: the highest test accuracy, or --last, the
// default) into a file: a TorchScript model as the same module with the trained parameters
// (torch.jit.load), a built-in model as a state_dict (torch.load; the keys of the Python
// definitions in examples/models/fedfleet_models.py), or with --format flat the raw float32
// buffer and, beside it as FILE.json, its layout (common/model/export.h).
//
// Both return the process exit status: 2 for bad usage (no such file, run, round or format; an
// output that cannot be written), 1 when the history cannot be read, its checkpoint is damaged,
// or the TorchScript file is gone or is not the run's model (--module names where it is now).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace fedfleet::cli {

struct ModelArgs {
  std::string what = "info";  // info, export
  std::string db = "fedfleet.db";
  int64_t run = 0;  // 0: the latest run
  // export: the checkpoint (at most one of round, best; neither: the latest).
  std::optional<uint32_t> round;
  bool best = false;
  std::string output;
  std::string format = "auto";  // auto (torchscript or state_dict), torchscript, state_dict, flat
  std::string module;           // TorchScript file to fill (default: the one the run loaded)
  bool json = false;            // info: print the description as JSON
};

int runModelCommand(const ModelArgs& args);

}  // namespace fedfleet::cli
