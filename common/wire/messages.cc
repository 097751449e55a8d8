// Cap'n Proto encoding of the plain message structs (common/wire/messages.h).
//
// encode() builds one Envelope (common/wire/fedfleet.capnp) in a first segment sized from the
// message; a large word-aligned bytes field is referenced in place as a segment of its own. It
// then writes the standard unpacked stream framing (segment table + segments) straight into the
// output string, so each byte of a model or payload is copied once. decode() reads the bytes in
// place when they are word aligned (copying them once into a word buffer otherwise), under the
// caller's traversal and nesting limits; every Cap'n Proto exception becomes a kCorrupt Status.
// Bytes fields are copied into std::string once.

#include "common/wire/messages.h"

#include <capnp/message.h>
#include <capnp/orphan.h>
#include <capnp/serialize.h>
#include <kj/exception.h>
#include <kj/io.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <iterator>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <variant>

#include "common/check.h"
#include "common/fednova.h"
#include "common/wire/fedfleet.capnp.h"
#include "common/wire/flat_message.h"
#include "common/wire/local_sgd_fields.h"

namespace fedfleet::wire {
namespace {

bool metricNameOk(const std::string& name) {
  if (name.empty() || name.size() > kMaxMetricName) return false;
  for (char c : name) {
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
          c == '.' || c == '-')) {
      return false;
    }
  }
  return true;
}

template <typename... Ts>
struct Overloaded : Ts... {
  using Ts::operator()...;
};
template <typename... Ts>
Overloaded(Ts...) -> Overloaded<Ts...>;

// ---------------------------------------------------------------------------------------------
// encode

capnp::Text::Reader asText(const std::string& s) { return capnp::Text::Reader(s.data(), s.size()); }

capnp::Data::Reader asData(const std::string& s) {
  return capnp::Data::Reader(reinterpret_cast<const kj::byte*>(s.data()), s.size());
}

// A large bytes field that starts on a word boundary and fills whole words is not copied into
// the builder: it becomes a segment of its own, referencing the caller's string, and is copied
// once, by writeMessage. (A size that is not a multiple of 8 would expose the bytes after the
// string's end, so such fields are copied.)
constexpr size_t kReferenceMinBytes = 64 * 1024;

bool canReference(const std::string& s) {
  return s.size() >= kReferenceMinBytes && s.size() % sizeof(capnp::word) == 0 &&
         reinterpret_cast<uintptr_t>(s.data()) % alignof(capnp::word) == 0;
}

// An orphan that points at `s` in place (see canReference).
template <typename StructBuilder>
capnp::Orphan<capnp::Data> referenceBlob(StructBuilder b, const std::string& s) {
  return capnp::Orphanage::getForMessageContaining(b).referenceExternalData(asData(s));
}

// Words a blob takes in the builder's first segment, rounded up, plus slack for its pointer.
size_t blobWords(const std::string& s) { return canReference(s) ? 2 : (s.size() + 1 + 7) / 8 + 1; }

// An upper bound on the segment words `message` needs, so that it is built in one segment
// (one allocation, no far pointers). Fixed-size parts are covered by the constant.
size_t estimateWords(const Message& message) {
  constexpr size_t kFixedWords = 128;
  return kFixedWords +
         std::visit(Overloaded{
                        [](const Hello& m) {
                          return blobWords(m.client_id) + blobWords(m.public_key) +
                                 blobWords(m.device_name);
                        },
                        [](const Task& m) {
                          return blobWords(m.model_name) + blobWords(m.model_bytes) +
                                 blobWords(m.control_bytes) + blobWords(m.data.dataset) +
                                 blobWords(m.data.scheme) + blobWords(m.codec) +
                                 blobWords(m.served.model) + 16;
                        },
                        [](const Chunk& m) { return blobWords(m.payload); },
                        [](const Summary&) { return size_t{8}; },
                        [](const Cancel& m) { return blobWords(m.reason); },
                        [](const Heartbeat&) { return size_t{0}; },
                        [](const Bye& m) { return blobWords(m.reason); },
                        [](const Error& m) { return blobWords(m.message); },
                        [](const UploadRequest&) { return size_t{0}; },
                        [](const UploadGrant&) { return size_t{0}; },
                        [](const SecAgg& m) {
                          return 16 * (m.adverts.size() + m.shares.size() + m.revealed.size()) +
                                 m.request.survivors.size() + m.request.dropped.size() + 8;
                        },
                    },
                    message);
}

