// Run configuration: TOML files with command-line overrides.
//
// One Config holds every section; each subcommand reads the sections it needs. Keys are
// "section.key" (for example "train.lr"). Loading rejects unknown sections and keys, values of
// the wrong type and out-of-range values with a message naming the key and the file, so a typo
// fails at start-up instead of being silently ignored. docs/CONFIG.md (README's config
// reference) lists every key; `Config::keys()` is the source of that list.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/config/choice.h"
#include "common/data/source.h"
#include "common/status.h"

namespace fedfleet::config {

// The values of the config keys that name one of a fixed set (common/config/choice.h).
enum class SampleFrom { kClients, kPartitions };          // coordinator.sample_from
enum class PolicyMode { kSync, kAsync, kDecentralized };  // policy.mode
enum class DeadlineKind { kFixed, kPercentile };          // policy.deadline
enum class AggregationMethod { kFedAvg, kFedNova, kScaffold, kMedian, kTrimmedMean, kCustom };
enum class ServerOptimizer { kFedAvg, kFedAvgM, kFedAdagrad, kFedAdam, kFedYogi };
enum class NormBoundAction { kClip, kReject };                 // aggregation.norm_bound_action
enum class SelectorKind { kUniform, kOort, kAvailability };    // selection.selector
enum class BlocksMode { kSingle, kPluralistic, kMultichain };  // blocks.mode
enum class DpMode { kNone, kCentral, kDistributed, kLocal };   // dp.mode
enum class SecAggMode { kNone, kSecAggPlus };                  // secagg.mode
enum class AvailabilityMode { kAlways, kDiurnal };             // sim.availability
enum class StragglerMode { kPartial, kDrop };                  // sim.straggler_mode
enum class ProgressMode { kAuto, kOn, kOff };                  // sim.progress
enum class Normalization { kNone, kFixed, kComputed };         // data.normalize
enum class DataTask { kClassification, kRegression };          // data.task
enum class PartitionScheme { kIid, kDirichlet, kLabels, kShards, kQuantity, kNone, kFiles };
enum class SimDevice { kCpu, kCuda };  // sim.device
// data.format and data.dataset: a data::DataFormat by its name, or "" (kUnset: data.format is
// not set and data.dataset says).
enum class DataFormatKey { kUnset, kFashionMnist, kIdx, kCsv, kTensors, kImageFolder, kSynthetic };

template <typename E, size_t N>
using NameTable = std::array<std::pair<E, std::string_view>, N>;
template <>
struct ChoiceNames<SampleFrom> {
  static constexpr NameTable<SampleFrom, 2> kNames{
      {{SampleFrom::kClients, "clients"}, {SampleFrom::kPartitions, "partitions"}}};
};
template <>
struct ChoiceNames<PolicyMode> {
  static constexpr NameTable<PolicyMode, 3> kNames{{{PolicyMode::kSync, "sync"},
                                                    {PolicyMode::kAsync, "async"},
                                                    {PolicyMode::kDecentralized, "decentralized"}}};
};
template <>
struct ChoiceNames<DeadlineKind> {
  static constexpr NameTable<DeadlineKind, 2> kNames{
      {{DeadlineKind::kFixed, "fixed"}, {DeadlineKind::kPercentile, "percentile"}}};
};
template <>
struct ChoiceNames<AggregationMethod> {
  static constexpr NameTable<AggregationMethod, 6> kNames{
      {{AggregationMethod::kFedAvg, "fedavg"},
       {AggregationMethod::kFedNova, "fednova"},
       {AggregationMethod::kScaffold, "scaffold"},
       {AggregationMethod::kMedian, "median"},
       {AggregationMethod::kTrimmedMean, "trimmed_mean"},
       // A Python strategy (fedfleet.Strategy), given to fedfleet.simulate or serve.
       {AggregationMethod::kCustom, "custom"}}};
};
template <>
struct ChoiceNames<ServerOptimizer> {
  static constexpr NameTable<ServerOptimizer, 5> kNames{
      {{ServerOptimizer::kFedAvg, "fedavg"},
       {ServerOptimizer::kFedAvgM, "fedavgm"},
       {ServerOptimizer::kFedAdagrad, "fedadagrad"},
       {ServerOptimizer::kFedAdam, "fedadam"},
       {ServerOptimizer::kFedYogi, "fedyogi"}}};
};
template <>
struct ChoiceNames<NormBoundAction> {
  static constexpr NameTable<NormBoundAction, 2> kNames{
      {{NormBoundAction::kClip, "clip"}, {NormBoundAction::kReject, "reject"}}};
};
template <>
struct ChoiceNames<SelectorKind> {
  static constexpr NameTable<SelectorKind, 3> kNames{
      {{SelectorKind::kUniform, "uniform"},
       {SelectorKind::kOort, "oort"},
       {SelectorKind::kAvailability, "availability"}}};
};
template <>
struct ChoiceNames<BlocksMode> {
  static constexpr NameTable<BlocksMode, 3> kNames{{{BlocksMode::kSingle, "single"},
                                                    {BlocksMode::kPluralistic, "pluralistic"},
                                                    {BlocksMode::kMultichain, "multichain"}}};
};
template <>
struct ChoiceNames<DpMode> {
  static constexpr NameTable<DpMode, 4> kNames{{{DpMode::kNone, "none"},
                                                {DpMode::kCentral, "central"},
                                                {DpMode::kDistributed, "distributed"},
                                                {DpMode::kLocal, "local"}}};
};
template <>
struct ChoiceNames<SecAggMode> {
  static constexpr NameTable<SecAggMode, 2> kNames{
      {{SecAggMode::kNone, "none"}, {SecAggMode::kSecAggPlus, "secagg_plus"}}};
};
template <>
struct ChoiceNames<AvailabilityMode> {
  static constexpr NameTable<AvailabilityMode, 2> kNames{
      {{AvailabilityMode::kAlways, "always"}, {AvailabilityMode::kDiurnal, "diurnal"}}};
};
template <>
struct ChoiceNames<StragglerMode> {
  static constexpr NameTable<StragglerMode, 2> kNames{
      {{StragglerMode::kPartial, "partial"}, {StragglerMode::kDrop, "drop"}}};
};
template <>
struct ChoiceNames<ProgressMode> {
  static constexpr NameTable<ProgressMode, 3> kNames{
      {{ProgressMode::kAuto, "auto"}, {ProgressMode::kOn, "on"}, {ProgressMode::kOff, "off"}}};
};
template <>
struct ChoiceNames<Normalization> {
  static constexpr NameTable<Normalization, 3> kNames{{{Normalization::kNone, "none"},
                                                       {Normalization::kFixed, "fixed"},
                                                       {Normalization::kComputed, "computed"}}};
};
template <>
struct ChoiceNames<DataFormatKey> {
  static constexpr NameTable<DataFormatKey, 7> kNames{
      {{DataFormatKey::kUnset, ""},
       {DataFormatKey::kFashionMnist, "fashion-mnist"},
       {DataFormatKey::kIdx, "idx"},
       {DataFormatKey::kCsv, "csv"},
       {DataFormatKey::kTensors, "tensors"},
       {DataFormatKey::kImageFolder, "image-folder"},
       {DataFormatKey::kSynthetic, "synthetic"}}};
};
template <>
struct ChoiceNames<PartitionScheme> {
  static constexpr NameTable<PartitionScheme, 7> kNames{{{PartitionScheme::kIid, "iid"},
                                                         {PartitionScheme::kDirichlet, "dirichlet"},
                                                         {PartitionScheme::kLabels, "labels"},
                                                         {PartitionScheme::kShards, "shards"},
                                                         {PartitionScheme::kQuantity, "quantity"},
                                                         {PartitionScheme::kNone, "none"},
                                                         {PartitionScheme::kFiles, "files"}}};
};
template <>
struct ChoiceNames<SimDevice> {
  static constexpr NameTable<SimDevice, 2> kNames{
      {{SimDevice::kCpu, "cpu"}, {SimDevice::kCuda, "cuda"}}};
};
template <>
struct ChoiceNames<DataTask> {
  static constexpr NameTable<DataTask, 2> kNames{
      {{DataTask::kClassification, "classification"}, {DataTask::kRegression, "regression"}}};
};

struct RunSection {
  std::string name = "fedfleet";  // run name recorded in the history
  uint64_t seed = 1;              // seeds sampling, model init, partitions, shuffling
  uint32_t rounds = 5;            // rounds to run (failed rounds count)
  double target_accuracy = 0;     // stop at the first evaluation reaching this (0: never)
};

struct CoordinatorSection {
  std::string bind = "tcp://127.0.0.1:7700";  // ROUTER bind address
  bool insecure = false;                      // plain text (no CURVE); logs a warning
  std::string keys_dir = "keys";              // holds coordinator.key / coordinator.key_secret
  std::string allow_dir;     // allowed client public keys (*.key); default <keys_dir>/clients
  uint32_t min_clients = 0;  // connected clients needed to start a round; 0: clients_per_round
  uint32_t clients_per_round = 2;  // K, sampled uniformly each round
  uint32_t quorum = 0;             // completed updates needed for a round to count; 0: ceil(K / 2)
  double deadline_s = 60;          // a round ends this long after its tasks were sent
  double liveness_s = 6;           // a client silent this long is treated as gone
  double wait_clients_s = 300;     // give up when min_clients are not connected for this long
  uint32_t max_failed_rounds = 5;  // end the run (exit 1) after this many failed rounds in a row
                                   // (0: never)
  Choice<SampleFrom> sample_from = "clients";  // "clients": each client trains its own partition;
                                               // "partitions": sample K of data.partitions, any
                                               // client trains the partition named in its task
  double server_lr = 1.0;               // eta_g
  uint32_t checkpoint_every = 1;        // rounds between checkpoints in the history (0: never)
  uint32_t keep_checkpoints = 3;        // checkpoints kept per run (the latest)
  bool keep_best = true;                // and the one of the best test accuracy
  uint32_t chunk_kib = 1024;            // upload chunk size asked of clients
  bool resume = false;                  // continue the latest run of this name from its checkpoint
  bool resume_changes = false;          // resume: accept a config that changes the run's meaning
                                        // (recorded as a resume_changes event with the diff)
  uint32_t threads = 1;                 // LibTorch threads for server-side evaluation (it overlaps
                                        // the clients' training, so one thread avoids contention)
  std::string codec = "none";           // codec every task asks for (common/compress/codec_spec.h)
  std::string slow_link_codec;          // codec for clients whose measured uplink is below
  double slow_link_mbps = 0;            // slow_link_mbps (empty: the same codec for all)
  uint32_t partial_buffer_mib = 64;     // round's kept uploads in memory; beyond: a temp file
  uint32_t eval_every = 1;              // evaluate the model every this many rounds (and last)
  uint32_t fed_eval_every = 0;          // the clients evaluate the model they get on their held-out
                                        // data every this many rounds (0: never)
  uint32_t fed_eval_clients = 0;        // of a round's clients, how many do (0: all)
  uint32_t max_concurrent_uploads = 0;  // upload credits: clients sending chunks at once (FIFO
                                        // grants; 0: unbounded)
  double upload_idle_s = 30;            // with upload credits: a granted upload silent this
                                        // long loses its credit (rejected; 0: never)
  uint32_t max_message_mib = 0;  // largest frame a client may send (1-256); a bigger one closes
                                 // its connection (logged and counted). 0: the largest frame an
                                 // honest client of this config sends (clientFrameLimitBytes)
  // Connections before they authenticate (common/transport/connection_admission.h): at most
  // this many at once (random early drop from half of it), this many from one address, each
  // given this long for its handshake (and twice that for its first message); and at most this
  // many connections of one key.
  uint32_t max_unauthenticated = 256;
  uint32_t max_unauthenticated_per_host = 64;
  double handshake_timeout_s = 5;
  uint32_t max_connections_per_key = 4;
  uint64_t max_samples_per_update = 1000000;  // the most samples an update may claim when its
                                              // partition's size is unknown (0: no bound, only
                                              // with partition sizes known)
};

// How rounds treat slow clients (engine/round_engine.h).
struct PolicySection {
  Choice<PolicyMode> mode = "sync";  // sync (rounds with a deadline), async (FedBuff),
                                     // decentralized (peers, no central model: [decentralized])
  Choice<DeadlineKind> deadline = "fixed";  // fixed (coordinator.deadline_s), percentile (of recent
                                            // task durations, at most coordinator.deadline_s)
  double deadline_percentile = 0.9;
  uint32_t deadline_window = 5;     // rounds of durations the percentile looks at
  double deadline_slack = 1.2;      // the percentile times this
  double over_selection = 0;        // select ceil(K (1 + b)), aggregate the first K
  bool partial_work = false;        // clients stop before the deadline and send what they did
  bool adaptive_steps = false;      // size each client's local steps to its measured speed
  double adaptive_target = 0.8;     // ... to finish at this fraction of the deadline
  double adaptive_max_factor = 1;   // ... doing at most this many times the configured work
  uint32_t async_concurrency = 10;  // async: clients training at once (C)
  uint32_t async_buffer = 5;        // async: updates per server step (K)
  uint32_t max_staleness = 10;      // async: staler updates are rejected
};

// How updates become the next model.
struct AggregationSection {
  Choice<AggregationMethod> method = "fedavg";  // fedavg, fednova, scaffold, median, trimmed_mean
  double trim_fraction = 0.1;     // trimmed_mean: dropped at each end
  double clip_norm = 0;           // clip each update's L2 norm to this before averaging (0: off)
  Choice<ServerOptimizer> server_optimizer =
      "fedavg";                             // fedavg, fedavgm, fedadagrad, fedadam, fedyogi
                                            // (learning rate: coordinator.server_lr)
  double server_momentum = 0.9;             // fedavgm
  double beta1 = 0.9;                       // adaptive optimisers
  double beta2 = 0.99;
  double tau = 1e-3;
  uint32_t buffer_mib = 256;  // median, trimmed_mean: updates kept in memory; beyond: a
                              // temporary file
  double norm_bound = 5;      // an update's L2 norm above this x the reference norm is
                              // clipped or rejected (0: off)
  Choice<NormBoundAction> norm_bound_action = "clip";  // clip, reject
  // The reference norm: the lower median of the last norm_window rounds' median norms, growing
  // by at most norm_growth a round (engine/norm_reference.h).
  uint32_t norm_window = 5;
  double norm_growth = 2;
  // A client the norm bound flagged (clipped or rejected) in quarantine_after of its rounds in a
  // row is not sampled for quarantine_rounds rounds (either 0: off).
  uint32_t quarantine_after = 2;
  uint32_t quarantine_rounds = 10;
  double weight_cap = 10;                  // no update weighs more than this x the round's median
                                           // sample count (0: off)
};

// Bounds on what one client can make the coordinator record.
struct LimitsSection {
  uint32_t events_per_client_round = 20;  // event rows per client and round; then one row
                                          // "events_left_out" with the count
  double max_loss = 1e6;                  // a summary's losses must lie in [0, max_loss]
  // Event rows per client in time: this many at once, then one every events_every_s seconds
  // (the engine's rows, and the coordinator's own rows about a key, each within such a budget;
  // either 0: none in time).
  double events_burst = 30;
  double events_every_s = 10;
};

// Which clients a round samples (engine/selector.h).
struct SelectionSection {
  Choice<SelectorKind> selector = "uniform";  // uniform, oort, availability
  double explore_initial = 0.9;        // oort: exploration fraction eps at first
  double explore_decay = 0.98;         // oort: eps multiplied by this every round
  double explore_min = 0.2;            // oort: floor of eps
  double alpha = 2;                    // oort: duration penalty exponent
  double preferred_duration_s = 0;     // oort: preferred round duration T (0: median seen)
  double cutoff = 0.95;                // oort: exploit among utilities >= cutoff x the cut-off
  uint32_t pacer_window = 20;          // oort: rounds per pacer window
  double pacer_step_s = 0;             // oort: pacer raises T by this (0: 10%)
  double expected_round_s = 0;         // availability: a client should stay online this long
                                       // (0: estimated from completed tasks)
  uint32_t recent_failure_rounds = 5;  // availability: recent failures are taken last
};

struct ModelSection {
  std::string name = "mlp";  // logreg, mlp, cnn, lenet, torchscript
  std::string path;          // TorchScript file when name = "torchscript"
  std::string init;  // start from these weights (a file `fedfleet model export` wrote); "": seed
  // Name patterns (fnmatch globs) of parameters and buffers each client keeps to itself, out
  // of aggregation (FedBN: ["*bn*"]; FedPer: ["head.*"]); []: everything is federated.
  std::vector<std::string> local;
};

struct DataSection {
  Choice<DataFormatKey> dataset = "fashion-mnist";  // the older name of `format` (used when
                                                    // format is "")
  Choice<DataFormatKey> format =
      "";              // fashion-mnist, idx, csv, tensors, image-folder or synthetic (FedProx's
                       // Synthetic(alpha, beta)); "": data.dataset. The file formats: split
                       // by the simulator, or each client's own (data.partition = "none")
  std::string dir;     // fashion-mnist's IDX files; default: the dataset-fashion-mnist package
  std::string path;    // idx: training images; csv, tensors: the training file; image-folder:
                       // the training folder (root/<class name>/<image>)
  std::string labels_path;             // idx: training labels
  std::string test_path;               // idx: test images; csv, tensors: the test file;
                                       // image-folder: the test folder
  std::string test_labels_path;        // idx: test labels
  std::string label_column = "label";  // csv: the column of class ids (regression: targets)
  // "classification" (class labels) or "regression" (float targets: a csv label column of
  // numbers, a tensors file's float "y"; train.loss mse or bce).
  Choice<DataTask> task = "classification";
  // Classes of the labels (0: from the data, its largest label + 1). Client processes that
  // train their own files (data.partition = "none") and the coordinator must agree on it for a
  // built-in model, whose output size it is.
  uint32_t num_classes = 0;
  std::vector<std::string> feature_columns;  // csv: feature columns ([]: all but the label)
  uint32_t image_channels = 1;               // image-folder: 1 (grey) or 3 (RGB)
  // image-folder: [rows, cols] every image is resampled to (an integer n: [n, n]); []: the
  // first training image's size.
  std::vector<uint32_t> image_size;
  double holdout_fraction = 0;  // files without a test file: the share held out for testing
  // Feature normalisation of csv, tensors and image-folder data: x <- (x - mean) / std per
  // channel (shaped samples: the first dimension; plain vectors: per feature, or one value for
  // all). "none"; "fixed": data.mean and data.std as given; "computed" (simulator): from the
  // training data, and the values used are recorded in the run's config as data.mean/data.std.
  Choice<Normalization> normalize = "none";
  std::vector<double> mean;
  std::vector<double> stddev;           // key data.std
  Choice<PartitionScheme> partition = "dirichlet";  // iid, dirichlet, labels, shards, quantity
  double alpha = 0.5;                   // Dirichlet concentration (dirichlet, quantity)
  uint32_t labels_per_client = 2;       // for partition = "labels"
  uint32_t shards_per_client = 2;       // for partition = "shards" (FedAvg: 2 of 300 samples)
  double synthetic_alpha = 1;           // synthetic: spread of the per-device models
  double synthetic_beta = 1;            // synthetic: spread of the per-device inputs
  bool synthetic_iid = false;           // synthetic: FedProx's IID variant
  uint32_t synthetic_dim = 60;          // synthetic: input dimension
  uint64_t max_samples = 0;             // synthetic: cap on a device's samples (0: none)
  uint32_t eval_devices = 1000;         // synthetic: the server evaluates on the test splits
                                        // of this many devices (the first ones)
  uint32_t partitions = 0;              // number of partitions; 0: min_clients
  uint32_t train_subset = 0;            // use the first N training samples (0: all)
  uint32_t test_subset = 0;             // evaluate on the first N test samples (0: all 10k)
};

struct TrainSection {
  uint32_t epochs = 1;
  uint32_t steps = 0;  // if > 0: local steps instead of epochs
  uint32_t batch = 32;
  double lr = 0.05;
  double momentum = 0;
  std::string optimizer = "sgd";  // sgd, adam or adamw (momentum: SGD only)
  // cross_entropy (classification), mse (regression), bce (0/1 labels or targets in [0, 1]),
  // or module: the TorchScript model's own loss(output, target) method.
  std::string loss = "cross_entropy";
  double weight_decay = 0;
  double prox_mu = 0;  // FedProx proximal term mu (0: off)
};

struct ClientSection {
  std::string coordinator = "tcp://127.0.0.1:7700";  // coordinator address
  std::string id;                                    // client id; default: the key name or host-pid
  std::string keys_dir = "keys";   // holds <id>.key / <id>.key_secret and coordinator.key
  std::string device = "auto";     // auto, cpu, cuda
  uint32_t threads = 1;            // LibTorch intra-op threads
  int64_t partition = -1;          // ask for this partition (-1: coordinator assigns)
  double heartbeat_s = 1;          // heartbeat period
  double exit_idle_s = 0;          // exit when the coordinator is silent this long (0: never)
  double upload_mbps = 0;          // emulate an uplink of this many Mbit/s (0: unthrottled)
  uint32_t upload_burst_kib = 64;  // token-bucket depth of that emulated uplink
  bool upload_pipelined = true;    // encode chunk i+1 while chunk i is sent (false: encode all,
                                   // then send; the benchmark's baseline)
  bool compress_on_gpu = true;     // training on a CUDA device: compress there, on its own stream
  std::string residual_storage = "fp32";  // error-feedback residual: fp32, bf16, fp16
  std::string local_state;     // model.local: file keeping this client's local part ("": memory)
  std::string scaffold_state;  // SCAFFOLD: file keeping c_k across restarts ("": none)
  std::string scaffold_storage = "fp32";  // SCAFFOLD: c_k held as fp32, bf16 or fp16
  std::string served_model_path;          // blocks: publish the served model here (and <path>.json;
                                          // written atomically; "": memory only)
  double local_dp_min_noise = 0;          // refuse tasks without local DP of at least this noise
                                          // multiplier z (0: off; docs/PRIVACY.md)
};

// The fleet simulator (`fedfleet sim`). The run, coordinator, model, data and train sections
// mean the same as for a real coordinator; these keys describe the simulated fleet.
struct SimSection {
  uint64_t clients = 1000;        // registered virtual clients (each its own data and profile)
  std::string fleet = "uniform";  // uniform, mobile-mix, or a CSV file of tiers (docs/SIM.md)
  Choice<AvailabilityMode> availability = "always";  // always, diurnal
  double online_hours = 0;                // diurnal: hours online a day (0: each tier's own)
  double dropout = -1;                    // per-task dropout probability (-1: each tier's own)
  double rejoin_s = 600;                  // a client that dropped out is back after this long
  double reference_gflops = 2;            // training FLOP/s (x 1e9) of a speed-1 device
  uint32_t workers = 0;                   // training threads (0: one per core)
  Choice<ProgressMode> progress = "auto";  // auto (a bar on a terminal), on, off
  std::string residual_storage = "bf16";  // error-feedback residual of each virtual client
  // The rate at which the coordinator takes in one granted upload, Mbit/s (0: unlimited): each
  // upload's frames arrive at the lower of this and the client's uplink. With upload credits
  // (coordinator.max_concurrent_uploads) it bounds how fast a round's uploads drain.
  double coordinator_ingress_mbps = 0;
  // Systems heterogeneity as in FedProx's experiments: this fraction of the tasks (drawn per
  // client and round) are stragglers that manage only a random 1..E-1 of the E local epochs.
  double stragglers = 0;
  // Testing and benchmarks only: this fraction of the virtual clients (the first
  // round(attackers x clients) of them) attack, every time they upload, as sim.attack says:
  // "constant:V" (V everywhere), "scaled:F" (their honest update x F), "signflip:F" (x -F), or
  // "inside_bound" (a constant update of norm just inside the coordinator's norm bound).
  double attackers = 0;
  std::string attack = "constant:1e20";
  Choice<StragglerMode> straggler_mode =
      "partial";  // partial: they send that work; drop: they never
                  // report (late at the deadline), as FedAvg drops them
  // Where virtual clients train and the server evaluates: cpu, or cuda (the first GPU; start-up
  // fails when this process, or an MPI rank, sees none).
  Choice<SimDevice> device = "cpu";
  // Local training's arithmetic: fp32, or bf16 (mixed precision: autocast runs the matrix
  // products and convolutions in bf16, weights and optimiser stay fp32; client/trainer.h). For
  // hardware with fast bf16 (AVX-512 BF16 / AMX CPUs, GPUs); elsewhere slower.
  std::string precision = "fp32";
  // Train a round's clients batched (client/batched_trainer.h): the tasks dispatched together
  // are split into one batch per worker, each trained as one batched computation. Results equal
  // per-client training up to float rounding, so a history differs from an unbatched one in the
  // last bits; off by default. The MPI backend trains per client whatever this says.
  bool batch_clients = false;
  // Decentralised runs (policy.mode = "decentralized"): this fraction of the peers (the
  // highest ids) compute slow_factor times slower for the whole run, and every iteration of a
  // peer is slowed by slowdown_factor with probability slowdown_probability for slowdown_s
  // virtual seconds (transient slowdowns; seeded by run.seed).
  double slow_fraction = 0;
  double slow_factor = 1;
  double slowdown_probability = 0;
  double slowdown_factor = 1;
  double slowdown_s = 0;
  // Decentralised runs: peers that leave for good (docs/SIM.md). peer_fail_at lists
  // "peer:virtual seconds" pairs ("3:12.5,7:40"); peer_failures instead draws that many distinct
  // peers (seeded by run.seed) leaving at times uniform over the run's expected length. The
  // others declare a leaver down coordinator.liveness_s later (the real peers' heartbeat
  // timeout). At most one of the two.
  std::string peer_fail_at;
  uint32_t peer_failures = 0;
};

// Decentralised training (policy.mode = "decentralized"; peer/peer_engine.h): peers train on
// their own shards and exchange with each other; no central model.
struct DecentralizedSection {
  std::string algorithm = "allreduce";  // allreduce, dpsgd, adpsgd, prague, hop, local
  uint32_t peers = 16;                  // P peers (each one data shard of data.partitions)
  uint64_t iterations = 100;            // per peer (0: until time_budget_s)
  double time_budget_s = 0;             // stop at this virtual time (0: iterations alone)
  double eval_every_s = 10;             // evaluate the peers' average model this often
  uint32_t pipeline = 1;                // allreduce: 1, or 2 (Pipe-SGD's one-step-stale overlap)
  std::string codec = "none";           // allreduce and local: codec inside the all-reduce
  std::string topology = "ring";        // dpsgd, adpsgd, hop: ring, torus, random
  uint32_t degree = 4;                  // random: d of the d-regular graph
  uint32_t group_size = 4;              // prague: peers per group
  uint32_t group_buffer = 4;            // prague: groups generated per Group Buffer batch
  uint32_t hop_bound = 2;               // hop: iteration gap bound
  uint32_t hop_backup = 0;              // hop: backup workers (proceed on n - b neighbours)
  uint32_t local_steps = 8;             // local: H inner steps per averaging
  double outer_lr = 0.7;                // local: outer Nesterov learning rate (DiLoCo)
  double outer_momentum = 0.9;          // local: outer momentum
  uint32_t steps_per_iteration = 1;     // local steps of one iteration (all but local)
  double mbps = 0;                      // simulator: every link's bandwidth, Mbit/s (0: fleet's)
  double latency_ms = -1;               // simulator: every link's latency (-1: fleet's)
};

struct HistorySection {
  std::string db = "fedfleet.db";
};

// Live metrics of a coordinator (coordinator/metrics_server.h): GET /metrics in Prometheus text
// format and GET /status as JSON, over plain HTTP.
struct MetricsSection {
  uint32_t port = 0;               // TCP port of the endpoint; 0: no endpoint
  std::string bind = "127.0.0.1";  // address to listen on (loopback: only this host may read)
};

// Block-cyclic data (engine/block_models.h; docs/ARCHITECTURE.md): a cycle of `count`
// blocks; in block m only the clients of block m train (data partition p lives in block
// p mod count) and their data favour block m's group of classes.
struct BlocksSection {
  uint32_t count = 0;                 // M blocks in a cycle (0: off)
  uint32_t rounds_per_block = 0;      // block length in rounds (set this or block_s)
  double block_s = 0;                 // block length in seconds of the run's clock (virtual in the
                                      // simulator, unix time on a real coordinator)
  double anchor_s = 0;                // block_s: block 0 starts at this time (mod count * block_s)
  Choice<BlocksMode> mode = "single";  // single, pluralistic, multichain
  double skew = 0.8;                  // fraction of a block's data from its own class group
  double overlap = 0;                 // fraction of clients also available in the next block
  uint32_t validation_samples = 500;  // per-block validation set (multichain's choice)
  uint32_t test_samples = 1000;       // per-block test set (block_metrics accuracy)
  double synthetic_shift = 1;  // synthetic data: block m's devices draw u_k, B_k around m x this
};

// Differential privacy of the trained model (engine/central_dp.h; docs/PRIVACY.md).
struct DpSection {
  Choice<DpMode> mode = "none";   // none, central (DP-FedAvg: the coordinator clips and noises),
                                  // distributed (the clients do, under secure aggregation) or
                                  // local (each client's update on its own)
  double noise_multiplier = 1.0;  // z: noise standard deviation over the clip norm
  double clip_norm = 1.0;         // updates clipped to this L2 norm (adaptive: the first clip)
  bool adaptive_clip = false;     // clip tracks target_quantile of the update norms
  double target_quantile = 0.5;   // adaptive: fraction of updates left unclipped
  double clip_lr = 0.2;           // adaptive: geometric learning rate of the clip
  double count_stddev = 0;        // adaptive: noise of the unclipped count (0: clients/round / 20)
  double delta = 1e-5;            // the delta of the (epsilon, delta) the history reports
  double target_epsilon = 0;      // > 0: the run stops before epsilon exceeds this
  uint64_t population = 0;        // clients sampled from (0: the run's partitions / clients)
};

// Secure aggregation of the clients' updates (engine/secure_aggregation.h; docs/PRIVACY.md).
struct SecAggSection {
  Choice<SecAggMode> mode = "none";  // none, secagg_plus (the coordinator sees only the masked sum)
  uint32_t neighbours = 0;      // k, the neighbour graph's degree (0: 2 ceil(log2 n))
  uint32_t threshold = 0;       // t, shares that rebuild a secret (0: floor((k + 1) / 2) + 1)
  double clip_range = 8.0;      // each weighted update value clipped to [-clip_range, clip_range]
  uint32_t quant_range = 0;     // integer levels of the quantisation (0: the most that fit)
  double stage_timeout_s = 30;  // how long a key or unmasking stage waits for the clients
};

struct Config {
  RunSection run;
  CoordinatorSection coordinator;
  PolicySection policy;
  AggregationSection aggregation;
  SelectionSection selection;
  ModelSection model;
  DataSection data;
  TrainSection train;
  ClientSection client;
  SimSection sim;
  DecentralizedSection decentralized;
  HistorySection history;
  MetricsSection metrics;
  BlocksSection blocks;
  LimitsSection limits;
  DpSection dp;
  SecAggSection secagg;

