// SqliteHistory: HistoryStore over the raw sqlite3 C API.
//
// Every value reaches SQLite through a bound parameter of a statement prepared once at open;
// no SQL text is built from data. Each public method is one statement in autocommit mode except
// commitRound, which runs BEGIN IMMEDIATE (take the write lock first, so the transaction cannot
// fail half-way on a lock upgrade), the writes, COMMIT, and ROLLBACK on any failure.

#include "common/history/sqlite_history.h"

#include <sqlite3.h>
#include <unistd.h>

#include <cctype>
#include <cmath>
#include <filesystem>
#include <limits>
#include <string_view>
#include <utility>

#include "common/history/record_checks.h"

namespace fedfleet::history {
namespace {

constexpr std::string_view kSchemaSql = R"sql(
CREATE TABLE schema_version (version INTEGER NOT NULL);
CREATE TABLE runs (
  run_id INTEGER PRIMARY KEY,
  name TEXT NOT NULL,
  config_json TEXT NOT NULL,
  started_at REAL,
  seed INTEGER NOT NULL,
  clock TEXT NOT NULL DEFAULT 'wall'
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
INSERT INTO schema_version (version) VALUES (5);
)sql";

// Version 1 -> 2: the run's clock, wall times of rounds, task times of updates.
constexpr std::string_view kMigrate1To2Sql = R"sql(
ALTER TABLE runs ADD COLUMN clock TEXT NOT NULL DEFAULT 'wall';
ALTER TABLE rounds ADD COLUMN wall_start REAL;
ALTER TABLE rounds ADD COLUMN wall_end REAL;
UPDATE rounds SET wall_start = start_time, wall_end = end_time;
ALTER TABLE updates ADD COLUMN start_time REAL;
ALTER TABLE updates ADD COLUMN end_time REAL;
ALTER TABLE updates ADD COLUMN wall_compute_s REAL;
ALTER TABLE updates ADD COLUMN codec TEXT NOT NULL DEFAULT '';
ALTER TABLE updates ADD COLUMN encode_s REAL;
ALTER TABLE updates ADD COLUMN decode_s REAL;
UPDATE updates SET wall_compute_s = compute_s;
UPDATE schema_version SET version = 2;
)sql";

// Version 2 -> 3: the engine's learned state (selection generator, selector, server optimiser,
// control variates) beside each checkpointed model.
constexpr std::string_view kMigrate2To3Sql = R"sql(
ALTER TABLE checkpoints ADD COLUMN engine_state BLOB NOT NULL DEFAULT x'';
UPDATE schema_version SET version = 3;
)sql";

// Version 3 -> 4: per-block evaluations of block-cyclic runs. Earlier tools may have added a
// block_metrics table of their own; it is kept.
constexpr std::string_view kMigrate3To4Sql = R"sql(
CREATE TABLE IF NOT EXISTS block_metrics (
  run_id INTEGER NOT NULL REFERENCES runs (run_id),
  round INTEGER NOT NULL,
  block TEXT NOT NULL,
  model TEXT NOT NULL,
  accuracy REAL,
  loss REAL,
  PRIMARY KEY (run_id, round, block, model)
);
UPDATE schema_version SET version = 4;
)sql";

// Version 4 -> 5: what each block-cyclic task told its client to serve, and how that model did
// on the client's held-out data (NULL in older rows and in runs without blocks); how long each
// update waited for its upload credit (protocol 5).
constexpr std::string_view kMigrate4To5Sql = R"sql(
ALTER TABLE updates ADD COLUMN served_block INTEGER;
ALTER TABLE updates ADD COLUMN served_model TEXT;
ALTER TABLE updates ADD COLUMN served_version INTEGER;
ALTER TABLE updates ADD COLUMN served_sha256 TEXT;
ALTER TABLE updates ADD COLUMN served_bytes INTEGER;
ALTER TABLE updates ADD COLUMN served_samples INTEGER;
ALTER TABLE updates ADD COLUMN served_loss REAL;
ALTER TABLE updates ADD COLUMN served_accuracy REAL;
ALTER TABLE updates ADD COLUMN grant_wait_s REAL;
UPDATE schema_version SET version = 5;
)sql";

constexpr const char* kRoundColumns =
    "run_id, round, start_time, end_time, selected, completed, late, dropped, rejected, status, "
    "train_loss, test_loss, test_accuracy, bytes_up, bytes_down, model_version, wall_start, "
    "wall_end";
