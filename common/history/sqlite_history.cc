// SqliteHistory: HistoryStore over the raw sqlite3 C API.
//
// Every value reaches SQLite through a bound parameter of a statement prepared once at open;
// no SQL text is built from data. The statements that write or read whole records are generated
// from the tables' column lists (common/history/sqlite_schema.h). Each public method is one
// statement in autocommit mode except commitRound, recordBlockMetrics and recordPeerIterations,
// which run BEGIN
// IMMEDIATE (take the write lock first, so the transaction cannot fail half-way on a lock
// upgrade), the writes, COMMIT, and ROLLBACK on any failure.

#include "common/history/sqlite_history.h"

#include <sqlite3.h>
#include <unistd.h>

#include <cctype>
#include <filesystem>
#include <string_view>
#include <type_traits>
#include <utility>

#include "common/history/record_checks.h"
#include "common/history/sqlite_schema.h"
#include "common/history/sqlite_statement.h"

namespace fedfleet::history {
namespace {

class SqliteHistory final : public HistoryStore {
 public:
  static Result<std::unique_ptr<HistoryStore>> open(const std::string& path,
                                                    const SqliteHistoryOptions& options);
  static Result<std::unique_ptr<HistoryStore>> openReadOnly(const std::string& path,
                                                            const SqliteHistoryOptions& options);

  Result<int64_t> beginRun(const RunRecord& run) override;
  Status upsertClient(const ClientRecord& client) override;
  Status commitRound(const RoundRecord& round, const std::vector<UpdateRecord>& updates,
                     const std::optional<CheckpointRecord>& checkpoint) override;
  Status recordEvent(const EventRecord& event) override;
  Result<std::vector<RunRecord>> runs() override;
  Result<std::vector<RoundRecord>> rounds(int64_t run_id) override;
  Result<std::vector<UpdateRecord>> updates(int64_t run_id, std::optional<uint32_t> round) override;
  Result<std::vector<ClientRecord>> clients() override;
  Result<std::vector<EventRecord>> events(std::optional<int64_t> run_id) override;
  Result<CheckpointRecord> latestCheckpoint(int64_t run_id) override;
  Result<std::vector<uint32_t>> checkpointRounds(int64_t run_id) override;
  Result<std::vector<BlockMetricRecord>> blockMetrics(int64_t run_id) override;
  Status recordBlockMetrics(const std::vector<BlockMetricRecord>& rows) override;
  Result<CheckpointRecord> checkpointAt(int64_t run_id, uint32_t round) override;
  Status pruneCheckpoints(int64_t run_id, uint32_t keep_last, bool keep_best) override;
  Status recordPeerIterations(const std::vector<PeerIterationRecord>& rows) override;
  Status recordPeerEval(const PeerEvalRecord& row) override;
  Result<std::vector<PeerIterationRecord>> peerIterations(int64_t run_id) const override;
  Result<std::vector<PeerEvalRecord>> peerEvals(int64_t run_id) const override;

 private:
  explicit SqliteHistory(DbPtr db) : db_(std::move(db)) {}

  Status prepareStatements();
  // The writes of commitRound, inside its transaction.
  Status writeRound(const RoundRecord& round, const std::vector<UpdateRecord>& updates,
                    const std::optional<CheckpointRecord>& checkpoint, const std::string& ctx);
  Query query(const StatementPtr& stmt, std::string context) const {
    return Query(db_.get(), stmt.get(), std::move(context));
  }
  template <typename RecordStatement>
  Query query(const RecordStatement& stmt, std::string context) const {
    return Query(db_.get(), stmt.statement(), std::move(context));
  }