// Enum values go over the wire as their numbers (the schema enums list the same values in the same
// order), so an out-of-range value reaches the receiver, which refuses it.
static_assert(static_cast<uint16_t>(schema::DeviceKind::CPU) ==
              static_cast<uint16_t>(DeviceKind::kCpu));
static_assert(static_cast<uint16_t>(schema::DeviceKind::CUDA) ==
              static_cast<uint16_t>(DeviceKind::kCuda));
static_assert(static_cast<uint16_t>(schema::ErrorCode::MALFORMED) ==
              static_cast<uint16_t>(ErrorCode::kMalformed));
static_assert(static_cast<uint16_t>(schema::ErrorCode::INTERNAL) ==
              static_cast<uint16_t>(ErrorCode::kInternal));
static_assert(static_cast<uint16_t>(schema::Optimizer::ADAMW) ==
              static_cast<uint16_t>(Optimizer::kAdamW));
static_assert(static_cast<uint16_t>(schema::ServedSource::ATTACHED) ==
              static_cast<uint16_t>(ServedSource::kAttached));

schema::DeviceKind toSchema(DeviceKind kind) {
  return static_cast<schema::DeviceKind>(static_cast<uint16_t>(kind));
}

void fill(schema::Hello::Builder b, const Hello& m) {
  b.setClientId(asText(m.client_id));
  b.setPublicKey(asText(m.public_key));
  b.setDeviceKind(toSchema(m.device_kind));
  b.setDeviceName(asText(m.device_name));
  b.setCores(m.cores);
  b.setMemoryBytes(m.memory_bytes);
  b.setDataSize(m.data_size);
  b.setProtocolVersion(m.protocol_version);
  b.setRequestedPartition(m.requested_partition);
  b.setSession(m.session);
  b.setLastCoordinatorSession(m.last_coordinator_session);
}

void fill(schema::Task::Builder b, const Task& m) {
  b.setRunId(m.run_id);
  b.setRound(m.round);
  b.setModelVersion(m.model_version);
  b.setModelName(asText(m.model_name));
  if (canReference(m.model_bytes)) {
    b.adoptModelBytes(referenceBlob(b, m.model_bytes));
  } else {
    b.setModelBytes(asData(m.model_bytes));
  }
  b.setModelSha256(capnp::Data::Reader(m.model_sha256.data(), m.model_sha256.size()));
  auto h = b.initHparams();
  setLocalSgdNumbers(h, m.hparams);
  h.setScaffold(m.hparams.scaffold);
  h.setStopAfterS(m.hparams.stop_after_s);
  h.setOptimizer(static_cast<schema::Optimizer>(static_cast<uint16_t>(m.hparams.optimizer)));
  h.setLoss(static_cast<schema::Loss>(static_cast<uint16_t>(m.hparams.loss)));
  auto d = b.initData();
  d.setDataset(asText(m.data.dataset));
  d.setScheme(asText(m.data.scheme));
  d.setAlpha(m.data.alpha);
  d.setLabelsPerClient(m.data.labels_per_client);
  d.setNumPartitions(m.data.num_partitions);
  d.setIndex(m.data.index);
  d.setSeed(m.data.seed);
  d.setSubset(m.data.subset);
  d.setBlocks(m.data.blocks);
  d.setSkew(m.data.skew);
  d.setShardsPerClient(m.data.shards_per_client);
  b.setDeadlineS(m.deadline_s);
  b.setCodec(asText(m.codec));
  b.setTaskToken(m.task_token);
  b.setChunkBytes(m.chunk_bytes);
  b.setCoordinatorSession(m.coordinator_session);
  b.setFedEval(m.fed_eval);
  if (m.local_dp.on()) {
    auto ld = b.initLocalDp();
    ld.setClip(m.local_dp.clip);
    ld.setNoiseMultiplier(m.local_dp.noise_multiplier);
    ld.setDelta(m.local_dp.delta);
  }
  if (m.secagg.on()) {
    auto sa = b.initSecagg();
    sa.setIndex(m.secagg.index);
    sa.setClients(m.secagg.clients);
    sa.setNeighbours(m.secagg.neighbours);
    sa.setThreshold(m.secagg.threshold);
    sa.setGraphSeed(m.secagg.graph_seed);
    sa.setClipRange(m.secagg.clip_range);
    sa.setQuantRange(m.secagg.quant_range);
    sa.setWeightScale(m.secagg.weight_scale);
    sa.setDpClip(m.secagg.dp_clip);
    sa.setDpNoiseStddev(m.secagg.dp_noise_stddev);
    sa.setFedNova(m.secagg.fednova);
    sa.setFedNovaMomentum(m.secagg.fednova_momentum);
  }
  if (canReference(m.control_bytes)) {
    b.adoptControlBytes(referenceBlob(b, m.control_bytes));
  } else if (!m.control_bytes.empty()) {
    b.setControlBytes(asData(m.control_bytes));
  }
  // The served model's bytes never go in the frame: they follow as part of the model frame.
  if (m.served.source != ServedSource::kNone) {
    auto sv = b.initServed();
    sv.setSource(static_cast<schema::ServedSource>(static_cast<uint16_t>(m.served.source)));
    sv.setBlock(m.served.block);
    sv.setModel(asText(m.served.model));
    sv.setVersion(m.served.version);
    sv.setSha256(capnp::Data::Reader(m.served.sha256.data(), m.served.sha256.size()));
  }
}