  // Reads a TOML file over the current values. Unknown keys, wrong types and parse errors
  // return kInvalidArgument naming the file, line and key; the Config may then be partly set.
  Status loadFile(const std::string& path);
  // Parses TOML text (the same rules; `origin` names it in messages).
  Status loadString(const std::string& toml_text, const std::string& origin);
  // Reads a Config::toJson() object over the current values (a stored run's configuration;
  // `origin` names it in messages): the same checks as a TOML file, keys it lacks left as they
  // are.
  Status loadJson(const nlohmann::json& json, const std::string& origin);
  // Applies one override "section.key=value"; the value is TOML ("0.1", "true", "\"text\"";
  // a bare word that is not a number or boolean is taken as a string).
  Status set(const std::string& assignment);

  // Checks ranges and cross-field rules (for example quorum <= clients_per_round).
  Status validate() const;
  Status validatePolicy() const;         // the [policy] section (part of validate())
  Status validateAggregation() const;    // the [aggregation] section (part of validate())
  Status validateBlocks() const;         // the [blocks] section (part of validate())
  Status validateDp() const;             // the [dp] section's names (ranges: the engine's check)
  Status validateSecAgg() const;         // the [secagg] section's names (ranges: the engine's)
  Status validateDecentralized() const;  // [decentralized] and the [sim] slowdown keys