constexpr const char* kUpdateColumns =
    "run_id, round, client_id, \"partition\", n_samples, steps, loss, compute_s, upload_s, "
    "bytes_up, bytes_down, weight, status, start_time, end_time, wall_compute_s, codec, "
    "encode_s, decode_s, served_block, served_model, served_version, served_sha256, served_bytes, "
    "served_samples, served_loss, served_accuracy, grant_wait_s";
constexpr const char* kClientColumns =
    "client_id, public_key, device_kind, device_name, cores, memory_bytes, data_size, first_seen, "
    "last_seen";

// Maps a SQLite result code (extended codes are on) to a Status carrying `context` and
// SQLite's own message. Must be called before anything else runs on `db` (errmsg is per call).
Status sqliteStatus(sqlite3* db, int rc, const std::string& context) {
  const std::string sqlite_message = (db != nullptr) ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  const std::string message = context + ": " + sqlite_message;
  switch (rc & 0xff) {
    case SQLITE_FULL:
      return ioError(context + ": disk is full (" + sqlite_message + ")");
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return timeoutError(message + " (another connection held the lock past the busy timeout)");
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return corrupt(message);
    case SQLITE_NOMEM:
    case SQLITE_TOOBIG:
      return resourceExhausted(message);
    case SQLITE_CONSTRAINT:
      if (rc == SQLITE_CONSTRAINT_PRIMARYKEY || rc == SQLITE_CONSTRAINT_UNIQUE) {
        return failedPrecondition(message);
      }
      if (rc == SQLITE_CONSTRAINT_FOREIGNKEY) return notFound(message);
      return invalidArgument(message);
    case SQLITE_CANTOPEN:
      return ioError(message + " (does the directory exist, and may this user write there?)");
    case SQLITE_IOERR:
    case SQLITE_READONLY:
    case SQLITE_PERM:
    case SQLITE_PROTOCOL:
    case SQLITE_AUTH:
      return ioError(message);
    default:
      return internalError(message);
  }
}

struct StatementDeleter {
  void operator()(sqlite3_stmt* stmt) const { sqlite3_finalize(stmt); }
};
using StatementPtr = std::unique_ptr<sqlite3_stmt, StatementDeleter>;

struct DbDeleter {
  void operator()(sqlite3* db) const { sqlite3_close_v2(db); }
};
using DbPtr = std::unique_ptr<sqlite3, DbDeleter>;

// One use of a prepared statement: binds parameters in order, steps, reads columns, and resets
// the statement and clears its bindings when it goes out of scope, so a cached statement never
// holds a read snapshot open or keeps a pointer to a caller's buffer.
class Query {
 public:
  Query(sqlite3* db, sqlite3_stmt* stmt, std::string context)
      : db_(db), stmt_(stmt), context_(std::move(context)) {}
  ~Query() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }
  Query(const Query&) = delete;
  Query& operator=(const Query&) = delete;

  Query& bindInt(int64_t v) { return record(sqlite3_bind_int64(stmt_, next_++, v)); }
  // Stores the bit pattern: values above INT64_MAX come back exactly through columnUint.
  Query& bindUint(uint64_t v) { return bindInt(static_cast<int64_t>(v)); }
  // NaN is stored as NULL by SQLite; columnDouble turns NULL back into NaN.
  Query& bindDouble(double v) { return record(sqlite3_bind_double(stmt_, next_++, v)); }
  Query& bindOptionalDouble(const std::optional<double>& v) {
    return v ? bindDouble(*v) : bindNull();
  }
  Query& bindNull() { return record(sqlite3_bind_null(stmt_, next_++)); }
  // The text must stay alive until the Query is destroyed (SQLITE_STATIC: no copy).
  Query& bindText(std::string_view v) {
    return record(
        sqlite3_bind_text64(stmt_, next_++, v.data(), v.size(), SQLITE_STATIC, SQLITE_UTF8));
  }
  Query& bindBlob(std::string_view v) {
    // A null pointer would store NULL, not an empty blob.
    static const char kEmpty = 0;
    return record(sqlite3_bind_blob64(stmt_, next_++, v.empty() ? &kEmpty : v.data(), v.size(),
                                      SQLITE_STATIC));
  }

  // true on a row, false when done; a failed bind or step is the error.
  Result<bool> step() {
    if (bind_rc_ != SQLITE_OK) return sqliteStatus(db_, bind_rc_, context_);
    int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    return sqliteStatus(db_, rc, context_);
  }
  // Steps a statement that returns no rows.
  Status run() {
    Result<bool> r = step();
    return r.status();
  }

  bool isNull(int col) const { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }
  int64_t columnInt(int col) const { return sqlite3_column_int64(stmt_, col); }
  uint64_t columnUint(int col) const { return static_cast<uint64_t>(columnInt(col)); }
  uint32_t columnUint32(int col) const { return static_cast<uint32_t>(columnInt(col)); }
  double columnDouble(int col) const {
    return isNull(col) ? std::numeric_limits<double>::quiet_NaN()
                       : sqlite3_column_double(stmt_, col);
  }
  std::optional<double> columnOptionalDouble(int col) const {
    if (isNull(col)) return std::nullopt;
    return sqlite3_column_double(stmt_, col);
  }
  std::string columnText(int col) const {
    const unsigned char* p = sqlite3_column_text(stmt_, col);
    int n = sqlite3_column_bytes(stmt_, col);
    return p ? std::string(reinterpret_cast<const char*>(p), static_cast<size_t>(n))
             : std::string();
  }
  std::string columnBlob(int col) const {
    const void* p = sqlite3_column_blob(stmt_, col);
    int n = sqlite3_column_bytes(stmt_, col);
    return p ? std::string(static_cast<const char*>(p), static_cast<size_t>(n)) : std::string();
  }

 private:
  Query& record(int rc) {
    if (rc != SQLITE_OK && bind_rc_ == SQLITE_OK) bind_rc_ = rc;
    return *this;
  }

  sqlite3* db_;
  sqlite3_stmt* stmt_;
  std::string context_;
  int next_ = 1;
  int bind_rc_ = SQLITE_OK;
};

