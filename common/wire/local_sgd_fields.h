// The numbers of a LocalSgd written to, and read from, a Cap'n Proto struct that names them
// alike (schema HyperParams and SimTrainJob). The optimizer, an enum in one schema and a byte in
// the other, is each caller's to write and check.
#pragma once

#include "common/wire/messages.h"

namespace fedfleet::wire {

template <class Builder>
void setLocalSgdNumbers(Builder b, const LocalSgd& s) {
  b.setEpochs(s.epochs);
  b.setMaxSteps(s.max_steps);
  b.setBatchSize(s.batch_size);
  b.setLr(s.lr);
  b.setMomentum(s.momentum);
  b.setWeightDecay(s.weight_decay);
  b.setSeed(s.seed);
  b.setProxMu(s.prox_mu);
}

template <class Reader>
void getLocalSgdNumbers(Reader r, LocalSgd& s) {
  s.epochs = r.getEpochs();
  s.max_steps = r.getMaxSteps();
  s.batch_size = r.getBatchSize();
  s.lr = r.getLr();
  s.momentum = r.getMomentum();
  s.weight_decay = r.getWeightDecay();
  s.seed = r.getSeed();
  s.prox_mu = r.getProxMu();
}

}  // namespace fedfleet::wire