  // Effective values after defaults are resolved.
  uint32_t minClients() const;
  uint32_t quorum() const;
  uint32_t partitions() const;
  // The data section alone (validate() runs it).
  Status validateDataSource() const;
  // data.format, or data.dataset when format is "" (fashion-mnist when neither is set, which
  // validate() refuses).
  data::DataFormat dataFormat() const;
  // Its name ("csv"), as the config spells it.
  std::string dataFormatName() const;
  // Whether the data come from files the user names (data.format idx, csv, tensors or
  // image-folder).
  bool readsDataFiles() const { return data::readsUserFiles(dataFormat()); }
  std::string allowDir() const;
  // The largest frame an honest client of this config sends: a chunk of coordinator.chunk_kib
  // with its codec header and message around it, or a secure-aggregation message for
  // secagg.neighbours, whichever is larger.
  uint64_t honestClientFrameBytes() const;
  // The coordinator's frame limit, in bytes: coordinator.max_message_mib, or when it is 0
  // honestClientFrameBytes() rounded up to a whole MiB. The transport refuses a larger frame at
  // its header and the wire decoder is given the same limit.
  uint64_t clientFrameLimitBytes() const;

  nlohmann::json toJson() const;
  // Every key as a TOML file that loadFile() reads back to an equal configuration (sections
  // and keys in alphabetical order).
  std::string toToml() const;
  // Every "section.key" with its default value's type, in order.
  static std::vector<std::string> keys();
};

}  // namespace fedfleet::config
