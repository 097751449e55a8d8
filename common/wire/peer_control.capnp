# The control messages between a decentralised peer and the peer coordinator
# (common/wire/peer_control.h). Only common/wire/peer_control.cc uses the generated code.
# Same compatibility rules as fedfleet.capnp: new fields get new ordinals, none is renumbered.

@0xa2dde1a210cecff4;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("fedfleet::wire::schema");

struct PeerTableEntry {
  peer @0 :UInt32;
  endpoint @1 :Text;
  publicKey @2 :Text;
}

struct PeerIteration {
  iteration @0 :UInt64;
  tStart @1 :Float64;
  tEnd @2 :Float64;
  computeS @3 :Float64;
  commS @4 :Float64;
  waitS @5 :Float64;
  bytesSent @6 :UInt64;
  bytesReceived @7 :UInt64;
  exchanges @8 :UInt32;
  staleness @9 :UInt32;
  skipped @10 :Bool;
  loss @11 :Float64;
}

struct PeerControl {
  kind @0 :UInt8;
  endpoint @1 :Text;
  table @2 :List(PeerTableEntry);
  iterations @3 :List(PeerIteration);
  data @4 :Data;
  request @5 :UInt64;
  iteration @6 :UInt64;
  values @7 :List(Float32);
  peer @8 :UInt32;
  text @9 :Text;
}