  // All constant after open: the connection and the statements prepared on it.
  DbPtr db_;
  RecordInsert<RunRecord> insert_run_;
  RecordInsert<ClientRecord> upsert_client_;
  StatementPtr run_exists_;
  StatementPtr round_exists_;
  RecordInsert<RoundRecord> insert_round_;
  RecordInsert<UpdateRecord> insert_update_;
  RecordInsert<CheckpointRecord> insert_checkpoint_;
  RecordInsert<EventRecord> insert_event_;
  RecordInsert<BlockMetricRecord> insert_block_metric_;
  RecordInsert<PeerIterationRecord> insert_peer_iteration_;
  RecordInsert<PeerEvalRecord> insert_peer_eval_;
  RecordSelect<PeerIterationRecord> select_peer_iterations_;
  RecordSelect<PeerEvalRecord> select_peer_evals_;
  RecordSelect<RunRecord> select_runs_;
  RecordSelect<RoundRecord> select_rounds_;
  RecordSelect<UpdateRecord> select_updates_;
  RecordSelect<UpdateRecord> select_round_updates_;
  RecordSelect<ClientRecord> select_clients_;
  RecordSelect<EventRecord> select_events_;
  RecordSelect<EventRecord> select_run_events_;
  RecordSelect<EventRecord> select_unattached_events_;
  RecordSelect<CheckpointRecord> select_latest_checkpoint_;
  RecordSelect<CheckpointRecord> select_checkpoint_at_;
  StatementPtr select_checkpoint_rounds_;
  StatementPtr prune_checkpoints_;
};

// Opens a connection to `filename` (a path, or a file: URI with SQLITE_OPEN_URI in `flags`) with
// extended result codes and the busy timeout of `options`.
Result<DbPtr> openConnection(const std::string& filename, int flags,
                             const SqliteHistoryOptions& options, const std::string& ctx) {
  sqlite3* raw = nullptr;
  int rc = sqlite3_open_v2(filename.c_str(), &raw, flags | SQLITE_OPEN_NOMUTEX, nullptr);
  DbPtr db(raw);  // sqlite3_open_v2 allocates a handle even on most failures
  if (rc != SQLITE_OK) return sqliteStatus(db.get(), rc, ctx);
  sqlite3_extended_result_codes(db.get(), 1);
  rc = sqlite3_busy_timeout(db.get(), options.busy_timeout_ms);
  if (rc != SQLITE_OK) return sqliteStatus(db.get(), rc, ctx + ": busy_timeout");
  return db;
}

// A file: URI naming `path` with `query`: the absolute path, every byte but unreserved ones and
// '/' percent-encoded, so '?', '#' and '%' in a file name stay part of the name.
std::string fileUri(const std::string& path, const std::string& query) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string uri = "file://";
  for (unsigned char c : std::filesystem::absolute(path).string()) {
    if (std::isalnum(c) || c == '/' || c == '-' || c == '.' || c == '_' || c == '~') {
      uri += static_cast<char>(c);
    } else {
      uri += '%';
      uri += kHex[c >> 4];
      uri += kHex[c & 15];
    }
  }
  return uri + "?" + query;
}

Result<std::unique_ptr<HistoryStore>> SqliteHistory::open(const std::string& path,
                                                          const SqliteHistoryOptions& options) {
  const std::string ctx = "open history '" + path + "'";
  FEDFLEET_ASSIGN_OR_RETURN(
      DbPtr db, openConnection(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, options, ctx));
  FEDFLEET_RETURN_IF_ERROR(execSql(db.get(), "PRAGMA foreign_keys = ON", ctx));
  // The first statement that reads the file: a file that is not a database fails here.
  {
    auto prepared = prepare(db.get(), "PRAGMA journal_mode = WAL");
    if (!prepared.isOk()) return prepared.status().withContext(ctx);
    StatementPtr wal = std::move(prepared).value();
    Query q(db.get(), wal.get(), ctx + ": journal_mode");
    FEDFLEET_ASSIGN_OR_RETURN(bool row, q.step());
    std::string mode = row ? q.column("journal_mode").text() : "";
    if (mode != "wal" && !(path == ":memory:" && mode == "memory")) {
      return ioError(ctx + ": could not switch to WAL journal (journal_mode is '" + mode + "')");
    }
  }
  FEDFLEET_RETURN_IF_ERROR(execSql(db.get(), "PRAGMA synchronous = NORMAL", ctx));
  if (options.max_page_count > 0) {
    // An integer we format ourselves, not caller text: PRAGMA takes no bound parameters.
    FEDFLEET_RETURN_IF_ERROR(execSql(
        db.get(), "PRAGMA max_page_count = " + std::to_string(options.max_page_count), ctx));
  }
  FEDFLEET_RETURN_IF_ERROR(createOrUpgradeSchema(db.get(), ctx));

  std::unique_ptr<SqliteHistory> store(new SqliteHistory(std::move(db)));
  FEDFLEET_RETURN_IF_ERROR(store->prepareStatements().withContext(ctx));
  return std::unique_ptr<HistoryStore>(std::move(store));
}

// Read-only: SQLITE_OPEN_READONLY and mode=ro, so SQLite never writes the database. Whether the
// connection may also touch the WAL index (-shm) depends on what is beside the file:
//  - no -wal file: no writer has the file open (a WAL connection keeps its -wal while open) and
//    every commit is in the database file, so it is opened immutable=1: no locks, no -shm or
//    -wal created, which holds for root too (root ignores the directory's permission bits);
//  - a -wal file in a directory this user may not write, with no -shm to share: SQLite could not
//    create the WAL index, so again immutable=1; what only the WAL holds (rounds a crashed
//    writer never checkpointed) is then not seen;
//  - otherwise a writer is running, or left its WAL: opened mode=ro, which reads the WAL through
//    the writer's -shm (SQLite may create the -shm when the writer left none).
Result<std::unique_ptr<HistoryStore>> SqliteHistory::openReadOnly(
    const std::string& path, const SqliteHistoryOptions& options) {
  const std::string ctx = "open history '" + path + "' read-only";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return ioError(ctx + ": no such file" + (ec ? " (" + ec.message() + ")" : std::string()));
  }
  const bool has_wal = std::filesystem::exists(path + "-wal", ec);
  const bool has_shm = std::filesystem::exists(path + "-shm", ec);
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  const bool dir_writable = ::access(dir.c_str(), W_OK) == 0;
  const bool immutable = !has_wal || (!dir_writable && !has_shm);
  FEDFLEET_ASSIGN_OR_RETURN(
      DbPtr db, openConnection(fileUri(path, immutable ? "mode=ro&immutable=1" : "mode=ro"),
                               SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, options, ctx));
  FEDFLEET_ASSIGN_OR_RETURN(std::optional<int64_t> version, readSchemaVersion(db.get(), ctx));
  if (!version) {
    return failedPrecondition(ctx + ": the database is empty, not a fedfleet history");
  }
  FEDFLEET_RETURN_IF_ERROR(checkReadOnlyVersion(*version, ctx));
  std::unique_ptr<SqliteHistory> store(new SqliteHistory(std::move(db)));
  FEDFLEET_RETURN_IF_ERROR(store->prepareStatements().withContext(ctx));
  return std::unique_ptr<HistoryStore>(std::move(store));
}

