#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstring>
#include <memory>
#include <vector>

#include "python/src/bindings.h"

namespace fedfleet::python {
namespace {

py::dict taskDict(const wire::Task& t) {
  py::dict d;
  d["round"] = t.round;
  d["token"] = t.task_token;
  d["model_name"] = t.model_name;
  d["deadline_s"] = t.deadline_s;
  d["epochs"] = t.hparams.epochs;
  d["max_steps"] = t.hparams.max_steps;
  d["batch_size"] = t.hparams.batch_size;
  d["lr"] = t.hparams.lr;
  d["momentum"] = t.hparams.momentum;
  d["weight_decay"] = t.hparams.weight_decay;
  d["prox_mu"] = t.hparams.prox_mu;
  d["seed"] = t.hparams.seed;
  return d;
}

}  // namespace

py::array_t<float> arrayOf(const float* values, size_t n) {
  auto* copy = new std::vector<float>(values, values + n);
  py::capsule owner(copy, [](void* p) { delete static_cast<std::vector<float>*>(p); });
  return py::array_t<float>({static_cast<py::ssize_t>(n)}, {sizeof(float)}, copy->data(), owner);
}

client::ClientRuntimeOptions::CustomTraining clientTraining(py::object client) {
  auto holder = std::make_shared<HeldObject>(std::move(client));
  return [holder](
             const wire::Task& task, const model::Layout& layout, const std::vector<float>& start,
             const std::atomic<bool>& stop) -> Result<client::ClientRuntimeOptions::CustomUpdate> {
    py::gil_scoped_acquire gil;
    try {
      py::list names, shapes, offsets;
      for (const auto& t : layout.tensors) {
        names.append(t.name);
        shapes.append(py::tuple(py::cast(t.shape)));
        offsets.append(t.offset);
      }
      py::tuple r = py::module_::import("fedfleet.client")
                        .attr("_fit")(holder->object, arrayOf(start.data(), start.size()), names,
                                      shapes, offsets, taskDict(task));
      auto delta = r[0].cast<py::array_t<float, py::array::c_style | py::array::forcecast>>();
      client::ClientRuntimeOptions::CustomUpdate u;
      u.delta.assign(delta.data(), delta.data() + delta.size());
      u.samples = r[1].cast<uint64_t>();
      u.steps = r[2].cast<uint64_t>();
      u.mean_loss = r[3].cast<double>();
      if (stop.load()) return unavailable("the coordinator gave up on the task");
      return u;
    } catch (const py::error_already_set& e) {
      return internalError(std::string("fit raised ") + e.what());
    } catch (const py::cast_error& e) {
      return invalidArgument(std::string("fit returned something else than a FitResult: ") +
                             e.what());
    }
  };
}

}  // namespace fedfleet::python
