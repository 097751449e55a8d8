#include <pybind11/numpy.h>

#include <cstring>
#include <memory>
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
// spilling), or one at a time through the strategy's accumulate() when it defines one.
class PythonAggregator : public engine::Aggregator {
 public:
  PythonAggregator(std::shared_ptr<HeldObject> holder, uint64_t n_params)
      : Aggregator(engine::AggregatorKind::kCustom, n_params), holder_(std::move(holder)) {
    py::gil_scoped_acquire gil;
    module_ = py::module_::import("fedfleet.strategy");
    results_ = py::list();
  }
  ~PythonAggregator() override {
    py::gil_scoped_acquire gil;
    results_ = py::object();
    module_ = py::object();
  }

  bool buffersUpdates() const override { return true; }

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
    py::gil_scoped_acquire gil;
    try {
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
  std::shared_ptr<HeldObject> holder_;
  // py::object, not py::list: a py::list member would be made (PyList_New) before the
  // constructor takes the GIL.
  py::object module_;
  py::object results_;
};

}  // namespace

engine::AggregatorFactory strategyAggregator(py::object strategy) {
  if (strategy.is_none()) return nullptr;
  auto holder = std::make_shared<HeldObject>(std::move(strategy));
  return [holder](uint64_t n_params) -> std::unique_ptr<engine::Aggregator> {
    return std::make_unique<PythonAggregator>(holder, n_params);
  };
}

}  // namespace fedfleet::python
