// The rows of the run history, as plain structs: what the round engine produces and the
// history stores (common/history/history.h) keep. No storage code: the engine library
// (engine/) uses these without linking any store.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace fedfleet::history {

// Metrics beside loss and accuracy, by name in the order they were computed: "mse" and "mae" of
// a model with float targets, then the model's own metrics() (each a mean over samples). Stored
// as a JSON object ({"mse": 0.25, ...}; NULL when empty), schema version 8.
using Metrics = std::vector<std::pair<std::string, double>>;

struct RunRecord {
  int64_t run_id = 0;
  std::string name;
  std::string config_json;  // the full resolved configuration
  double started_at = 0;    // unix seconds
  uint64_t seed = 0;
  std::string clock = "wall";  // "wall": round and update times are unix seconds (a real
                               // coordinator); "virtual": seconds of simulated time from the
                               // start of the run (the fleet simulator)
  // The model the checkpoints' flat buffers belong to, as JSON (common/model/export.h): its
  // name, the input shape and classes it was built for, and every tensor's name, shape and
  // offset. "" in runs recorded before the column existed.
  std::string model_json;
};

struct RoundRecord {
  int64_t run_id = 0;
  uint32_t round = 0;
  double start_time = 0;  // when the round started, on the run's clock (see RunRecord::clock)
  double end_time = 0;
  double wall_start = 0;  // unix seconds when the round started and ended in real time (equal
  double wall_end = 0;    // to start/end_time for a real coordinator)
  uint32_t selected = 0;
  uint32_t completed = 0;
  uint32_t late = 0;
  uint32_t dropped = 0;
  uint32_t rejected = 0;
  std::string status = "ok";  // "ok", "failed" (quorum not met) or "initial" (round 0: the
                              // starting model, evaluated before any training)
  double train_loss = 0;      // sample-weighted mean of the clients' mean losses
  std::optional<double> test_loss;
  std::optional<double> test_accuracy;  // fraction in [0, 1]; none for a regression
  Metrics test_metrics;                 // the same evaluation's further metrics
  uint64_t bytes_up = 0;
  uint64_t bytes_down = 0;
  uint64_t model_version = 0;  // version after this round
  // Federated evaluation (coordinator.fed_eval_every): the models this round's tasks carried
  // (synchronous rounds: the model after the previous round), evaluated by the clients on
  // their held-out data before training. Over the completed updates that report one: how many,
  // their held-out samples, and the sample-weighted means of their losses and accuracies
  // (unset: none reported).
  uint32_t fed_eval_clients = 0;
  uint64_t fed_eval_samples = 0;
  std::optional<double> fed_eval_loss;
  std::optional<double> fed_eval_accuracy;  // fraction in [0, 1]
  // Each metric's sample-weighted mean over the updates that report it.
  Metrics fed_eval_metrics;
  // Differential privacy (dp.mode = "central"; unset without): epsilon spent by the model after
  // this round (at the run's dp.delta), and the L2 norm the round's updates were clipped to.
  std::optional<double> dp_epsilon;
  std::optional<double> dp_clip;
};

struct UpdateRecord {
  int64_t run_id = 0;
  uint32_t round = 0;
  std::string client_id;
  int32_t partition = -1;
  uint64_t n_samples = 0;
  uint64_t steps = 0;
  double loss = 0;
  double compute_s = 0;  // as the client reports it (the simulator: virtual compute time)
  double upload_s = 0;
  double start_time = 0;      // task sent, on the run's clock
  double end_time = 0;        // update completed, rejected, cancelled or lost, same clock
  double wall_compute_s = 0;  // real seconds of computation (the simulator measures it; a real
                              // client's compute_s is already real)
  std::string codec;          // codec of the upload's payloads ("none", "qsgd", "topk", ...;
                              // empty when nothing arrived)
  double encode_s = 0;        // the client's time compressing (as it reports it)
  double decode_s = 0;        // the coordinator's time decoding and folding its chunks
  double grant_wait_s = 0;    // upload credits: from the client's upload request to its grant
                              // (never granted: to the update's end; never asked: 0)
  uint64_t bytes_up = 0;
  uint64_t bytes_down = 0;
  double weight = 0;
  std::string status;  // "completed", "late", "dropped", "rejected"
  // Block-cyclic runs: the model the task told the client to serve (wire::ServedModel) and how
  // it did on the client's held-out data. served_block < 0: nothing served (no blocks).
  int32_t served_block = -1;
  std::string served_model;       // "shared", "pluralistic", "chain"
  uint64_t served_version = 0;    // the coordinator's model version when it was first sent
  std::string served_sha256_hex;  // SHA-256 of the served model's bytes
  uint64_t served_bytes = 0;      // served-model bytes sent with this task (0: the client had
                                  // it, or it was the task's own model); part of bytes_down
  uint64_t served_samples = 0;    // held-out samples it was evaluated on (0: not evaluated)
  std::optional<double> served_loss;
  std::optional<double> served_accuracy;
  // Federated evaluation: the task's model on the client's held-out data, before training
  // (eval_samples 0: not asked, or the client holds no held-out data).
  uint64_t eval_samples = 0;
  std::optional<double> eval_loss;
  std::optional<double> eval_accuracy;
  Metrics eval_metrics;
};

