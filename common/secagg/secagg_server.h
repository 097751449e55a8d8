// SecAggServer: the coordinator's side of one SecAgg+ round (Bell et al., CCS 2020, on the
// secure aggregation of Bonawitz et al., CCS 2017), sans-I/O: a driver feeds it each client's
// messages under the index its authenticated key holds in the round's cohort, closes each stage
// at its deadline (or when every expected message is in), and sends what each close returns.
//
// The protocol, for a cohort of n clients in a random k-regular neighbour graph
// (neighbour_graph.h) and threshold t ((k+1)/2 < t <= k+1):
//  1. Advertise keys. Client i sends two X25519 public keys (one to seal shares, one for
//     pairwise masks) and a digest of its self-mask seed b_i. U1: the clients heard from.
//     Closing sends each client of U1 its neighbours' keys among U1.
//  2. Share keys. Client i splits b_i and its mask private key into t-of-(|N(i) in U1| + 1)
//     Shamir shares (shamir.h), keeps one pair, and seals one pair per neighbour j in U1 (all of
//     them, or it is not taken into U2) with AES-256-GCM under a
//     key from X25519(i, j) and HKDF: the coordinator routes them and cannot read them. U2: the
//     clients whose sealed shares arrived. Closing forwards to each client of U2 the shares
//     addressed to it by U2.
//  3. Masked input. Client i masks its quantised input x_i (integers mod 2^32):
//     y_i = x_i + PRG(b_i) + sum_{j in N(i) and U2, j > i} PRG(s_ij) - sum_{j < i} PRG(s_ij),
//     with s_ij from X25519 and HKDF (both ends compute it) and AES-256-CTR as the PRG. Each
//     chunk of y_i is added (mod 2^32) into the one running sum as it arrives; no code path
//     reads one client's upload for anything but that sum. U3: the complete uploads. An
//     incomplete upload is subtracted again at the stage's close and its client counts as
//     dropped. To subtract it, the chunks of each upload still in flight are kept in a
//     ChunkLog (common/chunk_log.h) until it completes: in memory up to a bound, beyond it in
//     an unlinked temporary file, so the server's memory is the sum plus at most the bound,
//     however many uploads are in flight. Nothing cheaper can take an upload back: masked
//     values are uniform mod 2^32 (incompressible), and the server cannot regenerate them
//     (it never learns x_i, and of a dropped client it may rebuild the mask key, never b_i).
//     A completed upload's chunks are forgotten at once.
//  4. Unmasking. Each client of U3 is asked for its own share of b_i and, for each neighbour j
//     it holds shares of, for b_j's share if j is in U3 and for j's mask key share if j is in U2
//     but not U3, never both (the client refuses a second request). U4: the clients that answered.
//     For every j in U3 the coordinator needs t shares of b_j from U4 to remove PRG(b_j); for every
//     j in U2 \ U3 with a neighbour in U3, t shares of its mask key, to recompute and remove the
//     pairwise masks its neighbours in U3 added. Reconstructions are checked (the seed against its
//     digest, the key against its public key); the sum that remains is sum_{i in U3} x_i mod 2^32.
// Clients can drop at any stage. The round completes while every survivor and every dropped
// client whose masks are in the sum has t neighbours in U4; otherwise finish() fails, and
// the caller changes nothing. A stage closed early (every message in) behaves as at its
// deadline. One owner; one object per round.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/chunk_log.h"
#include "common/secagg/neighbour_graph.h"
#include "common/secagg/round_params.h"
#include "common/secagg/shamir.h"

namespace fedfleet::secagg {

enum class Stage { kAdvertise, kShareKeys, kMaskedInput, kUnmask, kDone };
const char* stageName(Stage stage);

class SecAggServer {
 public:
  // The in-memory budget of the masked chunks kept for uploads in flight (the rest spill to a
  // temporary file) when the driver names none.
  static constexpr uint64_t kDefaultInFlightMemoryBytes = 64ull << 20;

  // Aborts on parameters validateRoundParams refuses (drivers check first). At most
  // `in_flight_memory_bytes` of masked chunks of incomplete uploads are held in memory.
  explicit SecAggServer(const RoundParams& params,
                        uint64_t in_flight_memory_bytes = kDefaultInFlightMemoryBytes);

  Stage stage() const { return stage_; }
  const RoundParams& params() const { return params_; }
  const NeighbourGraph& graph() const { return graph_; }
  // Whether every client still in the round has sent what the current stage expects (the
  // driver may close the stage before its deadline). Clients marked gone are not waited for.
  bool stageComplete() const;
  // Client `index` will send nothing more this round (its connection or task ended).
  void markGone(uint32_t index) { gone_.insert(index); }