// Runs SQL text that carries no values (pragmas, BEGIN/COMMIT, the schema).
Status execSql(sqlite3* db, std::string_view sql, const std::string& context) {
  int rc = sqlite3_exec(db, std::string(sql).c_str(), nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK) return sqliteStatus(db, rc, context);
  return Status::ok();
}

Result<StatementPtr> prepare(sqlite3* db, const std::string& sql) {
  sqlite3_stmt* stmt = nullptr;
  int rc = sqlite3_prepare_v3(db, sql.c_str(), static_cast<int>(sql.size()),
                              SQLITE_PREPARE_PERSISTENT, &stmt, nullptr);
  if (rc != SQLITE_OK) {
    sqlite3_finalize(stmt);
    return sqliteStatus(db, rc, "prepare '" + sql + "'");
  }
  return StatementPtr(stmt);
}

// Rolls back the open transaction, if SQLite has not already done so (it does on some errors,
// SQLITE_FULL among them). Adds a failed rollback to `cause` instead of dropping it.
Status rollback(sqlite3* db, Status cause) {
  if (sqlite3_get_autocommit(db)) return cause;
  int rc = sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr);
  if (rc == SQLITE_OK) return cause;
  return Status(cause.code(), cause.message() + "; ROLLBACK also failed: " + sqlite3_errmsg(db));
}

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
  Status pruneCheckpoints(int64_t run_id, uint32_t keep_last) override;

 private:
  explicit SqliteHistory(DbPtr db) : db_(std::move(db)) {}

  Status prepareStatements();
  // The writes of commitRound, inside its transaction.
  Status writeRound(const RoundRecord& round, const std::vector<UpdateRecord>& updates,
                    const std::optional<CheckpointRecord>& checkpoint, const std::string& ctx);
  Query query(const StatementPtr& stmt, std::string context) {
    return Query(db_.get(), stmt.get(), std::move(context));
  }

  DbPtr db_;
  StatementPtr insert_run_;
  StatementPtr upsert_client_;
  StatementPtr run_exists_;
  StatementPtr round_exists_;
  StatementPtr insert_round_;
  StatementPtr insert_update_;
  StatementPtr insert_checkpoint_;
  StatementPtr insert_event_;
  StatementPtr select_runs_;
  StatementPtr select_rounds_;
  StatementPtr select_updates_;
  StatementPtr select_round_updates_;
  StatementPtr select_clients_;
  StatementPtr select_events_;
  StatementPtr select_run_events_;
  StatementPtr select_unattached_events_;
  StatementPtr select_latest_checkpoint_;
  StatementPtr select_checkpoint_rounds_;
  StatementPtr prune_checkpoints_;
  StatementPtr insert_block_metric_;
};

