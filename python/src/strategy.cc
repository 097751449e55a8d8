#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "engine/aggregator.h"
#include "python/src/bindings.h"

namespace fedfleet::python {
namespace {

// What a Python exception says, bounded (it ends up in the history's events).
std::string pythonError(const py::error_already_set& e) {
  std::string what = e.what();
  constexpr size_t kMax = 2000;
  if (what.size() > kMax) what = what.substr(0, kMax) + " ... (cut)";
  return what;
}

// aggregation.method = "custom": a fedfleet.Strategy of the user's, called by the engine on the
// simulator's or the coordinator's thread with the GIL taken only for the call. It receives
// the updates the engine accepted (every check, bound and clip already applied), buffered
// until the round settles (K x P floats held: the memory of median and trimmed_mean without
// spilling), or one at a time through the strategy's accumulate() when it defines one. With
// secure aggregation (`secure`) it holds nothing: the engine hands it the unmasked sum of the
// survivors' weighted updates, which the strategy receives as one update (their weighted mean).
class PythonAggregator : public engine::Aggregator {
 public:
  PythonAggregator(std::shared_ptr<HeldObject> holder, uint64_t n_params, bool secure)
      : Aggregator(engine::AggregatorKind::kCustom, n_params),
        holder_(std::move(holder)),
        secure_(secure) {
    py::gil_scoped_acquire gil;
    module_ = py::module_::import("fedfleet.strategy");
    results_ = py::list();
  }
  ~PythonAggregator() override {
    py::gil_scoped_acquire gil;
    results_ = py::object();
    module_ = py::object();
  }

  bool buffersUpdates() const override { return !secure_; }

  // configure_fit: per-client settings for the round (fedfleet/strategy.py checks them).
  void roundStarting(uint32_t round, const std::vector<std::string>& clients) override {
    py::gil_scoped_acquire gil;
    settings_.clear();
    configure_failure_.clear();
    try {
      py::object got = module_.attr("_configure")(holder_->object, round, clients);
      for (const auto& [client, keys] : got.cast<py::dict>()) {
        Settings& s = settings_[client.cast<std::string>()];
        for (const auto& [key, value] : keys.cast<py::dict>()) {
          const auto k = key.cast<std::string>();
          if (k == "epochs") s.epochs = value.cast<uint32_t>();
          if (k == "max_steps") s.max_steps = value.cast<uint32_t>();
          if (k == "batch_size") s.batch_size = value.cast<uint32_t>();
          if (k == "lr") s.lr = value.cast<float>();
          if (k == "momentum") s.momentum = value.cast<float>();
          if (k == "weight_decay") s.weight_decay = value.cast<float>();
          if (k == "prox_mu") s.prox_mu = value.cast<float>();
        }
      }
    } catch (const py::error_already_set& e) {
      settings_.clear();
      configure_failure_ = "the strategy's configure_fit raised " + pythonError(e);
    } catch (const py::cast_error& e) {
      settings_.clear();
      configure_failure_ = std::string(
                               "the strategy's configure_fit returned settings of the "
                               "wrong type: ") +
                           e.what();
    }
  }

  void configureTask(const std::string& client, wire::HyperParams& hp) override {
    auto it = settings_.find(client);
    if (it == settings_.end()) return;
    const Settings& s = it->second;
    if (s.epochs) hp.epochs = *s.epochs;
    if (s.max_steps) hp.max_steps = *s.max_steps;
    if (s.batch_size) hp.batch_size = *s.batch_size;
    if (s.lr) hp.lr = *s.lr;
    if (s.momentum) hp.momentum = *s.momentum;
    if (s.weight_decay) hp.weight_decay = *s.weight_decay;
    if (s.prox_mu) hp.prox_mu = *s.prox_mu;
  }

