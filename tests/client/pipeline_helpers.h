// Helpers shared by the upload pipeline's tests (host and GPU): layouts, deltas, codecs and
// draining a pipeline.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "client/upload_pipeline.h"
#include "common/compress/codec.h"

namespace fedfleet::client {

inline model::Layout layoutOf(const std::vector<size_t>& sizes) {
  model::Layout l;
  for (size_t i = 0; i < sizes.size(); ++i) {
    l.tensors.push_back(
        {"tensor" + std::to_string(i), {static_cast<int64_t>(sizes[i])}, sizes[i], l.total});
    l.total += sizes[i];
  }
  return l;
}

inline std::vector<float> randomDelta(size_t n, uint64_t seed, float scale = 0.01f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0, scale);
  std::vector<float> x(n);
  for (auto& v : x) v = d(rng);
  return x;
}

inline std::shared_ptr<const compress::Codec> codecFor(const std::string& text) {
  auto spec = compress::parseCodecSpec(text);
  EXPECT_TRUE(spec.isOk()) << spec.status().toString();
  auto codec = compress::makeCodec(*spec);
  EXPECT_TRUE(codec.isOk()) << codec.status().toString();
  return std::shared_ptr<const compress::Codec>(std::move(codec).value());
}

// Takes every chunk, in order, failing the test on a gap or a stall.
inline std::vector<EncodedChunk> drain(UploadPipeline& p) {
  std::vector<EncodedChunk> out;
  while (!p.drained()) {
    auto c = p.pop(30);
    if (!c) {
      ADD_FAILURE() << "no chunk " << out.size() << ": " << p.status().toString();
      break;
    }
    out.push_back(std::move(*c));
  }
  return out;
}

}  // namespace fedfleet::client