// The schema version of the database, std::nullopt for an empty one (no tables). A database
// with tables but no schema_version table is another program's: kFailedPrecondition, as is an
// empty or multi-row schema_version table. Reads only.
Result<std::optional<int64_t>> readSchemaVersion(sqlite3* db, const std::string& ctx) {
  // The first read of the file: one that is not a database fails here.
  auto listed = prepare(db,
                        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE "
                        "'sqlite_%'");
  if (!listed.isOk()) return listed.status().withContext(ctx);
  StatementPtr tables = std::move(listed).value();
  bool has_version_table = false;
  int table_count = 0;
  {
    Query q(db, tables.get(), ctx + ": list tables");
    while (true) {
      FEDFLEET_ASSIGN_OR_RETURN(bool row, q.step());
      if (!row) break;
      ++table_count;
      if (q.columnText(0) == "schema_version") has_version_table = true;
    }
  }
  if (!has_version_table) {
    if (table_count > 0) {
      return failedPrecondition(ctx + ": the file is a SQLite database but not a fedfleet " +
                                "history (it has tables but no schema_version table)");
    }
    return std::optional<int64_t>();
  }
  FEDFLEET_ASSIGN_OR_RETURN(StatementPtr version_stmt,
                            prepare(db, "SELECT version FROM schema_version"));
  Query q(db, version_stmt.get(), ctx + ": read schema_version");
  FEDFLEET_ASSIGN_OR_RETURN(bool row, q.step());
  if (!row) return failedPrecondition(ctx + ": the schema_version table is empty");
  const int64_t version = q.columnInt(0);
  FEDFLEET_ASSIGN_OR_RETURN(bool extra, q.step());
  if (extra) return failedPrecondition(ctx + ": the schema_version table has several rows");
  return std::optional<int64_t>(version);
}

// The refusal of a schema version this build neither reads nor upgrades.
Status unsupportedVersion(int64_t version, const std::string& ctx) {
  return failedPrecondition(
      ctx + ": schema version " + std::to_string(version) + " is not supported; this build " +
      "reads and writes version " + std::to_string(kSqliteSchemaVersion) +
      (version > kSqliteSchemaVersion ? " (the file was written by a newer fedfleet)" : ""));
}

// Creates the schema in an empty database or checks the version of an existing one, upgrading
// an older one. Runs in one IMMEDIATE transaction so two processes opening a new file cannot
// both create it.
Status prepareSchema(sqlite3* db, const std::string& path) {
  const std::string ctx = "open history '" + path + "'";
  FEDFLEET_RETURN_IF_ERROR(execSql(db, "BEGIN IMMEDIATE", ctx));
  auto check = [&]() -> Status {
    FEDFLEET_ASSIGN_OR_RETURN(std::optional<int64_t> found, readSchemaVersion(db, ctx));
    if (!found) return execSql(db, kSchemaSql, ctx + ": create schema");
    int64_t version = *found;
    if (version == 1) {
      FEDFLEET_RETURN_IF_ERROR(execSql(db, kMigrate1To2Sql, ctx + ": upgrade schema 1 -> 2"));
      version = 2;
    }
    if (version == 2) {
      FEDFLEET_RETURN_IF_ERROR(execSql(db, kMigrate2To3Sql, ctx + ": upgrade schema 2 -> 3"));
      version = 3;
    }
    if (version == 3) {
      FEDFLEET_RETURN_IF_ERROR(execSql(db, kMigrate3To4Sql, ctx + ": upgrade schema 3 -> 4"));
      version = 4;
    }
    if (version == 4) return execSql(db, kMigrate4To5Sql, ctx + ": upgrade schema 4 -> 5");
    if (version != kSqliteSchemaVersion) return unsupportedVersion(version, ctx);
    return Status::ok();
  };
  Status st = check();
  if (st.isOk()) st = execSql(db, "COMMIT", ctx + ": commit schema");
  if (!st.isOk()) return rollback(db, st);
  return Status::ok();
}

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
    std::string mode = row ? q.columnText(0) : "";
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
  FEDFLEET_RETURN_IF_ERROR(prepareSchema(db.get(), path));

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
  if (*version != kSqliteSchemaVersion) {
    Status refused = unsupportedVersion(*version, ctx);
    if (*version > kSqliteSchemaVersion) return refused;
    return failedPrecondition(refused.message() +
                              " (an older file; a read-only open never upgrades it, opening it "
                              "for writing, as the coordinator does, upgrades it)");
  }
  std::unique_ptr<SqliteHistory> store(new SqliteHistory(std::move(db)));
  FEDFLEET_RETURN_IF_ERROR(store->prepareStatements().withContext(ctx));
  return std::unique_ptr<HistoryStore>(std::move(store));
}

