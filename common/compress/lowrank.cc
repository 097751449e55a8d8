#include "common/compress/lowrank.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/check.h"
#include "common/splitmix.h"
#include "kernels/accumulate.h"
#include "kernels/convert.h"

namespace fedfleet::compress {
namespace {

// y (rows x r, row-major) = M (rows x cols) b (cols x r, row-major).
void multiply(const float* m, size_t rows, size_t cols, const double* b, size_t r, double* y) {
  std::fill(y, y + rows * r, 0.0);
  for (size_t i = 0; i < rows; ++i) {
    double* yi = y + i * r;
    const float* mi = m + i * cols;
    for (size_t c = 0; c < cols; ++c) {
      const double v = mi[c];
      const double* bc = b + c * r;
      for (size_t j = 0; j < r; ++j) yi[j] += v * bc[j];
    }
  }
}

// z (cols x r, row-major) = M^T y (y: rows x r, row-major).
void multiplyTransposed(const float* m, size_t rows, size_t cols, const double* y, size_t r,
                        double* z) {
  std::fill(z, z + cols * r, 0.0);
  for (size_t i = 0; i < rows; ++i) {
    const double* yi = y + i * r;
    const float* mi = m + i * cols;
    for (size_t c = 0; c < cols; ++c) {
      const double v = mi[c];
      double* zc = z + c * r;
      for (size_t j = 0; j < r; ++j) zc[j] += v * yi[j];
    }
  }
}

// Makes the r columns of a (len x r, row-major) orthonormal in place: modified Gram-Schmidt,
// twice (one pass loses orthogonality when the columns are nearly dependent). A column left
// with almost nothing of its own after the projections becomes zero.
void orthonormalize(double* a, size_t len, size_t r) {
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t j = 0; j < r; ++j) {
      double before = 0;
      for (size_t i = 0; i < len; ++i) before += a[i * r + j] * a[i * r + j];
      for (size_t k = 0; k < j; ++k) {
        double dot = 0;
        for (size_t i = 0; i < len; ++i) dot += a[i * r + j] * a[i * r + k];
        for (size_t i = 0; i < len; ++i) a[i * r + j] -= dot * a[i * r + k];
      }
      double after = 0;
      for (size_t i = 0; i < len; ++i) after += a[i * r + j] * a[i * r + j];
      const bool empty = !(after > 1e-24 * before) || after == 0;
      const double inv = empty ? 0.0 : 1.0 / std::sqrt(after);
      for (size_t i = 0; i < len; ++i) a[i * r + j] *= inv;
    }
  }
}

// Column j of a (len x r, row-major) divided by its largest magnitude, as fp16 into out (same
// layout); returns that magnitude (0 for a zero column, which is written as zeros).
void normalizedColumnsFp16(const double* a, size_t len, size_t r, double* max_abs,
                           std::vector<float>* tmp, unsigned char* out) {
  for (size_t j = 0; j < r; ++j) {
    double m = 0;
    for (size_t i = 0; i < len; ++i) m = std::max(m, std::fabs(a[i * r + j]));
    max_abs[j] = m;
  }
  tmp->resize(len * r);
  for (size_t i = 0; i < len; ++i) {
    for (size_t j = 0; j < r; ++j) {
      (*tmp)[i * r + j] = max_abs[j] > 0 ? static_cast<float>(a[i * r + j] / max_abs[j]) : 0.0f;
    }
  }
  kernels::floatToFp16(tmp->data(), len * r, out);
}

// Eigen-decomposition of the symmetric l x l matrix a (row-major, destroyed) by cyclic Jacobi
// rotations: on return a's diagonal holds the eigenvalues and v's column k (row-major l x l)
// the eigenvector of a[k][k].
void symmetricEigen(std::vector<double>& a, size_t l, std::vector<double>* v) {
  v->assign(l * l, 0.0);
  for (size_t k = 0; k < l; ++k) (*v)[k * l + k] = 1.0;
  double total = 0;
  for (double e : a) total += e * e;
  for (int sweep = 0; sweep < 60; ++sweep) {
    double off = 0;
    for (size_t p = 0; p < l; ++p) {
      for (size_t q = p + 1; q < l; ++q) off += a[p * l + q] * a[p * l + q];
    }
    if (!(off > 1e-30 * total)) break;
    for (size_t p = 0; p < l; ++p) {
      for (size_t q = p + 1; q < l; ++q) {
        const double apq = a[p * l + q];
        if (apq == 0) continue;
        const double theta = (a[q * l + q] - a[p * l + p]) / (2 * apq);
        const double t =
            (theta >= 0 ? 1.0 : -1.0) / (std::fabs(theta) + std::sqrt(theta * theta + 1));
        const double c = 1 / std::sqrt(t * t + 1), s = t * c;
        for (size_t k = 0; k < l; ++k) {  // columns p and q
          const double akp = a[k * l + p], akq = a[k * l + q];
          a[k * l + p] = c * akp - s * akq;
          a[k * l + q] = s * akp + c * akq;
        }
        for (size_t k = 0; k < l; ++k) {  // rows p and q
          const double apk = a[p * l + k], aqk = a[q * l + k];
          a[p * l + k] = c * apk - s * aqk;
          a[q * l + k] = s * apk + c * aqk;
        }
        for (size_t k = 0; k < l; ++k) {
          const double vkp = (*v)[k * l + p], vkq = (*v)[k * l + q];
          (*v)[k * l + p] = c * vkp - s * vkq;
          (*v)[k * l + q] = s * vkp + c * vkq;
        }
      }
    }
  }
}

