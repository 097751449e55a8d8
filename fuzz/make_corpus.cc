// Writes the seed corpora of the harnesses in fuzz/ (fuzz/corpus/<name>/), each seed laid out as
// its harness reads inputs (see the header comment of fuzz/<name>_fuzzer.cc), from messages,
// payloads, IDX files and configs made with the project's own encoders. Deterministic: running
// it again writes the same files. Usage: fuzz_make_corpus DIR (normally fuzz/corpus); files in
// DIR/<name>/ that it does not write are left alone.

#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "common/check.h"
#include "common/compress/codec.h"
#include "common/config/config.h"
#include "common/wire/messages.h"
#include "common/wire/peer_control.h"
#include "common/wire/peer_message.h"
#include "common/wire/sim_job.h"

namespace fedfleet::fuzz {
namespace {

namespace fs = std::filesystem;

void put32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}

void putBigEndian32(std::string* out, uint32_t v) {
  for (int i = 3; i >= 0; --i) out->push_back(static_cast<char>(v >> (8 * i)));
}

class CorpusWriter {
 public:
  explicit CorpusWriter(fs::path dir) : dir_(std::move(dir)) {}

  void write(const std::string& harness, const std::string& name, const std::string& bytes) {
    const fs::path folder = dir_ / harness;
    fs::create_directories(folder);
    std::ofstream f(folder / name, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    FEDFLEET_CHECK_MSG(f.good(), (folder / name).c_str());
    ++count_;
  }

  int count() const { return count_; }

 private:
  fs::path dir_;
  int count_ = 0;
};

// ----- wire ----------------------------------------------------------------------------------

wire::Sha256 shaPattern(uint8_t step) {
  wire::Sha256 s{};
  for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<uint8_t>(i * step + 1);
  return s;
}

std::string modelBytes(size_t floats, float scale) {
  std::string out(floats * 4, '\0');
  for (size_t i = 0; i < floats; ++i) {
    const float v = scale * static_cast<float>(static_cast<int>(i % 17) - 8);
    std::memcpy(out.data() + 4 * i, &v, 4);
  }
  return out;
}

wire::Task sampleTask() {
  wire::Task t;
  t.run_id = 3;
  t.round = 7;
  t.model_version = 12;
  t.model_name = "mlp";
  t.model_sha256 = shaPattern(7);
  t.hparams.epochs = 2;
  t.hparams.batch_size = 32;
  t.hparams.seed = 99;
  t.data.scheme = "dirichlet";
  t.data.num_partitions = 10;
  t.data.index = 4;
  t.deadline_s = 60;
  t.codec = "qsgd8";
  t.task_token = 0x1234;
  t.chunk_bytes = 4096;
  return t;
}

std::string singleFrame(const wire::Message& m, uint8_t control = 0) {
  std::string in(1, static_cast<char>(control));
  in += wire::encode(m);
  return in;
}

// A Task as the transport sends it: the frame with model_bytes empty, then the model frame.
std::string taskFrames(wire::Task t) {
  std::string model = std::move(t.model_bytes);
  t.model_bytes.clear();
  if (t.served.source == wire::ServedSource::kAttached) model += t.served.bytes;
  t.served.bytes.clear();
  const std::string frame = wire::encode(t);
  std::string in(1, '\1');
  put32(&in, static_cast<uint32_t>(frame.size()));
  return in + frame + model;
}

void writeWire(CorpusWriter& w) {
  wire::Hello hello;
  hello.client_id = "client-7";
  hello.public_key = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7";
  hello.device_kind = wire::DeviceKind::kCuda;
  hello.device_name = "cpu-4";
  hello.cores = 4;
  hello.memory_bytes = 8ull << 30;
  hello.data_size = 600;
  hello.requested_partition = 3;
  hello.session = 0xabcdef;
  w.write("wire", "hello", singleFrame(hello));
  w.write("wire", "hello_tight_limits", singleFrame(hello, 2));

  wire::Task task = sampleTask();
  task.model_bytes = modelBytes(16, 0.01f);
  w.write("wire", "task_one_frame", singleFrame(task));
  w.write("wire", "task_frames", taskFrames(task));

  wire::Task scaffold = task;
  scaffold.hparams.scaffold = true;
  scaffold.hparams.prox_mu = 0.01f;
  scaffold.hparams.stop_after_s = 5;
  scaffold.control_bytes = modelBytes(16, -0.5f);
  w.write("wire", "task_scaffold_frames", taskFrames(scaffold));

  wire::Task served = task;
  served.data.scheme = "block-cyclic";
  served.data.blocks = 3;
  served.data.skew = 0.8;
  served.served.source = wire::ServedSource::kAttached;
  served.served.block = 1;
  served.served.model = "pluralistic";
  served.served.version = 11;
  served.served.sha256 = shaPattern(5);
  served.served.bytes = modelBytes(16, 0.02f);
  w.write("wire", "task_served_attached_frames", taskFrames(served));
  served.served.source = wire::ServedSource::kUnchanged;
  served.served.bytes.clear();
  w.write("wire", "task_served_unchanged_frames", taskFrames(served));

  Result<std::unique_ptr<compress::Codec>> codec =
      compress::makeCodec(*compress::parseCodecSpec("qsgd8"));
  FEDFLEET_CHECK(codec.isOk());
  std::vector<float> delta(64);
  for (size_t i = 0; i < delta.size(); ++i) delta[i] = 0.001f * static_cast<float>(i % 9) - 0.004f;
  wire::Chunk chunk;
  chunk.task_token = 0x1234;
  chunk.offset = 128;
  (*codec)->encode(delta.data(), delta.size(), 5, &chunk.payload);
  chunk.last = true;
  chunk.elements = delta.size();
  chunk.n_samples = 600;
  chunk.steps = 19;
  w.write("wire", "chunk", singleFrame(chunk));
  // An older client's chunk: the retired tensor index (schema field @1, the 32 bits after the
  // task token in the struct's data) set, which the decoder must ignore.
  {
    std::string older = singleFrame(chunk);
    const uint64_t token = chunk.task_token;
    const std::string needle(reinterpret_cast<const char*>(&token), sizeof token);
    const size_t at = older.find(needle);
    FEDFLEET_CHECK(at != std::string::npos && older.find(needle, at + 1) == std::string::npos);
    const uint32_t tensor_index = 1;
    std::memcpy(older.data() + at + 8, &tensor_index, sizeof tensor_index);
    w.write("wire", "chunk_retired_tensor_index", older);
  }

  wire::Summary summary;
  summary.task_token = 0x1234;
  summary.n_samples = 600;
  summary.steps = 19;
  summary.mean_loss = 0.42;
  summary.sum_sq_loss = 110.5;
  summary.compute_seconds = 1.5;
  summary.upload_seconds = 0.25;
  summary.encode_seconds = 0.01;
  summary.served_samples = 100;
  summary.served_loss = 0.5;
  summary.served_accuracy = 0.81;
  summary.served_sha256 = shaPattern(3);
  w.write("wire", "summary", singleFrame(summary));

  w.write("wire", "cancel", singleFrame(wire::Cancel{0x1234, "deadline"}));
  w.write("wire", "heartbeat", singleFrame(wire::Heartbeat{77}));
  w.write("wire", "bye", singleFrame(wire::Bye{"shutting down"}));
  w.write("wire", "error",
          singleFrame(wire::Error{wire::ErrorCode::kRejected, "payload holds NaN", 0x1234}));
  w.write("wire", "upload_request", singleFrame(wire::UploadRequest{0x1234}));
  w.write("wire", "upload_grant", singleFrame(wire::UploadGrant{0x1234}));

  // Secure aggregation and local DP: a task of each, and a SecAgg message of every list.
  wire::Task secure = task;
  secure.secagg = {3, 8, 6, 4, 99, 8.0, 1u << 20, 600.0, 0.5, 0.1};
  secure.local_dp = {};
  w.write("wire", "task_secagg_frames", taskFrames(secure));
  wire::Task local = task;
  local.local_dp = {1.0, 0.8, 1e-5};
  w.write("wire", "task_local_dp_frames", taskFrames(local));
  wire::SecAgg step;
  step.task_token = 0x1234;
  step.step = wire::SecAggStep::kForwarded;
  step.adverts.push_back({3, std::string(32, 'e'), std::string(32, 'm'), std::string(32, 'd')});
  step.shares.push_back({2, 3, std::string(112, 's')});
  step.request.survivors = {1, 3};
  step.request.dropped = {5};
  step.revealed.push_back({1, true, std::string(44, 'r')});
  w.write("wire", "secagg", singleFrame(step));

  // Refused shapes: a Heartbeat followed by a model frame, a truncated Task frame.
  std::string extra(1, '\1');
  const std::string beat = wire::encode(wire::Heartbeat{1});
  put32(&extra, static_cast<uint32_t>(beat.size()));
  w.write("wire", "heartbeat_extra_frame", extra + beat + "xxxxxxxx");
  std::string cut = singleFrame(task);
  cut.resize(cut.size() / 2 + 1);
  w.write("wire", "task_truncated", cut);

  // The simulator's worker jobs and results (common/wire/sim_job.h), decoded from the same input.
  const auto floats = [](std::initializer_list<float> v) {
    return std::make_shared<const std::string>(reinterpret_cast<const char*>(v.begin()),
                                               v.size() * sizeof(float));
  };
  wire::SimTrainJob train;
  train.client = 7;
  train.recipe = {"mlp", "", 3, {1, 28, 28}, 10, wire::Loss::kCrossEntropy, "cpu"};
  train.start = floats({1.0f, -2.0f, 0.5f});
  train.scaffold = true;
  train.control_c = floats({0.1f, 0.2f, 0.3f});
  train.control_ck = {0.0f, 0.5f, -0.5f};
  train.fed_eval = true;
  train.served = floats({3.0f, 2.0f, 1.0f});
  w.write("wire", "sim_train_job", std::string(1, '\0') + wire::encodeSimJob(train));
  wire::SimEvalJob eval{train.recipe, floats({1.0f}), 0, 500, 250};
  w.write("wire", "sim_eval_job", std::string(1, '\0') + wire::encodeSimJob(eval));
  wire::SimTrainResult result;
  result.steps = 9;
  result.delta = {0.25f, -0.125f};
  result.fed_evaluation = wire::SimEvaluation{Status::ok(), 40, 0.7, 0.5, {{"mae", 0.2}}};
  w.write("wire", "sim_train_result", std::string(1, '\0') + wire::encodeSimJobResult(result));
  wire::SimEvalResult pieces;
  pieces.pieces.push_back({250, 120.5, 200, true, {}});
  w.write("wire", "sim_eval_result", std::string(1, '\0') + wire::encodeSimJobResult(pieces));

  // Decentralised peers' messages (common/wire/peer_message.h): a ring chunk and a group
  // assignment, within the fuzzer's receiver limits (16 peers, 4096 elements).
  wire::PeerMessage peer_chunk;
  peer_chunk.kind = wire::PeerMessageKind::kChunk;
  peer_chunk.from = 3;
  peer_chunk.to = 4;
  peer_chunk.iteration = 7;
  peer_chunk.step = 5;
  peer_chunk.chunk = 2;
  peer_chunk.values = {0.5f, -1.0f, 2.0f, 0.25f};
  w.write("wire", "peer_chunk", std::string(1, '\0') + wire::encodePeerMessage(peer_chunk));
  wire::PeerMessage peer_assign;
  peer_assign.kind = wire::PeerMessageKind::kGroupAssign;
  peer_assign.from = 16;
  peer_assign.to = 1;
  peer_assign.group = 9;
  peer_assign.members = {1, 4, 7, 12};
  w.write("wire", "peer_group_assign", std::string(1, '\0') + wire::encodePeerMessage(peer_assign));

  // The peers' control messages with their coordinator (common/wire/peer_control.h): a peer
  // table, an iteration report and a model reply, within the same limits.
  wire::PeerControl table;
  table.kind = wire::PeerControlKind::kTable;
  table.table = {{0, "tcp://127.0.0.1:7001", std::string(40, 'a')},
                 {1, "tcp://127.0.0.1:7002", std::string(40, 'b')}};
  w.write("wire", "peer_control_table", std::string(1, '\0') + wire::encodePeerControl(table));
  wire::PeerControl report;
  report.kind = wire::PeerControlKind::kIterations;
  report.iterations = {{4, 1.5, 2.25, 0.5, 0.125, 0.125, 4096, 4096, 2, 1, false, 0.7}};
  w.write("wire", "peer_control_iterations",
          std::string(1, '\0') + wire::encodePeerControl(report));
  wire::PeerControl reply;
  reply.kind = wire::PeerControlKind::kModelReply;
  reply.request = 3;
  reply.iteration = 12;
  reply.values = {0.5f, -0.25f, 1.0f};
  w.write("wire", "peer_control_model", std::string(1, '\0') + wire::encodePeerControl(reply));
}

// ----- payload ---------------------------------------------------------------------------------

std::string payloadInput(const std::string& spec_text, std::string_view payload, uint32_t n,
                         float w, uint8_t control = 1) {
  std::string in(1, static_cast<char>(control));
  put32(&in, n);
  uint32_t wbits;
  std::memcpy(&wbits, &w, 4);
  put32(&in, wbits);
  in.push_back(static_cast<char>(spec_text.size()));
  in += spec_text;
  in += payload;
  return in;
}

void writePayload(CorpusWriter& w) {
  const char* specs[] = {"none",
                         "fp16",
                         "bf16",
                         "qsgd8",
                         "qsgd4",
                         "qsgd4,bucket=64",
                         "topk:0.1",
                         "topk:0.25,ef=off",
                         "sign",
                         "sign,bucket=8",
                         "topk:0.01,warmup=4,dense_below=100",
                         "lowrank:4",
                         "lowrank:2,ef=off"};
  const uint32_t sizes[] = {37, 300};
  for (const char* text : specs) {
    Result<compress::CodecSpec> spec = compress::parseCodecSpec(text);
    FEDFLEET_CHECK_MSG(spec.isOk(), text);
    Result<std::unique_ptr<compress::Codec>> codec = compress::makeCodec(*spec);
    FEDFLEET_CHECK(codec.isOk());
    for (uint32_t n : sizes) {
      std::vector<float> x(n);
      for (uint32_t i = 0; i < n; ++i) {
        x[i] = static_cast<float>((i * 37) % 101) * 0.01f - 0.5f;
        if (i % 29 == 0) x[i] *= 40.0f;
      }
      std::string payload;
      // lowrank as a matrix of 3 rows where 3 divides n (300), else as one row.
      (*codec)->encodeRows(x.data(), n, n % 3 == 0 ? 3 : 1, 17 + n, &payload);
      std::string name = std::string(text) + "_" + std::to_string(n);
      for (char& c : name) {
        if (c == ':' || c == ',' || c == '=') c = '_';
      }
      w.write("payload", name, payloadInput(text, payload, n, 0.25f));
    }
  }
  // The count given apart from the header, a spec of another codec, an empty payload.
  Result<std::unique_ptr<compress::Codec>> fp16 =
      compress::makeCodec(*compress::parseCodecSpec("fp16"));
  std::vector<float> x(20, 0.125f);
  std::string payload;
  (*fp16)->encode(x.data(), x.size(), 1, &payload);
  w.write("payload", "fp16_explicit_n", payloadInput("fp16", payload, 20, -1.0f, 0));
  w.write("payload", "fp16_wrong_n", payloadInput("fp16", payload, 21, 1.0f, 0));
  w.write("payload", "fp16_as_sign", payloadInput("sign", payload, 20, 1.0f));
  w.write("payload", "empty", payloadInput("none", "", 0, 1.0f, 0));
}

// ----- idx ---------------------------------------------------------------------------------------

std::string idxImages(uint32_t n, uint32_t rows, uint32_t cols, uint32_t magic = 0x803) {
  std::string out;
  putBigEndian32(&out, magic);
  putBigEndian32(&out, n);
  putBigEndian32(&out, rows);
  putBigEndian32(&out, cols);
  for (uint32_t i = 0; i < n * rows * cols; ++i) out.push_back(static_cast<char>(i * 7 + 3));
  return out;
}

std::string idxLabels(uint32_t n, uint8_t top = 9) {
  std::string out;
  putBigEndian32(&out, 0x801);
  putBigEndian32(&out, n);
  for (uint32_t i = 0; i < n; ++i) out.push_back(static_cast<char>(i % (top + 1)));
  return out;
}

std::string gzip(std::string_view plain) {
  z_stream z{};
  FEDFLEET_CHECK(deflateInit2(&z, 9, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) == Z_OK);
  std::string out(deflateBound(&z, plain.size()), '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(plain.data()));
  z.avail_in = static_cast<uInt>(plain.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  FEDFLEET_CHECK(deflate(&z, Z_FINISH) == Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

std::string idxInput(std::string_view images, std::string_view labels, uint8_t control = 0,
                     uint8_t limit = 0) {
  std::string in;
  in.push_back(static_cast<char>(control));
  in.push_back(static_cast<char>(limit));
  put32(&in, static_cast<uint32_t>(images.size()));
  in += images;
  in += labels;
  return in;
}

void writeIdx(CorpusWriter& w) {
  const std::string images = idxImages(3, 4, 4), labels = idxLabels(3);
  w.write("idx", "plain", idxInput(images, labels));
  w.write("idx", "gzip_files", idxInput(gzip(images), gzip(labels)));
  w.write("idx", "gzip_here", idxInput(images, labels, 3));
  w.write("idx", "limit", idxInput(images, labels, 4, 2));
  w.write("idx", "many_classes", idxInput(idxImages(5, 2, 3), idxLabels(5, 46)));
  const std::string half = gzip(images.substr(0, 20));
  w.write("idx", "gzip_two_members", idxInput(half + gzip(images.substr(20)), gzip(labels)));
  w.write("idx", "gzip_trailing_garbage", idxInput(gzip(images) + "junk", labels));
  std::string cut = gzip(idxImages(20, 8, 8));
  cut.resize(cut.size() / 2);
  w.write("idx", "gzip_truncated", idxInput(cut, idxLabels(20)));
  w.write("idx", "plain_truncated", idxInput(images.substr(0, images.size() - 3), labels));
  w.write("idx", "count_mismatch", idxInput(idxImages(4, 2, 2), labels));
  w.write("idx", "bad_magic", idxInput(idxImages(3, 2, 2, 0x801), labels));
}

// ----- config ----------------------------------------------------------------------------------

// TOML text of the keys of `c` whose values differ from `base` (all keys of a Config when `base`
// is null), in the sections `only` names (all when empty). JSON strings and numbers are TOML too.
std::string toToml(const config::Config& c, const config::Config* base = nullptr,
                   const std::string& only = "") {
  const nlohmann::json json = c.toJson();
  const nlohmann::json base_json = base != nullptr ? base->toJson() : nlohmann::json::object();
  std::string out;
  for (const auto& [section, keys] : json.items()) {
    if (!only.empty() && section != only) continue;
    std::string body;
    for (const auto& [key, value] : keys.items()) {
      if (base != nullptr && base_json[section][key] == value) continue;
      body += key + " = " + value.dump() + "\n";
    }
    if (!body.empty()) out += "[" + section + "]\n" + body + "\n";
  }
  return out;
}

std::string readFile(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

void writeConfig(CorpusWriter& w, const fs::path& source_dir) {
  for (const char* name : {"demo.toml", "sim_mobile_mix.toml"}) {
    const std::string text = readFile(source_dir / "examples" / "configs" / name);
    FEDFLEET_CHECK_MSG(!text.empty(), name);
    w.write("config", name, text);
  }
  // Every key with its default, a section a seed (each under the harness's max_len).
  config::Config defaults;
  const nlohmann::json sections = defaults.toJson();
  for (const auto& [section, keys] : sections.items()) {
    w.write("config", "section_" + section + ".toml", toToml(defaults, nullptr, section));
  }

  config::Config async = defaults;
  async.policy.mode = "async";
  async.policy.async_concurrency = 8;
  async.policy.async_buffer = 4;
  async.aggregation.server_optimizer = "fedadam";
  async.coordinator.codec = "topk:0.01,warmup=2";
  async.coordinator.slow_link_codec = "sign,bucket=64";
  async.coordinator.slow_link_mbps = 2.5;
  w.write("config", "async.toml", toToml(async, &defaults));

  config::Config blocks = defaults;
  blocks.blocks.count = 3;
  blocks.blocks.rounds_per_block = 4;
  blocks.blocks.mode = "multichain";
  blocks.data.dataset = "synthetic";
  blocks.selection.selector = "oort";
  blocks.client.partition = 5;
  w.write("config", "blocks.toml", toToml(blocks, &defaults));

  w.write("config", "inline_tables.toml",
          "run = { name = \"x\", rounds = 3 }\n[train]\nlr = 1e-2\nsteps = 0x10\n"
          "[coordinator]\ncodec = 'qsgd4,bucket=256'\ndeadline_s = 1_000.5\n");
  w.write("config", "unknown_key.toml", "[train]\nlearning_rate = 0.1\n");
  w.write("config", "wrong_type.toml", "[run]\nrounds = \"five\"\nseed = -1\n");
  w.write("config", "syntax_error.toml", "[run\nname = \"unterminated\n");
}

}  // namespace
}  // namespace fedfleet::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR   (writes DIR/<harness>/<seed>; normally fuzz/corpus)\n",
                 argv[0]);
    return 2;
  }
  fedfleet::fuzz::CorpusWriter w(argv[1]);
  fedfleet::fuzz::writeWire(w);
  fedfleet::fuzz::writePayload(w);
  fedfleet::fuzz::writeIdx(w);
  fedfleet::fuzz::writeConfig(w, FEDFLEET_SOURCE_DIR);
  std::printf("fuzz_make_corpus: wrote %d seeds under %s\n", w.count(), argv[1]);
  return 0;
}