// The clients upsert: a known client keeps its client_id and first_seen; every other column
// takes the new value.
std::string upsertClientSql() {
  std::string sql = insertSql(kClientsTable) + " ON CONFLICT (client_id) DO UPDATE SET ";
  const char* separator = "";
  for (const Column<ClientRecord>& c : kClientsTable.columns) {
    if (c.name == "client_id" || c.name == "first_seen") continue;
    sql += separator + sqlName(c.name) + " = excluded." + sqlName(c.name);
    separator = ", ";
  }
  return sql;
}

Status SqliteHistory::prepareStatements() {
  sqlite3* db = db_.get();
  auto records = [db](auto& target, const auto& table, const std::string& sql) -> Status {
    using Statement = std::remove_reference_t<decltype(target)>;
    FEDFLEET_ASSIGN_OR_RETURN(target, prepareRecordStatement<Statement>(db, table, sql));
    return Status::ok();
  };
  auto plain = [db](StatementPtr& target, const std::string& sql) -> Status {
    FEDFLEET_ASSIGN_OR_RETURN(target, prepare(db, sql));
    return Status::ok();
  };
  FEDFLEET_RETURN_IF_ERROR(records(insert_run_, kRunsTable, insertSql(kRunsTable)));
  FEDFLEET_RETURN_IF_ERROR(records(upsert_client_, kClientsTable, upsertClientSql()));
  FEDFLEET_RETURN_IF_ERROR(records(insert_round_, kRoundsTable, insertSql(kRoundsTable)));
  FEDFLEET_RETURN_IF_ERROR(records(insert_update_, kUpdatesTable, insertSql(kUpdatesTable)));
  FEDFLEET_RETURN_IF_ERROR(
      records(insert_checkpoint_, kCheckpointsTable, insertSql(kCheckpointsTable)));
  FEDFLEET_RETURN_IF_ERROR(records(insert_event_, kEventsTable, insertSql(kEventsTable)));
  FEDFLEET_RETURN_IF_ERROR(
      records(insert_block_metric_, kBlockMetricsTable, insertSql(kBlockMetricsTable)));
  FEDFLEET_RETURN_IF_ERROR(
      records(insert_peer_iteration_, kPeerIterationsTable, insertSql(kPeerIterationsTable)));
  FEDFLEET_RETURN_IF_ERROR(records(insert_peer_eval_, kPeerEvalsTable, insertSql(kPeerEvalsTable)));
  FEDFLEET_RETURN_IF_ERROR(
      records(select_peer_iterations_, kPeerIterationsTable,
              selectSql(kPeerIterationsTable, "WHERE run_id = :run_id ORDER BY peer, iteration")));
  FEDFLEET_RETURN_IF_ERROR(
      records(select_peer_evals_, kPeerEvalsTable,
              selectSql(kPeerEvalsTable, "WHERE run_id = :run_id ORDER BY time_s, id")));
  FEDFLEET_RETURN_IF_ERROR(
      records(select_runs_, kRunsTable, selectSql(kRunsTable, "ORDER BY run_id")));
  FEDFLEET_RETURN_IF_ERROR(
      records(select_rounds_, kRoundsTable,
              selectSql(kRoundsTable, "WHERE run_id = :run_id ORDER BY round")));
  FEDFLEET_RETURN_IF_ERROR(records(select_updates_, kUpdatesTable,
                                   selectSql(kUpdatesTable, "WHERE run_id = :run_id ORDER BY id")));
  FEDFLEET_RETURN_IF_ERROR(
      records(select_round_updates_, kUpdatesTable,
              selectSql(kUpdatesTable, "WHERE run_id = :run_id AND round = :round ORDER BY id")));
  FEDFLEET_RETURN_IF_ERROR(
      records(select_clients_, kClientsTable, selectSql(kClientsTable, "ORDER BY client_id")));
  FEDFLEET_RETURN_IF_ERROR(
      records(select_events_, kEventsTable, selectSql(kEventsTable, "ORDER BY id")));
  FEDFLEET_RETURN_IF_ERROR(records(select_run_events_, kEventsTable,
                                   selectSql(kEventsTable, "WHERE run_id = :run_id ORDER BY id")));
  FEDFLEET_RETURN_IF_ERROR(records(select_unattached_events_, kEventsTable,
                                   selectSql(kEventsTable, "WHERE run_id IS NULL ORDER BY id")));
  FEDFLEET_RETURN_IF_ERROR(
      records(select_latest_checkpoint_, kCheckpointsTable,
              selectSql(kCheckpointsTable, "WHERE run_id = :run_id ORDER BY round DESC LIMIT 1")));
  FEDFLEET_RETURN_IF_ERROR(
      records(select_checkpoint_at_, kCheckpointsTable,
              selectSql(kCheckpointsTable, "WHERE run_id = :run_id AND round = :round")));
  FEDFLEET_RETURN_IF_ERROR(plain(run_exists_, "SELECT 1 FROM runs WHERE run_id = :run_id"));
  FEDFLEET_RETURN_IF_ERROR(
      plain(round_exists_, "SELECT 1 FROM rounds WHERE run_id = :run_id AND round = :round"));
  FEDFLEET_RETURN_IF_ERROR(
      plain(select_checkpoint_rounds_,
            "SELECT round FROM checkpoints WHERE run_id = :run_id ORDER BY round"));
  FEDFLEET_RETURN_IF_ERROR(plain(
      prune_checkpoints_,
      "DELETE FROM checkpoints WHERE run_id = :run_id AND round NOT IN (SELECT round FROM "
      "checkpoints WHERE run_id = :run_id ORDER BY round DESC LIMIT :keep_last) AND NOT "
      "(:keep_best "
      "AND round IS (SELECT c.round FROM checkpoints c JOIN rounds r ON r.run_id = c.run_id AND "
      "r.round = c.round LEFT JOIN rounds n ON n.run_id = c.run_id AND n.round = c.round + 1 "
      "WHERE c.run_id = :run_id AND COALESCE(r.test_accuracy, n.fed_eval_accuracy, "
      "-r.test_loss, -n.fed_eval_loss) IS NOT NULL ORDER BY COALESCE(r.test_accuracy, "
      "n.fed_eval_accuracy, -r.test_loss, -n.fed_eval_loss) DESC, c.round LIMIT 1))"));
  return Status::ok();
}

