// Hop's bookkeeping of its in-neighbours' updates (Luo et al., ASPLOS 2019), as pure logic for
// the hop algorithm of peer/peer_engine.h.
//
// Iterations count from 0; a neighbour's update tagged t is its model after its iteration t.
// With n live in-neighbours and b backup workers, iteration t of this peer mixes the first
// n - b neighbours (in arrival order) whose updates tagged t or later have arrived, each with
// its newest model. The iteration gap is bounded: iteration t may start only while every live
// neighbour's newest update is tagged at least t - 1 - bound (none yet counts as -1): a peer
// completes at most `bound` iterations more than any live neighbour. A peer that has fallen
// that far behind (a neighbour completed newest + 1 >= t + max(bound, 1) iterations while it
// completed t) holds the others back, so it skips: it resumes at the most advanced neighbour's
// next iteration newest + 1 instead of computing the ones between.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace fedfleet::peer {

class HopQueues {
 public:
  HopQueues(std::vector<uint32_t> in_neighbours, uint32_t backup, uint32_t bound);

  // An update of `from` tagged `iteration` arrived. Tags of one neighbour that go backwards
  // are ignored (the newest wins). False for a sender that is not an in-neighbour.
  bool onUpdate(uint32_t from, uint64_t iteration);
  // `peer` is gone: it no longer counts, neither for mixing nor for the bound.
  void onDown(uint32_t peer);

  // min(n - b, live in-neighbours): updates iteration t waits for.
  uint32_t required() const;
  // Live in-neighbours.
  uint32_t live() const;
  // The neighbours iteration t mixes, in arrival order, once required() of them have an
  // update tagged >= t; nullopt before.
  std::optional<std::vector<uint32_t>> chosenFor(uint64_t t) const;
  // May iteration t start (the bound above)?
  bool mayStart(uint64_t t) const;
  // At the start of iteration t: the iteration to resume at, s + 1 for the largest newest
  // tag s of a live neighbour with s + 1 - t >= max(bound, 1); nullopt when there is none.
  std::optional<uint64_t> skipTarget(uint64_t t) const;
  // Forget arrivals tagged below t (they can no longer be chosen).
  void prune(uint64_t t);
  // The newest tag of `peer` (-1: none).
  int64_t newest(uint32_t peer) const;

 private:
  struct Arrival {
    uint64_t iteration;
    uint64_t seq;
  };
  struct Neighbour {
    uint32_t id;
    bool live = true;
    int64_t newest = -1;
    std::vector<Arrival> arrivals;  // increasing iteration
  };
  const Neighbour* find(uint32_t id) const;

  std::vector<Neighbour> neighbours_;
  uint32_t backup_, bound_;
  uint64_t seq_ = 0;
};

}  // namespace fedfleet::peer