void fill(schema::Chunk::Builder b, const Chunk& m) {
  b.setTaskToken(m.task_token);
  b.setOffset(m.offset);  // retiredTensorIndex is left 0 (fedfleet.capnp)
  if (canReference(m.payload)) {
    b.adoptPayload(referenceBlob(b, m.payload));
  } else {
    b.setPayload(asData(m.payload));
  }
  b.setLast(m.last);
  b.setElements(m.elements);
  b.setNSamples(m.n_samples);
  b.setSteps(m.steps);
}

void fill(schema::Summary::Builder b, const Summary& m) {
  b.setTaskToken(m.task_token);
  b.setNSamples(m.n_samples);
  b.setSteps(m.steps);
  b.setMeanLoss(m.mean_loss);
  b.setSumSqLoss(m.sum_sq_loss);
  b.setComputeSeconds(m.compute_seconds);
  b.setUploadSeconds(m.upload_seconds);
  b.setEncodeSeconds(m.encode_seconds);
  if (m.served_samples > 0) {
    b.setServedSamples(m.served_samples);
    b.setServedLoss(m.served_loss);
    b.setServedAccuracy(m.served_accuracy);
    b.setServedSha256(capnp::Data::Reader(m.served_sha256.data(), m.served_sha256.size()));
  }
  if (m.eval_samples > 0) {
    b.setEvalSamples(m.eval_samples);
    b.setEvalLoss(m.eval_loss);
    b.setEvalAccuracy(m.eval_accuracy);
    b.setEvalNoAccuracy(!m.eval_has_accuracy);
    if (!m.eval_metrics.empty()) {
      auto list = b.initEvalMetrics(static_cast<unsigned>(m.eval_metrics.size()));
      for (unsigned i = 0; i < list.size(); ++i) {
        list[i].setName(asText(m.eval_metrics[i].first));
        list[i].setValue(m.eval_metrics[i].second);
      }
    }
  }
}

void fill(schema::Cancel::Builder b, const Cancel& m) {
  b.setTaskToken(m.task_token);
  b.setReason(asText(m.reason));
}

void fill(schema::Heartbeat::Builder b, const Heartbeat& m) { b.setSeq(m.seq); }

void fill(schema::Bye::Builder b, const Bye& m) { b.setReason(asText(m.reason)); }

void fill(schema::Error::Builder b, const Error& m) {
  b.setCode(static_cast<schema::ErrorCode>(static_cast<uint16_t>(m.code)));
  b.setMessage(asText(m.message));
  b.setTaskToken(m.task_token);
}

void fill(schema::UploadRequest::Builder b, const UploadRequest& m) {
  b.setTaskToken(m.task_token);
}

void fill(schema::UploadGrant::Builder b, const UploadGrant& m) { b.setTaskToken(m.task_token); }