// out (len x r, row-major) = a (len x l, row-major) times columns idx[0, r) of w (l x l).
void project(const double* a, size_t len, size_t l, const std::vector<double>& w,
             const std::vector<size_t>& idx, double* out) {
  const size_t r = idx.size();
  for (size_t i = 0; i < len; ++i) {
    for (size_t j = 0; j < r; ++j) {
      double x = 0;
      for (size_t k = 0; k < l; ++k) x += a[i * l + k] * w[k * l + idx[j]];
      out[i * r + j] = x;
    }
  }
}

struct EncodeScratch {
  std::vector<double> omega, y, z, gram, eig, p0, q0;
  std::vector<float> tmp;
};

struct DecodeScratch {
  std::vector<float> p, q, qt, row;
};

}  // namespace

void lowrankEncode(const float* x, size_t rows, size_t cols, uint32_t rank, uint64_t seed,
                   std::string* out) {
  FEDFLEET_CHECK(rows >= 1);
  if (cols == 0) rows = 1;  // an empty matrix is one empty row
  const size_t r = lowrankEffectiveRank(rank, rows, cols);
  PayloadHeader h;
  h.kind = CodecKind::kLowrank;
  h.param = static_cast<uint32_t>(r);
  h.n = static_cast<uint32_t>(rows * cols);
  appendPayloadHeader(h, out);
  const auto rows32 = static_cast<uint32_t>(rows);
  out->append(reinterpret_cast<const char*>(&rows32), sizeof(rows32));
  if (r == 0) return;

  thread_local EncodeScratch s;
  const double* p0;  // rows x r: M ~ p0 q0^T
  const double* q0;  // cols x r
  if (r == rows) {
    // The rows span at most r dimensions: P0 = I and Q0 = M^T are exact.
    s.y.assign(rows * r, 0.0);
    s.z.assign(cols * r, 0.0);
    for (size_t i = 0; i < rows; ++i) s.y[i * r + i] = 1.0;
    multiplyTransposed(x, rows, cols, s.y.data(), r, s.z.data());
    p0 = s.y.data();
    q0 = s.z.data();
  } else if (r == cols) {
    // Likewise for the columns: P0 = M and Q0 = I.
    s.y.assign(rows * r, 0.0);
    s.z.assign(cols * r, 0.0);
    for (size_t i = 0; i < rows; ++i) {
      for (size_t c = 0; c < cols; ++c) s.y[i * r + c] = x[i * cols + c];
    }
    for (size_t c = 0; c < cols; ++c) s.z[c * r + c] = 1.0;
    p0 = s.y.data();
    q0 = s.z.data();
  } else {
    // l = r plus oversampling columns: the subspace found then holds the top r directions
    // even when the random start is nearly blind to one of them.
    const size_t l = std::min({r + std::min<size_t>(r, kLowrankOversampling), rows, cols});
    s.y.assign(rows * l, 0.0);
    s.z.assign(cols * l, 0.0);
    // Omega: +-1, 64 signs from each SplitMix64 output of the seed's stream.
    s.omega.resize(cols * l);
    uint64_t state = seed, bits = 0;
    for (size_t e = 0; e < cols * l; ++e) {
      if (e % 64 == 0) bits = splitMix64(state++);
      s.omega[e] = (bits >> (e % 64)) & 1 ? 1.0 : -1.0;
    }
    multiply(x, rows, cols, s.omega.data(), l, s.y.data());
    orthonormalize(s.y.data(), rows, l);
    for (int it = 0; it < kLowrankPowerIterations; ++it) {
      multiplyTransposed(x, rows, cols, s.y.data(), l, s.z.data());
      orthonormalize(s.z.data(), cols, l);
      multiply(x, rows, cols, s.z.data(), l, s.y.data());
      orthonormalize(s.y.data(), rows, l);
    }
    // M ~ Y Z^T with Z = M^T Y. The top r eigenvectors W of Z^T Z (the squared singular
    // values of Y^T M) give M ~ (Y W) (Z W)^T, the best rank r within the subspace.
    multiplyTransposed(x, rows, cols, s.y.data(), l, s.z.data());
    s.gram.assign(l * l, 0.0);
    for (size_t c = 0; c < cols; ++c) {
      const double* zc = s.z.data() + c * l;
      for (size_t a = 0; a < l; ++a) {
        for (size_t b = 0; b < l; ++b) s.gram[a * l + b] += zc[a] * zc[b];
      }
    }
    symmetricEigen(s.gram, l, &s.eig);
    std::vector<size_t> order(l);
    for (size_t k = 0; k < l; ++k) order[k] = k;
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return s.gram[a * l + a] > s.gram[b * l + b]; });
    order.resize(r);
    s.p0.resize(rows * r);
    s.q0.resize(cols * r);
    project(s.y.data(), rows, l, s.eig, order, s.p0.data());
    project(s.z.data(), cols, l, s.eig, order, s.q0.data());
    p0 = s.p0.data();
    q0 = s.q0.data();
  }

  std::vector<double> p_max(r), q_max(r);
  const size_t scales_at = out->size();
  out->resize(scales_at + 4 * r + 2 * r * (rows + cols));
  auto* body = reinterpret_cast<unsigned char*>(out->data()) + scales_at;
  normalizedColumnsFp16(p0, rows, r, p_max.data(), &s.tmp, body + 4 * r);
  normalizedColumnsFp16(q0, cols, r, q_max.data(), &s.tmp, body + 4 * r + 2 * r * rows);
  for (size_t j = 0; j < r; ++j) {
    // A scale past float's range becomes infinity, which decoding refuses.
    const auto scale = static_cast<float>(p_max[j] * q_max[j]);
    std::memcpy(body + 4 * j, &scale, sizeof(scale));
  }
}