  // aggregate_evaluate: the round's federated evaluation from the clients' reports.
  Status aggregateEvaluation(uint32_t round, const std::vector<engine::EvaluationReport>& reports,
                             engine::RoundEvaluation& evaluation) override {
    py::gil_scoped_acquire gil;
    try {
      py::list results;
      for (const auto& r : reports) {
        py::dict metrics;
        for (const auto& [name, v] : r.metrics) metrics[py::str(name)] = v;
        results.append(py::make_tuple(
            r.client, r.samples, r.loss,
            r.accuracy ? py::object(py::float_(*r.accuracy)) : py::object(py::none()), metrics));
      }
      py::object got = module_.attr("_evaluate")(holder_->object, round, results);
      if (got.is_none()) return Status::ok();
      auto t = got.cast<py::tuple>();
      engine::RoundEvaluation out;
      out.loss = t[0].cast<double>();
      if (!t[1].is_none()) out.accuracy = t[1].cast<double>();
      for (const auto& item : t[2].cast<py::list>()) {
        auto pair = item.cast<py::tuple>();
        out.metrics.emplace_back(pair[0].cast<std::string>(), pair[1].cast<double>());
      }
      evaluation = std::move(out);
      return Status::ok();
    } catch (const py::error_already_set& e) {
      return invalidArgument("the strategy's aggregate_evaluate raised " + pythonError(e));
    } catch (const py::cast_error& e) {
      return invalidArgument(std::string("the strategy's aggregate_evaluate returned no "
                                         "(loss, metrics): ") +
                             e.what());
    }
  }

  Status buffer(const float* update, size_t n, const engine::BufferedUpdate& facts) override {
    py::gil_scoped_acquire gil;
    try {
      py::array_t<float> values = arrayOf(update, n);
      module_.attr("_receive")(holder_->object, results_, std::string(facts.client), facts.samples,
                               facts.steps, facts.weight, values);
      return Status::ok();
    } catch (const py::error_already_set& e) {
      return invalidArgument("the strategy's accumulate raised " + pythonError(e));
    }
  }

  bool pseudoGradient(float* sum, const engine::RoundTotals& totals,
                      std::string* failure) override {
    if (!configure_failure_.empty()) {
      *failure = configure_failure_;
      return false;
    }
    py::gil_scoped_acquire gil;
    try {
      if (secure_) {  // the round's only update: the survivors' weighted mean
        if (!(totals.weight > 0)) {
          *failure = "secure aggregation: the unmasked sum has no weight";
          return false;
        }
        std::vector<float> mean(sum, sum + n_params_);
        for (float& v : mean) v = static_cast<float>(v / totals.weight);
        module_.attr("_receive")(holder_->object, results_, std::string(kSecureSum),
                                 static_cast<double>(totals.completed), 0, totals.weight,
                                 arrayOf(mean.data(), mean.size()));
      }
      py::object g = module_.attr("_aggregate")(holder_->object, totals.round, results_,
                                                static_cast<uint64_t>(n_params_));
      auto values = g.cast<py::array_t<float, py::array::c_style | py::array::forcecast>>();
      if (static_cast<uint64_t>(values.size()) != n_params_) {
        *failure = "the strategy's aggregate_fit returned " + std::to_string(values.size()) +
                   " values for a model of " + std::to_string(n_params_);
        return false;
      }
      std::memcpy(sum, values.data(), n_params_ * sizeof(float));
      return true;
    } catch (const py::error_already_set& e) {
      *failure = "the strategy's aggregate_fit raised " + pythonError(e);
      return false;
    } catch (const py::cast_error& e) {
      *failure = std::string("the strategy's aggregate_fit returned no float array: ") + e.what();
      return false;
    }
  }

  void clearRound() override {
    py::gil_scoped_acquire gil;
    results_ = py::list();
  }

 private:
  // The client id of the update a strategy gets under secure aggregation.
  static constexpr const char* kSecureSum = "(secure sum)";
  // configure_fit's settings of one client (unset: the config's).
  struct Settings {
    std::optional<uint32_t> epochs, max_steps, batch_size;
    std::optional<float> lr, momentum, weight_decay, prox_mu;
  };

  std::shared_ptr<HeldObject> holder_;
  const bool secure_;
  std::map<std::string, Settings> settings_;  // this round's, by client id
  std::string configure_failure_;             // configure_fit failed this round: why
  // py::object, not py::list: a py::list member would be made (PyList_New) before the
  // constructor takes the GIL.
  py::object module_;
  py::object results_;
};

}  // namespace

engine::AggregatorFactory strategyAggregator(py::object strategy) {
  if (strategy.is_none()) return nullptr;
  auto holder = std::make_shared<HeldObject>(std::move(strategy));
  return [holder](uint64_t n_params, bool secure) -> std::unique_ptr<engine::Aggregator> {
    return std::make_unique<PythonAggregator>(holder, n_params, secure);
  };
}

}  // namespace fedfleet::python