Status SqliteHistory::prepareStatements() {
  sqlite3* db = db_.get();
  const std::string round_cols = kRoundColumns;
  const std::string update_cols = kUpdateColumns;
  const std::string client_cols = kClientColumns;
  struct Item {
    StatementPtr* target;
    std::string sql;
  };
  const Item items[] = {
      {&insert_run_,
       "INSERT INTO runs (name, config_json, started_at, seed, clock) VALUES (?, ?, ?, ?, ?)"},
      {&upsert_client_,
       "INSERT INTO clients (" + client_cols +
           ") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (client_id) DO UPDATE SET "
           "public_key = excluded.public_key, device_kind = excluded.device_kind, "
           "device_name = excluded.device_name, cores = excluded.cores, "
           "memory_bytes = excluded.memory_bytes, data_size = excluded.data_size, "
           "last_seen = excluded.last_seen"},
      {&run_exists_, "SELECT 1 FROM runs WHERE run_id = ?"},
      {&round_exists_, "SELECT 1 FROM rounds WHERE run_id = ? AND round = ?"},
      {&insert_round_, "INSERT INTO rounds (" + round_cols +
                           ") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"},
      {&insert_update_, "INSERT INTO updates (" + update_cols +
                            ") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, "
                            "?, ?, ?, ?, ?, ?, ?, ?, ?)"},
      {&insert_checkpoint_,
       "INSERT INTO checkpoints (run_id, round, model_version, sha256, blob, engine_state) "
       "VALUES (?, ?, ?, ?, ?, ?)"},
      {&insert_event_,
       "INSERT INTO events (run_id, time, kind, client_id, detail) VALUES (?, ?, ?, ?, ?)"},
      {&select_runs_,
       "SELECT run_id, name, config_json, started_at, seed, clock FROM runs ORDER BY run_id"},
      {&select_rounds_, "SELECT " + round_cols + " FROM rounds WHERE run_id = ? ORDER BY round"},
      {&select_updates_, "SELECT " + update_cols + " FROM updates WHERE run_id = ? ORDER BY id"},
      {&select_round_updates_,
       "SELECT " + update_cols + " FROM updates WHERE run_id = ? AND round = ? ORDER BY id"},
      {&select_clients_, "SELECT " + client_cols + " FROM clients ORDER BY client_id"},
      {&select_events_, "SELECT run_id, time, kind, client_id, detail FROM events ORDER BY id"},
      {&select_run_events_,
       "SELECT run_id, time, kind, client_id, detail FROM events WHERE run_id = ? ORDER BY id"},
      {&select_unattached_events_,
       "SELECT run_id, time, kind, client_id, detail FROM events WHERE run_id IS NULL "
       "ORDER BY id"},
      {&select_latest_checkpoint_,
       "SELECT run_id, round, model_version, sha256, blob, engine_state FROM checkpoints "
       "WHERE run_id = ? "
       "ORDER BY round DESC LIMIT 1"},
      {&select_checkpoint_rounds_, "SELECT round FROM checkpoints WHERE run_id = ? ORDER BY round"},
      {&prune_checkpoints_,
       "DELETE FROM checkpoints WHERE run_id = ?1 AND round NOT IN (SELECT round FROM "
       "checkpoints WHERE run_id = ?1 ORDER BY round DESC LIMIT ?2)"},
      {&insert_block_metric_,
       "INSERT INTO block_metrics (run_id, round, block, model, accuracy, loss) "
       "VALUES (?, ?, ?, ?, ?, ?)"},
  };
  for (const Item& item : items) {
    FEDFLEET_ASSIGN_OR_RETURN(*item.target, prepare(db, item.sql));
  }
  return Status::ok();
}

