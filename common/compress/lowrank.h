// The lowrank codec: a chunk read as a rows x cols matrix M (row-major), sent as a rank-r
// approximation M ~ sum_j s_j p_j q_j^T (PowerSGD's factorisation, Vogels et al., NeurIPS 2019,
// computed by the sender alone: a few rounds of randomised subspace iteration, Halko, Martinsson
// and Tropp, SIAM Review 2011).
//
// Why this codec: a client's update of a dense layer after a few local steps is close to low
// rank (each minibatch gradient of a linear layer has rank at most the batch size), while its
// energy is spread over nearly every element, so keeping 1% of the elements (topk) loses
// direction that r rows and columns keep (docs/BENCHMARKS.md, codecs_accuracy).
//
// Body (after the 12-byte payload header, whose param is r and whose n is rows * cols):
//   offset          size                 field
//   0               4                    rows (>= 1, divides n; 1 when n = 0); cols = n / rows
//   4               4r                   s_0..s_{r-1}, fp32, finite, |s_j| <= kMaxLowrankScale
//   4 + 4r          2 * rows * r         P, fp16, row-major (P[i * r + j] = p_j[i]), |value| <= 1
//   4 + 4r + 2rR    2 * cols * r         Q, fp16, row-major (Q[c * r + j] = q_j[c]), |value| <= 1
// with r <= min(rows, cols, kMaxRank) (r = 0: the zero matrix). Decoding checks all of it, so
// every decoded value is finite: |M_ic| <= r * kMaxLowrankScale.
//
// Encoding: r' = min(rank, rows, cols). When r' is rows or cols the factors are exact (P0 = I,
// Q0 = M^T, or P0 = M, Q0 = I). Otherwise l = min(r' + min(r', kLowrankOversampling), rows,
// cols); Y = orth(M Omega) with Omega a cols x l matrix of +-1 drawn from the seed (orth:
// modified Gram-Schmidt, twice); then kLowrankPowerIterations times Y <- orth(M orth(M^T Y));
// then Z = M^T Y, so that M ~ Y Z^T, and with W the eigenvectors of Z^T Z for its r' largest
// eigenvalues (cyclic Jacobi), P0 = Y W and Q0 = Z W: the best rank r' within the subspace. Column
// j of each factor is divided by its largest magnitude (p_j, q_j in
// [-1, 1], where fp16 keeps 11 bits of each value) and s_j is the product of the two. All of it
// in double precision in a fixed order: the same (x, rows, cols, rank, seed) gives the same
// bytes on every machine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/compress/payload.h"
#include "common/status.h"

namespace fedfleet::compress {

// Largest rank a lowrank spec may name and a payload may carry. Decoding costs r multiply-adds
// an element, so this also bounds what a payload can cost the coordinator.
constexpr uint32_t kMaxRank = 64;

// Largest |s_j| a payload may carry, FLT_MAX / 128 (2^121 (1 - 2^-24)): a sum of r <= 64 such
// terms over factors in [-1, 1] stays finite with room for its rounding.
constexpr float kMaxLowrankScale = 2.6584559e36f;

// Rounds of subspace iteration after the first product.
constexpr int kLowrankPowerIterations = 2;

// Extra columns of the random start beyond the rank (at most the rank itself).
constexpr size_t kLowrankOversampling = 8;

// The rank a payload of a rows x cols matrix carries for a spec of rank `rank`.
inline size_t lowrankEffectiveRank(size_t rank, size_t rows, size_t cols) {
  size_t r = rank < rows ? rank : rows;
  return r < cols ? r : cols;
}

// Bytes of a lowrank payload (header included) of rank r for a rows x cols matrix.
inline size_t lowrankPayloadBytes(size_t r, size_t rows, size_t cols) {
  return kPayloadHeaderBytes + 4 + 4 * r + 2 * r * (rows + cols);
}

// Appends the payload of x[0, rows * cols) read as a rows x cols matrix, of rank
// lowrankEffectiveRank(rank, rows, cols) (see above). rows >= 1 and rows divides the element
// count (checked by the caller: Codec::encodeRows). x must be finite; a value so large that a
// factor's scale overflows yields a payload that decoding refuses.
void lowrankEncode(const float* x, size_t rows, size_t cols, uint32_t rank, uint64_t seed,
                   std::string* out);

// Checks a lowrank payload's body against header h (h.n == n, checked by the caller) and
// decodes it: out[i] = value_i (accumulate false) or out[i] = fma(w, value_i, out[i])
// (accumulate true, the same bits as decoding then kernels::weightedAccumulate). CORRUPT, out
// untouched, naming the first problem.
Status lowrankDecode(const PayloadHeader& h, const unsigned char* body, size_t body_bytes, size_t n,
                     float w, float* out, bool accumulate);

}  // namespace fedfleet::compress
