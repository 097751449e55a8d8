#include "driver/peer_options.h"

#include "common/compress/codec_spec.h"

namespace fedfleet::driver {

Result<peer::PeerOptions> peerOptionsFromConfig(const config::Config& config) {
  const config::DecentralizedSection& d = config.decentralized;
  peer::PeerOptions o;
  FEDFLEET_ASSIGN_OR_RETURN(o.algorithm, peer::parseAlgorithm(d.algorithm));
  FEDFLEET_ASSIGN_OR_RETURN(o.topology, peer::parseTopology(d.topology));
  Result<compress::CodecSpec> codec = compress::parseCodecSpec(d.codec);
  if (!codec.isOk()) return codec.status().withContext("decentralized.codec");
  o.codec = *codec;
  o.peers = d.peers;
  o.iterations = d.iterations;
  o.seed = config.run.seed;
  o.pipeline = d.pipeline;
  o.degree = d.degree;
  o.group_size = d.group_size;
  o.group_buffer = d.group_buffer;
  o.hop_bound = d.hop_bound;
  o.hop_backup = d.hop_backup;
  o.local_steps = d.local_steps;
  o.outer_lr = d.outer_lr;
  o.outer_momentum = d.outer_momentum;
  o.steps_per_iteration = d.steps_per_iteration;
  if (Status s = peer::validate(o); !s.isOk()) {
    return invalidArgument("[decentralized] " + s.message());
  }
  return o;
}

}  // namespace fedfleet::driver