  // Stage 1. `from` is the sender's index, from its authenticated identity, never from the
  // message. kFailedPrecondition out of stage or twice; kInvalidArgument for keys or a digest
  // of the wrong size, or an index that is not the sender's.
  Status onAdvert(uint32_t from, const KeyAdvert& advert);
  // Ends stage 1: per client of U1, its neighbours' adverts among U1.
  std::vector<std::pair<uint32_t, std::vector<KeyAdvert>>> closeAdvertise();

  // Stage 2: the sender's sealed shares, one per neighbour in U1 it was sent keys of, each
  // exactly as long as a sealed pair of shares. kFailedPrecondition out of stage, twice, or
  // from a client not in U1; kInvalidArgument otherwise.
  Status onSealedShares(uint32_t from, const std::vector<SealedShares>& shares);
  // Ends stage 2: per client of U2, the sealed shares addressed to it by U2.
  std::vector<std::pair<uint32_t, std::vector<SealedShares>>> closeShareKeys();

  // Stage 3: values [offset, offset + n) of the sender's masked input, added to the sum and
  // kept until the upload completes. Chunks of one sender are contiguous, starting at 0.
  // kFailedPrecondition out of stage or from a client not in U2 (or already complete);
  // kInvalidArgument out of order or past the length; kIoError when the chunk cannot be kept
  // (the spill file): then nothing of it is added, and the caller drops the upload.
  Status onMaskedChunk(uint32_t from, uint64_t offset, const uint32_t* values, size_t n);
  // The sender says its upload is complete: it stays in the sum and its kept chunks are
  // forgotten. kInvalidArgument when values are missing.
  Status onMaskedDone(uint32_t from);
  // Ends stage 3: incomplete uploads are taken back out of the sum (should reading a spilled
  // chunk back fail, finish() fails with that error); per client of U3, which shares it must
  // reveal.
  std::vector<std::pair<uint32_t, UnmaskRequest>> closeMaskedInput();

  // Stage 4: the shares one client of U3 reveals. Each must be one it was asked for, carry its
  // own evaluation point and decode; kFailedPrecondition out of stage, twice, or from a client
  // not asked; kInvalidArgument (nothing kept) otherwise.
  Status onRevealed(uint32_t from, const std::vector<RevealedShare>& shares);
  // Ends the round: sum_{i in U3} x_i mod 2^32 (params.length values), or why it cannot be
  // had (kFailedPrecondition: too few shares for some client, naming it; kCorrupt: a
  // reconstruction that does not match its digest or public key).
  Result<std::vector<uint32_t>> finish();

  // The clients whose inputs are in the sum (U3), in index order.
  std::vector<uint32_t> survivors() const;
  // How many clients passed each stage so far: |U1|, |U2|, |U3|, |U4|.
  std::array<size_t, 4> stageCounts() const {
    return {adverts_.size(), shared_.size(), complete_.size(), revealed_.size()};
  }
  // Bytes of masked chunks of incomplete uploads held in memory (at most the budget given at
  // construction), and spilled to the temporary file this round.
  uint64_t inFlightMemoryBytes() const { return in_flight_log_.memoryBytes(); }
  uint64_t inFlightSpilledBytes() const { return in_flight_log_.spilledBytes(); }

 private:
  bool isNeighbourIn(uint32_t i, uint32_t j, const std::map<uint32_t, KeyAdvert>& set) const;

  const RoundParams params_;
  const NeighbourGraph graph_;
  Stage stage_ = Stage::kAdvertise;

  std::map<uint32_t, KeyAdvert> adverts_;                    // U1
  std::map<uint32_t, std::vector<SealedShares>> shared_;     // U2: what each sent
  std::map<uint32_t, uint64_t> in_flight_;                   // values received, until complete
  std::set<uint32_t> complete_;                              // U3
  std::map<uint32_t, UnmaskRequest> requests_;               // asked in stage 4
  std::map<uint32_t, std::vector<RevealedShare>> revealed_;  // U4
  std::vector<uint32_t> sum_;                                // running sum of masked inputs
  std::set<uint32_t> gone_;                                  // not waited for
  // The chunks of the uploads in flight, to take back those that never complete.
  ChunkLog in_flight_log_;
  // Not ok: an incomplete upload could not be taken back (reading its chunks failed), and
  // finish() fails with this.
  Status taken_back_;
};

}  // namespace fedfleet::secagg