Result<int64_t> SqliteHistory::beginRun(const RunRecord& run) {
  Query q = query(insert_run_, "beginRun('" + run.name + "')");
  q.bindText(run.name)
      .bindText(run.config_json)
      .bindDouble(run.started_at)
      .bindUint(run.seed)
      .bindText(run.clock);
  FEDFLEET_RETURN_IF_ERROR(q.run());
  return static_cast<int64_t>(sqlite3_last_insert_rowid(db_.get()));
}

Status SqliteHistory::upsertClient(const ClientRecord& c) {
  if (c.client_id.empty()) return invalidArgument("upsertClient: empty client_id");
  Query q = query(upsert_client_, "upsertClient('" + c.client_id + "')");
  q.bindText(c.client_id)
      .bindText(c.public_key)
      .bindText(c.device_kind)
      .bindText(c.device_name)
      .bindInt(c.cores)
      .bindUint(c.memory_bytes)
      .bindUint(c.data_size)
      .bindDouble(c.first_seen)
      .bindDouble(c.last_seen);
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
    q.bindInt(r.run_id);
    FEDFLEET_ASSIGN_OR_RETURN(bool exists, q.step());
    if (!exists) return notFound(ctx + ": run " + std::to_string(r.run_id) + " does not exist");
  }
  {
    Query q = query(round_exists_, ctx);
    q.bindInt(r.run_id).bindInt(r.round);
    FEDFLEET_ASSIGN_OR_RETURN(bool exists, q.step());
    if (exists) {
      return failedPrecondition(ctx + ": the round is already committed (rounds are never " +
                                "overwritten)");
    }
  }
  {
    Query q = query(insert_round_, ctx + ": insert round");
    q.bindInt(r.run_id)
        .bindInt(r.round)
        .bindDouble(r.start_time)
        .bindDouble(r.end_time)
        .bindInt(r.selected)
        .bindInt(r.completed)
        .bindInt(r.late)
        .bindInt(r.dropped)
        .bindInt(r.rejected)
        .bindText(r.status)
        .bindDouble(r.train_loss)
        .bindOptionalDouble(r.test_loss)
        .bindOptionalDouble(r.test_accuracy)
        .bindUint(r.bytes_up)
        .bindUint(r.bytes_down)
        .bindUint(r.model_version)
        .bindDouble(r.wall_start)
        .bindDouble(r.wall_end);
    FEDFLEET_RETURN_IF_ERROR(q.run());
  }
  if (checkpoint) {
    Query q = query(insert_checkpoint_, ctx + ": insert checkpoint");
    q.bindInt(checkpoint->run_id)
        .bindInt(checkpoint->round)
        .bindUint(checkpoint->model_version)
        .bindText(checkpoint->sha256_hex)
        .bindBlob(checkpoint->blob)
        .bindBlob(checkpoint->engine_state);
    FEDFLEET_RETURN_IF_ERROR(q.run());
  }
  for (size_t i = 0; i < updates.size(); ++i) {
    const UpdateRecord& u = updates[i];
    Query q = query(insert_update_, ctx + ": insert update " + std::to_string(i) + " (client '" +
                                        u.client_id + "', status '" + u.status + "')");
    q.bindInt(u.run_id)
        .bindInt(u.round)
        .bindText(u.client_id)
        .bindInt(u.partition)
        .bindUint(u.n_samples)
        .bindUint(u.steps)
        .bindDouble(u.loss)
        .bindDouble(u.compute_s)
        .bindDouble(u.upload_s)
        .bindUint(u.bytes_up)
        .bindUint(u.bytes_down)
        .bindDouble(u.weight)
        .bindText(u.status)
        .bindDouble(u.start_time)
        .bindDouble(u.end_time)
        .bindDouble(u.wall_compute_s)
        .bindText(u.codec)
        .bindDouble(u.encode_s)
        .bindDouble(u.decode_s);
    if (u.served_block < 0) {
      for (int k = 0; k < 8; ++k) q.bindNull();
    } else {
      q.bindInt(u.served_block)
          .bindText(u.served_model)
          .bindUint(u.served_version)
          .bindText(u.served_sha256_hex)
          .bindUint(u.served_bytes)
          .bindUint(u.served_samples)
          .bindOptionalDouble(u.served_loss)
          .bindOptionalDouble(u.served_accuracy);
    }
    q.bindDouble(u.grant_wait_s);
    FEDFLEET_RETURN_IF_ERROR(q.run());
  }
  return Status::ok();
}

