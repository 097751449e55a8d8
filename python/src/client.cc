#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstring>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "common/model/batch.h"
#include "python/src/bindings.h"

namespace fedfleet::python {
namespace {

// The keys of fedfleet.client.Task: `h` a task's wire::HyperParams or a simulator job's
// client::TrainOptions, both local SGD settings.
py::dict taskDict(uint64_t round, const wire::LocalSgd& h) {
  py::dict d;
  d["round"] = round;
  d["epochs"] = h.epochs;
  d["max_steps"] = h.max_steps;
  d["batch_size"] = h.batch_size;
  d["lr"] = h.lr;
  d["momentum"] = h.momentum;
  d["weight_decay"] = h.weight_decay;
  d["prox_mu"] = h.prox_mu;
  d["seed"] = h.seed;
  d["optimizer"] = wire::optimizerName(h.optimizer);
  return d;
}

py::dict taskDict(const wire::Task& t) {
  py::dict d = taskDict(t.round, t.hparams);
  d["token"] = t.task_token;
  d["model_name"] = t.model_name;
  d["deadline_s"] = t.deadline_s;
  d["fed_eval"] = t.fed_eval;
  return d;
}

// The model's layout as the lists fedfleet.client's helpers take.
py::tuple layoutLists(const model::Layout& layout) {
  py::list names, shapes, offsets;
  for (const auto& t : layout.tensors) {
    names.append(t.name);
    shapes.append(py::tuple(py::cast(t.shape)));
    offsets.append(t.offset);
  }
  return py::make_tuple(names, shapes, offsets);
}

// A numpy array over a tensor's memory, the tensor kept alive by the array.
py::array arrayOver(const at::Tensor& t) {
  auto* held = new at::Tensor(t.contiguous());
  py::capsule owner(held, [](void* p) { delete static_cast<at::Tensor*>(p); });
  std::vector<py::ssize_t> shape(held->sizes().begin(), held->sizes().end());
  if (held->scalar_type() == at::kFloat) {
    return py::array_t<float>(shape, held->data_ptr<float>(), owner);
  }
  return py::array_t<int64_t>(shape, held->data_ptr<int64_t>(), owner);
}

// The delta, samples, steps and loss of fedfleet.client's (delta, samples, steps, loss,
// evaluation).
void takeFit(const py::tuple& r, std::vector<float>& delta, uint64_t& samples, uint64_t& steps,
             double& mean_loss) {
  auto d = r[0].cast<py::array_t<float, py::array::c_style | py::array::forcecast>>();
  delta.assign(d.data(), d.data() + d.size());
  samples = r[1].cast<uint64_t>();
  steps = r[2].cast<uint64_t>();
  mean_loss = r[3].cast<double>();
}

// The evaluation of the same tuple: (samples, loss, accuracy or None, [(name, value)]) or None.
std::optional<client::ServedEvaluation> takeEvaluation(const py::tuple& r) {
  if (r.size() < 5 || r[4].is_none()) return std::nullopt;
  auto e = r[4].cast<py::tuple>();
  client::ServedEvaluation out;
  out.n = e[0].cast<uint64_t>();
  out.loss = e[1].cast<double>();
  if (!e[2].is_none()) out.accuracy = e[2].cast<double>();
  for (const auto& item : e[3].cast<py::list>()) {
    auto pair = item.cast<py::tuple>();
    out.metrics.emplace_back(pair[0].cast<std::string>(), pair[1].cast<double>());
  }
  return out;
}

// SCAFFOLD's c and c_k as arrays (None, None when the task is not SCAFFOLD's).
std::pair<py::object, py::object> controlArrays(const client::ScaffoldControls& s) {
  if (s.c == nullptr || s.ck == nullptr) return {py::none(), py::none()};
  return {arrayOf(s.c->data(), s.c->size()), arrayOf(s.ck->data(), s.ck->size())};
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
             const client::ScaffoldControls& scaffold,
             const std::atomic<bool>& stop) -> Result<client::ClientRuntimeOptions::CustomUpdate> {
    py::gil_scoped_acquire gil;
    try {
      auto [c, ck] = controlArrays(scaffold);
      py::tuple r = py::module_::import("fedfleet.client")
                        .attr("_fit")(holder->object, arrayOf(start.data(), start.size()),
                                      layoutLists(layout), taskDict(task), c, ck);
      client::ClientRuntimeOptions::CustomUpdate u;
      takeFit(r, u.delta, u.samples, u.steps, u.mean_loss);
      u.evaluation = takeEvaluation(r);
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

sim::CustomTrainer simClientTraining(py::object client_fn) {
  auto holder = std::make_shared<HeldObject>(std::move(client_fn));
  return [holder](const sim::CustomTrainJob& job,
                  const std::atomic<bool>* stop) -> Result<client::TrainResult> {
    const client::TrainOptions& o = *job.options;
    // The shard as the built-in trainer batches it, gathered once (without the GIL).
    auto [x, y] = model::makeBatch(*job.data, job.indices->data(), job.indices->size(),
                                   c10::Device(c10::kCPU));
    if (!x.defined()) return internalError("could not gather a virtual client's shard");
    if (job.data->hasFeatures() && !job.data->sample_shape.empty()) {
      std::vector<int64_t> shape = {x.size(0)};
      shape.insert(shape.end(), job.data->sample_shape.begin(), job.data->sample_shape.end());
      x = x.view(shape);
    }
    py::gil_scoped_acquire gil;
    try {
      py::dict task = taskDict(job.round, o);
      task["token"] = 0;
      task["model_name"] = "";
      task["deadline_s"] = 0.0;
      auto [c, ck] = controlArrays(o.scaffold);
      py::tuple r =
          py::module_::import("fedfleet.client")
              .attr("_sim_fit")(holder->object, job.client,
                                arrayOf(job.start->data(), job.start->size()),
                                layoutLists(*job.layout), task, arrayOver(x), arrayOver(y), c, ck);
      client::TrainResult out;
      uint64_t samples = 0;
      takeFit(r, out.delta, samples, out.steps, out.mean_loss);
      out.n_samples = samples;
      out.stopped_early = stop != nullptr && stop->load();
      return out;
    } catch (const py::error_already_set& e) {
      return internalError("client " + std::to_string(job.client) + ": fit raised " + e.what());
    } catch (const py::cast_error& e) {
      return invalidArgument(std::string("fit returned something else than a FitResult: ") +
                             e.what());
    }
  };
}

void bindClient(py::module_& m) {
  py::class_<client::PassOrder>(m, "PassOrder",
                                "The built-in trainer's order of a shard's samples, pass by pass.")
      .def(py::init([](uint64_t seed, size_t m) { return client::PassOrder(seed, m); }),
           py::arg("seed"), py::arg("m"))
      .def(
          "next",
          [](client::PassOrder& o) {
            const std::vector<int64_t>& order = o.next();
            return py::array_t<int64_t>(static_cast<py::ssize_t>(order.size()), order.data());
          },
          "The next pass's permutation of 0..m-1 (int64).");
}

}  // namespace fedfleet::python