struct ClientRecord {
  std::string client_id;
  std::string public_key;
  std::string device_kind;  // "cpu" / "cuda"
  std::string device_name;
  uint32_t cores = 0;
  uint64_t memory_bytes = 0;
  uint64_t data_size = 0;
  double first_seen = 0;
  double last_seen = 0;
};

struct CheckpointRecord {
  int64_t run_id = 0;
  uint32_t round = 0;
  uint64_t model_version = 0;
  std::string sha256_hex;
  std::string blob;          // flat fp32 parameters
  std::string engine_state;  // the round engine's learned state (RoundEngine::saveState)
};

struct EventRecord {
  int64_t run_id = 0;  // 0 when not tied to a run
  double time = 0;     // unix seconds
  std::string kind;    // "auth_rejected", "malformed_frame", "stale_update", "error", ...
  std::string client_id;
  std::string detail;
};

// One evaluation of one block's model in a block-cyclic run (table
// block_metrics(run_id, round, block, model, accuracy, loss), schema version 4): the model
// ("shared", "pluralistic", "chain", or "served": the one block `block` is served) evaluated on
// block `block`'s test set at the end of the block that ended with `round`. block and model are
// read as text, whatever type the writer gave them (older files may hold a table of their own).
struct BlockMetricRecord {
  int64_t run_id = 0;
  uint32_t round = 0;
  std::string block;
  std::string model;
  std::optional<double> accuracy;  // fraction in [0, 1]
  std::optional<double> loss;
};

// Decentralised (peer-to-peer) runs. Such a run is a RunRecord like any other (its config_json
// is the resolved configuration: policy.mode "decentralized", and decentralized.algorithm,
// which `fedfleet report` labels it by), and its clock says
// whether the times below are virtual (the simulator) or real (peer processes). Instead of
// rounds it has one row per peer and iteration, and now and then an evaluation of the average
// of the peers' models (schema version 10). A run with either is what the report draws as
// decentralised.

// One iteration of one peer (table peer_iterations, primary key (run_id, peer, iteration)).
// The durations are what the peer spent in [t_start, t_end]; they need not add up to it
// (computation and transfers may overlap), and an iteration Hop skipped has skipped set and
// usually zero compute.
struct PeerIterationRecord {
  int64_t run_id = 0;
  uint32_t peer = 0;       // peer index 0..P-1
  uint64_t iteration = 0;  // the peer's own iteration counter
  double t_start = 0;      // seconds since the run's start (virtual time in the simulator)
  double t_end = 0;        // when the iteration's exchange finished
  double compute_s = 0;    // time computing (training) in this iteration
  double comm_s = 0;       // time sending/receiving
  double wait_s = 0;       // time blocked waiting for peers (neither computing nor transferring)
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint32_t exchanges = 0;  // peers exchanged with (neighbours averaged, group size - 1, ...)
  uint32_t staleness = 0;  // iterations between the model a gradient was computed on and the one
                           // it is applied to
  bool skipped = false;    // Hop: the iteration was skipped to catch up
};

// One evaluation of the average of the peers' models on the test set (table peer_evals).
struct PeerEvalRecord {
  int64_t run_id = 0;
  double time_s = 0;            // seconds since the run's start (virtual in the simulator)
  uint64_t iterations = 0;      // sum of all peers' iterations so far
  uint32_t peers_averaged = 0;  // how many peers' models were averaged for this evaluation
  double accuracy = 0;          // of the average model on the test set, in [0, 1]; NaN: none
                                // (a regression)
  double loss = 0;
};

}  // namespace fedfleet::history
