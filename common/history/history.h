// The run history: every run, round, client update, client, checkpoint and event.
//
// HistoryStore is the interface the coordinator writes through; SqliteHistory
// (common/history/sqlite_history.h) is the durable backend (WAL, schema version table, one
// transaction per round) and MemoryHistory the in-process one for tests and quick simulations.
// Every method returns a Status; a failing write (full disk, read-only file, SQLITE_BUSY past
// the busy timeout) is reported, never dropped.
//
// Both backends behave the same, down to the error codes:
//   kNotFound            a write names a run_id that beginRun never returned; latestCheckpoint
//                        with no checkpoint for the run
//   kFailedPrecondition  commitRound for a (run_id, round) already committed (never overwritten),
//                        likewise a block_metrics or peer_iterations row already written; a
//                        SQLite file with an unknown schema version
//   kInvalidArgument     a status string outside the documented values, update/checkpoint rows
//                        whose run_id/round differ from the round's, an empty client_id, peer
//                        rows with negative or non-finite times
//   kIoError             file-system/database failure; a full disk says "disk is full"
//   kTimeout             the database stayed locked by another connection past the busy timeout
//   kCorrupt             the file is not a SQLite database or is damaged
// A failed write changes nothing. Query results are ordered: runs by run_id, rounds by round,
// updates and events in insertion order, clients by client_id, peer iterations by (peer,
// iteration), peer evaluations by time.
//
// Numbers: uint64_t fields round-trip exactly (SQLite stores their bit pattern as INTEGER).
// Doubles round-trip exactly, except that SQLite stores NaN as NULL: a NaN in a plain double
// field reads back as NaN, a NaN std::optional reads back as std::nullopt (the memory backend
// applies the same rule).
//
// Threads: a store object is not thread-safe; use it from one thread at a time (the coordinator
// owns it on its event-loop thread). Several processes may open the same SQLite file (WAL lets
// `fedfleet history` read while a coordinator writes).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/history/records.h"
#include "common/status.h"

namespace fedfleet::history {

class HistoryStore {
 public:
  virtual ~HistoryStore() = default;

  // Creates a run and returns its run_id (run.run_id is ignored). Ids increase: a later run
  // always has a larger id.
  virtual Result<int64_t> beginRun(const RunRecord& run) = 0;
  // Inserts or updates a client (by client_id). An existing row keeps its first_seen; every
  // other field, last_seen included, takes the new value.
  virtual Status upsertClient(const ClientRecord& client) = 0;
  // Writes a round, its update rows and, when given, a checkpoint in one transaction: either
  // all of it is committed or none of it. round.status is "initial", "ok" or "failed"; each
  // update's status is "completed", "late", "dropped" or "rejected" (else kInvalidArgument).
  virtual Status commitRound(const RoundRecord& round, const std::vector<UpdateRecord>& updates,
                             const std::optional<CheckpointRecord>& checkpoint) = 0;
  // Records an event; run_id 0 ties it to no run, an unknown run_id is kNotFound.
  virtual Status recordEvent(const EventRecord& event) = 0;

  // Queries (used by resume, `fedfleet history` and tests).
  virtual Result<std::vector<RunRecord>> runs() = 0;
  virtual Result<std::vector<RoundRecord>> rounds(int64_t run_id) = 0;
  virtual Result<std::vector<UpdateRecord>> updates(int64_t run_id,
                                                    std::optional<uint32_t> round) = 0;
  virtual Result<std::vector<ClientRecord>> clients() = 0;
  // All events when run_id is nullopt; run_id 0 selects the events not tied to a run.
  virtual Result<std::vector<EventRecord>> events(std::optional<int64_t> run_id) = 0;
  // The checkpoint with the highest round of `run_id`; kNotFound if none.
  virtual Result<CheckpointRecord> latestCheckpoint(int64_t run_id) = 0;

  // The block_metrics rows of `run_id`, ordered by round, block, model. Empty when the database
  // has no block_metrics table (not a block-cyclic history) or the run has no rows; the default
  // implementation (test doubles) has no block table.
  virtual Result<std::vector<BlockMetricRecord>> blockMetrics(int64_t /*run_id*/) {
    return std::vector<BlockMetricRecord>{};
  }

  // Writes block_metrics rows, all or none. Errors: kNotFound for a run_id beginRun never
  // returned, kFailedPrecondition for a (run_id, round, block, model) already written,
  // kInvalidArgument for an empty block or model. The default implementation (test doubles)
  // returns kFailedPrecondition; both backends override it.
  virtual Status recordBlockMetrics(const std::vector<BlockMetricRecord>& /*rows*/) {
    return failedPrecondition("recordBlockMetrics is not supported by this history backend");
  }