Status lowrankDecode(const PayloadHeader& h, const unsigned char* body, size_t body_bytes, size_t n,
                     float w, float* out, bool accumulate) {
  if (body_bytes < 4) {
    return corrupt("lowrank payload body is " + std::to_string(body_bytes) +
                   " bytes, too short for its row count");
  }
  uint32_t rows32;
  std::memcpy(&rows32, body, sizeof(rows32));
  const size_t rows = rows32;
  // No more rows than elements: an empty matrix is one empty row (a payload claiming 2^32 - 1
  // empty rows would make the loop below spin for nothing).
  if (rows == 0 || n % rows != 0 || rows > std::max<size_t>(n, 1)) {
    return corrupt("lowrank payload has " + std::to_string(rows) + " rows, which do not divide " +
                   std::to_string(n) + " elements");
  }
  const size_t cols = n / rows;
  const size_t r = h.param;
  if (r > lowrankEffectiveRank(kMaxRank, rows, cols)) {
    return corrupt("lowrank payload has rank " + std::to_string(r) + " for a " +
                   std::to_string(rows) + " x " + std::to_string(cols) + " matrix (at most " +
                   std::to_string(lowrankEffectiveRank(kMaxRank, rows, cols)) + ")");
  }
  const size_t want = lowrankPayloadBytes(r, rows, cols) - kPayloadHeaderBytes;
  if (body_bytes != want) {
    return corrupt("lowrank payload body is " + std::to_string(body_bytes) + " bytes, expected " +
                   std::to_string(want));
  }
  const unsigned char* scales = body + 4;
  const unsigned char* p16 = scales + 4 * r;
  const unsigned char* q16 = p16 + 2 * r * rows;
  std::vector<float> s(r);
  for (size_t j = 0; j < r; ++j) {
    std::memcpy(&s[j], scales + 4 * j, sizeof(float));
    if (!(std::fabs(s[j]) <= kMaxLowrankScale)) {  // also false for NaN
      return corrupt("lowrank payload scale " + std::to_string(j) + " is " + std::to_string(s[j]) +
                     ", not finite and at most FLT_MAX / 128 in magnitude");
    }
  }
  // Every factor value in [-1, 1]: fp16 magnitude bits at most those of 1.0 (0x3c00), which
  // also excludes NaN and infinity.
  for (size_t e = 0; e < r * (rows + cols); ++e) {
    uint16_t v;
    std::memcpy(&v, p16 + 2 * e, sizeof(v));
    if ((v & 0x7fffu) > 0x3c00u) {
      return corrupt("lowrank payload factor value " + std::to_string(e) + " is not in [-1, 1]");
    }
  }
  thread_local DecodeScratch d;
  d.p.resize(rows * r);
  d.q.resize(cols * r);
  d.qt.resize(cols * r);
  d.row.resize(cols);
  kernels::fp16ToFloat(p16, rows * r, d.p.data());
  kernels::fp16ToFloat(q16, cols * r, d.q.data());
  for (size_t c = 0; c < cols; ++c) {
    for (size_t j = 0; j < r; ++j) d.qt[j * cols + c] = d.q[c * r + j];
  }
  for (size_t i = 0; i < rows; ++i) {
    float* row = accumulate ? d.row.data() : out + i * cols;
    std::fill(row, row + cols, 0.0f);
    for (size_t j = 0; j < r; ++j) {
      const float a = s[j] * d.p[i * r + j];
      const float* qj = d.qt.data() + j * cols;
      for (size_t c = 0; c < cols; ++c) row[c] += a * qj[c];
    }
    if (accumulate) kernels::weightedAccumulate(out + i * cols, row, w, cols);
  }
  return Status::ok();
}

}  // namespace fedfleet::compress
