// Trainer: local SGD on one client's shard, from a given flat model, to a delta and statistics.
//
// Pure computation (no I/O, no clock other than measuring itself): the client runtime calls it
// with the model of a task, the simulator calls it directly for each virtual client. The result
// carries what the coordinator needs for FedAvg/FedNova (delta, n, steps) and for Oort
// (mean loss, sum of squared per-sample losses). FedProx's proximal term and SCAFFOLD's
// control-variate correction are options of the same SGD;
// with SCAFFOLD the result also holds the control update Dc_k (see takeUpload for the upload).
//
// Batches: on the CPU each step gathers its samples through a lookup table straight into a
// reused float buffer (no allocation per step). On a GPU the whole shard goes over once per call
// as bytes, each epoch's permutation once per epoch, and each step gathers and normalises on the
// device, so the host never waits inside an epoch. Feature-vector data sets
// (data::Dataset::hasFeatures()) take the same two paths with float rows copied as they are
// (no normalisation). Per-sample losses stay on the device and are read once at the end.
//
// Gradients: the built-in fully connected models ("logreg", "mlp") on the CPU take a fast path
// by default, without autograd: the forward pass, cross-entropy, backward pass and the SGD
// update are written out over ATen matrix products (out= calls into buffers allocated once per
// call) and plain loops, which costs a fraction of autograd + torch::optim::SGD per step on the
// small batches of a simulated fleet. Everything else (cnn, lenet, TorchScript, a GPU) goes
// through autograd. Both paths compute the same function up to float rounding.
//
// Precision: fp32 by default. TrainOptions::precision = kBf16 is mixed precision through
// LibTorch's autocast (on the CPU, or on CUDA for a CUDA trainer): each step's forward pass runs
// its matrix products and convolutions in bf16, the logits are cast back to fp32 for the loss,
// and the backward pass follows the forward's types; the weights, their gradients and the
// optimiser stay fp32 (the master weights). The manual-gradient path has no bf16: with kBf16
// "logreg" and "mlp" train through autograd. Worth it only where bf16 is fast (CPUs with
// AVX-512 BF16 or AMX, GPUs); elsewhere it is slower than fp32.
//
// Unlike common/model/*.h, this header includes <torch/torch.h>: client code that trains speaks
// LibTorch (torch::Device, torch::set_num_threads) and gets it from here.
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "common/data/dataset.h"
#include "common/model/model.h"
#include "common/status.h"
#include "common/wire/messages.h"

namespace fedfleet::client {

// SCAFFOLD's control variates for one train() call: both point at start.size() values in the
// model's flat layout and must outlive the call.
struct ScaffoldControls {
  const std::vector<float>* c = nullptr;   // the server's control variate c (Task::control_bytes)
  const std::vector<float>* ck = nullptr;  // this client's control variate c_k
};

// The task's local SGD settings (wire::LocalSgd): max_steps > 0 is exactly this many steps
// (passes repeat as needed; epochs unused); seed seeds the per-epoch shuffle
// (std::mt19937_64); FedProx makes every gradient g into g + prox_mu (w - start) (>= 0; 0:
// off); Adam and AdamW train through autograd (the manual-gradient path is SGD's).
struct TrainOptions : wire::LocalSgd {
  // SCAFFOLD (option II) when both are set: every gradient g becomes g - c_k + c, and the result
  // carries control_delta. Both null: off. (Corrections apply before weight decay and momentum.)
  ScaffoldControls scaffold;
  // Leave the delta on the model's device (result.device_delta, for compress::DeviceCompressor)
  // instead of copying it to result.delta, when that device is a CUDA device and SCAFFOLD is
  // off; ignored otherwise.
  bool delta_on_device = false;
  // kBf16: mixed precision (see above); kFp32 computes exactly as before the option existed.
  wire::Precision precision = wire::Precision::kFp32;

