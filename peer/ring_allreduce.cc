#include "peer/ring_allreduce.h"

#include <algorithm>
#include <string>

#include "common/check.h"
#include "common/splitmix.h"

namespace fedfleet::peer {

RingStep ringStep(uint32_t m, uint32_t rank, uint32_t step) {
  FEDFLEET_CHECK(m >= 2 && rank < m && step < 2 * (m - 1));
  auto mod = [m](int64_t x) { return static_cast<uint32_t>(((x % m) + m) % m); };
  if (step < m - 1) {
    return {mod(int64_t{rank} - step), mod(int64_t{rank} - step - 1), true};
  }
  const int64_t s = step - (m - 1);
  return {mod(int64_t{rank} + 1 - s), mod(int64_t{rank} - s), false};
}

std::pair<size_t, size_t> chunkRange(size_t n, uint32_t members, uint32_t chunk) {
  return {n * chunk / members, n * (uint64_t{chunk} + 1) / members};
}

size_t ringValuesSent(size_t n, uint32_t members, uint32_t rank) {
  size_t total = 0;
  for (uint32_t s = 0; members >= 2 && s < 2 * (members - 1); ++s) {
    auto [b, e] = chunkRange(n, members, ringStep(members, rank, s).send_chunk);
    total += e - b;
  }
  return total;
}

RingAllReduce::RingAllReduce(std::vector<uint32_t> members, uint32_t self, uint64_t group,
                             uint64_t iteration, std::vector<float> data,
                             RingCompression compression)
    : members_(std::move(members)),
      self_(self),
      group_(group),
      iteration_(iteration),
      compression_(compression),
      data_(std::move(data)) {
  auto it = std::find(members_.begin(), members_.end(), self_);
  FEDFLEET_CHECK_MSG(it != members_.end(), "a ring's members must include this peer");
  const uint32_t m = static_cast<uint32_t>(members_.size());
  rank_ = static_cast<uint32_t>(it - members_.begin());
  prev_ = members_[(rank_ + m - 1) % m];
  next_ = members_[(rank_ + 1) % m];
  total_steps_ = m >= 2 ? 2 * (m - 1) : 0;
}

wire::PeerMessage RingAllReduce::makeSend(uint32_t step) {
  const uint32_t m = static_cast<uint32_t>(members_.size());
  const RingStep rs = ringStep(m, rank_, step);
  auto [b, e] = chunkRange(data_.size(), m, rs.send_chunk);
  wire::PeerMessage out;
  out.kind = wire::PeerMessageKind::kChunk;
  out.from = self_;
  out.to = next_;
  out.iteration = iteration_;
  out.group = group_;
  out.step = step;
  out.chunk = rs.send_chunk;
  if (compression_.codec == nullptr) {
    out.values.assign(data_.begin() + b, data_.begin() + e);
    return out;
  }
  out.elements = static_cast<uint32_t>(e - b);
  if (!rs.reduce && step > m - 1) {
    out.payload = forward_;  // pass the owner's payload on unchanged
    return out;
  }
  const uint64_t seed = splitMix64(compression_.seed ^ splitMix64(iteration_ * 1000003ull + step) ^
                                   (uint64_t{self_} << 40));
  compress::ErrorFeedback* ef =
      rs.reduce ? compression_.reduce_residual : compression_.gather_residual;
  if (e > b) {
    if (ef != nullptr) {
      Status s = ef->encode(*compression_.codec, b, data_.data() + b, e - b, seed, &out.payload);
      FEDFLEET_CHECK_MSG(s.isOk(), s.message().c_str());  // a non-finite model: a training bug
    } else {
      compression_.codec->encode(data_.data() + b, e - b, seed, &out.payload);
    }
  }
  if (!rs.reduce && e > b) {
    // The owner keeps what the others will decode, so all members agree bit for bit.
    Status s = compression_.codec->decode(out.payload, e - b, data_.data() + b);
    FEDFLEET_CHECK_MSG(s.isOk(), s.message().c_str());
  }
  if (e == b) out.elements = 0;
  return out;
}

std::vector<wire::PeerMessage> RingAllReduce::start() {
  std::vector<wire::PeerMessage> out;
  if (total_steps_ > 0) out.push_back(makeSend(0));
  return out;
}

Status RingAllReduce::check(const wire::PeerMessage& m) const {
  const uint32_t size = static_cast<uint32_t>(members_.size());
  const RingStep rs = ringStep(size, rank_, m.step);
  if (m.chunk != rs.recv_chunk) {
    return invalidArgument("ring chunk " + std::to_string(m.chunk) + " at step " +
                           std::to_string(m.step) + " from peer " + std::to_string(m.from) +
                           ", the schedule says chunk " + std::to_string(rs.recv_chunk));
  }
  auto [b, e] = chunkRange(data_.size(), size, rs.recv_chunk);
  const size_t len = e - b;
  if (compression_.codec == nullptr) {
    if (m.values.size() != len || !m.payload.empty()) {
      return invalidArgument("ring chunk from peer " + std::to_string(m.from) + " holds " +
                             std::to_string(m.values.size()) + " values, expected " +
                             std::to_string(len));
    }
  } else if (m.elements != len || !m.values.empty()) {
    return invalidArgument("compressed ring chunk from peer " + std::to_string(m.from) + " holds " +
                           std::to_string(m.elements) + " elements, expected " +
                           std::to_string(len));
  }
  return Status::ok();
}

Status RingAllReduce::apply(const wire::PeerMessage& m) {
  const uint32_t size = static_cast<uint32_t>(members_.size());
  const RingStep rs = ringStep(size, rank_, m.step);
  auto [b, e] = chunkRange(data_.size(), size, rs.recv_chunk);
  const size_t len = e - b;
  std::vector<float> decoded;
  const float* in = m.values.data();
  if (compression_.codec != nullptr) {
    decoded.resize(len);
    if (len > 0) {
      Status s = compression_.codec->decode(m.payload, len, decoded.data());
      if (!s.isOk())
        return invalidArgument("ring chunk from peer " + std::to_string(m.from) + ": " +
                               s.message());
    }
    in = decoded.data();
    if (!rs.reduce) forward_ = m.payload;
  }
  if (rs.reduce) {
    for (size_t i = 0; i < len; ++i) data_[b + i] += in[i];
  } else {
    std::copy(in, in + len, data_.begin() + b);
  }
  return Status::ok();
}

Status RingAllReduce::onChunk(wire::PeerMessage message, std::vector<wire::PeerMessage>* sends) {
  if (message.from != prev_) {
    return invalidArgument("ring chunk from peer " + std::to_string(message.from) +
                           ", which is not this ring's predecessor " + std::to_string(prev_));
  }
  if (message.step < next_step_ || message.step >= total_steps_ || early_.count(message.step)) {
    return invalidArgument("ring step " + std::to_string(message.step) + " from peer " +
                           std::to_string(message.from) + " is a repeat or past the ring's " +
                           std::to_string(total_steps_) + " steps");
  }
  FEDFLEET_RETURN_IF_ERROR(check(message));
  early_.emplace(message.step, std::move(message));
  while (!done()) {
    auto it = early_.find(next_step_);
    if (it == early_.end()) break;
    FEDFLEET_RETURN_IF_ERROR(apply(it->second));
    early_.erase(it);
    ++received_;
    ++next_step_;
    if (next_step_ < total_steps_) sends->push_back(makeSend(next_step_));
  }
  return Status::ok();
}

}  // namespace fedfleet::peer
