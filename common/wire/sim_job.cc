#include "common/wire/sim_job.h"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>
#include <kj/io.h>

#include <climits>
#include <cstring>
#include <exception>
#include <new>

#include "common/check.h"
#include "common/wire/flat_message.h"
#include "common/wire/local_sgd_fields.h"
#include "common/wire/sim_job.capnp.h"

namespace fedfleet::wire {
namespace {

capnp::Data::Reader asData(const std::string& s) {
  return capnp::Data::Reader(reinterpret_cast<const kj::byte*>(s.data()), s.size());
}
std::string bytesOf(capnp::Data::Reader d) {
  return std::string(reinterpret_cast<const char*>(d.begin()), d.size());
}
std::shared_ptr<const std::string> sharedBytesOf(capnp::Data::Reader d) {
  return std::make_shared<const std::string>(bytesOf(d));
}
const std::string& orEmpty(const std::shared_ptr<const std::string>& s) {
  static const std::string kEmpty;
  return s ? *s : kEmpty;
}

template <typename Builder>
void setFloats(Builder list, const std::vector<float>& v) {
  for (size_t i = 0; i < v.size(); ++i) list.set(static_cast<unsigned>(i), v[i]);
}
std::vector<float> floatsOf(capnp::List<float>::Reader list) {  // bounded by the caller
  std::vector<float> out(list.size());
  for (unsigned i = 0; i < list.size(); ++i) out[i] = list[i];
  return out;
}

// ---- writing ---------------------------------------------------------------------------------

void fillRecipe(schema::SimModelRecipe::Builder b, const SimModelRecipe& r) {
  b.setName(r.name);
  b.setPath(r.path);
  b.setSeed(r.seed);
  auto shape = b.initSampleShape(static_cast<unsigned>(r.sample_shape.size()));
  for (size_t i = 0; i < r.sample_shape.size(); ++i) {
    shape.set(static_cast<unsigned>(i), r.sample_shape[i]);
  }
  b.setClasses(r.classes);
  b.setLoss(static_cast<uint8_t>(r.loss));
  b.setDevice(r.device);
}

void fillStatus(schema::SimStatus::Builder b, const Status& s) {
  b.setCode(static_cast<uint16_t>(s.code()));
  b.setMessage(s.message());
}

template <typename Builder>
void fillMetrics(Builder list, const std::vector<std::pair<std::string, double>>& m) {
  for (size_t i = 0; i < m.size(); ++i) {
    list[static_cast<unsigned>(i)].setName(m[i].first);
    list[static_cast<unsigned>(i)].setValue(m[i].second);
  }
}

void fillEvaluation(schema::SimEvaluation::Builder b, const SimEvaluation& e) {
  fillStatus(b.initStatus(), e.status);
  b.setN(e.n);
  b.setLoss(e.loss);
  b.setHasAccuracy(e.accuracy.has_value());
  b.setAccuracy(e.accuracy.value_or(0));
  fillMetrics(b.initMetrics(static_cast<unsigned>(e.metrics.size())), e.metrics);
}

void fillTrainJob(schema::SimTrainJob::Builder b, const SimTrainJob& j) {
  b.setClient(j.client);
  fillRecipe(b.initRecipe(), j.recipe);
  setLocalSgdNumbers(b, j);
  b.setOptimizer(static_cast<uint8_t>(j.optimizer));
  b.setStart(asData(orEmpty(j.start)));
  b.setScaffold(j.scaffold);
  b.setControlC(asData(orEmpty(j.control_c)));
  setFloats(b.initControlCk(static_cast<unsigned>(j.control_ck.size())), j.control_ck);
  b.setFedEval(j.fed_eval);
  b.setHasServed(j.served != nullptr);
  b.setServed(asData(orEmpty(j.served)));
  b.setPrecision(static_cast<uint8_t>(j.precision));
}

void fillEvalJob(schema::SimEvalJob::Builder b, const SimEvalJob& j) {
  fillRecipe(b.initRecipe(), j.recipe);
  b.setParams(asData(orEmpty(j.params)));
  b.setBegin(j.begin);
  b.setEnd(j.end);
  b.setPiece(j.piece);
}

void fillTrainResult(schema::SimTrainResult::Builder b, const SimTrainResult& r) {
  fillStatus(b.initStatus(), r.status);
  b.setSteps(r.steps);
  b.setStoppedEarly(r.stopped_early);
  b.setMeanLoss(r.mean_loss);
  b.setSumSqLoss(r.sum_sq_loss);
  setFloats(b.initDelta(static_cast<unsigned>(r.delta.size())), r.delta);
  setFloats(b.initControlDelta(static_cast<unsigned>(r.control_delta.size())), r.control_delta);
  b.setHasFedEvaluation(r.fed_evaluation.has_value());
  if (r.fed_evaluation) fillEvaluation(b.initFedEvaluation(), *r.fed_evaluation);
  b.setHasServedEvaluation(r.served_evaluation.has_value());
  if (r.served_evaluation) fillEvaluation(b.initServedEvaluation(), *r.served_evaluation);
  b.setWallSeconds(r.wall_seconds);
}

void fillEvalResult(schema::SimEvalResult::Builder b, const SimEvalResult& r) {
  fillStatus(b.initStatus(), r.status);
  auto pieces = b.initPieces(static_cast<unsigned>(r.pieces.size()));
  for (size_t i = 0; i < r.pieces.size(); ++i) {
    const SimEvalPiece& p = r.pieces[i];
    auto pb = pieces[static_cast<unsigned>(i)];
    pb.setN(p.n);
    pb.setLossSum(p.loss_sum);
    pb.setCorrect(p.correct);
    pb.setHasAccuracy(p.has_accuracy);
    fillMetrics(pb.initMetricSums(static_cast<unsigned>(p.metric_sums.size())), p.metric_sums);
  }
}

template <typename Fill>
std::string serialise(Fill fill) {
  try {
    capnp::MallocMessageBuilder builder(1024, capnp::AllocationStrategy::GROW_HEURISTICALLY);
    fill(builder.initRoot<schema::SimJobEnvelope>());
    return writeFlat(builder);
  } catch (const kj::Exception& e) {
    FEDFLEET_CHECK_MSG(false, e.getDescription().cStr());  // a field over Cap'n Proto's limits
  } catch (const std::exception& e) {
    FEDFLEET_CHECK_MSG(false, e.what());  // out of memory
  }
  return {};
}

// ---- reading ---------------------------------------------------------------------------------

// A list of zero-sized structs (or a primitive list read from one) can claim millions of
// elements in a few bytes, and several pointers may name the same list; Cap'n Proto's traversal
// limit lets through about one element a word. So every list draws on one budget, the bytes
// that carry the message, before anything is built: an honest list of n floats takes 4n of
// them, of n structs at least 8n, and the lists of one message never take more than it has.
class ListBudget {
 public:
  explicit ListBudget(size_t message_bytes) : left_(message_bytes), total_(message_bytes) {}
  Status take(const char* what, size_t n, size_t bytes_each) {
    if (n > left_ / bytes_each) {
      return corrupt(std::string("simulator message: a list of ") + std::to_string(n) + " " + what +
                     " more than its " + std::to_string(total_) + " bytes can hold");
    }
    left_ -= n * bytes_each;
    return Status::ok();
  }