  bool usesScaffold() const { return scaffold.c != nullptr || scaffold.ck != nullptr; }
  // Where SCAFFOLD's correction c - c_k goes. Plain SGD (no momentum): into every gradient,
  // y <- y - lr (g + c - c_k), the paper's step. With momentum or an adaptive optimiser: after
  // the optimiser's step, on the weights, y <- y - lr (c - c_k), outside the momentum buffer,
  // as NIID-Bench's reference code does (and its published table was made with): added to the
  // gradient, momentum rho would amplify it about 1 / (1 - rho) times, while the control
  // variate's update assumes K steps of lr (c - c_k). The two are the same step without
  // momentum (weight decay acts on w alone either way).
  bool scaffoldAfterStep() const {
    return usesScaffold() && (momentum != 0 || optimizer != wire::Optimizer::kSgd);
  }
};

// The order in which a trainer visits a shard of m samples: a fresh permutation of 0..m-1 for
// each pass, drawn by std::shuffle from one std::mt19937_64 seeded with TrainOptions::seed.
// Trainer and BatchedTrainer use it, and the Python package's Task.batches hands a custom
// training loop the same batches.
class PassOrder {
 public:
  PassOrder(uint64_t seed, size_t m) : rng_(seed), order_(m) {}
  // The next pass's permutation (valid until the next call).
  const std::vector<int64_t>& next() {
    std::iota(order_.begin(), order_.end(), int64_t{0});
    std::shuffle(order_.begin(), order_.end(), rng_);
    return order_;
  }
  const std::vector<int64_t>& current() const { return order_; }

 private:
  std::mt19937_64 rng_;
  std::vector<int64_t> order_;
};

// SCAFFOLD's control delta (TrainResult::control_delta) after `steps` steps of rate `lr` that
// moved the first `parameter_values` values of the model by delta[0..): -c - delta / (K lr)
// there, 0 for the buffers after them and everywhere when no step was taken.
// The values of a flat layout that are parameters (they come first; the buffers follow them).
size_t parameterValues(const model::Layout& layout);
std::vector<float> scaffoldControlDelta(const std::vector<float>& c,
                                        const std::vector<float>& delta, uint64_t steps, float lr,
                                        size_t parameter_values);

// The options a task's hyper-parameters ask for (the client runtime and the simulator alike):
// everything but the SCAFFOLD controls, which the caller points at its c and c_k when
// hp.scaffold is set.
TrainOptions trainOptionsFrom(const wire::HyperParams& hp);

struct TrainResult {
  std::vector<float> delta;  // final flat parameters - start, in the model's layout
  // With TrainOptions::delta_on_device on a CUDA device: the same values as one contiguous fp32
  // tensor there, and `delta` is empty. Every kernel writing it has finished on return, so
  // work on any stream may read it.
  at::Tensor device_delta;
  uint64_t n_samples = 0;  // samples processed (a sample seen in two epochs counts twice)
  uint64_t steps = 0;      // optimizer steps taken
  double mean_loss = 0;    // mean per-sample loss (the model's) over the processed samples
  double sum_sq_loss = 0;  // sum over processed samples of the squared per-sample loss
  double compute_seconds = 0;
  bool stopped_early = false;  // the stop flag ended training before the planned steps
  // SCAFFOLD only (empty otherwise): Dc_k = c_k_new - c_k, where after K = steps steps of rate
  // lr from x_t = start to y, c_k_new = c_k - c + (x_t - y) / (K lr), i.e.
  // Dc_k = -c - delta / (K lr); all zeros when no step was taken (K = 0: c_k stays).
  std::vector<float> control_delta;
};

// The update a client uploads for `result` (wire::Task): the delta alone, or, for a SCAFFOLD
// task, the delta followed by the control delta (2P values). Moves out of `result`. A SCAFFOLD
// result is one whose control_delta is non-empty; its size must equal the delta's (checked).
// Cut it with planUploadChunks(model.layout(), chunk_bytes, /*scaffold=*/2P values long)
// (client/upload_pipeline.h). One virtual client's SCAFFOLD round in the simulator:
//   std::vector<float> ck = control_variate.values();        // client/control_variate.h
//   opts.scaffold = {&c, &ck};                               // c: the task's control_bytes
//   TrainResult r = trainer.train(model, x_t, ds, indices, opts).value();
//   control_variate.apply(r.control_delta);                  // once the update is delivered
//   std::vector<float> upload = takeUpload(r);               // D_k, then Dc_k
std::vector<float> takeUpload(TrainResult& result);

class Trainer {
 public:
  // How batches reach the device. kAuto: kHostGather on the CPU, kDeviceShard elsewhere. The
  // two give bit-identical inputs; forcing kDeviceShard on the CPU lets CPU-only tests cover it.
  enum class BatchSource { kAuto, kHostGather, kDeviceShard };

