// BatchedTrainer: the local training of several clients of one architecture as one batched
// computation, with results equal to Trainer::train client by client up to float rounding.
//
// The simulator trains the K clients of a round one after another, each a chain of small
// matrix products; batched, the K weight sets are stacked along a leading client axis and every
// layer runs once for all of them: Linear layers as batched matrix products (baddbmm: weights
// [K, out, in]), convolutions as one grouped convolution (groups = K) over the clients' inputs
// concatenated on the channel axis, ReLU and max-pooling elementwise as they are. The clients'
// weights never mix: each group and each batch slice sees only its own client's weights and
// samples, so the gradient of sum_k (mean loss of client k) with respect to client k's weights is
// client k's own gradient.
//
// Each client keeps everything of its own that Trainer would: its shard and sample indices, its
// data order (std::mt19937_64(seed), reshuffled every pass), batch size and step count, learning
// rate, momentum, weight decay, FedProx prox_mu and SCAFFOLD controls (as per-client columns
// broadcast over the stacked tensors). When the clients' batches in a step differ in size (the
// short last batch of a pass, shards of other sizes, other batch sizes), the step's inputs are
// padded to the largest one with zero samples whose loss weight is 0, and each real sample
// weighs 1 / (its client's batch size): each client's loss is the mean over its own samples and
// padding adds nothing to any gradient. A client whose steps are done, or whose stop flag is
// set, leaves the batch before the next step: its result is read out and its rows are dropped
// from every stacked tensor, so it costs nothing further.
//
// Gradients come from autograd on the batched graph, and the SGD update is written out over the
// stacked tensors with the same formula as torch::optim::SGD's. On one CPU thread a batched
// product costs what its K products cost, and Trainer's manual-gradient path for logreg and mlp
// stays faster than this (docs/BENCHMARKS.md, "Batched clients"); batching is meant for a GPU,
// where K small kernels per layer become one. The same code runs on a CUDA device: each step's
// batch is gathered on the host and copied over once.
//
// What cannot be batched trains client by client through Trainer, with one log line per reason
// (once per process): TorchScript modules, models with buffers (BatchNorm), losses other than
// cross-entropy, regression targets, Adam/AdamW, precision bf16 (batches compute in fp32;
// Trainer's autocast does the bf16), a job Trainer would refuse (Trainer returns its
// error), and a batch LibTorch fails on (a shape or label that does not fit: each client then
// gets Trainer's own result or error).
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "client/trainer.h"
#include "common/data/dataset.h"
#include "common/model/model.h"
#include "common/status.h"

namespace fedfleet::client {

// One client's training in a batch: Trainer::train's arguments. The pointers must be non-null
// and outlive BatchedTrainer::train; `stop` may be null.
struct BatchedJob {
  const std::vector<float>* start = nullptr;
  const data::Dataset* data = nullptr;
  const std::vector<uint32_t>* indices = nullptr;
  TrainOptions options;
  const std::atomic<bool>* stop = nullptr;
};

class BatchedTrainer {
 public:
  explicit BatchedTrainer(c10::Device device);

  // Whether clients of `model` can train batched: a built-in "logreg", "mlp", "cnn" or "lenet"
  // with fp32 parameters, no buffers and the cross-entropy loss.
  static bool supportsModel(model::Model& model);

  // Trains jobs[k] for every k as Trainer(device).train(model, *start, *data, *indices, options,
  // stop) would, and returns the K results in the order of `jobs`: the same deltas, steps,
  // n_samples, mean_loss, sum_sq_loss, control deltas and stopped_early, up to float rounding.
  // `model` gives the architecture (its parameters' shapes and its loss); batched training
  // neither reads nor changes its weights, and leaves it where it is. The clients that train
  // client by client (see above) leave `model` as Trainer::train does. compute_seconds of a
  // batched client is its share of the batch's time: the time until it left the batch, over
  // the number of clients the batch started with.
  // Failures, per job: what Trainer::train returns for it. Stop flags are read before every
  // step, as Trainer reads them. Safe to call concurrently from several threads with different
  // models.
  std::vector<Result<TrainResult>> train(model::Model& model, const std::vector<BatchedJob>& jobs);

  const c10::Device& device() const { return device_; }

 private:
  c10::Device device_;
};

}  // namespace fedfleet::client
