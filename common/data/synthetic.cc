#include "common/data/synthetic.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>
#include <new>
#include <random>
#include <string>

#include "common/check.h"
#include "common/data/block_cyclic.h"

namespace fedfleet::data {
namespace {

// The independent random streams of a federation. A device's stream is keyed by (seed, k, kind);
// the IID variant's shared parameters use k = 0 with their own kind.
enum class Stream : uint32_t { kCount = 0, kParameters = 1, kTrain = 2, kTest = 3, kShared = 4 };

// The sample-count stream: one lognormal draw per device, kept on std::mt19937_64 so that the
// device sizes (and with them a simulation's schedule) are those of earlier versions.
std::mt19937_64 countGenerator(uint64_t seed, uint64_t k) {
  std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32),
                    static_cast<uint32_t>(k), static_cast<uint32_t>(k >> 32),
                    static_cast<uint32_t>(Stream::kCount)};
  return std::mt19937_64(seq);
}

// SplitMix64's output function: a bijection of 64-bit words that mixes every input bit into
// every output bit.
constexpr uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// xoshiro256++ (Blackman and Vigna, "Scrambled linear pseudorandom number generators", 2021):
// 256 bits of state, period 2^256 - 1, every output bit of good quality, about a nanosecond a
// draw.
class Xoshiro256pp {
 public:
  // The generator of stream (seed, k, stream). Its state words are chained bijections:
  // s0 = mix(seed + G), s1 = mix(k + s0), s2 = mix(stream + s1), s3 = mix(s2 + G), so distinct
  // keys give distinct (and never all-zero) states, each word well mixed. Streams of distinct
  // keys are then disjoint stretches of one 2^256 cycle: two overlap within L draws with
  // probability about L / 2^256.
  Xoshiro256pp(uint64_t seed, uint64_t k, Stream stream) {
    constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;
    s_[0] = mix64(seed + kGolden);
    s_[1] = mix64(k + s_[0]);
    s_[2] = mix64(static_cast<uint64_t>(stream) + s_[1]);
    s_[3] = mix64(s_[2] + kGolden);
  }

  uint64_t operator()() {
    const uint64_t result = std::rotl(s_[0] + s_[3], 23) + s_[0];
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = std::rotl(s_[3], 45);
    return result;
  }

 private:
  std::array<uint64_t, 4> s_;
};

// ln(u) for a normal float u in (0, 1], to about 1 ulp: Cephes' logf (u = (1 + x) 2^e with
// 1 + x in [sqrt(1/2), sqrt(2)), a degree-9 polynomial in x). Integer comparisons and arithmetic
// selects only (a float comparison may trap, which keeps GCC from vectorising a loop around it).
inline float logApprox(float u) {
  const int32_t bits = std::bit_cast<int32_t>(u);
  const int32_t mantissa = bits & 0x007fffff;
  const int32_t low = mantissa < 0x003504f3 ? 1 : 0;            // mantissa < sqrt(1/2)
  const float m = std::bit_cast<float>(mantissa | 0x3f000000);  // u = m 2^(exponent - 126)
  // u = (1 + x) 2^e with 1 + x = m or 2m in [sqrt(1/2), sqrt(2)); x is exact either way.
  const int32_t e = ((bits >> 23) & 0xff) - 126 - low;
  const float x = (m - 1.0f) + m * static_cast<float>(low);
  const float z = x * x;
  float y = 7.0376836292e-2f;
  y = y * x - 1.1514610310e-1f;
  y = y * x + 1.1676998740e-1f;
  y = y * x - 1.2420140846e-1f;
  y = y * x + 1.4249322787e-1f;
  y = y * x - 1.6668057665e-1f;
  y = y * x + 2.0000714765e-1f;
  y = y * x - 2.4999993993e-1f;
  y = y * x + 3.3333331174e-1f;
  y = y * x * z;
  const float fe = static_cast<float>(e);
  y += fe * -2.12194440e-4f;
  y += -0.5f * z;
  return x + y + fe * 0.693359375f;
}