Result<int64_t> SqliteHistory::beginRun(const RunRecord& run) {
  Query q = query(insert_run_, "beginRun('" + run.name + "')");
  insert_run_.bind(q, run);
  FEDFLEET_RETURN_IF_ERROR(q.run());
  return static_cast<int64_t>(sqlite3_last_insert_rowid(db_.get()));
}

Status SqliteHistory::upsertClient(const ClientRecord& c) {
  if (c.client_id.empty()) return invalidArgument("upsertClient: empty client_id");
  Query q = query(upsert_client_, "upsertClient('" + c.client_id + "')");
  upsert_client_.bind(q, c);
  return q.run();
}

Status SqliteHistory::commitRound(const RoundRecord& round,
                                  const std::vector<UpdateRecord>& updates,
                                  const std::optional<CheckpointRecord>& checkpoint) {
  FEDFLEET_RETURN_IF_ERROR(checkCommitArguments(round, updates, checkpoint));
  const std::string ctx = commitContext(round);
  FEDFLEET_RETURN_IF_ERROR(execSql(db_.get(), "BEGIN IMMEDIATE", ctx + ": begin"));
  Status st = writeRound(round, updates, checkpoint, ctx);
  if (st.isOk()) st = execSql(db_.get(), "COMMIT", ctx + ": commit");
  if (!st.isOk()) return rollback(db_.get(), st);
  return Status::ok();
}