Status SqliteHistory::recordEvent(const EventRecord& e) {
  const std::string ctx = "recordEvent('" + e.kind + "')";
  Query q = query(insert_event_, ctx);
  if (e.run_id == 0) {
    q.bindNull();
  } else {
    q.bindInt(e.run_id);
  }
  q.bindDouble(e.time).bindText(e.kind).bindText(e.client_id).bindText(e.detail);
  Status st = q.run();
  if (st.code() == StatusCode::kNotFound) {  // the foreign key on run_id
    return notFound(ctx + ": run " + std::to_string(e.run_id) + " does not exist");
  }
  return st;
}

// Steps `q` to its last row and returns readRow(q) for every row, in order.
template <typename T, typename ReadRow>
Result<std::vector<T>> collectRows(Query& q, ReadRow readRow) {
  std::vector<T> out;
  while (true) {
    FEDFLEET_ASSIGN_OR_RETURN(bool row, q.step());
    if (!row) return out;
    out.push_back(readRow(q));
  }
}

Result<std::vector<RunRecord>> SqliteHistory::runs() {
  Query q = query(select_runs_, "runs()");
  return collectRows<RunRecord>(q, [](Query& q) {
    RunRecord r;
    r.run_id = q.columnInt(0);
    r.name = q.columnText(1);
    r.config_json = q.columnText(2);
    r.started_at = q.columnDouble(3);
    r.seed = q.columnUint(4);
    r.clock = q.columnText(5);
    return r;
  });
}

Result<std::vector<RoundRecord>> SqliteHistory::rounds(int64_t run_id) {
  Query q = query(select_rounds_, "rounds(" + std::to_string(run_id) + ")");
  q.bindInt(run_id);
  return collectRows<RoundRecord>(q, [](Query& q) {
    RoundRecord r;
    r.run_id = q.columnInt(0);
    r.round = q.columnUint32(1);
    r.start_time = q.columnDouble(2);
    r.end_time = q.columnDouble(3);
    r.selected = q.columnUint32(4);
    r.completed = q.columnUint32(5);
    r.late = q.columnUint32(6);
    r.dropped = q.columnUint32(7);
    r.rejected = q.columnUint32(8);
    r.status = q.columnText(9);
    r.train_loss = q.columnDouble(10);
    r.test_loss = q.columnOptionalDouble(11);
    r.test_accuracy = q.columnOptionalDouble(12);
    r.bytes_up = q.columnUint(13);
    r.bytes_down = q.columnUint(14);
    r.model_version = q.columnUint(15);
    r.wall_start = q.columnDouble(16);
    r.wall_end = q.columnDouble(17);
    return r;
  });
}

Result<std::vector<UpdateRecord>> SqliteHistory::updates(int64_t run_id,
                                                         std::optional<uint32_t> round) {
  const std::string ctx = "updates(" + std::to_string(run_id) + ")";
  Query q = round ? query(select_round_updates_, ctx) : query(select_updates_, ctx);
  q.bindInt(run_id);
  if (round) q.bindInt(*round);
  return collectRows<UpdateRecord>(q, [](Query& q) {
    UpdateRecord u;
    u.run_id = q.columnInt(0);
    u.round = q.columnUint32(1);
    u.client_id = q.columnText(2);
    u.partition = static_cast<int32_t>(q.columnInt(3));
    u.n_samples = q.columnUint(4);
    u.steps = q.columnUint(5);
    u.loss = q.columnDouble(6);
    u.compute_s = q.columnDouble(7);
    u.upload_s = q.columnDouble(8);
    u.bytes_up = q.columnUint(9);
    u.bytes_down = q.columnUint(10);
    u.weight = q.columnDouble(11);
    u.status = q.columnText(12);
    u.start_time = q.columnDouble(13);
    u.end_time = q.columnDouble(14);
    u.wall_compute_s = q.columnDouble(15);
    u.codec = q.columnText(16);
    u.encode_s = q.columnDouble(17);
    u.decode_s = q.columnDouble(18);
    if (!q.isNull(19)) {
      u.served_block = static_cast<int32_t>(q.columnInt(19));
      u.served_model = q.columnText(20);
      u.served_version = q.columnUint(21);
      u.served_sha256_hex = q.columnText(22);
      u.served_bytes = q.columnUint(23);
      u.served_samples = q.columnUint(24);
      u.served_loss = q.columnOptionalDouble(25);
      u.served_accuracy = q.columnOptionalDouble(26);
    }
    u.grant_wait_s = q.columnDouble(27);
    return u;
  });
}

