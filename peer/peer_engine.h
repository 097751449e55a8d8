// PeerEngine: one peer of decentralised training as a deterministic state machine.
//
// Beside the round engine's star (engine/round_engine.h), peers train on their own shards and
// exchange models or gradients with each other as their algorithm says; nobody aggregates
// centrally. Like RoundEngine it does no I/O and reads no clock: a driver (the simulator,
// sim/peer_simulator.h, or a networked peer process) feeds it events and carries out the actions
// it returns, in order. One PeerEngine per peer; Prague's coordinator side is a GroupGenerator
// (peer/group_generator.h) driven the same way. Given the same events in the same order and the
// same seed, it returns the same actions.
//
// Training happens outside: the engine asks for work with a Compute action (the parameters to
// start from, the local steps), and the driver answers with onComputed(iteration, delta, ...)
// where delta = trained - start (client::Trainer's delta). With plain SGD and one step that is
// -lr * gradient, so "averaging gradients" and "averaging deltas" are the same thing.
//
// The algorithms (PeerOptions::algorithm), each iteration t of peer i, x_i its model, u_i its
// delta:
//  allreduce  Compute on x; ring all-reduce of u over all P peers (reduce-scatter then
//             all-gather: each peer sends 2 (P - 1) / P of the model); x += mean(u). With a
//             codec, every chunk a peer sends is compressed with error feedback (a residual per
//             element for its reduce-scatter sends and one for its all-gather sends). pipeline
//             = 2 (Pipe-SGD): iteration t + 1 computes while the all-reduce of t is in flight,
//             on a model that lacks mean(u_t): one step stale, never more.
//  dpsgd      Send x_i^t to the neighbours and Compute on x_i^t at once; when u_i and every
//             neighbour's x_j^t are in: x_i^{t+1} = sum_j W_ij x_j^t + u_i (Metropolis weights on
//             the ring, torus or seeded random d-regular topology; peer/topology.h).
//  adpsgd     Peers are split into actives and passives (peer/topology.h: even ids active).
//             An active computes u on its model, then averages with one passive neighbour drawn
//             with its seeded generator (AverageRequest carrying x_i; the passive sets
//             x_j = (x_i + x_j) / 2 and replies with it; the active adopts it), then x_i += u.
//             A passive computes and applies its own u continuously and answers requests
//             whenever they come (its u may then be stale by the averagings in between). Only
//             actives initiate, only with passives, so no cycle of waits can form.
//  prague     Compute u, x += u, then GroupRequest to the generator; when the generator assigns
//             a group, its members average their models with a ring all-reduce over the group
//             (Partial All-Reduce) and go on (a group of one: alone this time). A group whose
//             member dies is abandoned: the others keep their own models for that iteration.
//             A peer that finished its iterations sends the generator a Leave.
//  hop        Compute u, x' = x + u, send x' tagged t to the neighbours; proceed once n - b of
//             the n neighbours' models tagged t or later arrived (backup workers b: the first
//             n - b in arrival order; peer/hop_queues.h), x = mean of x' and those. A peer does
//             not start iteration t while a live neighbour's newest model is more than `bound`
//             iterations behind (t - 1 - newest > bound); a peer whose neighbour completed
//             max(bound, 1) or more iterations beyond its own t skips ahead instead of holding
//             the others back: it averages with the neighbours' newest models, records the
//             iterations between as skipped and resumes at that neighbour's next iteration.
//  local      Compute H steps (local_steps) from x; all-reduce the pseudo-gradient
//             d = -(u) = x - x_i; outer Nesterov step (peer/outer_optimizer.h):
//             v = m v + mean(d); x -= lr_o (mean(d) + m v) (DiLoCo; lr_o 0.7, m 0.9 defaults;
//             lr_o 1, m 0 is FedAvg's periodic averaging).
//
// Failure: onPeerDown(p). adpsgd, prague and hop with backup workers (b >= 1) carry on without
// p. allreduce, dpsgd, local and hop with b = 0 cannot: the engine returns a Fail action naming
// p, saying the algorithm cannot continue without it and which algorithms can, and does
// nothing more.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <variant>
#include <vector>

#include "common/compress/codec_spec.h"
#include "common/status.h"
#include "common/wire/peer_message.h"

