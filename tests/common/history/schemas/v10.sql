-- Schema version 10 as a new file got it (the CREATE statements fedfleet generates from its column lists, verbatim).
CREATE TABLE schema_version (version INTEGER NOT NULL);
CREATE TABLE runs (
  run_id INTEGER PRIMARY KEY,
  name TEXT NOT NULL,
  config_json TEXT NOT NULL,
  started_at REAL,
  seed INTEGER NOT NULL,
  clock TEXT NOT NULL DEFAULT 'wall',
  model_json TEXT NOT NULL DEFAULT ''
);
CREATE TABLE rounds (
  run_id INTEGER NOT NULL REFERENCES runs (run_id),
  round INTEGER NOT NULL,
  start_time REAL,
  end_time REAL,
  selected INTEGER NOT NULL,
  completed INTEGER NOT NULL,
  late INTEGER NOT NULL,
  dropped INTEGER NOT NULL,
  rejected INTEGER NOT NULL,
  status TEXT NOT NULL CHECK (status IN ('initial', 'ok', 'failed')),
  train_loss REAL,
  test_loss REAL,
  test_accuracy REAL,
  bytes_up INTEGER NOT NULL,
  bytes_down INTEGER NOT NULL,
  model_version INTEGER NOT NULL,
  wall_start REAL,
  wall_end REAL,
  fed_eval_clients INTEGER NOT NULL DEFAULT 0,
  fed_eval_samples INTEGER NOT NULL DEFAULT 0,
  fed_eval_loss REAL,
  fed_eval_accuracy REAL,
  test_metrics TEXT,
  fed_eval_metrics TEXT,
  dp_epsilon REAL,
  dp_clip REAL,
  PRIMARY KEY (run_id, round)
);
CREATE TABLE updates (
  id INTEGER PRIMARY KEY,
  run_id INTEGER NOT NULL,
  round INTEGER NOT NULL,
  client_id TEXT NOT NULL,
  "partition" INTEGER NOT NULL,
  n_samples INTEGER NOT NULL,
  steps INTEGER NOT NULL,
  loss REAL,
  compute_s REAL,
  upload_s REAL,
  bytes_up INTEGER NOT NULL,
  bytes_down INTEGER NOT NULL,
  weight REAL,
  status TEXT NOT NULL CHECK (status IN ('completed', 'late', 'dropped', 'rejected')),
  start_time REAL,
  end_time REAL,
  wall_compute_s REAL,
  codec TEXT NOT NULL DEFAULT '',
  encode_s REAL,
  decode_s REAL,
  served_block INTEGER,
  served_model TEXT,
  served_version INTEGER,
  served_sha256 TEXT,
  served_bytes INTEGER,
  served_samples INTEGER,
  served_loss REAL,
  served_accuracy REAL,
  grant_wait_s REAL,
  eval_samples INTEGER NOT NULL DEFAULT 0,
  eval_loss REAL,
  eval_accuracy REAL,
  eval_metrics TEXT,
  FOREIGN KEY (run_id, round) REFERENCES rounds (run_id, round)
);
CREATE INDEX updates_by_round ON updates (run_id, round);
CREATE TABLE clients (
  client_id TEXT PRIMARY KEY NOT NULL,
  public_key TEXT NOT NULL,
  device_kind TEXT NOT NULL,
  device_name TEXT NOT NULL,
  cores INTEGER NOT NULL,
  memory_bytes INTEGER NOT NULL,
  data_size INTEGER NOT NULL,
  first_seen REAL,
  last_seen REAL
);
CREATE TABLE checkpoints (
  run_id INTEGER NOT NULL,
  round INTEGER NOT NULL,
  model_version INTEGER NOT NULL,
  sha256 TEXT NOT NULL,
  blob BLOB NOT NULL,
  engine_state BLOB NOT NULL DEFAULT x'',
  PRIMARY KEY (run_id, round),
  FOREIGN KEY (run_id, round) REFERENCES rounds (run_id, round)
);
CREATE TABLE events (
  id INTEGER PRIMARY KEY,
  run_id INTEGER REFERENCES runs (run_id),
  time REAL,
  kind TEXT NOT NULL,
  client_id TEXT NOT NULL,
  detail TEXT NOT NULL
);
CREATE INDEX events_by_run ON events (run_id);
CREATE TABLE block_metrics (
  run_id INTEGER NOT NULL REFERENCES runs (run_id),
  round INTEGER NOT NULL,
  block TEXT NOT NULL,
  model TEXT NOT NULL,
  accuracy REAL,
  loss REAL,
  PRIMARY KEY (run_id, round, block, model)
);
CREATE TABLE peer_iterations (
  run_id INTEGER NOT NULL REFERENCES runs (run_id),
  peer INTEGER NOT NULL,
  iteration INTEGER NOT NULL,
  t_start REAL NOT NULL,
  t_end REAL NOT NULL,
  compute_s REAL NOT NULL,
  comm_s REAL NOT NULL,
  wait_s REAL NOT NULL,
  bytes_sent INTEGER NOT NULL,
  bytes_received INTEGER NOT NULL,
  exchanges INTEGER NOT NULL,
  staleness INTEGER NOT NULL,
  skipped INTEGER NOT NULL CHECK (skipped IN (0, 1)),
  PRIMARY KEY (run_id, peer, iteration)
);
CREATE TABLE peer_evals (
  id INTEGER PRIMARY KEY,
  run_id INTEGER NOT NULL REFERENCES runs (run_id),
  time_s REAL NOT NULL,
  iterations INTEGER NOT NULL,
  peers_averaged INTEGER NOT NULL,
  accuracy REAL,
  loss REAL
);
CREATE INDEX peer_evals_by_run ON peer_evals (run_id, time_s);
INSERT INTO schema_version (version) VALUES (10);