Result<std::vector<ClientRecord>> SqliteHistory::clients() {
  Query q = query(select_clients_, "clients()");
  return collectRows<ClientRecord>(q, [](Query& q) {
    ClientRecord c;
    c.client_id = q.columnText(0);
    c.public_key = q.columnText(1);
    c.device_kind = q.columnText(2);
    c.device_name = q.columnText(3);
    c.cores = q.columnUint32(4);
    c.memory_bytes = q.columnUint(5);
    c.data_size = q.columnUint(6);
    c.first_seen = q.columnDouble(7);
    c.last_seen = q.columnDouble(8);
    return c;
  });
}

Result<std::vector<EventRecord>> SqliteHistory::events(std::optional<int64_t> run_id) {
  const std::string ctx = "events()";
  const StatementPtr& stmt = !run_id        ? select_events_
                             : *run_id == 0 ? select_unattached_events_
                                            : select_run_events_;
  Query q = query(stmt, ctx);
  if (run_id && *run_id != 0) q.bindInt(*run_id);
  return collectRows<EventRecord>(q, [](Query& q) {
    EventRecord e;
    e.run_id = q.isNull(0) ? 0 : q.columnInt(0);
    e.time = q.columnDouble(1);
    e.kind = q.columnText(2);
    e.client_id = q.columnText(3);
    e.detail = q.columnText(4);
    return e;
  });
}

Result<CheckpointRecord> SqliteHistory::latestCheckpoint(int64_t run_id) {
  const std::string ctx = "latestCheckpoint(" + std::to_string(run_id) + ")";
  Query q = query(select_latest_checkpoint_, ctx);
  q.bindInt(run_id);
  FEDFLEET_ASSIGN_OR_RETURN(bool row, q.step());
  if (!row) return notFound(ctx + ": run has no checkpoint");
  CheckpointRecord c;
  c.run_id = q.columnInt(0);
  c.round = q.columnUint32(1);
  c.model_version = q.columnUint(2);
  c.sha256_hex = q.columnText(3);
  c.blob = q.columnBlob(4);
  c.engine_state = q.columnBlob(5);
  return c;
}

Result<std::vector<uint32_t>> SqliteHistory::checkpointRounds(int64_t run_id) {
  Query q = query(select_checkpoint_rounds_, "checkpointRounds(" + std::to_string(run_id) + ")");
  q.bindInt(run_id);
  return collectRows<uint32_t>(q, [](Query& q) { return q.columnUint32(0); });
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
  FEDFLEET_ASSIGN_OR_RETURN(StatementPtr select,
                            prepare(db_.get(),
                                    "SELECT run_id, round, block, model, accuracy, loss FROM "
                                    "block_metrics WHERE run_id = ? ORDER BY round, block, model"));
  Query q = query(select, ctx);
  q.bindInt(run_id);
  return collectRows<BlockMetricRecord>(q, [](Query& q) {
    BlockMetricRecord b;
    b.run_id = q.columnInt(0);
    b.round = q.columnUint32(1);
    b.block = q.columnText(2);
    b.model = q.columnText(3);
    b.accuracy = q.columnOptionalDouble(4);
    b.loss = q.columnOptionalDouble(5);
    return b;
  });
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
    q.bindInt(b.run_id)
        .bindInt(b.round)
        .bindText(b.block)
        .bindText(b.model)
        .bindOptionalDouble(b.accuracy)
        .bindOptionalDouble(b.loss);
    st = q.run();
    if (!st.isOk()) break;
  }
  if (st.isOk()) st = execSql(db_.get(), "COMMIT", ctx + ": commit");
  if (!st.isOk()) return rollback(db_.get(), st);
  return Status::ok();
}

Status SqliteHistory::pruneCheckpoints(int64_t run_id, uint32_t keep_last) {
  const std::string ctx =
      "pruneCheckpoints(" + std::to_string(run_id) + ", " + std::to_string(keep_last) + ")";
  if (keep_last == 0) return invalidArgument(ctx + ": keep_last must be at least 1");
  Query q = query(prune_checkpoints_, ctx);
  q.bindInt(run_id).bindInt(keep_last);
  return q.run();
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
