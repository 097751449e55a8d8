# The fedfleet wire schema: one Envelope per ZeroMQ frame, a union over the protocol messages.
#
# Only common/wire/messages.cc uses the generated code; everything else sees the plain structs of
# common/wire/messages.h. Field meanings are documented there. Compatibility rules: never renumber
# or retype a field; add new fields with the next ordinal; add new messages as new union members
# (an old reader reports an unknown member as a corrupt frame).

@0xff8cacb19154ce26;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("fedfleet::wire::schema");

enum DeviceKind {
  cpu @0;
  cuda @1;
}

enum Optimizer {
  sgd @0;
  adam @1;
  adamw @2;
}

enum Loss {
  crossEntropy @0;
  mse @1;
  bce @2;
  module @3;
}

enum ErrorCode {
  unknown @0;
  malformed @1;
  unknownClient @2;
  staleTask @3;
  badVersion @4;
  rejected @5;
  internal @6;
}

struct Hello {
  clientId @0 :Text;
  publicKey @1 :Text;
  deviceKind @2 :DeviceKind;
  deviceName @3 :Text;
  cores @4 :UInt32;
  memoryBytes @5 :UInt64;
  dataSize @6 :UInt64;
  protocolVersion @7 :UInt32;
  requestedPartition @8 :Int32 = -1;
  session @9 :UInt64;  # random per client process start: tells a restart from a repeated Hello
  lastCoordinatorSession @10 :UInt64;  # of the last task it took (0: none)
}

struct HyperParams {
  epochs @0 :UInt32;
  maxSteps @1 :UInt32;
  batchSize @2 :UInt32;
  lr @3 :Float32;
  momentum @4 :Float32;
  weightDecay @5 :Float32;
  seed @6 :UInt64;
  proxMu @7 :Float32;       # FedProx mu (0: off)
  scaffold @8 :Bool;        # SCAFFOLD: the update is 2P values (delta, then control delta)
  stopAfterS @9 :Float64;   # partial work: stop training this long after receipt (0: off)
  optimizer @10 :Optimizer; # the local optimiser (sgd: momentum and weight decay as given)
  loss @11 :Loss;           # the training loss (train.loss)
}

struct DataSpec {
  dataset @0 :Text;
  scheme @1 :Text;
  alpha @2 :Float64;
  labelsPerClient @3 :UInt32;
  numPartitions @4 :UInt32;
  index @5 :UInt32;
  seed @6 :UInt64;
  subset @7 :UInt32;
  blocks @8 :UInt32;   # scheme "block-cyclic": M blocks
  skew @9 :Float64;    # scheme "block-cyclic": fraction of a shard from its block's classes
  shardsPerClient @10 :UInt32;  # scheme "shards": shards a partition (0, an older sender: 2)
}

enum ServedSource {
  none @0;
  unchanged @1;
  taskModel @2;
  attached @3;
}

struct ServedModel {
  source @0 :ServedSource;
  block @1 :UInt32;
  model @2 :Text;
  version @3 :UInt64;
  sha256 @4 :Data;  # exactly 32 bytes unless source is none
}

struct Task {
  runId @0 :UInt64;
  round @1 :UInt32;
  modelVersion @2 :UInt64;
  modelName @3 :Text;
  modelBytes @4 :Data;
  modelSha256 @5 :Data;  # exactly 32 bytes
  hparams @6 :HyperParams;
  data @7 :DataSpec;
  deadlineS @8 :Float64;
  codec @9 :Text;
  taskToken @10 :UInt64;
  chunkBytes @11 :UInt32;
  controlBytes @12 :Data;  # SCAFFOLD server control variate c: empty, or as long as modelBytes
  served @13 :ServedModel;  # protocol 5: the model the client serves (block-cyclic runs)
  coordinatorSession @14 :UInt64;  # the coordinator process's session id (0: none)
  fedEval @15 :Bool;  # evaluate the task's model on the client's held-out data first
  secagg @16 :SecAggTask;  # secure aggregation of this task's update (clients = 0: off)
  localDp @17 :LocalDpTask;  # local differential privacy of this task's update (clip = 0: off)
}

struct LocalDpTask {
  clip @0 :Float64;
  noiseMultiplier @1 :Float64;
  delta @2 :Float64;
}