Status SqliteHistory::writeRound(const RoundRecord& r, const std::vector<UpdateRecord>& updates,
                                 const std::optional<CheckpointRecord>& checkpoint,
                                 const std::string& ctx) {
  {
    Query q = query(run_exists_, ctx);
    q.parameter(":run_id").integer(r.run_id);
    FEDFLEET_ASSIGN_OR_RETURN(bool exists, q.step());
    if (!exists) return notFound(ctx + ": run " + std::to_string(r.run_id) + " does not exist");
  }
  {
    Query q = query(round_exists_, ctx);
    q.parameter(":run_id").integer(r.run_id);
    q.parameter(":round").integer(r.round);
    FEDFLEET_ASSIGN_OR_RETURN(bool exists, q.step());
    if (exists) {
      return failedPrecondition(ctx + ": the round is already committed (rounds are never " +
                                "overwritten)");
    }
  }
  {
    Query q = query(insert_round_, ctx + ": insert round");
    insert_round_.bind(q, r);
    FEDFLEET_RETURN_IF_ERROR(q.run());
  }
  if (checkpoint) {
    Query q = query(insert_checkpoint_, ctx + ": insert checkpoint");
    insert_checkpoint_.bind(q, *checkpoint);
    FEDFLEET_RETURN_IF_ERROR(q.run());
  }
  for (size_t i = 0; i < updates.size(); ++i) {
    const UpdateRecord& u = updates[i];
    Query q = query(insert_update_, ctx + ": insert update " + std::to_string(i) + " (client '" +
                                        u.client_id + "', status '" + u.status + "')");
    insert_update_.bind(q, u);
    FEDFLEET_RETURN_IF_ERROR(q.run());
  }
  return Status::ok();
}

Status SqliteHistory::recordEvent(const EventRecord& e) {
  const std::string ctx = "recordEvent('" + e.kind + "')";
  Query q = query(insert_event_, ctx);
  insert_event_.bind(q, e);
  Status st = q.run();
  if (st.code() == StatusCode::kNotFound) {  // the foreign key on run_id
    return notFound(ctx + ": run " + std::to_string(e.run_id) + " does not exist");
  }
  return st;
}

// Steps `q` to its last row and returns select.read(q) for every row, in order.
template <typename Record>
Result<std::vector<Record>> collectRecords(Query& q, const RecordSelect<Record>& select) {
  std::vector<Record> out;
  while (true) {
    FEDFLEET_ASSIGN_OR_RETURN(bool row, q.step());
    if (!row) return out;
    out.push_back(select.read(q));
  }
}

Result<std::vector<RunRecord>> SqliteHistory::runs() {
  Query q = query(select_runs_, "runs()");
  return collectRecords(q, select_runs_);
}

Result<std::vector<RoundRecord>> SqliteHistory::rounds(int64_t run_id) {
  Query q = query(select_rounds_, "rounds(" + std::to_string(run_id) + ")");
  q.parameter(":run_id").integer(run_id);
  return collectRecords(q, select_rounds_);
}

Result<std::vector<UpdateRecord>> SqliteHistory::updates(int64_t run_id,
                                                         std::optional<uint32_t> round) {
  const RecordSelect<UpdateRecord>& select = round ? select_round_updates_ : select_updates_;
  Query q = query(select, "updates(" + std::to_string(run_id) + ")");
  q.parameter(":run_id").integer(run_id);
  if (round) q.parameter(":round").integer(*round);
  return collectRecords(q, select);
}