namespace fedfleet::peer {

using wire::PeerMessage;
using wire::PeerMessageKind;

enum class Algorithm { kAllReduce, kDpsgd, kAdpsgd, kPrague, kHop, kLocal };
enum class Topology { kRing, kTorus, kRandom };

// "allreduce", "dpsgd", "adpsgd", "prague", "hop", "local" and back; INVALID_ARGUMENT naming
// the choices otherwise.
const char* algorithmName(Algorithm algorithm);
Result<Algorithm> parseAlgorithm(const std::string& text);
// "ring", "torus", "random" and back.
const char* topologyName(Topology topology);
Result<Topology> parseTopology(const std::string& text);

// The id of Prague's group generator in messages: one past the last peer.
inline uint32_t generatorId(uint32_t peers) { return peers; }

struct PeerOptions {
  Algorithm algorithm = Algorithm::kAllReduce;
  uint32_t peers = 0;       // P >= 2
  uint64_t iterations = 0;  // per peer; 0: until the driver stops
  uint64_t seed = 1;        // topology, neighbour choice, codec seeds
  // allreduce
  uint32_t pipeline = 1;      // 1, or 2 (Pipe-SGD)
  compress::CodecSpec codec;  // inside the all-reduce (allreduce and local); "none": fp32
  // dpsgd, adpsgd, hop
  Topology topology = Topology::kRing;
  uint32_t degree = 4;  // random: d of the d-regular graph (P * d even, d < P)
  // prague
  uint32_t group_size = 4;
  uint32_t group_buffer = 4;  // batches of candidate groups the generator draws at a time
  // hop
  uint32_t hop_bound = 2;   // iteration gap bound
  uint32_t hop_backup = 0;  // backup workers b: proceed on n - b neighbours
  // local (DiLoCo)
  uint32_t local_steps = 8;  // H inner steps per outer step
  double outer_lr = 0.7;
  double outer_momentum = 0.9;
  // Steps per Compute for every algorithm but local (which uses local_steps).
  uint32_t steps_per_iteration = 1;
};

// OK when the options are coherent (P >= 2; pipeline 1 or 2, and 2 for allreduce only; a valid
// codec; random topology: 1 <= degree < P and P * degree even; prague: group_size in [2, P];
// group_buffer >= 1; hop: hop_backup below the fewest neighbours a peer has; local_steps and
// steps_per_iteration >= 1; outer_lr > 0; outer_momentum in [0, 1)). INVALID_ARGUMENT naming
// the option.
Status validate(const PeerOptions& options);

// ---- actions ---------------------------------------------------------------------------------

// Train from `params` for `steps` local steps and answer with onComputed(iteration, ...).
// At most one Compute is outstanding per engine.
struct Compute {
  uint64_t iteration = 0;
  std::shared_ptr<const std::vector<float>> params;
  uint32_t steps = 1;
};
// Deliver `message` to message.to (a peer, or the generator).
struct Send {
  PeerMessage message;
};
// Iteration `iteration` of this peer is over (its model updated), or was skipped (Hop).
struct IterationDone {
  uint64_t iteration = 0;
  uint32_t exchanges = 0;  // models or chunks received and used in it
  uint32_t staleness = 0;  // iterations the delta's starting model lagged (pipeline, AD-PSGD,
                           // Hop's skip distance)
  bool skipped = false;
  double loss = 0;  // the Compute's loss (0 when skipped)
  uint64_t samples = 0;
};
// The peer finished its configured iterations; nothing more will come from it but answers to
// others (AD-PSGD's passives keep answering, Prague's members finish their group).
struct Finished {};
// The peer cannot continue (a dead peer the algorithm needs, a malformed message from a peer it
// trusts to follow the protocol); `status` says why. Nothing follows.
struct Fail {
  Status status;
};

using PeerAction = std::variant<Compute, Send, IterationDone, Finished, Fail>;

// ---- the engine ------------------------------------------------------------------------------

class PeerAlgorithm;

class PeerEngine {
 public:
  // Peer `self` (0 .. P - 1) with `initial` parameters (usually the same on every peer). Options
  // must validate (checked: aborts otherwise).
  PeerEngine(const PeerOptions& options, uint32_t self, std::vector<float> initial);
  ~PeerEngine();
  PeerEngine(const PeerEngine&) = delete;
  PeerEngine& operator=(const PeerEngine&) = delete;

  // The first actions (a Compute; dpsgd also its model's Sends). Call once.
  std::vector<PeerAction> start();

  // The Compute for `iteration` is done: delta = trained - params, `samples` trained on, the
  // mean `loss`. A delta of the wrong size, or an iteration that was not asked for, is a
  // driver bug (checked: aborts).
  std::vector<PeerAction> onComputed(uint64_t iteration, std::vector<float> delta, uint64_t samples,
                                     double loss);

  // A message for this peer. A message the protocol does not expect (a wrong size, a step past
  // the ring, an unknown group, a sender that is not a neighbour) returns a Fail action: peers
  // are trusted to follow the protocol once authenticated, so a violation is a bug or an attack
  // and the run stops. Messages that come early (chunks of a ring this peer has not joined yet,
  // a neighbour's model of the next iteration, a group's chunks before its assignment) are kept
  // until they apply, within bounds (a pipeline's worth of rings, one pending group); a message
  // from a peer reported down is dropped (it may have been in flight); late chunks of a group
  // this peer abandoned are dropped.
  std::vector<PeerAction> onMessage(PeerMessage message);

  // Peer `peer` is gone for good (its connection lost, the simulator killed it).
  std::vector<PeerAction> onPeerDown(uint32_t peer);

  // The current model (for evaluation of the peers' average, and checkpoints).
  const std::vector<float>& model() const;
  uint32_t self() const;
  // Iterations completed or skipped so far.
  uint64_t iteration() const;
  bool finished() const;
  bool failed() const;

 private:
  std::unique_ptr<PeerAlgorithm> impl_;  // one per algorithm (peer/peer_algorithm.h)
};

}  // namespace fedfleet::peer
