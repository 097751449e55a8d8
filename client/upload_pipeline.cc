#include "client/upload_pipeline.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>

#include "common/check.h"
#include "common/compress/lowrank.h"
#include "common/splitmix.h"

namespace fedfleet::client {
namespace {

double steadyNow() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

bool allFinite(const std::vector<float>& x) {
  // A float is NaN or infinite when its exponent bits are all ones. An OR over a comparison of
  // the bits vectorises (a sum of x * 0 would not: float addition does not reassociate).
  uint32_t bad = 0;
  for (float v : x) bad |= (std::bit_cast<uint32_t>(v) & 0x7f800000u) == 0x7f800000u;
  return bad == 0;
}

// Cuts `total` units into the fewest pieces of at most `most` (>= 1) units each, as even as can
// be (the first total % pieces of them one unit longer), and calls emit(units) for each in turn.
template <typename Emit>
void evenPieces(uint64_t total, uint64_t most, Emit emit) {
  const uint64_t pieces = (total + most - 1) / most;
  const uint64_t base = total / pieces, longer = total % pieces;
  for (uint64_t p = 0; p < pieces; ++p) emit(base + (p < longer ? 1 : 0));
}

}  // namespace

std::vector<ChunkRange> planChunks(const model::Layout& layout, size_t chunk_bytes,
                                   bool per_tensor) {
  const uint64_t max_elems = std::min<uint64_t>(std::max<size_t>(1, chunk_bytes / sizeof(float)),
                                                compress::kMaxPayloadElements);
  std::vector<ChunkRange> plan;
  std::optional<ChunkRange> group;  // whole tensors collected so far
  auto flush = [&] {
    if (group) plan.push_back(*group);
    group.reset();
  };
  for (size_t i = 0; i < layout.tensors.size(); ++i) {
    const auto& t = layout.tensors[i];
    const uint64_t numel = t.numel;
    if (numel == 0) continue;  // holds nothing: in no chunk's count, never a chunk's start
    if (numel > max_elems) {
      flush();
      uint64_t offset = t.offset;
      evenPieces(numel, max_elems, [&](uint64_t n) {
        plan.push_back({static_cast<uint32_t>(i), offset, n});
        offset += n;
      });
      continue;
    }
    if (group && (per_tensor || group->elements + numel > max_elems)) flush();
    if (!group) group = ChunkRange{static_cast<uint32_t>(i), t.offset, 0};
    group->elements += numel;
  }
  flush();
  if (plan.empty()) plan.push_back({0, 0, 0});
  return plan;
}

model::Layout flatLayout(size_t n) {
  model::Layout layout;
  layout.tensors.push_back({"flat", {static_cast<int64_t>(n)}, n, 0});
  layout.total = n;
  return layout;
}

std::vector<ChunkRange> planMatrixChunks(const model::Layout& layout, size_t chunk_bytes,
                                         uint32_t rank) {
  const uint64_t budget = std::max<size_t>(chunk_bytes, 4);
  // Body bytes of a block of b rows of `cols` columns.
  const auto body = [rank](uint64_t b, uint64_t cols) {
    return compress::lowrankPayloadBytes(compress::lowrankEffectiveRank(rank, b, cols), b, cols) -
           compress::kPayloadHeaderBytes;
  };
  std::vector<ChunkRange> plan;
  for (size_t i = 0; i < layout.tensors.size(); ++i) {
    const auto& t = layout.tensors[i];
    if (t.numel == 0) continue;
    const uint64_t rows =
        t.shape.size() >= 2 && t.shape[0] > 0 ? static_cast<uint64_t>(t.shape[0]) : 1;
    const uint64_t cols = t.numel / rows;
    const uint64_t fit_rows = std::min<uint64_t>(compress::kMaxPayloadElements / cols, rows);
    // The most whole rows whose body fits (body grows with b).
    uint64_t lo = 0, hi = fit_rows;
    while (lo < hi) {
      const uint64_t mid = lo + (hi - lo + 1) / 2;
      if (body(mid, cols) <= budget) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    uint64_t offset = t.offset;
    if (lo >= 1) {
      evenPieces(rows, lo, [&](uint64_t b) {
        plan.push_back(
            {static_cast<uint32_t>(i), offset, b * cols, false, static_cast<uint32_t>(b)});
        offset += b * cols;
      });
      continue;
    }
    // Not one row fits: one-row pieces of at most m values (a body of 4 + 4 + 2 (1 + m) bytes).
    const uint64_t m = std::max<uint64_t>(1, budget >= 10 ? (budget - 10) / 2 : 1);
    evenPieces(t.numel, m, [&](uint64_t n) {
      plan.push_back({static_cast<uint32_t>(i), offset, n, false, 1});
      offset += n;
    });
  }
  if (plan.empty()) plan.push_back({0, 0, 0});
  return plan;
}

std::vector<ChunkRange> planUploadChunks(const model::Layout& layout, size_t chunk_bytes,
                                         bool scaffold, const compress::CodecSpec& codec) {
  std::vector<ChunkRange> plan =
      compress::factorsMatrices(codec)
          ? planMatrixChunks(layout, chunk_bytes, codec.rank)
          : planChunks(layout, chunk_bytes, compress::selectsPerTensor(codec));
  for (ChunkRange& c : plan) {
    if (c.tensor_index < layout.tensors.size()) {
      c.dense = compress::denseBelow(codec, layout.tensors[c.tensor_index].numel);
    }
  }
  if (!scaffold) return plan;
  const size_t half = plan.size();
  const auto tensors = static_cast<uint32_t>(layout.tensors.size());
  plan.reserve(2 * half);
  for (size_t i = 0; i < half; ++i) {
    ChunkRange c = plan[i];
    c.tensor_index += tensors;
    c.offset += layout.total;
    plan.push_back(c);
  }
  return plan;
}

namespace {

// The codec of chunk r: fp16 when r.dense, else the task's.
const compress::Codec& chunkCodec(const compress::Codec& codec, const ChunkRange& r) {
  static const std::unique_ptr<compress::Codec> fp16 = [] {
    compress::CodecSpec spec;
    spec.name = "fp16";
    return std::move(compress::makeCodec(spec).value());
  }();
  return r.dense ? *fp16 : codec;
}

}  // namespace

Status encodeUploadChunk(const compress::Codec& codec, const ChunkRange& r, const float* x,
                         compress::ErrorFeedback* residual, uint64_t seed, std::string* out) {
  const compress::Codec& c = chunkCodec(codec, r);
  const size_t rows = r.rows > 0 ? r.rows : 1;
  if (residual != nullptr) return residual->encode(c, r.offset, x, r.elements, seed, out, rows);
  out->reserve(out->size() + c.maxEncodedBytes(r.elements));
  c.encodeRows(x, r.elements, rows, seed, out);
  return Status::ok();
}

uint64_t chunkSeed(uint64_t task_seed, size_t index) {
  return splitMix64(splitMix64(task_seed) ^ (0x5851f42d4c957f2dull * (index + 1)));
}

UploadPipeline::UploadPipeline(std::vector<float> delta, std::vector<ChunkRange> plan,
                               std::shared_ptr<const compress::Codec> codec,
                               compress::ErrorFeedback* residual, uint64_t task_seed,
                               UploadPipelineOptions options)
    : UploadPipeline(std::move(delta), DeviceDelta{}, std::move(plan), std::move(codec), residual,
                     task_seed, options) {}

UploadPipeline::UploadPipeline(DeviceDelta delta, std::vector<ChunkRange> plan,
                               std::shared_ptr<const compress::Codec> codec, uint64_t task_seed,
                               UploadPipelineOptions options)
    : UploadPipeline({}, std::move(delta), std::move(plan), std::move(codec), nullptr, task_seed,
                     options) {}

UploadPipeline::UploadPipeline(std::vector<float> delta, DeviceDelta device_delta,
                               std::vector<ChunkRange> plan,
                               std::shared_ptr<const compress::Codec> codec,
                               compress::ErrorFeedback* residual, uint64_t task_seed,
                               UploadPipelineOptions options)
    : delta_(std::move(delta)),
      device_(std::move(device_delta)),
      plan_(std::move(plan)),
      codec_(std::move(codec)),
      residual_(residual),
      task_seed_(task_seed),
      options_(options) {
  FEDFLEET_CHECK(codec_ != nullptr);
  FEDFLEET_CHECK(!plan_.empty());
  FEDFLEET_CHECK(options_.queue_depth >= 1);
  const bool on_device = device_.compressor != nullptr;
  FEDFLEET_CHECK(!on_device || (delta_.empty() && (device_.data != nullptr || device_.size == 0)));
  FEDFLEET_CHECK(!on_device || device_.residual == nullptr ||
                 device_.residual->size() == device_.size);
  const size_t size = on_device ? device_.size : delta_.size();
  uint64_t next = 0;
  for (const auto& r : plan_) {
    FEDFLEET_CHECK_MSG(r.offset == next, "upload plan is not contiguous");
    next += r.elements;
  }
  FEDFLEET_CHECK_MSG(next == size, "upload plan does not cover the delta");
  FEDFLEET_CHECK(residual_ == nullptr || residual_->size() == delta_.size());
  encoder_ = std::thread([this] { encodeAll(); });
}

UploadPipeline::~UploadPipeline() {
  cancel();
  encoder_.join();
}

void UploadPipeline::cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_ = true;
  ready_.clear();
  cv_.notify_all();
}

bool UploadPipeline::drained() const {
  std::lock_guard<std::mutex> lock(mu_);
  return taken_ == plan_.size();
}

bool UploadPipeline::failed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !status_.isOk();
}

