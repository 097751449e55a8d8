// UploadPipeline: encodes a trained delta chunk by chunk on its own thread while the client's
// loop thread sends the chunks already encoded, so compression and the uplink overlap instead
// of alternating (chunk i + 1 is encoded while chunk i is on the wire).
//
// Chunking (planChunks): the delta is cut along the model's tensors, and no chunk holds more
// than max(1, chunk_bytes / 4) elements (chunk_bytes of fp32 input; the encoded payload is
// smaller for every codec but none). A tensor larger than that is split into the fewest pieces
// that fit, of equal size (the first numel % pieces one element longer), so the last piece is
// not a sliver; consecutive smaller tensors are grouped whole into one chunk while the group
// fits, unless grouping is off (per_tensor: every tensor in chunks of its own, as a top-k
// upload is cut so that each tensor gets its share of the kept elements). A chunk is therefore
// either a run of whole tensors or one piece of one tensor, never straddles a tensor boundary in
// part, and the chunks cover [0, total) with contiguous, increasing offsets. Empty tensors are
// skipped (a chunk's tensor_index is the tensor holding its first element). An empty model gives
// one chunk of 0 elements (the upload still has a last chunk).
//
// Threads: the constructor starts one encoder thread, which first checks the whole delta is
// finite, then encodes the chunks in order into a queue of at most `queue_depth` chunks,
// waiting for room; the owner (the client's loop thread) takes them with tryPop()/pop() and
// is the only thread that sends. Non-pipelined mode (the baseline of bench/pipeline_overlap.sh)
// encodes every chunk before the first is released.
//
// Randomness: chunk i is encoded with seed chunkSeed(task_seed, i), so a stochastic codec
// (qsgd) draws different numbers for every chunk and the same upload is bit-identical on a
// rerun.
//
// Error feedback: when given a compress::ErrorFeedback, every chunk is encoded through it
// (payload of delta + residual; the residual keeps what the codec dropped). The encoder thread
// is its only user from construction until the pipeline is destroyed (the destructor joins).
// If the pipeline is cancelled or fails part-way, the residual of the chunks already encoded
// has been updated as though they were delivered: the owner should reset() it then.
//
// On the GPU: a delta that lives on a CUDA device (DeviceDelta, a client training there) is
// encoded there by a compress::DeviceCompressor, on that compressor's own stream, with the
// residual on the device too (compress::DeviceResidual); the payloads are the bytes the host
// path gives for the same values, so everything after the encoder is the same.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/compress/codec.h"
#include "common/compress/device_compressor.h"
#include "common/compress/error_feedback.h"
#include "common/model/model.h"
#include "common/status.h"

namespace fedfleet::client {

// One element range of the flat delta.
struct ChunkRange {
  uint32_t tensor_index = 0;  // index in the layout of the tensor the range starts in
  uint64_t offset = 0;        // first element
  uint64_t elements = 0;
  bool dense = false;  // sent as fp16, not through the task's codec (compress::denseBelow)
  // lowrank (compress::factorsMatrices): the range is this many whole rows of a matrix of
  // elements / rows columns (Codec::encodeRows); 0 for the other codecs.
  uint32_t rows = 0;