void fill(schema::SecAgg::Builder b, const SecAgg& m) {
  b.setTaskToken(m.task_token);
  b.setStep(static_cast<uint8_t>(m.step));
  auto adverts = b.initAdverts(static_cast<unsigned>(m.adverts.size()));
  for (size_t i = 0; i < m.adverts.size(); ++i) {
    const auto& a = m.adverts[i];
    adverts[i].setIndex(a.index);
    adverts[i].setEncryptionKey(asData(a.encryption_key));
    adverts[i].setMaskKey(asData(a.mask_key));
    adverts[i].setSeedDigest(asData(a.seed_digest));
  }
  auto shares = b.initShares(static_cast<unsigned>(m.shares.size()));
  for (size_t i = 0; i < m.shares.size(); ++i) {
    shares[i].setFrom(m.shares[i].from);
    shares[i].setTo(m.shares[i].to);
    shares[i].setSealed(asData(m.shares[i].sealed));
  }
  auto survivors = b.initSurvivors(static_cast<unsigned>(m.request.survivors.size()));
  for (size_t i = 0; i < m.request.survivors.size(); ++i) survivors.set(i, m.request.survivors[i]);
  auto dropped = b.initDropped(static_cast<unsigned>(m.request.dropped.size()));
  for (size_t i = 0; i < m.request.dropped.size(); ++i) dropped.set(i, m.request.dropped[i]);
  auto revealed = b.initRevealed(static_cast<unsigned>(m.revealed.size()));
  for (size_t i = 0; i < m.revealed.size(); ++i) {
    revealed[i].setOwner(m.revealed[i].owner);
    revealed[i].setSelfMask(m.revealed[i].self_mask);
    revealed[i].setShare(asData(m.revealed[i].share));
  }
}

void fillEnvelope(schema::Envelope::Builder env, const Message& message) {
  std::visit(Overloaded{
                 [&](const Hello& m) { fill(env.initHello(), m); },
                 [&](const Task& m) { fill(env.initTask(), m); },
                 [&](const Chunk& m) { fill(env.initChunk(), m); },
                 [&](const Summary& m) { fill(env.initSummary(), m); },
                 [&](const Cancel& m) { fill(env.initCancel(), m); },
                 [&](const Heartbeat& m) { fill(env.initHeartbeat(), m); },
                 [&](const Bye& m) { fill(env.initBye(), m); },
                 [&](const Error& m) { fill(env.initError(), m); },
                 [&](const UploadRequest& m) { fill(env.initUploadRequest(), m); },
                 [&](const UploadGrant& m) { fill(env.initUploadGrant(), m); },
                 [&](const SecAgg& m) { fill(env.initSecAgg(), m); },
             },
             message);
}

// ---------------------------------------------------------------------------------------------
// decode

std::string toString(capnp::Text::Reader t) { return std::string(t.begin(), t.size()); }

std::string toString(capnp::Data::Reader d) {
  return std::string(reinterpret_cast<const char*>(d.begin()), d.size());
}

// A SHA-256 field: exactly 32 bytes.
Status readSha(capnp::Data::Reader d, const char* what, Sha256* out) {
  if (d.size() != out->size()) {
    return corrupt(std::string(what) + " is " + std::to_string(d.size()) + " bytes, expected 32");
  }
  std::memcpy(out->data(), d.begin(), d.size());
  return Status::ok();
}

Result<Message> read(schema::Hello::Reader r) {
  Hello m;
  m.client_id = toString(r.getClientId());
  m.public_key = toString(r.getPublicKey());
  switch (r.getDeviceKind()) {
    case schema::DeviceKind::CPU:
      m.device_kind = DeviceKind::kCpu;
      break;
    case schema::DeviceKind::CUDA:
      m.device_kind = DeviceKind::kCuda;
      break;
    default:
      return corrupt("Hello: unknown device kind " +
                     std::to_string(static_cast<uint16_t>(r.getDeviceKind())));
  }
  m.device_name = toString(r.getDeviceName());
  m.cores = r.getCores();
  m.memory_bytes = r.getMemoryBytes();
  m.data_size = r.getDataSize();
  m.protocol_version = r.getProtocolVersion();
  m.requested_partition = r.getRequestedPartition();
  m.session = r.getSession();
  m.last_coordinator_session = r.getLastCoordinatorSession();
  return Message(std::move(m));
}

