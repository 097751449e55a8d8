// NormReference: the reference norm the norm bound (protocol step 8a) judges a round's updates
// against, taken from the rounds settled before it, so that no update moves the bound it is
// judged by and a hostile minority cannot walk the bound up quickly.
//
// After a round settles, the engine hands it the norms of the round's completed updates, each
// counted at most at the bound it was judged by (an update beyond it counts as the bound, so a
// 10^20 update weighs like any other over-large one). The reference is then the lower median
// of the last `window` rounds' lower medians, and at most `growth` times the reference before
// it: a median over rounds does not follow one round's outliers, and the growth cap keeps even
// a rise of the honest norms (for example the damage a clipped attack lets in) from raising it
// by more than `growth` a round. It may fall as fast as the medians do. Until a round has been
// observed there is none, and the engine judges the first round against its own lower median.
//
// Deterministic (a function of the norms observed, in order), and saved with the engine state
// (engine/engine_state.h), so a resumed run judges as the uninterrupted one would. One owner:
// not thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace fedfleet::engine {

// The first bytes of a saved NormReference (the engine state's norm reference section).
inline constexpr std::string_view kNormReferenceMagic = "NRF1";

class NormReference {
 public:
  // window: rounds whose medians the reference is the median of (at least 1); growth: the most
  // the reference may grow from one round to the next (at least 1).
  NormReference(uint32_t window, double growth);

  // The reference for the next round settled; none before any round was observed.
  std::optional<double> reference() const { return reference_; }
  // A settled round's completed norms, each at most the bound it was judged by. A round without
  // any (every update lost, or all non-finite) changes nothing.
  void observe(const std::vector<double>& norms);

  // The state as bytes ("NRF1", the reference, the medians), and back. load() refuses bytes
  // that do not parse (kCorrupt) and then changes nothing; medians beyond this window are
  // dropped (oldest first), so a resume with another aggregation.norm_window keeps working.
  std::string save() const;
  Status load(std::string_view bytes);

 private:
  uint32_t window_;
  double growth_;
  std::deque<double> medians_;  // the last `window_` rounds' lower medians, oldest first
  std::optional<double> reference_;
};

}  // namespace fedfleet::engine