  bool operator==(const ChunkRange&) const = default;
};

// The chunks of a delta laid out as `layout`, by the rule above. chunk_bytes == 0 counts as 4
// (one element a chunk).
std::vector<ChunkRange> planChunks(const model::Layout& layout, size_t chunk_bytes,
                                   bool per_tensor = false);

// A layout of one tensor of n elements, for a delta whose model layout is unknown.
model::Layout flatLayout(size_t n);

// The chunks of a delta for lowrank of rank `rank`: every tensor read as a matrix of shape[0]
// rows (a tensor of one dimension as one row), one chunk a tensor where its payload's body
// (compress::lowrankPayloadBytes less the header) fits in chunk_bytes, else blocks of whole rows
// as large as fit, cut evenly; a tensor not even one of whose rows fits is cut into pieces of
// a row (each a one-row matrix) that do. `rows` is set on every chunk.
std::vector<ChunkRange> planMatrixChunks(const model::Layout& layout, size_t chunk_bytes,
                                         uint32_t rank);

// The chunks of an update of a model laid out as `layout` (wire::Task) for the task's codec:
// planChunks(layout, chunk_bytes, compress::selectsPerTensor(codec)) for a delta alone, with
// `dense` set on the chunks of the tensors compress::denseBelow(codec, numel) names; for a
// SCAFFOLD update (the delta, then the control delta: 2 * layout.total values) those chunks,
// then the same again shifted by layout.total elements and by layout.tensors.size() tensors, so
// both halves are cut alike (dense marks included) and no chunk holds values of both. For
// lowrank (compress::factorsMatrices) the delta's chunks are planMatrixChunks'.
std::vector<ChunkRange> planUploadChunks(const model::Layout& layout, size_t chunk_bytes,
                                         bool scaffold, const compress::CodecSpec& codec = {});

// Appends to *out the payload of chunk r of an upload (x points at its first element): fp16
// when r.dense, else `codec` (encodeRows with r.rows when set); through `residual` (error
// feedback) when given. Errors as
// compress::ErrorFeedback::encode (a non-finite value with a residual).
Status encodeUploadChunk(const compress::Codec& codec, const ChunkRange& r, const float* x,
                         compress::ErrorFeedback* residual, uint64_t seed, std::string* out);

// The codec seed of chunk `index` of an upload whose task carries `task_seed` (a SplitMix64
// mix of the two, so neighbouring seeds and indices give unrelated streams).
uint64_t chunkSeed(uint64_t task_seed, size_t index);

// A chunk ready to send.
struct EncodedChunk {
  size_t index = 0;  // position in the plan
  ChunkRange range;
  std::string payload;  // self-describing codec payload (common/compress/payload.h)
  double encode_seconds = 0;
  bool last = false;
};

// A delta in CUDA device memory, and what encodes it there.
struct DeviceDelta {
  std::shared_ptr<const void> owner;  // keeps `data` alive while the pipeline exists
  const float* data = nullptr;        // device memory, `size` floats, final: nothing writes it
  size_t size = 0;
  compress::DeviceCompressor* compressor = nullptr;  // on data's device; outlives the pipeline
  compress::DeviceResidual* residual = nullptr;      // error feedback (null: none); as above
};

struct UploadPipelineOptions {
  size_t queue_depth = 4;  // encoded chunks waiting to be sent, at most (>= 1)
  bool pipelined = true;   // false: encode every chunk before releasing the first
  // Set: encodes each chunk of a host delta instead of the codec and residual (secure
  // aggregation's masked chunks, client/masked_upload.h), on the encoder thread.
  std::function<Status(const ChunkRange& r, const float* x, uint64_t seed, std::string* payload)>
      encode_host;
};

class UploadPipeline {
 public:
  // Starts encoding `delta` cut as `plan` with `codec`. The plan must cover the delta exactly
  // with contiguous increasing offsets (a broken plan is a caller bug: it aborts). `residual`,
  // when non-null, must have delta.size() elements and outlive the pipeline; it is used by the
  // encoder thread alone until the destructor returns.
  UploadPipeline(std::vector<float> delta, std::vector<ChunkRange> plan,
                 std::shared_ptr<const compress::Codec> codec, compress::ErrorFeedback* residual,
                 uint64_t task_seed, UploadPipelineOptions options = {});
  // The same for a delta on a CUDA device: chunks are encoded by delta.compressor, through
  // delta.residual when non-null (which, like the compressor, the encoder thread alone uses
  // until the destructor returns). The plan must cover delta.size elements.
  UploadPipeline(DeviceDelta delta, std::vector<ChunkRange> plan,
                 std::shared_ptr<const compress::Codec> codec, uint64_t task_seed,
                 UploadPipelineOptions options = {});
  // Cancels and joins the encoder thread.
  ~UploadPipeline();
  UploadPipeline(const UploadPipeline&) = delete;
  UploadPipeline& operator=(const UploadPipeline&) = delete;

  // The next chunk, in plan order, if it has been encoded (and, non-pipelined, once all have);
  // nullopt otherwise, and always after failed() or once every chunk has been taken.
  std::optional<EncodedChunk> tryPop();
  // As tryPop, waiting up to timeout_s for the chunk.
  std::optional<EncodedChunk> pop(double timeout_s);

  // True once every chunk has been taken.
  bool drained() const;
  // True when encoding stopped on an error: the delta (or delta + residual) is not finite
  // (INVALID_ARGUMENT), or, on the GPU, a CUDA call failed (INTERNAL). status() then says why;
  // no further chunk comes.
  bool failed() const;
  Status status() const;
  // Stops the encoder after the chunk in progress; chunks not yet taken are dropped.
  void cancel();

  size_t chunkCount() const { return plan_.size(); }
  // Seconds the encoder thread spent so far (finiteness check and every chunk's encoding).
  double encodeSeconds() const;

 private:
  UploadPipeline(std::vector<float> delta, DeviceDelta device_delta, std::vector<ChunkRange> plan,
                 std::shared_ptr<const compress::Codec> codec, compress::ErrorFeedback* residual,
                 uint64_t task_seed, UploadPipelineOptions options);
  void encodeAll();
  // OK when every value is finite; INVALID_ARGUMENT when not.
  Status checkFinite();
  Result<EncodedChunk> encodeChunk(size_t index);
  bool waitForRoom();

  const std::vector<float> delta_;  // on the host (empty when on the device)
  const DeviceDelta device_;        // on the device (data null when on the host)
  const std::vector<ChunkRange> plan_;
  const std::shared_ptr<const compress::Codec> codec_;
  compress::ErrorFeedback* const residual_;
  const uint64_t task_seed_;
  const UploadPipelineOptions options_;

  mutable std::mutex mu_;
  std::condition_variable cv_;      // signalled on every queue change, failure and cancel
  std::deque<EncodedChunk> ready_;  // GUARDED_BY(mu_)
  size_t taken_ = 0;                // GUARDED_BY(mu_)
  bool cancelled_ = false;          // GUARDED_BY(mu_)
  Status status_;                   // GUARDED_BY(mu_)
  double encode_seconds_ = 0;       // GUARDED_BY(mu_)
  std::thread encoder_;
};

}  // namespace fedfleet::client