Result<Message> read(schema::Task::Reader r) {
  Task m;
  FEDFLEET_RETURN_IF_ERROR(readSha(r.getModelSha256(), "Task: model_sha256", &m.model_sha256));
  m.run_id = r.getRunId();
  m.round = r.getRound();
  m.model_version = r.getModelVersion();
  m.model_name = toString(r.getModelName());
  m.model_bytes = toString(r.getModelBytes());
  m.control_bytes = toString(r.getControlBytes());  // its length is checked by checkTask
  auto h = r.getHparams();
  getLocalSgdNumbers(h, m.hparams);
  m.hparams.scaffold = h.getScaffold();
  m.hparams.stop_after_s = h.getStopAfterS();
  const auto optimizer = static_cast<uint16_t>(h.getOptimizer());
  if (optimizer > static_cast<uint16_t>(Optimizer::kAdamW)) {
    return corrupt("Task: unknown optimizer " + std::to_string(optimizer));
  }
  m.hparams.optimizer = static_cast<Optimizer>(optimizer);
  const auto loss = static_cast<uint16_t>(h.getLoss());
  if (loss > static_cast<uint16_t>(Loss::kModule)) {
    return corrupt("Task: unknown loss " + std::to_string(loss));
  }
  m.hparams.loss = static_cast<Loss>(loss);
  auto d = r.getData();
  m.data.dataset = toString(d.getDataset());
  m.data.scheme = toString(d.getScheme());
  m.data.alpha = d.getAlpha();
  m.data.labels_per_client = d.getLabelsPerClient();
  m.data.num_partitions = d.getNumPartitions();
  m.data.index = d.getIndex();
  m.data.seed = d.getSeed();
  m.data.subset = d.getSubset();
  m.data.blocks = d.getBlocks();
  m.data.skew = d.getSkew();
  m.data.shards_per_client = d.getShardsPerClient() == 0 ? 2 : d.getShardsPerClient();
  m.deadline_s = r.getDeadlineS();
  m.codec = toString(r.getCodec());
  m.task_token = r.getTaskToken();
  m.chunk_bytes = r.getChunkBytes();
  m.coordinator_session = r.getCoordinatorSession();
  m.fed_eval = r.getFedEval();
  if (r.hasLocalDp()) {
    auto ld = r.getLocalDp();
    m.local_dp = {ld.getClip(), ld.getNoiseMultiplier(), ld.getDelta()};
    if (m.local_dp.on() && !(std::isfinite(m.local_dp.clip) && m.local_dp.noise_multiplier > 0 &&
                             std::isfinite(m.local_dp.noise_multiplier) && m.local_dp.delta > 0 &&
                             m.local_dp.delta < 1)) {
      return corrupt(
          "Task: local DP needs a finite clip, a noise multiplier > 0 and delta in "
          "(0, 1)");
    }
  }
  if (r.hasSecagg()) {
    auto sa = r.getSecagg();
    m.secagg.index = sa.getIndex();
    m.secagg.clients = sa.getClients();
    m.secagg.neighbours = sa.getNeighbours();
    m.secagg.threshold = sa.getThreshold();
    m.secagg.graph_seed = sa.getGraphSeed();
    m.secagg.clip_range = sa.getClipRange();
    m.secagg.quant_range = sa.getQuantRange();
    m.secagg.weight_scale = sa.getWeightScale();
    m.secagg.dp_clip = sa.getDpClip();
    m.secagg.dp_noise_stddev = sa.getDpNoiseStddev();
    m.secagg.fednova = sa.getFedNova();
    m.secagg.fednova_momentum = sa.getFedNovaMomentum();
    if (m.secagg.fednova && !fedNovaMomentumValid(m.secagg.fednova_momentum)) {
      return corrupt("Task: FedNova momentum " + std::to_string(m.secagg.fednova_momentum) +
                     " outside [0, 1)");
    }
    if (m.secagg.on() && m.secagg.index >= m.secagg.clients) {
      return corrupt("Task: secure aggregation index " + std::to_string(m.secagg.index) +
                     " outside a cohort of " + std::to_string(m.secagg.clients));
    }
  }
  if (r.hasServed()) {
    auto sv = r.getServed();
    const auto source = static_cast<uint16_t>(sv.getSource());
    if (source > static_cast<uint16_t>(ServedSource::kAttached)) {
      return corrupt("Task: unknown served-model source " + std::to_string(source));
    }
    m.served.source = static_cast<ServedSource>(source);
    if (m.served.source != ServedSource::kNone) {
      FEDFLEET_RETURN_IF_ERROR(readSha(sv.getSha256(), "Task: served sha256", &m.served.sha256));
      m.served.block = sv.getBlock();
      m.served.model = toString(sv.getModel());
      m.served.version = sv.getVersion();
    }
  }
  return Message(std::move(m));
}

Result<Message> read(schema::Chunk::Reader r) {
  Chunk m;
  m.task_token = r.getTaskToken();
  m.offset = r.getOffset();  // retiredTensorIndex is not read: older clients still send it
  m.payload = toString(r.getPayload());
  m.last = r.getLast();
  m.elements = r.getElements();
  m.n_samples = r.getNSamples();
  m.steps = r.getSteps();
  return Message(std::move(m));
}