// sqrt(x) for x in [0, 64], to a few ulp: the classic inverse square root estimate refined by
// three Newton steps (relative error 3.4% -> 1.8e-3 -> 4.7e-6 -> rounding), times x. std::sqrt
// would be exact but, as it may set errno, keeps the loop from vectorising.
inline float sqrtApprox(float x) {
  float y = std::bit_cast<float>(0x5f3759df - (std::bit_cast<int32_t>(x) >> 1));
  const float half = 0.5f * x;
  y = y * (1.5f - half * y * y);
  y = y * (1.5f - half * y * y);
  y = y * (1.5f - half * y * y);
  return x * y;  // 0 for x = 0 (y stays finite)
}

// Standard normal draws, in bulk, by the Box-Muller transform: from a uniform u in (0, 1] and an
// angle t uniform on the circle, (r cos t, r sin t) with r = sqrt(-2 ln u) are two independent
// N(0, 1). One 64-bit draw feeds a pair. 31 bits make u = (b + 1/2) 2^-31, finest near 0 where
// the tail is (|z| <= sqrt(2 ln 2^32) = 6.66; P(|z| > 6.66) = 3e-11). 24 bits f make
// a = (pi/2)(f - 1/2), uniform on a quarter circle, and 3 more bits pick one of the 8 symmetries
// of the square (swap cos and sin, flip either sign): the images of the quarter tile the circle
// evenly, so t is uniform on it. sin a and cos a on [-pi/4, pi/4] are Cephes' sinf/cosf
// polynomials. No libm call and no branch: the transform loop vectorises, and its bits depend
// on the generator alone.
class NormalSource {
 public:
  explicit NormalSource(Xoshiro256pp rng) : rng_(rng) {}

  // Fills out[0, n) with independent N(0, 1) draws. The sequence is a function of the generator
  // and of the sizes of the calls only.
  void fill(float* out, size_t n) {
    while (n > 0) {
      const size_t m = std::min(n, 2 * kPairs), pairs = (m + 1) / 2;
      for (size_t i = 0; i < pairs; ++i) {
        const uint64_t w = rng_();
        radius_bits_[i] = static_cast<uint32_t>(w);
        angle_bits_[i] = static_cast<uint32_t>(w >> 32);
      }
      transform(pairs);
      std::copy_n(first_.data(), pairs, out);
      std::copy_n(second_.data(), m - pairs, out + pairs);
      out += m;
      n -= m;
    }
  }

 private:
  static constexpr size_t kPairs = 256;

  void transform(size_t pairs) {
    constexpr float kTwoPowMinus31 = 1.0f / 2147483648.0f;
    constexpr float kTwoPowMinus24 = 1.0f / 16777216.0f;
    constexpr float kHalfPi = 1.57079632679489662f;
    for (size_t i = 0; i < pairs; ++i) {
      const float u =
          (static_cast<float>(static_cast<int32_t>(radius_bits_[i] >> 1)) + 0.5f) * kTwoPowMinus31;
      const float r = sqrtApprox(std::fabs(-2.0f * logApprox(u)));  // fabs: no -0
      const uint32_t ab = angle_bits_[i];
      const float a =
          (static_cast<float>(static_cast<int32_t>(ab >> 8)) * kTwoPowMinus24 - 0.5f) * kHalfPi;
      const float z = a * a;
      const float sin_a =
          ((-1.9515295891e-4f * z + 8.3321608736e-3f) * z - 1.6666654611e-1f) * z * a + a;
      const float cos_tail =
          (2.443315711809948e-5f * z - 1.388731625493765e-3f) * z + 4.166664568298827e-2f;
      const float cos_a = cos_tail * z * z - 0.5f * z + 1.0f;
      // Bit 0 swaps cos and sin, bits 1 and 2 flip the signs (as masks: no branch).
      const uint32_t swap = 0u - (ab & 1u);
      const uint32_t sin_bits = std::bit_cast<uint32_t>(r * sin_a);
      const uint32_t cos_bits = std::bit_cast<uint32_t>(r * cos_a);
      const uint32_t x = (sin_bits & swap) | (cos_bits & ~swap);
      const uint32_t y = (cos_bits & swap) | (sin_bits & ~swap);
      first_[i] = std::bit_cast<float>(x ^ ((ab << 30) & 0x80000000u));
      second_[i] = std::bit_cast<float>(y ^ ((ab << 29) & 0x80000000u));
    }
  }

  Xoshiro256pp rng_;
  std::array<uint32_t, kPairs> radius_bits_, angle_bits_;
  std::array<float, kPairs> first_, second_;
};