Status UploadPipeline::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

double UploadPipeline::encodeSeconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return encode_seconds_;
}

std::optional<EncodedChunk> UploadPipeline::tryPop() { return pop(0); }

std::optional<EncodedChunk> UploadPipeline::pop(double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  auto ready = [&] { return !ready_.empty() || !status_.isOk() || cancelled_; };
  if (timeout_s > 0) cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), ready);
  if (ready_.empty() || !status_.isOk() || cancelled_) return std::nullopt;
  EncodedChunk c = std::move(ready_.front());
  ready_.pop_front();
  ++taken_;
  cv_.notify_all();
  return c;
}

bool UploadPipeline::waitForRoom() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return cancelled_ || ready_.size() < options_.queue_depth; });
  return !cancelled_;
}

Status UploadPipeline::checkFinite() {
  bool finite = true;
  if (device_.compressor != nullptr) {
    FEDFLEET_ASSIGN_OR_RETURN(const uint64_t bad,
                              device_.compressor->countNonFinite(device_.data, device_.size));
    finite = bad == 0;
  } else {
    finite = allFinite(delta_);
  }
  return finite ? Status::ok() : invalidArgument("the update has non-finite values");
}

Result<EncodedChunk> UploadPipeline::encodeChunk(size_t index) {
  const ChunkRange& r = plan_[index];
  EncodedChunk c;
  c.index = index;
  c.range = r;
  c.last = index + 1 == plan_.size();
  const double t0 = steadyNow();
  const uint64_t seed = chunkSeed(task_seed_, index);
  if (device_.compressor != nullptr) {
    const compress::Codec& codec = chunkCodec(*codec_, r);
    const float* x = device_.data + r.offset;
    FEDFLEET_RETURN_IF_ERROR(
        device_.residual != nullptr
            ? device_.compressor->encode(codec, device_.residual, r.offset, x, r.elements, seed,
                                         &c.payload)
            : device_.compressor->encode(codec, x, r.elements, seed, &c.payload));
  } else {
    const float* x = delta_.data() + r.offset;
    if (options_.encode_host) {
      FEDFLEET_RETURN_IF_ERROR(options_.encode_host(r, x, seed, &c.payload));
    } else {
      FEDFLEET_RETURN_IF_ERROR(encodeUploadChunk(*codec_, r, x, residual_, seed, &c.payload));
    }
  }
  c.encode_seconds = steadyNow() - t0;
  return c;
}

void UploadPipeline::encodeAll() {
  auto fail = [&](Status st) {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = std::move(st);
    ready_.clear();
    cv_.notify_all();
  };
  const double t0 = steadyNow();
  Status finite = checkFinite();
  {
    std::lock_guard<std::mutex> lock(mu_);
    encode_seconds_ += steadyNow() - t0;
  }
  if (!finite.isOk()) {
    fail(std::move(finite));
    return;
  }
  std::vector<EncodedChunk> held;  // non-pipelined: everything, released at the end
  for (size_t i = 0; i < plan_.size(); ++i) {
    if (options_.pipelined && !waitForRoom()) return;
    auto c = encodeChunk(i);
    if (!c.isOk()) {
      fail(c.status());
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (cancelled_) return;
    encode_seconds_ += c->encode_seconds;
    if (options_.pipelined) {
      ready_.push_back(std::move(c).value());
      cv_.notify_all();
    } else {
      held.push_back(std::move(c).value());
    }
  }
  if (!options_.pipelined) {
    std::lock_guard<std::mutex> lock(mu_);
    if (cancelled_) return;
    for (auto& c : held) ready_.push_back(std::move(c));
    cv_.notify_all();
  }
}

}  // namespace fedfleet::client