Result<Message> read(schema::Summary::Reader r) {
  Summary m;
  m.task_token = r.getTaskToken();
  m.n_samples = r.getNSamples();
  m.steps = r.getSteps();
  m.mean_loss = r.getMeanLoss();
  m.sum_sq_loss = r.getSumSqLoss();
  m.compute_seconds = r.getComputeSeconds();
  m.upload_seconds = r.getUploadSeconds();
  m.encode_seconds = r.getEncodeSeconds();
  m.served_samples = r.getServedSamples();
  if (m.served_samples > 0) {
    m.served_loss = r.getServedLoss();
    m.served_accuracy = r.getServedAccuracy();
    FEDFLEET_RETURN_IF_ERROR(
        readSha(r.getServedSha256(), "Summary: served sha256", &m.served_sha256));
  } else if (r.getServedLoss() != 0 || r.getServedAccuracy() != 0 ||
             r.getServedSha256().size() > 0) {
    // encode() writes none of them then: figures no one would read are refused, not ignored.
    return corrupt("Summary: served-model figures without served samples");
  }
  m.eval_samples = r.getEvalSamples();
  if (m.eval_samples > 0) {
    m.eval_loss = r.getEvalLoss();
    m.eval_accuracy = r.getEvalAccuracy();
    m.eval_has_accuracy = !r.getEvalNoAccuracy();
    const auto list = r.getEvalMetrics();
    if (list.size() > kMaxEvalMetrics) {
      return corrupt("Summary: " + std::to_string(list.size()) + " evaluation metrics, more than " +
                     std::to_string(kMaxEvalMetrics));
    }
    for (const auto metric : list) {
      std::string name = toString(metric.getName());
      if (!metricNameOk(name)) {
        return corrupt("Summary: an evaluation metric's name is not 1 to " +
                       std::to_string(kMaxMetricName) + " of [A-Za-z0-9_.-]");
      }
      for (const auto& [seen, value] : m.eval_metrics) {
        if (seen == name) return corrupt("Summary: evaluation metric '" + name + "' twice");
      }
      m.eval_metrics.emplace_back(std::move(name), metric.getValue());
    }
  } else if ((r.hasEvalMetrics() && r.getEvalMetrics().size() > 0) || r.getEvalLoss() != 0 ||
             r.getEvalAccuracy() != 0 || r.getEvalNoAccuracy()) {
    return corrupt("Summary: evaluation figures without evaluated samples");
  }
  return Message(std::move(m));
}

Result<Message> read(schema::Cancel::Reader r) {
  Cancel m;
  m.task_token = r.getTaskToken();
  m.reason = toString(r.getReason());
  return Message(std::move(m));
}

Result<Message> read(schema::Heartbeat::Reader r) {
  Heartbeat m;
  m.seq = r.getSeq();
  return Message(std::move(m));
}

Result<Message> read(schema::Bye::Reader r) {
  Bye m;
  m.reason = toString(r.getReason());
  return Message(std::move(m));
}

Result<Message> read(schema::Error::Reader r) {
  Error m;
  auto code = static_cast<uint16_t>(r.getCode());
  // A code this build does not know (a newer peer) reads as kUnknown: the message text still
  // says what went wrong, and refusing the whole Error would hide it.
  m.code = code <= static_cast<uint16_t>(ErrorCode::kInternal) ? static_cast<ErrorCode>(code)
                                                               : ErrorCode::kUnknown;
  m.message = toString(r.getMessage());
  m.task_token = r.getTaskToken();
  return Message(std::move(m));
}

Result<Message> read(schema::UploadRequest::Reader r) {
  return Message(UploadRequest{r.getTaskToken()});
}

Result<Message> read(schema::UploadGrant::Reader r) {
  return Message(UploadGrant{r.getTaskToken()});
}