Result<std::vector<ClientRecord>> SqliteHistory::clients() {
  Query q = query(select_clients_, "clients()");
  return collectRecords(q, select_clients_);
}

Result<std::vector<EventRecord>> SqliteHistory::events(std::optional<int64_t> run_id) {
  const RecordSelect<EventRecord>& select = !run_id        ? select_events_
                                            : *run_id == 0 ? select_unattached_events_
                                                           : select_run_events_;
  Query q = query(select, "events()");
  if (run_id && *run_id != 0) q.parameter(":run_id").integer(*run_id);
  return collectRecords(q, select);
}

Result<CheckpointRecord> SqliteHistory::latestCheckpoint(int64_t run_id) {
  const std::string ctx = "latestCheckpoint(" + std::to_string(run_id) + ")";
  Query q = query(select_latest_checkpoint_, ctx);
  q.parameter(":run_id").integer(run_id);
  FEDFLEET_ASSIGN_OR_RETURN(bool row, q.step());
  if (!row) return notFound(ctx + ": run has no checkpoint");
  return select_latest_checkpoint_.read(q);
}

Result<CheckpointRecord> SqliteHistory::checkpointAt(int64_t run_id, uint32_t round) {
  const std::string ctx =
      "checkpointAt(" + std::to_string(run_id) + ", " + std::to_string(round) + ")";
  Query q = query(select_checkpoint_at_, ctx);
  q.parameter(":run_id").integer(run_id);
  q.parameter(":round").integer(round);
  FEDFLEET_ASSIGN_OR_RETURN(bool row, q.step());
  if (!row) return notFound(ctx + ": no checkpoint of that round");
  return select_checkpoint_at_.read(q);
}

Result<std::vector<uint32_t>> SqliteHistory::checkpointRounds(int64_t run_id) {
  Query q = query(select_checkpoint_rounds_, "checkpointRounds(" + std::to_string(run_id) + ")");
  q.parameter(":run_id").integer(run_id);
  std::vector<uint32_t> out;
  while (true) {
    FEDFLEET_ASSIGN_OR_RETURN(bool row, q.step());
    if (!row) return out;
    out.push_back(static_cast<uint32_t>(q.column("round").integer()));
  }
}

Result<std::vector<BlockMetricRecord>> SqliteHistory::blockMetrics(int64_t run_id) {
  const std::string ctx = "blockMetrics(" + std::to_string(run_id) + ")";
  // Schema version 4 has the table; look for it anyway (a reader may be pointed at a file a
  // migration has not touched), and prepare the query only when it is there.
  FEDFLEET_ASSIGN_OR_RETURN(
      StatementPtr exists,
      prepare(db_.get(),
              "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'block_metrics'"));
  {
    Query q = query(exists, ctx + ": look for the table");
    FEDFLEET_ASSIGN_OR_RETURN(bool found, q.step());
    if (!found) return std::vector<BlockMetricRecord>{};
  }
  FEDFLEET_ASSIGN_OR_RETURN(
      RecordSelect<BlockMetricRecord> select,
      prepareRecordStatement<RecordSelect<BlockMetricRecord>>(
          db_.get(), kBlockMetricsTable,
          selectSql(kBlockMetricsTable, "WHERE run_id = :run_id ORDER BY round, block, model")));
  Query q = query(select, ctx);
  q.parameter(":run_id").integer(run_id);
  return collectRecords(q, select);
}

Status SqliteHistory::recordBlockMetrics(const std::vector<BlockMetricRecord>& rows) {
  const std::string ctx = "recordBlockMetrics(" + std::to_string(rows.size()) + " rows)";
  if (rows.empty()) return Status::ok();
  FEDFLEET_RETURN_IF_ERROR(checkBlockMetricRows(rows).withContext(ctx));
  FEDFLEET_RETURN_IF_ERROR(execSql(db_.get(), "BEGIN IMMEDIATE", ctx));
  Status st;
  for (const BlockMetricRecord& b : rows) {
    Query q = query(insert_block_metric_, ctx + ": run " + std::to_string(b.run_id) + " round " +
                                              std::to_string(b.round) + " block " + b.block +
                                              " model " + b.model);
    insert_block_metric_.bind(q, b);
    st = q.run();
    if (!st.isOk()) break;
  }
  if (st.isOk()) st = execSql(db_.get(), "COMMIT", ctx + ": commit");
  if (!st.isOk()) return rollback(db_.get(), st);
  return Status::ok();
}