// Anything above this is a lognormal draw far beyond any memory (z > 15); clamped so the
// conversion to an integer is defined.
constexpr double kMaxDrawnSamples = 1e15;

}  // namespace

Result<SyntheticFederation> SyntheticFederation::create(const SyntheticSpec& spec) {
  auto bad = [](const std::string& what) { return invalidArgument("synthetic: " + what); };
  if (spec.devices == 0) return bad("devices must be >= 1");
  if (spec.dim == 0) return bad("dim must be >= 1");
  if (spec.num_classes < 2 || spec.num_classes > 256) {
    return bad("num_classes must be in 2..256, got " + std::to_string(spec.num_classes));
  }
  if (!std::isfinite(spec.alpha) || spec.alpha < 0) {
    return bad("alpha must be finite and >= 0, got " + std::to_string(spec.alpha));
  }
  if (spec.blocks > spec.num_classes || !std::isfinite(spec.block_shift)) {
    return bad("blocks must be at most num_classes and block_shift finite");
  }
  if (!std::isfinite(spec.beta) || spec.beta < 0) {
    return bad("beta must be finite and >= 0, got " + std::to_string(spec.beta));
  }
  if (!(spec.train_fraction > 0 && spec.train_fraction < 1)) {
    return bad("train_fraction must lie strictly between 0 and 1, got " +
               std::to_string(spec.train_fraction));
  }
  if (spec.max_samples == 1) return bad("max_samples must be 0 (no cap) or >= 2");
  try {
    SyntheticFederation fed(spec);
    if (spec.iid) {
      // FedProx's IID variant: W ~ N(0, 1), b ~ N(0, 1), v = B * 1 with B ~ N(0, beta), shared.
      const size_t dim = spec.dim, classes = spec.num_classes;
      NormalSource normal(Xoshiro256pp(spec.seed, 0, Stream::kShared));
      std::vector<float> z(1 + dim * classes + classes);
      normal.fill(z.data(), z.size());
      auto p = std::make_shared<DeviceParameters>();
      p->v.assign(dim, static_cast<float>(spec.beta * z[0]));
      p->w.assign(z.begin() + 1, z.begin() + 1 + dim * classes);
      p->b.assign(z.begin() + 1 + dim * classes, z.end());
      fed.shared_ = std::move(p);
    }
    return fed;
  } catch (const std::bad_alloc&) {
    return resourceExhausted("synthetic: out of memory for the shared parameters");
  }
}

uint64_t SyntheticFederation::totalSamples(uint64_t k) const {
  FEDFLEET_CHECK_MSG(k < spec_.devices, "synthetic: device index out of range");
  std::mt19937_64 rng = countGenerator(spec_.seed, k);
  std::lognormal_distribution<double> lognormal(4.0, 2.0);
  const double drawn = std::min(std::floor(lognormal(rng)), kMaxDrawnSamples);
  const uint64_t total = static_cast<uint64_t>(drawn) + 50;
  return spec_.max_samples > 0 ? std::min(total, spec_.max_samples) : total;
}

uint64_t SyntheticFederation::trainSamples(uint64_t k) const {
  const uint64_t total = totalSamples(k);  // >= 2 (create() checks max_samples)
  const double wanted = std::round(spec_.train_fraction * static_cast<double>(total));
  return std::clamp<uint64_t>(static_cast<uint64_t>(wanted), 1, total - 1);
}

SyntheticFederation::DeviceParameters SyntheticFederation::deviceParameters(uint64_t k) const {
  FEDFLEET_CHECK_MSG(k < spec_.devices, "synthetic: device index out of range");
  if (shared_) return *shared_;
  const size_t dim = spec_.dim, classes = spec_.num_classes;
  NormalSource normal(Xoshiro256pp(spec_.seed, k, Stream::kParameters));
  std::vector<float> z(2 + dim + dim * classes + classes);
  normal.fill(z.data(), z.size());
  const double u = spec_.alpha * z[0];  // u_k ~ N(0, alpha): mean of W and b
  double big_b = spec_.beta * z[1];     // B_k ~ N(0, beta)
  // Block-cyclic variant: device k is in block m = k mod blocks; B_k is centred at m x shift and
  // b_k favours block m's class group by + shift.
  const uint32_t block = spec_.blocks > 0 ? static_cast<uint32_t>(k % spec_.blocks) : 0;
  if (spec_.blocks > 0) big_b += spec_.block_shift * block;
  const float* next = z.data() + 2;
  DeviceParameters p;
  p.v.resize(dim);
  for (auto& x : p.v) x = static_cast<float>(big_b + *next++);  // v_k ~ N(B_k, 1)
  p.w.resize(dim * classes);
  for (auto& x : p.w) x = static_cast<float>(u + *next++);  // W ~ N(u_k, 1)
  p.b.resize(classes);
  for (auto& x : p.b) x = static_cast<float>(u + *next++);  // b ~ N(u_k, 1)
  if (spec_.blocks > 0) {
    const ClassGroup g = classGroup(block, spec_.blocks, static_cast<uint32_t>(classes));
    for (uint32_t c = g.first; c < g.first + g.size; ++c) {
      p.b[c] += static_cast<float>(spec_.block_shift);
    }
  }
  return p;
}