// Sizes of keys and shares are the secure-aggregation code's to check (it knows them); here
// only the step must be one there is.
Result<Message> read(schema::SecAgg::Reader r) {
  SecAgg m;
  m.task_token = r.getTaskToken();
  const uint8_t step = r.getStep();
  if (step < static_cast<uint8_t>(SecAggStep::kAdvert) ||
      step > static_cast<uint8_t>(SecAggStep::kReveal)) {
    return corrupt("SecAgg: unknown step " + std::to_string(step));
  }
  m.step = static_cast<SecAggStep>(step);
  // Bounded before anything is built: a list of empty structs costs the sender almost nothing.
  const size_t most = secagg::kMaxNeighbours + 1;
  if (r.getAdverts().size() > most || r.getShares().size() > most ||
      r.getSurvivors().size() > most || r.getDropped().size() > most ||
      r.getRevealed().size() > most) {
    return corrupt("SecAgg: a list of more than " + std::to_string(most) +
                   " entries (a client's neighbours and itself)");
  }
  for (auto a : r.getAdverts()) {
    m.adverts.push_back({a.getIndex(), toString(a.getEncryptionKey()), toString(a.getMaskKey()),
                         toString(a.getSeedDigest())});
  }
  for (auto sh : r.getShares()) {
    m.shares.push_back({sh.getFrom(), sh.getTo(), toString(sh.getSealed())});
  }
  for (uint32_t v : r.getSurvivors()) m.request.survivors.push_back(v);
  for (uint32_t v : r.getDropped()) m.request.dropped.push_back(v);
  for (auto rv : r.getRevealed()) {
    m.revealed.push_back({rv.getOwner(), rv.getSelfMask(), toString(rv.getShare())});
  }
  return Message(std::move(m));
}

Result<Message> readEnvelope(schema::Envelope::Reader env) {
  switch (env.which()) {
    case schema::Envelope::HELLO:
      return read(env.getHello());
    case schema::Envelope::TASK:
      return read(env.getTask());
    case schema::Envelope::CHUNK:
      return read(env.getChunk());
    case schema::Envelope::SUMMARY:
      return read(env.getSummary());
    case schema::Envelope::CANCEL:
      return read(env.getCancel());
    case schema::Envelope::HEARTBEAT:
      return read(env.getHeartbeat());
    case schema::Envelope::BYE:
      return read(env.getBye());
    case schema::Envelope::ERROR:
      return read(env.getError());
    case schema::Envelope::UPLOAD_REQUEST:
      return read(env.getUploadRequest());
    case schema::Envelope::UPLOAD_GRANT:
      return read(env.getUploadGrant());
    case schema::Envelope::SEC_AGG:
      return read(env.getSecAgg());
  }
  return corrupt("unknown message kind (union tag " +
                 std::to_string(static_cast<uint16_t>(env.which())) + ")");
}

// What a Task must satisfy once its model bytes are in place (decode, decodeFrames).
Status checkTask(const Task& m) {
  if (!m.control_bytes.empty() && m.control_bytes.size() != m.model_bytes.size()) {
    return corrupt("Task: control_bytes is " + std::to_string(m.control_bytes.size()) +
                   " bytes, model_bytes " + std::to_string(m.model_bytes.size()));
  }
  return Status::ok();
}

Result<Message> decodeEnvelope(std::string_view bytes, const DecodeLimits& limits);

}  // namespace

const char* deviceKindName(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kCpu:
      return "cpu";
    case DeviceKind::kCuda:
      return "cuda";
  }
  return "unknown";
}

const char* optimizerName(Optimizer o) {
  switch (o) {
    case Optimizer::kSgd:
      return "sgd";
    case Optimizer::kAdam:
      return "adam";
    case Optimizer::kAdamW:
      return "adamw";
  }
  return "unknown";
}

Result<Optimizer> parseOptimizer(std::string_view name) {
  for (Optimizer o : {Optimizer::kSgd, Optimizer::kAdam, Optimizer::kAdamW}) {
    if (name == optimizerName(o)) return o;
  }
  return invalidArgument("unknown optimizer \"" + std::string(name) + "\" (sgd, adam or adamw)");
}

const char* precisionName(Precision p) {
  switch (p) {
    case Precision::kFp32:
      return "fp32";
    case Precision::kBf16:
      return "bf16";
  }
  return "unknown";
}

Result<Precision> parsePrecision(std::string_view name) {
  for (Precision p : {Precision::kFp32, Precision::kBf16}) {
    if (name == precisionName(p)) return p;
  }
  return invalidArgument("unknown precision \"" + std::string(name) + "\" (fp32 or bf16)");
}

const char* lossName(Loss loss) {
  switch (loss) {
    case Loss::kCrossEntropy:
      return "cross_entropy";
    case Loss::kMse:
      return "mse";
    case Loss::kBce:
      return "bce";
    case Loss::kModule:
      return "module";
  }
  return "unknown";
}

Result<Loss> parseLoss(std::string_view name) {
  for (Loss l : {Loss::kCrossEntropy, Loss::kMse, Loss::kBce, Loss::kModule}) {
    if (name == lossName(l)) return l;
  }
  return invalidArgument("unknown loss \"" + std::string(name) +
                         "\" (cross_entropy, mse, bce or module)");
}