Status SqliteHistory::pruneCheckpoints(int64_t run_id, uint32_t keep_last, bool keep_best) {
  const std::string ctx = "pruneCheckpoints(" + std::to_string(run_id) + ", " +
                          std::to_string(keep_last) + (keep_best ? ", best" : "") + ")";
  if (keep_last == 0) return invalidArgument(ctx + ": keep_last must be at least 1");
  Query q = query(prune_checkpoints_, ctx);
  q.parameter(":run_id").integer(run_id);
  q.parameter(":keep_last").integer(keep_last);
  q.parameter(":keep_best").integer(keep_best ? 1 : 0);
  return q.run();
}

Status SqliteHistory::recordPeerIterations(const std::vector<PeerIterationRecord>& rows) {
  const std::string ctx = "recordPeerIterations(" + std::to_string(rows.size()) + " rows)";
  if (rows.empty()) return Status::ok();
  FEDFLEET_RETURN_IF_ERROR(checkPeerIterationRows(rows).withContext(ctx));
  FEDFLEET_RETURN_IF_ERROR(execSql(db_.get(), "BEGIN IMMEDIATE", ctx));
  Status st;
  for (const PeerIterationRecord& r : rows) {
    // The context names the row only when it fails: a batch may hold many thousand rows.
    Query q = query(insert_peer_iteration_, ctx);
    insert_peer_iteration_.bind(q, r);
    st = q.run();
    if (!st.isOk()) {
      const std::string row = "run " + std::to_string(r.run_id) + " peer " +
                              std::to_string(r.peer) + " iteration " + std::to_string(r.iteration);
      if (st.code() == StatusCode::kNotFound) {  // the foreign key on run_id
        st = notFound(ctx + ": " + row + ": run " + std::to_string(r.run_id) + " does not exist");
      } else if (st.code() == StatusCode::kFailedPrecondition) {  // the primary key
        st = failedPrecondition(ctx + ": " + row + " is already written");
      } else {
        st = st.withContext(row);
      }
      break;
    }
  }
  if (st.isOk()) st = execSql(db_.get(), "COMMIT", ctx + ": commit");
  if (!st.isOk()) return rollback(db_.get(), st);
  return Status::ok();
}

Status SqliteHistory::recordPeerEval(const PeerEvalRecord& row) {
  const std::string ctx = "recordPeerEval(run " + std::to_string(row.run_id) + ")";
  FEDFLEET_RETURN_IF_ERROR(checkPeerEval(row).withContext(ctx));
  Query q = query(insert_peer_eval_, ctx);
  insert_peer_eval_.bind(q, row);
  Status st = q.run();
  if (st.code() == StatusCode::kNotFound) {  // the foreign key on run_id
    return notFound(ctx + ": run " + std::to_string(row.run_id) + " does not exist");
  }
  return st;
}

Result<std::vector<PeerIterationRecord>> SqliteHistory::peerIterations(int64_t run_id) const {
  Query q = query(select_peer_iterations_, "peerIterations(" + std::to_string(run_id) + ")");
  q.parameter(":run_id").integer(run_id);
  return collectRecords(q, select_peer_iterations_);
}

Result<std::vector<PeerEvalRecord>> SqliteHistory::peerEvals(int64_t run_id) const {
  Query q = query(select_peer_evals_, "peerEvals(" + std::to_string(run_id) + ")");
  q.parameter(":run_id").integer(run_id);
  return collectRecords(q, select_peer_evals_);
}

}  // namespace

Result<std::unique_ptr<HistoryStore>> openSqliteHistory(const std::string& path,
                                                        const SqliteHistoryOptions& options) {
  return SqliteHistory::open(path, options);
}

Result<std::unique_ptr<HistoryStore>> openSqliteHistory(const std::string& path) {
  return openSqliteHistory(path, SqliteHistoryOptions{});
}

Result<std::unique_ptr<HistoryStore>> openSqliteHistoryReadOnly(
    const std::string& path, const SqliteHistoryOptions& options) {
  return SqliteHistory::openReadOnly(path, options);
}

Result<std::unique_ptr<HistoryStore>> openSqliteHistoryReadOnly(const std::string& path) {
  return openSqliteHistoryReadOnly(path, SqliteHistoryOptions{});
}

}  // namespace fedfleet::history
