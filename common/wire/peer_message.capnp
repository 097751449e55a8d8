# Messages between decentralised peers (common/wire/peer_message.h). Only
# common/wire/peer_message.cc uses the generated code. Same compatibility rules as fedfleet.capnp.

@0x8f462532d866c75d;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("fedfleet::wire::schema");

struct PeerMessage {
  kind @0 :UInt8;
  from @1 :UInt32;
  to @2 :UInt32;
  iteration @3 :UInt64;
  group @4 :UInt64;
  step @5 :UInt32;
  chunk @6 :UInt32;
  values @7 :List(Float32);
  payload @8 :Data;
  elements @9 :UInt32;
  members @10 :List(UInt32);
}