const char* secAggStepName(SecAggStep step) {
  switch (step) {
    case SecAggStep::kAdvert:
      return "advert";
    case SecAggStep::kKeys:
      return "keys";
    case SecAggStep::kShares:
      return "shares";
    case SecAggStep::kForwarded:
      return "forwarded";
    case SecAggStep::kUnmask:
      return "unmask";
    case SecAggStep::kReveal:
      return "reveal";
  }
  return "?";
}

const char* messageName(const Message& message) {
  static constexpr const char* kNames[] = {"Hello",         "Task",        "Chunk", "Summary",
                                           "Cancel",        "Heartbeat",   "Bye",   "Error",
                                           "UploadRequest", "UploadGrant", "SecAgg"};
  static_assert(std::size(kNames) == std::variant_size_v<Message>);
  return kNames[message.index()];
}

std::string encode(const Message& message) {
  try {
    capnp::MallocMessageBuilder builder(
        static_cast<unsigned int>(std::min<size_t>(estimateWords(message), UINT_MAX / 2)),
        capnp::AllocationStrategy::GROW_HEURISTICALLY);
    fillEnvelope(builder.initRoot<schema::Envelope>(), message);
    return writeFlat(builder);
  } catch (const kj::Exception& e) {
    // Only a field over Cap'n Proto's size limits (kMaxFieldBytes) gets here: a caller bug.
    FEDFLEET_CHECK_MSG(false, e.getDescription().cStr());
  } catch (const std::exception& e) {
    FEDFLEET_CHECK_MSG(false, e.what());  // out of memory: nothing sensible to return
  }
  return {};
}

size_t encodedSize(const Chunk& chunk) {
  // Scalars take the same words whatever their values: only the payload's length varies. What a
  // frame adds around its payload is measured once for each way encode() stores it: copied into
  // the first segment (padded to whole words), or referenced as a segment of its own (the
  // segment table's second entry and the double-far pointer's landing pad).
  static const size_t kCopied = encode(Message(Chunk{})).size();
  static const size_t kReferenced = [] {
    Chunk c;
    c.payload.assign(kReferenceMinBytes, '\0');
    return encode(Message(c)).size() - c.payload.size();
  }();
  const size_t n = chunk.payload.size();
  constexpr size_t kWord = sizeof(capnp::word);
  if (canReference(chunk.payload)) return kReferenced + n;
  return kCopied + (n + kWord - 1) / kWord * kWord;
}

Result<Message> decode(std::string_view bytes, const DecodeLimits& limits) {
  FEDFLEET_ASSIGN_OR_RETURN(Message message, decodeEnvelope(bytes, limits));
  if (const auto* task = std::get_if<Task>(&message)) FEDFLEET_RETURN_IF_ERROR(checkTask(*task));
  return message;
}

Result<Message> decodeFrames(std::string_view frame, std::optional<std::string> model_frame,
                             const DecodeLimits& limits) {
  FEDFLEET_ASSIGN_OR_RETURN(Message message, decodeEnvelope(frame, limits));
  auto* task = std::get_if<Task>(&message);
  if (task == nullptr) {
    if (model_frame) {
      return corrupt(std::string(messageName(message)) + " followed by an extra frame of " +
                     std::to_string(model_frame->size()) + " bytes (only a Task has one)");
    }
    return message;
  }
  if (!model_frame)
    return corrupt("Task (token " + std::to_string(task->task_token) + ") without its model frame");
  if (!task->model_bytes.empty()) {
    return corrupt("Task (token " + std::to_string(task->task_token) +
                   ") has model bytes both in its frame and in a model frame");
  }
  task->model_bytes = std::move(*model_frame);
  if (task->served.source == ServedSource::kAttached) {
    // The model frame: the training model, then the served model of the same size.
    const size_t n = task->model_bytes.size();
    if (n % 2 != 0) {
      return corrupt("Task (token " + std::to_string(task->task_token) + "): a model frame of " +
                     std::to_string(n) + " bytes cannot hold two models of one size");
    }
    task->served.bytes.assign(task->model_bytes, n / 2, n / 2);
    task->model_bytes.resize(n / 2);
  }
  FEDFLEET_RETURN_IF_ERROR(checkTask(*task));
  return message;
}

namespace {

Result<Message> decodeEnvelope(std::string_view bytes, const DecodeLimits& limits) {
  return readFlat<schema::Envelope, Message>(bytes, limits, "frame", readEnvelope);
}

}  // namespace

}  // namespace fedfleet::wire