 private:
  size_t left_;
  const size_t total_;
};

Result<SimModelRecipe> readRecipe(schema::SimModelRecipe::Reader r, ListBudget& bound) {
  SimModelRecipe out;
  FEDFLEET_RETURN_IF_ERROR(bound.take("shape dimensions", r.getSampleShape().size(), 8));
  out.name = r.getName();
  out.path = r.getPath();
  out.seed = r.getSeed();
  for (int64_t d : r.getSampleShape()) out.sample_shape.push_back(d);
  out.classes = r.getClasses();
  if (r.getLoss() > static_cast<uint8_t>(Loss::kModule)) {
    return corrupt("simulator job: unknown loss " + std::to_string(r.getLoss()));
  }
  out.loss = static_cast<Loss>(r.getLoss());
  out.device = r.getDevice();
  return out;
}

Status readStatus(schema::SimStatus::Reader r) {
  if (r.getCode() > static_cast<uint16_t>(StatusCode::kInternal)) {
    return corrupt("simulator result: unknown status code " + std::to_string(r.getCode()));
  }
  return Status(static_cast<StatusCode>(r.getCode()), r.getMessage());
}

template <typename Reader>
Result<std::vector<std::pair<std::string, double>>> readMetrics(Reader list, ListBudget& bound) {
  FEDFLEET_RETURN_IF_ERROR(bound.take("metrics", list.size(), 8));
  std::vector<std::pair<std::string, double>> out;
  for (auto m : list) out.emplace_back(m.getName(), m.getValue());
  return out;
}

Result<SimEvaluation> readEvaluation(schema::SimEvaluation::Reader r, ListBudget& bound) {
  SimEvaluation e;
  e.status = readStatus(r.getStatus());
  e.n = r.getN();
  e.loss = r.getLoss();
  if (r.getHasAccuracy()) e.accuracy = r.getAccuracy();
  FEDFLEET_ASSIGN_OR_RETURN(e.metrics, readMetrics(r.getMetrics(), bound));
  return e;
}

Status checkFloatBytes(const char* what, size_t n) {
  if (n % sizeof(float) != 0) {
    return corrupt(std::string("simulator job: ") + what + " of " + std::to_string(n) +
                   " bytes is not a whole number of floats");
  }
  return Status::ok();
}

Result<SimTrainJob> readTrainJob(schema::SimTrainJob::Reader r, ListBudget& bound) {
  SimTrainJob j;
  j.client = r.getClient();
  FEDFLEET_ASSIGN_OR_RETURN(j.recipe, readRecipe(r.getRecipe(), bound));
  getLocalSgdNumbers(r, j);
  if (r.getOptimizer() > static_cast<uint8_t>(Optimizer::kAdamW)) {
    return corrupt("simulator job: unknown optimizer " + std::to_string(r.getOptimizer()));
  }
  j.optimizer = static_cast<Optimizer>(r.getOptimizer());
  j.start = sharedBytesOf(r.getStart());
  FEDFLEET_RETURN_IF_ERROR(checkFloatBytes("start model", j.start->size()));
  j.scaffold = r.getScaffold();
  if (j.scaffold) {
    j.control_c = sharedBytesOf(r.getControlC());
    FEDFLEET_RETURN_IF_ERROR(checkFloatBytes("control variate", j.control_c->size()));
    FEDFLEET_RETURN_IF_ERROR(bound.take("control values", r.getControlCk().size(), 4));
    j.control_ck = floatsOf(r.getControlCk());
  }
  j.fed_eval = r.getFedEval();
  if (r.getHasServed()) {
    j.served = sharedBytesOf(r.getServed());
    FEDFLEET_RETURN_IF_ERROR(checkFloatBytes("served model", j.served->size()));
  }
  if (r.getPrecision() > static_cast<uint8_t>(Precision::kBf16)) {
    return corrupt("simulator job: unknown precision " + std::to_string(r.getPrecision()));
  }
  j.precision = static_cast<Precision>(r.getPrecision());
  return j;
}

Result<SimEvalJob> readEvalJob(schema::SimEvalJob::Reader r, ListBudget& bound) {
  SimEvalJob j;
  FEDFLEET_ASSIGN_OR_RETURN(j.recipe, readRecipe(r.getRecipe(), bound));
  j.params = sharedBytesOf(r.getParams());
  FEDFLEET_RETURN_IF_ERROR(checkFloatBytes("model", j.params->size()));
  j.begin = r.getBegin();
  j.end = r.getEnd();
  j.piece = r.getPiece();
  if (j.end < j.begin || j.piece == 0) {
    return corrupt("simulator job: evaluation of [" + std::to_string(j.begin) + ", " +
                   std::to_string(j.end) + ") in pieces of " + std::to_string(j.piece));
  }
  return j;
}

Result<SimTrainResult> readTrainResult(schema::SimTrainResult::Reader r, ListBudget& bound) {
  SimTrainResult out;
  out.status = readStatus(r.getStatus());
  out.steps = r.getSteps();
  out.stopped_early = r.getStoppedEarly();
  out.mean_loss = r.getMeanLoss();
  out.sum_sq_loss = r.getSumSqLoss();
  FEDFLEET_RETURN_IF_ERROR(bound.take("delta values", r.getDelta().size(), 4));
  FEDFLEET_RETURN_IF_ERROR(bound.take("control values", r.getControlDelta().size(), 4));
  out.delta = floatsOf(r.getDelta());
  out.control_delta = floatsOf(r.getControlDelta());
  if (r.getHasFedEvaluation()) {
    FEDFLEET_ASSIGN_OR_RETURN(out.fed_evaluation, readEvaluation(r.getFedEvaluation(), bound));
  }
  if (r.getHasServedEvaluation()) {
    FEDFLEET_ASSIGN_OR_RETURN(out.served_evaluation,
                              readEvaluation(r.getServedEvaluation(), bound));
  }
  out.wall_seconds = r.getWallSeconds();
  return out;
}

Result<SimEvalResult> readEvalResult(schema::SimEvalResult::Reader r, ListBudget& bound) {
  SimEvalResult out;
  out.status = readStatus(r.getStatus());
  FEDFLEET_RETURN_IF_ERROR(bound.take("evaluation pieces", r.getPieces().size(), 8));
  for (auto p : r.getPieces()) {
    SimEvalPiece piece;
    piece.n = p.getN();
    piece.loss_sum = p.getLossSum();
    piece.correct = p.getCorrect();
    piece.has_accuracy = p.getHasAccuracy();
    FEDFLEET_ASSIGN_OR_RETURN(piece.metric_sums, readMetrics(p.getMetricSums(), bound));
    out.pieces.push_back(std::move(piece));
  }
  return out;
}

}  // namespace

std::string encodeSimJob(const SimJob& job) {
  return serialise([&](schema::SimJobEnvelope::Builder b) {
    if (const auto* t = std::get_if<SimTrainJob>(&job)) {
      fillTrainJob(b.initTrain(), *t);
    } else {
      fillEvalJob(b.initEval(), std::get<SimEvalJob>(job));
    }
  });
}

std::string encodeSimJobResult(const SimJobResult& result) {
  return serialise([&](schema::SimJobEnvelope::Builder b) {
    if (const auto* t = std::get_if<SimTrainResult>(&result)) {
      fillTrainResult(b.initTrainResult(), *t);
    } else {
      fillEvalResult(b.initEvalResult(), std::get<SimEvalResult>(result));
    }
  });
}

Result<SimJob> decodeSimJob(std::string_view bytes, const DecodeLimits& limits) {
  ListBudget bound(bytes.size());
  return readFlat<schema::SimJobEnvelope, SimJob>(
      bytes, limits, "simulator message",
      [&bound](schema::SimJobEnvelope::Reader e) -> Result<SimJob> {
        switch (e.which()) {
          case schema::SimJobEnvelope::TRAIN: {
            FEDFLEET_ASSIGN_OR_RETURN(SimTrainJob j, readTrainJob(e.getTrain(), bound));
            return SimJob(std::move(j));
          }
          case schema::SimJobEnvelope::EVAL: {
            FEDFLEET_ASSIGN_OR_RETURN(SimEvalJob j, readEvalJob(e.getEval(), bound));
            return SimJob(std::move(j));
          }
          default:
            return corrupt("simulator message is not a job");
        }
      });
}

Result<SimJobResult> decodeSimJobResult(std::string_view bytes, const DecodeLimits& limits) {
  ListBudget bound(bytes.size());
  return readFlat<schema::SimJobEnvelope, SimJobResult>(
      bytes, limits, "simulator message",
      [&bound](schema::SimJobEnvelope::Reader e) -> Result<SimJobResult> {
        switch (e.which()) {
          case schema::SimJobEnvelope::TRAIN_RESULT: {
            FEDFLEET_ASSIGN_OR_RETURN(SimTrainResult r, readTrainResult(e.getTrainResult(), bound));
            return SimJobResult(std::move(r));
          }
          case schema::SimJobEnvelope::EVAL_RESULT: {
            FEDFLEET_ASSIGN_OR_RETURN(SimEvalResult r, readEvalResult(e.getEvalResult(), bound));
            return SimJobResult(std::move(r));
          }
          default:
            return corrupt("simulator message is not a job's result");
        }
      });
}

}  // namespace fedfleet::wire