# Secure aggregation (SecAgg+): the round the client's masked update joins.
struct SecAggTask {
  index @0 :UInt32;       # the client's place in the round's cohort
  clients @1 :UInt32;     # the cohort's size (0: no secure aggregation)
  neighbours @2 :UInt32;
  threshold @3 :UInt32;
  graphSeed @4 :UInt64;
  clipRange @5 :Float64;
  quantRange @6 :UInt32;
  weightScale @7 :Float64;  # the update is quantised as (n_samples / weightScale) x delta
  dpClip @8 :Float64;       # central or distributed DP: L2 clip of the update, weight 1 (0: off)
  dpNoiseStddev @9 :Float64;  # ... and the Gaussian noise each value gets before quantising
  fedNova @10 :Bool;        # the weight is also divided by FedNova's a(steps, fedNovaMomentum)
  fedNovaMomentum @11 :Float64;
}

struct SecAggKeys {
  index @0 :UInt32;
  encryptionKey @1 :Data;  # 32 bytes
  maskKey @2 :Data;        # 32 bytes
  seedDigest @3 :Data;     # 32 bytes
}

struct SecAggSealed {
  from @0 :UInt32;
  to @1 :UInt32;
  sealed @2 :Data;
}

struct SecAggReveal {
  owner @0 :UInt32;
  selfMask @1 :Bool;
  share @2 :Data;
}

# One step of a SecAgg+ round, either way (common/secagg/secagg_server.h).
struct SecAgg {
  taskToken @0 :UInt64;
  step @1 :UInt8;
  adverts @2 :List(SecAggKeys);
  shares @3 :List(SecAggSealed);
  survivors @4 :List(UInt32);
  dropped @5 :List(UInt32);
  revealed @6 :List(SecAggReveal);
}

struct Chunk {
  taskToken @0 :UInt64;
  # Retired: the tensor the chunk starts in. Neither written nor read since the coordinator
  # places a chunk by its offset alone, and a field nobody checks is one a client could fill
  # with anything. The ordinal stays taken (never reuse it); older clients still send it.
  retiredTensorIndex @1 :UInt32;
  offset @2 :UInt64;
  payload @3 :Data;
  last @4 :Bool;
  elements @5 :UInt64;  # values this chunk's payload decodes to
  nSamples @6 :UInt64;  # the update's weight inputs, known once training is done: the
  steps @7 :UInt64;     # coordinator folds each chunk into its running sum as it arrives
}

struct Summary {
  taskToken @0 :UInt64;
  nSamples @1 :UInt64;
  steps @2 :UInt64;
  meanLoss @3 :Float64;
  sumSqLoss @4 :Float64;
  computeSeconds @5 :Float64;
  uploadSeconds @6 :Float64;
  encodeSeconds @7 :Float64;
  servedSamples @8 :UInt64;   # held-out samples the served model was evaluated on (0: none)
  servedLoss @9 :Float64;
  servedAccuracy @10 :Float64;
  servedSha256 @11 :Data;     # the served model evaluated: empty, or 32 bytes
  evalSamples @12 :UInt64;    # federated evaluation (Task.fedEval): held-out samples (0: none)
  evalLoss @13 :Float64;      # mean loss of the task's model on them
  evalAccuracy @14 :Float64;  # its accuracy on them, in [0, 1]
  evalNoAccuracy @15 :Bool;   # the model has no accuracy (a regression): evalAccuracy unset
  evalMetrics @16 :List(Metric);  # further metrics on them (mse, mae, the model's own), by name
}

struct Metric {
  name @0 :Text;    # [A-Za-z0-9_.-], 1 to 64 characters
  value @1 :Float64;
}

struct Cancel {
  taskToken @0 :UInt64;
  reason @1 :Text;
}

struct Heartbeat {
  seq @0 :UInt64;
}

struct Bye {
  reason @0 :Text;
}

struct Error {
  code @0 :ErrorCode;
  message @1 :Text;
  taskToken @2 :UInt64;
}

# Upload credits (protocol 5): a client whose update is ready asks before sending any chunk,
# and sends the chunks only after the coordinator's grant for that task.
struct UploadRequest {
  taskToken @0 :UInt64;
}

struct UploadGrant {
  taskToken @0 :UInt64;
}

struct Envelope {
  union {
    hello @0 :Hello;
    task @1 :Task;
    chunk @2 :Chunk;
    summary @3 :Summary;
    cancel @4 :Cancel;
    heartbeat @5 :Heartbeat;
    bye @6 :Bye;
    error @7 :Error;
    uploadRequest @8 :UploadRequest;
    uploadGrant @9 :UploadGrant;
    secAgg @10 :SecAgg;
  }
}
