# The fleet simulator's worker jobs as bytes (common/wire/sim_job.h): what one virtual client's
# training or one stretch of the server's evaluation needs, and what comes back. The MPI backend
# of the simulator's worker pool (sim/mpi_workers.h) sends them between ranks of one job.
# Only common/wire/sim_job.cc uses the generated code. Same compatibility rules as fedfleet.capnp.

@0xdae8fa8e1eeae983;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("fedfleet::wire::schema");

struct SimModelRecipe {
  name @0 :Text;
  path @1 :Text;
  seed @2 :UInt64;
  sampleShape @3 :List(Int64);
  classes @4 :Int64;
  loss @5 :UInt8;
  device @6 :Text;
}

struct SimTrainJob {
  client @0 :UInt64;
  recipe @1 :SimModelRecipe;
  epochs @2 :UInt32;
  maxSteps @3 :UInt32;
  batchSize @4 :UInt32;
  lr @5 :Float32;
  momentum @6 :Float32;
  weightDecay @7 :Float32;
  proxMu @8 :Float32;
  optimizer @9 :UInt8;
  seed @10 :UInt64;
  start @11 :Data;
  scaffold @12 :Bool;
  controlC @13 :Data;
  controlCk @14 :List(Float32);
  fedEval @15 :Bool;
  hasServed @16 :Bool;
  served @17 :Data;
  precision @18 :UInt8;  # wire::Precision; 0 (fp32) when absent
}

struct SimEvalJob {
  recipe @0 :SimModelRecipe;
  params @1 :Data;
  begin @2 :UInt64;
  end @3 :UInt64;
  piece @4 :UInt32;
}

struct SimStatus {
  code @0 :UInt16;
  message @1 :Text;
}

struct SimMetric {
  name @0 :Text;
  value @1 :Float64;
}

struct SimEvaluation {
  status @0 :SimStatus;
  n @1 :UInt64;
  loss @2 :Float64;
  hasAccuracy @3 :Bool;
  accuracy @4 :Float64;
  metrics @5 :List(SimMetric);
}

struct SimTrainResult {
  status @0 :SimStatus;
  steps @1 :UInt64;
  stoppedEarly @2 :Bool;
  meanLoss @3 :Float64;
  sumSqLoss @4 :Float64;
  delta @5 :List(Float32);
  controlDelta @6 :List(Float32);
  hasFedEvaluation @7 :Bool;
  fedEvaluation @8 :SimEvaluation;
  hasServedEvaluation @9 :Bool;
  servedEvaluation @10 :SimEvaluation;
  wallSeconds @11 :Float64;
}

struct SimEvalPiece {
  n @0 :UInt64;
  lossSum @1 :Float64;
  correct @2 :UInt64;
  hasAccuracy @3 :Bool;
  metricSums @4 :List(SimMetric);
}

struct SimEvalResult {
  status @0 :SimStatus;
  pieces @1 :List(SimEvalPiece);
}

struct SimJobEnvelope {
  union {
    train @0 :SimTrainJob;
    eval @1 :SimEvalJob;
    trainResult @2 :SimTrainResult;
    evalResult @3 :SimEvalResult;
  }
}
