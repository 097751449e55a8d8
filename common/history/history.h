// The run history: every run, round, client update, client, checkpoint and event.
//
// HistoryStore is the interface the coordinator writes through; SqliteHistory
// (common/history/sqlite_history.h) is the durable backend (WAL, schema version table, one
// transaction per round) and MemoryHistory the in-process one for tests and quick simulations.
// Every method returns a Status; a failing write (full disk, read-only file, SQLITE_BUSY past
// the busy timeout) is reported, never dropped.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace fedfleet::history {

struct RunRecord {
  int64_t run_id = 0;
  std::string name;
  std::string config_json;  // the full resolved configuration
  double started_at = 0;    // unix seconds
  uint64_t seed = 0;
};

struct RoundRecord {
  int64_t run_id = 0;
  uint32_t round = 0;
  double start_time = 0;  // unix seconds (wall) when the round started
  double end_time = 0;
  uint32_t selected = 0;
  uint32_t completed = 0;
  uint32_t late = 0;
  uint32_t dropped = 0;
  uint32_t rejected = 0;
  std::string status = "ok";  // "ok" or "failed" (quorum not met)
  double train_loss = 0;      // sample-weighted mean of the clients' mean losses
  std::optional<double> test_loss;
  std::optional<double> test_accuracy;  // fraction in [0, 1]
  uint64_t bytes_up = 0;
  uint64_t bytes_down = 0;
  uint64_t model_version = 0;  // version after this round
};

struct UpdateRecord {
  int64_t run_id = 0;
  uint32_t round = 0;
  std::string client_id;
  int32_t partition = -1;
  uint64_t n_samples = 0;
  uint64_t steps = 0;
  double loss = 0;
  double compute_s = 0;
  double upload_s = 0;
  uint64_t bytes_up = 0;
  uint64_t bytes_down = 0;
  double weight = 0;
  std::string status;  // "completed", "late", "dropped", "rejected"
};

struct ClientRecord {
  std::string client_id;
  std::string public_key;
  std::string device_kind;  // "cpu" / "cuda"
  std::string device_name;
  uint32_t cores = 0;
  uint64_t memory_bytes = 0;
  uint64_t data_size = 0;
  double first_seen = 0;
  double last_seen = 0;
};

struct CheckpointRecord {
  int64_t run_id = 0;
  uint32_t round = 0;
  uint64_t model_version = 0;
  std::string sha256_hex;
  std::string blob;  // flat fp32 parameters
};

struct EventRecord {
  int64_t run_id = 0;  // 0 when not tied to a run
  double time = 0;     // unix seconds
  std::string kind;    // "auth_rejected", "malformed_frame", "stale_update", "error", ...
  std::string client_id;
  std::string detail;
};

class HistoryStore {
 public:
  virtual ~HistoryStore() = default;

  // Creates a run; fills and returns its run_id.
  virtual Result<int64_t> beginRun(const RunRecord& run) = 0;
  // Inserts or updates a client (by client_id).
  virtual Status upsertClient(const ClientRecord& client) = 0;
  // Writes a round, its update rows and, when given, a checkpoint in one transaction: either
  // all of it is committed or none of it.
  virtual Status commitRound(const RoundRecord& round, const std::vector<UpdateRecord>& updates,
                             const std::optional<CheckpointRecord>& checkpoint) = 0;
  virtual Status recordEvent(const EventRecord& event) = 0;

  // Queries (used by resume, `fedfleet history` and tests).
  virtual Result<std::vector<RunRecord>> runs() = 0;
  virtual Result<std::vector<RoundRecord>> rounds(int64_t run_id) = 0;
  virtual Result<std::vector<UpdateRecord>> updates(int64_t run_id,
                                                    std::optional<uint32_t> round) = 0;
  virtual Result<std::vector<ClientRecord>> clients() = 0;
  virtual Result<std::vector<EventRecord>> events(std::optional<int64_t> run_id) = 0;
  // The checkpoint with the highest round of `run_id`; kNotFound if none.
  virtual Result<CheckpointRecord> latestCheckpoint(int64_t run_id) = 0;
};

// Opens (creating if needed) a SQLite history at `path`: WAL mode, foreign keys on, schema
// created or checked against the schema_version table (a newer or unknown version is an error).
Result<std::unique_ptr<HistoryStore>> openSqliteHistory(const std::string& path);

// An in-memory store with the same behaviour, for tests.
std::unique_ptr<HistoryStore> createMemoryHistory();

}  // namespace fedfleet::history