  // How gradients and the SGD step are computed. kAutograd: LibTorch autograd and
  // torch::optim::SGD, for any model. kManual: hand-written forward, backward and update for the
  // models supportsManualGradients() accepts; the same SGD (d = g + weight_decay * w; momentum
  // buffer d on the first step, momentum * buf + d after; w -= lr * buf, or lr * d without
  // momentum), so results agree with kAutograd up to float rounding (not bit for bit). kAuto:
  // kManual where supported, else kAutograd.
  enum class GradientPath { kAuto, kAutograd, kManual };

  explicit Trainer(c10::Device device, BatchSource source = BatchSource::kAuto,
                   GradientPath gradients = GradientPath::kAuto);

  // Local SGD from `start` (flat parameters in the layout of `model`): sets the model to
  // `start`, then runs `opts.epochs` passes over `indices` of `ds` (or exactly opts.max_steps
  // steps when > 0) in minibatches of opts.batch_size (the last batch of a pass may be smaller),
  // reshuffled at the start of every pass with std::mt19937_64(opts.seed), with
  // torch::optim::SGD(lr, momentum, weight_decay) on the mean cross-entropy of each batch, each
  // gradient first corrected by FedProx's prox_mu (w - start) and SCAFFOLD's c - c_k when asked
  // (both paths alike; with neither, no step does any extra work). The
  // model is moved to this trainer's device first if it is elsewhere, is in train mode while
  // training, and is left holding the trained parameters in its previous train/eval mode.
  // `stop`, when non-null, is read before every step; once true, training ends after the step
  // in progress, and the result holds the work done with stopped_early = true. Same inputs and
  // seed on the CPU give a bit-identical result (with the same LibTorch thread count and
  // gradient path).
  // Failures: start.size() != model's parameter count, empty indices, an index >= ds.size(),
  // batch_size == 0, epochs == 0 with max_steps == 0, prox_mu negative or not finite, one
  // SCAFFOLD control without the other or either not start.size() long, lr == 0 with SCAFFOLD
  // (the control update divides by it), sample storage that does not match the
  // labels (data::checkSampleStorage: an empty image shape, too few bytes or floats), or
  // GradientPath::kManual for a model supportsManualGradients() rejects or with precision kBf16
  // -> kInvalidArgument; a LibTorch failure (model/input mismatch, a label >= the model's
  // classes, out of memory) -> kInternal. Safe to call concurrently from several threads with
  // different models. With opts.precision kBf16, autocast is on for this thread only inside each
  // step's forward pass; the thread's previous autocast state (flags, dtypes) is back, and the
  // autocast cache cleared, when train() returns, whether it succeeded or failed.
  Result<TrainResult> train(model::Model& model, const std::vector<float>& start,
                            const data::Dataset& ds, const std::vector<uint32_t>& indices,
                            const TrainOptions& opts, const std::atomic<bool>* stop = nullptr);

  // Whether the manual gradient path applies to `model` with this trainer: the trainer's device
  // is the CPU and `model` is a built-in "logreg" (one Linear layer) or "mlp" (Linear layers with
  // a ReLU between consecutive ones) whose parameters() are fp32 and form a chain of weights
  // [out, in] and biases [out], each layer's in being the previous layer's out.
  bool supportsManualGradients(model::Model& model) const;

  const c10::Device& device() const { return device_; }

 private:
  c10::Device device_;
  BatchSource source_;
  GradientPath gradients_;
};

}  // namespace fedfleet::client