Result<Dataset> SyntheticFederation::generate(uint64_t k, bool train) const {
  if (k >= spec_.devices) {
    return invalidArgument("synthetic: device " + std::to_string(k) + " of a " +
                           std::to_string(spec_.devices) + "-device federation");
  }
  const uint64_t total = totalSamples(k), n_train = trainSamples(k);
  const uint64_t n = train ? n_train : total - n_train;
  const size_t dim = spec_.dim, classes = spec_.num_classes;
  if (n > std::numeric_limits<size_t>::max() / dim / sizeof(float)) {
    return resourceExhausted("synthetic: device " + std::to_string(k) + "'s " + std::to_string(n) +
                             " samples do not fit in memory");
  }
  try {
    const DeviceParameters local = shared_ ? DeviceParameters() : deviceParameters(k);
    const DeviceParameters& p = shared_ ? *shared_ : local;
    Dataset ds;
    ds.feature_dim = spec_.dim;
    ds.num_classes = spec_.num_classes;
    ds.features.resize(static_cast<size_t>(n) * dim);
    ds.labels.resize(static_cast<size_t>(n));

    // x = v + sd * z, with sd_j = (j + 1)^-0.6: the covariance diag((j + 1)^-1.2).
    NormalSource normal(Xoshiro256pp(spec_.seed, k, train ? Stream::kTrain : Stream::kTest));
    normal.fill(ds.features.data(), ds.features.size());
    std::vector<float> sd(dim);
    for (size_t j = 0; j < dim; ++j) {
      sd[j] = static_cast<float>(std::pow(static_cast<double>(j + 1), -0.6));
    }
    // y = argmax(x W + b), the first maximum on a tie, in fp32 on the stored x. The products go
    // a block of samples at a time through a transposed copy of the block, so that the inner
    // loop runs over samples (contiguous, vectorised) rather than over the few classes; each
    // logit still sums b_c + x_0 W_0c + x_1 W_1c + ... in that order.
    constexpr size_t kBlock = 64;
    std::vector<float> xt(dim * kBlock), logits(classes * kBlock);
    for (size_t i0 = 0; i0 < n; i0 += kBlock) {
      const size_t rows = std::min<size_t>(kBlock, n - i0);
      for (size_t i = 0; i < rows; ++i) {
        float* x = ds.features.data() + (i0 + i) * dim;
        for (size_t j = 0; j < dim; ++j) x[j] = p.v[j] + sd[j] * x[j];
        for (size_t j = 0; j < dim; ++j) xt[j * kBlock + i] = x[j];
      }
      for (size_t c = 0; c < classes; ++c) {
        float* out = logits.data() + c * kBlock;
        std::fill_n(out, rows, p.b[c]);
        for (size_t j = 0; j < dim; ++j) {
          const float w = p.w[j * classes + c];
          const float* xj = xt.data() + j * kBlock;
          for (size_t i = 0; i < rows; ++i) out[i] += xj[i] * w;
        }
      }
      for (size_t i = 0; i < rows; ++i) {
        size_t best = 0;
        for (size_t c = 1; c < classes; ++c) {
          if (logits[c * kBlock + i] > logits[best * kBlock + i]) best = c;
        }
        ds.labels[i0 + i] = static_cast<Label>(best);
      }
    }
    return ds;
  } catch (const std::bad_alloc&) {
    return resourceExhausted("synthetic: out of memory generating device " + std::to_string(k) +
                             "'s " + std::to_string(n) + " samples");
  }
}

}  // namespace fedfleet::data