  // The rounds of `run_id` that have a checkpoint, ascending (empty for an unknown run). The
  // default implementation (for test doubles) returns kFailedPrecondition; both backends
  // override it.
  virtual Result<std::vector<uint32_t>> checkpointRounds(int64_t /*run_id*/) {
    return failedPrecondition("checkpointRounds is not supported by this history backend");
  }
  // The checkpoint of `run_id` at `round`; kNotFound when there is none (never written, or
  // pruned). The default implementation (for test doubles) returns kFailedPrecondition; both
  // backends override it.
  virtual Result<CheckpointRecord> checkpointAt(int64_t /*run_id*/, uint32_t /*round*/) {
    return failedPrecondition("checkpointAt is not supported by this history backend");
  }
  // Deletes the checkpoints of `run_id` except the `keep_last` with the highest rounds and, when
  // `keep_best`, the best one: of the checkpointed rounds whose model has a recorded accuracy
  // (its test accuracy, else the federated accuracy of the next round, whose tasks carried it),
  // the one with the highest (the earliest of equals); in a run without accuracies (a
  // regression), by the lowest test loss, else federated loss, the same way (rounds and updates
  // stay). keep_last == 0 is kInvalidArgument: resume needs the latest checkpoint. A run with fewer
  // checkpoints, or an unknown run, is left alone and gives OK. The default implementation (for
  // test doubles) returns kFailedPrecondition; both backends override it.
  virtual Status pruneCheckpoints(int64_t /*run_id*/, uint32_t /*keep_last*/, bool /*keep_best*/) {
    return failedPrecondition("pruneCheckpoints is not supported by this history backend");
  }

  // Decentralised runs (records.h). Both backends override these four; the defaults (test
  // doubles) refuse the writes with kFailedPrecondition and read nothing.
  //
  // Writes iteration rows, all or none (one transaction). Errors: kNotFound for a run_id beginRun
  // never returned; kInvalidArgument for a row whose t_start, t_end, compute_s, comm_s or wait_s
  // is negative or not finite, or whose t_end < t_start, or two rows with the same (run_id,
  // peer, iteration); kFailedPrecondition for a (run_id, peer, iteration) already written (rows
  // are never overwritten). An empty vector is OK and writes nothing.
  virtual Status recordPeerIterations(const std::vector<PeerIterationRecord>& /*rows*/) {
    return failedPrecondition("recordPeerIterations is not supported by this history backend");
  }
  // Writes one evaluation of the averaged model. Errors: kNotFound for an unknown run_id;
  // kInvalidArgument for a time_s that is negative or not finite, or an accuracy outside
  // [0, 1] (NaN is allowed: no accuracy). The loss may be anything (NaN is stored as NULL).
  virtual Status recordPeerEval(const PeerEvalRecord& /*row*/) {
    return failedPrecondition("recordPeerEval is not supported by this history backend");
  }
  // The iteration rows of `run_id`, ordered by (peer, iteration); empty for an unknown run.
  virtual Result<std::vector<PeerIterationRecord>> peerIterations(int64_t /*run_id*/) const {
    return std::vector<PeerIterationRecord>{};
  }
  // The evaluations of `run_id`, ordered by time_s, equal times in the order they were written;
  // empty for an unknown run.
  virtual Result<std::vector<PeerEvalRecord>> peerEvals(int64_t /*run_id*/) const {
    return std::vector<PeerEvalRecord>{};
  }
};

// Opens (creating if needed) a SQLite history at `path`: WAL mode, foreign keys on, schema
// created or checked against the schema_version table; an older file is upgraded in place, one
// step (one transaction) a version. Fails with kIoError when the file cannot be opened or created
// (missing directory, no permission), kCorrupt when it is not a SQLite database,
// kFailedPrecondition on a schema version newer than this build's ("upgrade fedfleet") or one no
// fedfleet wrote, or a database that is not a fedfleet history; a failed upgrade step returns its
// error, naming the step, and leaves the file at the version before it.
// common/history/sqlite_history.h has an overload taking options.
Result<std::unique_ptr<HistoryStore>> openSqliteHistory(const std::string& path);

// Opens an existing SQLite history at `path` for reading only (`fedfleet history`, `fedfleet
// report`): the database file is never written, no table is created, the journal mode is left
// as it is, and a file no writer has open is read without creating -wal or -shm files beside it
// (so a history in a read-only directory, or on read-only media, can be read). Every write
// method of the returned store fails with kIoError. Fails with kIoError when the file does not
// exist or cannot be opened, kCorrupt when it is not a SQLite database, kFailedPrecondition for
// an empty database, one that is not a fedfleet history, or a schema version other than this
// build's (an older file is not upgraded: a read-only open never changes it).
Result<std::unique_ptr<HistoryStore>> openSqliteHistoryReadOnly(const std::string& path);

// An in-memory store with the same behaviour, for tests.
std::unique_ptr<HistoryStore> createMemoryHistory();

}  // namespace fedfleet::history
