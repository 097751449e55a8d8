#include "common/history/sqlite_schema.h"

#include <bit>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/history/record_diff.h"

namespace fedfleet::history {
namespace {

// The table's rowid, which SQLite assigns on insert: read into field `Member`, never bound.
template <auto Member, typename Record = typename RecordOf<decltype(Member)>::type>
constexpr Column<Record> assignedId(std::string_view name) {
  Column<Record> column = field<Member>(name, "INTEGER", "PRIMARY KEY");
  column.bind = nullptr;
  return column;
}

// A rowid no record field holds: it only keeps rows in insertion order.
template <typename Record>
constexpr Column<Record> insertionOrder(std::string_view name) {
  return {name, "INTEGER", "PRIMARY KEY"};
}

// A column of an update's served model: NULL when the task served none (served_block < 0), and
// a NULL read back leaves the record's default (served_block -1: nothing served).
template <auto Member>
constexpr Column<UpdateRecord> servedField(std::string_view name, std::string_view type) {
  return {name,
          type,
          {},
          [](const UpdateRecord& u, const Parameter& p) {
            if (u.served_block < 0) {
              p.null();
            } else {
              bindValue(p, u.*Member);
            }
          },
          [](const Value& value, UpdateRecord& u) {
            if (!value.isNull()) readValue(value, u.*Member);
          },
          [](const UpdateRecord& a, const UpdateRecord& b) {
            return differenceOf(a.*Member, b.*Member);
          }};
}

// A Metrics column: a JSON object of the metrics in their order, NULL when there are none.
template <typename Record, Metrics Record::*Member>
constexpr Column<Record> metricsField(std::string_view name) {
  return {name,
          "TEXT",
          {},
          [](const Record& r, const Parameter& p) {
            const Metrics& m = r.*Member;
            if (m.empty()) return p.null();
            nlohmann::ordered_json j = nlohmann::ordered_json::object();
            for (const auto& [key, value] : m) j[key] = value;
            p.textCopy(j.dump());  // a temporary
          },
          [](const Value& value, Record& r) {
            Metrics& m = r.*Member;
            m.clear();
            if (value.isNull()) return;
            // A value another program wrote that is not an object of numbers reads as none.
            const auto j = nlohmann::ordered_json::parse(value.text(), nullptr, false);
            if (!j.is_object()) return;
            for (const auto& [key, v] : j.items()) {
              if (v.is_number()) m.emplace_back(key, v.template get<double>());
            }
          },
          [](const Record& a, const Record& b) { return differenceOf(a.*Member, b.*Member); }};
}

constexpr Column<RunRecord> kRunColumns[] = {
    assignedId<&RunRecord::run_id>("run_id"),
    field<&RunRecord::name>("name", "TEXT", "NOT NULL"),
    field<&RunRecord::config_json>("config_json", "TEXT", "NOT NULL"),
    field<&RunRecord::started_at>("started_at", "REAL"),
    field<&RunRecord::seed>("seed", "INTEGER", "NOT NULL"),
    field<&RunRecord::clock>("clock", "TEXT", "NOT NULL DEFAULT 'wall'"),
    field<&RunRecord::model_json>("model_json", "TEXT", "NOT NULL DEFAULT ''"),
};

constexpr Column<RoundRecord> kRoundColumns[] = {
    field<&RoundRecord::run_id>("run_id", "INTEGER", "NOT NULL REFERENCES runs (run_id)"),
    field<&RoundRecord::round>("round", "INTEGER", "NOT NULL"),
    field<&RoundRecord::start_time>("start_time", "REAL"),
    field<&RoundRecord::end_time>("end_time", "REAL"),
    field<&RoundRecord::selected>("selected", "INTEGER", "NOT NULL"),
    field<&RoundRecord::completed>("completed", "INTEGER", "NOT NULL"),
    field<&RoundRecord::late>("late", "INTEGER", "NOT NULL"),
    field<&RoundRecord::dropped>("dropped", "INTEGER", "NOT NULL"),
    field<&RoundRecord::rejected>("rejected", "INTEGER", "NOT NULL"),
    field<&RoundRecord::status>("status", "TEXT",
                                "NOT NULL CHECK (status IN ('initial', 'ok', 'failed'))"),
    field<&RoundRecord::train_loss>("train_loss", "REAL"),
    field<&RoundRecord::test_loss>("test_loss", "REAL"),
    field<&RoundRecord::test_accuracy>("test_accuracy", "REAL"),
    field<&RoundRecord::bytes_up>("bytes_up", "INTEGER", "NOT NULL"),
    field<&RoundRecord::bytes_down>("bytes_down", "INTEGER", "NOT NULL"),
    field<&RoundRecord::model_version>("model_version", "INTEGER", "NOT NULL"),
    wallClock(field<&RoundRecord::wall_start>("wall_start", "REAL")),  // schema 2
    wallClock(field<&RoundRecord::wall_end>("wall_end", "REAL")),
    field<&RoundRecord::fed_eval_clients>("fed_eval_clients", "INTEGER",  // schema 7
                                          "NOT NULL DEFAULT 0"),
    field<&RoundRecord::fed_eval_samples>("fed_eval_samples", "INTEGER", "NOT NULL DEFAULT 0"),
    field<&RoundRecord::fed_eval_loss>("fed_eval_loss", "REAL"),
    field<&RoundRecord::fed_eval_accuracy>("fed_eval_accuracy", "REAL"),
    metricsField<RoundRecord, &RoundRecord::test_metrics>("test_metrics"),  // schema 8
    metricsField<RoundRecord, &RoundRecord::fed_eval_metrics>("fed_eval_metrics"),
    field<&RoundRecord::dp_epsilon>("dp_epsilon", "REAL"),  // schema 9
    field<&RoundRecord::dp_clip>("dp_clip", "REAL"),
};
constexpr std::string_view kRoundConstraints[] = {"PRIMARY KEY (run_id, round)"};

constexpr Column<UpdateRecord> kUpdateColumns[] = {
    insertionOrder<UpdateRecord>("id"),
    field<&UpdateRecord::run_id>("run_id", "INTEGER", "NOT NULL"),
    field<&UpdateRecord::round>("round", "INTEGER", "NOT NULL"),
    field<&UpdateRecord::client_id>("client_id", "TEXT", "NOT NULL"),
    field<&UpdateRecord::partition>("partition", "INTEGER", "NOT NULL"),
    field<&UpdateRecord::n_samples>("n_samples", "INTEGER", "NOT NULL"),
    field<&UpdateRecord::steps>("steps", "INTEGER", "NOT NULL"),
    field<&UpdateRecord::loss>("loss", "REAL"),
    field<&UpdateRecord::compute_s>("compute_s", "REAL"),
    field<&UpdateRecord::upload_s>("upload_s", "REAL"),
    field<&UpdateRecord::bytes_up>("bytes_up", "INTEGER", "NOT NULL"),
    field<&UpdateRecord::bytes_down>("bytes_down", "INTEGER", "NOT NULL"),
    field<&UpdateRecord::weight>("weight", "REAL"),
    field<&UpdateRecord::status>(
        "status", "TEXT",
        "NOT NULL CHECK (status IN ('completed', 'late', 'dropped', 'rejected'))"),
    field<&UpdateRecord::start_time>("start_time", "REAL"),  // schema 2
    field<&UpdateRecord::end_time>("end_time", "REAL"),
    wallClock(field<&UpdateRecord::wall_compute_s>("wall_compute_s", "REAL")),
    field<&UpdateRecord::codec>("codec", "TEXT", "NOT NULL DEFAULT ''"),
    wallClock(field<&UpdateRecord::encode_s>("encode_s", "REAL")),
    wallClock(field<&UpdateRecord::decode_s>("decode_s", "REAL")),
    servedField<&UpdateRecord::served_block>("served_block", "INTEGER"),  // schema 5
    servedField<&UpdateRecord::served_model>("served_model", "TEXT"),
    servedField<&UpdateRecord::served_version>("served_version", "INTEGER"),
    servedField<&UpdateRecord::served_sha256_hex>("served_sha256", "TEXT"),
    servedField<&UpdateRecord::served_bytes>("served_bytes", "INTEGER"),
    servedField<&UpdateRecord::served_samples>("served_samples", "INTEGER"),
    servedField<&UpdateRecord::served_loss>("served_loss", "REAL"),
    servedField<&UpdateRecord::served_accuracy>("served_accuracy", "REAL"),
    field<&UpdateRecord::grant_wait_s>("grant_wait_s", "REAL"),
    field<&UpdateRecord::eval_samples>("eval_samples", "INTEGER", "NOT NULL DEFAULT 0"),  // 7
    field<&UpdateRecord::eval_loss>("eval_loss", "REAL"),
    field<&UpdateRecord::eval_accuracy>("eval_accuracy", "REAL"),
    metricsField<UpdateRecord, &UpdateRecord::eval_metrics>("eval_metrics"),  // schema 8
};
constexpr std::string_view kUpdateConstraints[] = {
    "FOREIGN KEY (run_id, round) REFERENCES rounds (run_id, round)"};
constexpr Index kUpdateIndexes[] = {{"updates_by_round", "run_id, round"}};

constexpr Column<ClientRecord> kClientColumns[] = {
    field<&ClientRecord::client_id>("client_id", "TEXT", "PRIMARY KEY NOT NULL"),
    field<&ClientRecord::public_key>("public_key", "TEXT", "NOT NULL"),
    field<&ClientRecord::device_kind>("device_kind", "TEXT", "NOT NULL"),
    field<&ClientRecord::device_name>("device_name", "TEXT", "NOT NULL"),
    field<&ClientRecord::cores>("cores", "INTEGER", "NOT NULL"),
    field<&ClientRecord::memory_bytes>("memory_bytes", "INTEGER", "NOT NULL"),
    field<&ClientRecord::data_size>("data_size", "INTEGER", "NOT NULL"),
    field<&ClientRecord::first_seen>("first_seen", "REAL"),
    field<&ClientRecord::last_seen>("last_seen", "REAL"),
};

constexpr Column<CheckpointRecord> kCheckpointColumns[] = {
    field<&CheckpointRecord::run_id>("run_id", "INTEGER", "NOT NULL"),
    field<&CheckpointRecord::round>("round", "INTEGER", "NOT NULL"),
    field<&CheckpointRecord::model_version>("model_version", "INTEGER", "NOT NULL"),
    field<&CheckpointRecord::sha256_hex>("sha256", "TEXT", "NOT NULL"),
    blobField<&CheckpointRecord::blob>("blob", "NOT NULL"),
    blobField<&CheckpointRecord::engine_state>("engine_state", "NOT NULL DEFAULT x''"),  // 3
};
constexpr std::string_view kCheckpointConstraints[] = {
    "PRIMARY KEY (run_id, round)", "FOREIGN KEY (run_id, round) REFERENCES rounds (run_id, round)"};

constexpr Column<EventRecord> kEventColumns[] = {
    insertionOrder<EventRecord>("id"),
    // 0 (no run) is stored as NULL, which the foreign key lets through; NULL reads back as 0.
    {"run_id", "INTEGER", "REFERENCES runs (run_id)",
     [](const EventRecord& e, const Parameter& p) {
       if (e.run_id == 0) {
         p.null();
       } else {
         p.integer(e.run_id);
       }
     },
     [](const Value& value, EventRecord& e) { e.run_id = value.integer(); },
     [](const EventRecord& a, const EventRecord& b) { return differenceOf(a.run_id, b.run_id); }},
    field<&EventRecord::time>("time", "REAL"),
    field<&EventRecord::kind>("kind", "TEXT", "NOT NULL"),
    field<&EventRecord::client_id>("client_id", "TEXT", "NOT NULL"),
    field<&EventRecord::detail>("detail", "TEXT", "NOT NULL"),
};
constexpr Index kEventIndexes[] = {{"events_by_run", "run_id"}};

// block and model read as text whatever type a file's writer gave them (Value::text).
constexpr Column<BlockMetricRecord> kBlockMetricColumns[] = {
    field<&BlockMetricRecord::run_id>("run_id", "INTEGER", "NOT NULL REFERENCES runs (run_id)"),
    field<&BlockMetricRecord::round>("round", "INTEGER", "NOT NULL"),
    field<&BlockMetricRecord::block>("block", "TEXT", "NOT NULL"),
    field<&BlockMetricRecord::model>("model", "TEXT", "NOT NULL"),
    field<&BlockMetricRecord::accuracy>("accuracy", "REAL"),
    field<&BlockMetricRecord::loss>("loss", "REAL"),
};
constexpr std::string_view kBlockMetricConstraints[] = {
    "PRIMARY KEY (run_id, round, block, model)"};

constexpr Column<PeerIterationRecord> kPeerIterationColumns[] = {
    field<&PeerIterationRecord::run_id>("run_id", "INTEGER", "NOT NULL REFERENCES runs (run_id)"),
    field<&PeerIterationRecord::peer>("peer", "INTEGER", "NOT NULL"),
    field<&PeerIterationRecord::iteration>("iteration", "INTEGER", "NOT NULL"),
    field<&PeerIterationRecord::t_start>("t_start", "REAL", "NOT NULL"),
    field<&PeerIterationRecord::t_end>("t_end", "REAL", "NOT NULL"),
    field<&PeerIterationRecord::compute_s>("compute_s", "REAL", "NOT NULL"),
    field<&PeerIterationRecord::comm_s>("comm_s", "REAL", "NOT NULL"),
    field<&PeerIterationRecord::wait_s>("wait_s", "REAL", "NOT NULL"),
    field<&PeerIterationRecord::bytes_sent>("bytes_sent", "INTEGER", "NOT NULL"),
    field<&PeerIterationRecord::bytes_received>("bytes_received", "INTEGER", "NOT NULL"),
    field<&PeerIterationRecord::exchanges>("exchanges", "INTEGER", "NOT NULL"),
    field<&PeerIterationRecord::staleness>("staleness", "INTEGER", "NOT NULL"),
    field<&PeerIterationRecord::skipped>("skipped", "INTEGER",
                                         "NOT NULL CHECK (skipped IN (0, 1))"),
};
constexpr std::string_view kPeerIterationConstraints[] = {"PRIMARY KEY (run_id, peer, iteration)"};

// Evaluations keep their insertion order (id) to order equal times.
constexpr Column<PeerEvalRecord> kPeerEvalColumns[] = {
    insertionOrder<PeerEvalRecord>("id"),
    field<&PeerEvalRecord::run_id>("run_id", "INTEGER", "NOT NULL REFERENCES runs (run_id)"),
    field<&PeerEvalRecord::time_s>("time_s", "REAL", "NOT NULL"),
    field<&PeerEvalRecord::iterations>("iterations", "INTEGER", "NOT NULL"),
    field<&PeerEvalRecord::peers_averaged>("peers_averaged", "INTEGER", "NOT NULL"),
    field<&PeerEvalRecord::accuracy>("accuracy", "REAL"),
    field<&PeerEvalRecord::loss>("loss", "REAL"),
};
constexpr Index kPeerEvalIndexes[] = {{"peer_evals_by_run", "run_id, time_s"}};

// The released upgrade steps. Each one's SQL is what that version's fedfleet ran; never edit
// one, add a step.
constexpr SchemaUpgrade kSchemaUpgrades[] = {
    {1, 2, "the run's clock, wall times of rounds, task times and codecs of updates", R"sql(
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
)sql"},
    {2, 3,
     "the engine's learned state (selection generator, selector, server optimiser, control "
     "variates) beside each checkpointed model",
     R"sql(
ALTER TABLE checkpoints ADD COLUMN engine_state BLOB NOT NULL DEFAULT x'';
)sql"},
    {3, 4,
     "per-block evaluations of block-cyclic runs (a block_metrics table an earlier tool added "
     "is kept)",
     R"sql(
CREATE TABLE IF NOT EXISTS block_metrics (
  run_id INTEGER NOT NULL REFERENCES runs (run_id),
  round INTEGER NOT NULL,
  block TEXT NOT NULL,
  model TEXT NOT NULL,
  accuracy REAL,
  loss REAL,
  PRIMARY KEY (run_id, round, block, model)
);
)sql"},
    {4, 5,
     "the model each block-cyclic task served and how it did on the client's held-out data "
     "(NULL in older rows), and each update's wait for its upload credit",
     R"sql(
ALTER TABLE updates ADD COLUMN served_block INTEGER;
ALTER TABLE updates ADD COLUMN served_model TEXT;
ALTER TABLE updates ADD COLUMN served_version INTEGER;
ALTER TABLE updates ADD COLUMN served_sha256 TEXT;
ALTER TABLE updates ADD COLUMN served_bytes INTEGER;
ALTER TABLE updates ADD COLUMN served_samples INTEGER;
ALTER TABLE updates ADD COLUMN served_loss REAL;
ALTER TABLE updates ADD COLUMN served_accuracy REAL;
ALTER TABLE updates ADD COLUMN grant_wait_s REAL;
)sql"},
    {5, 6,
     "the layout of the run's model (names, shapes and offsets of its tensors), so that a "
     "checkpoint can be exported as a model file",
     R"sql(
ALTER TABLE runs ADD COLUMN model_json TEXT NOT NULL DEFAULT '';
)sql"},
    {6, 7,
     "federated evaluation: each update's evaluation of its task's model on the client's "
     "held-out data, and each round's sample-weighted figures over them",
     R"sql(
ALTER TABLE rounds ADD COLUMN fed_eval_clients INTEGER NOT NULL DEFAULT 0;
ALTER TABLE rounds ADD COLUMN fed_eval_samples INTEGER NOT NULL DEFAULT 0;
ALTER TABLE rounds ADD COLUMN fed_eval_loss REAL;
ALTER TABLE rounds ADD COLUMN fed_eval_accuracy REAL;
ALTER TABLE updates ADD COLUMN eval_samples INTEGER NOT NULL DEFAULT 0;
ALTER TABLE updates ADD COLUMN eval_loss REAL;
ALTER TABLE updates ADD COLUMN eval_accuracy REAL;
)sql"},
    {7, 8,
     "metrics beside loss and accuracy (a regression's mse and mae, a model's own metrics): "
     "of the server's evaluation and the federated one per round, and of each update's",
     R"sql(
ALTER TABLE rounds ADD COLUMN test_metrics TEXT;
ALTER TABLE rounds ADD COLUMN fed_eval_metrics TEXT;
ALTER TABLE updates ADD COLUMN eval_metrics TEXT;
)sql"},
    {8, 9,
     "differential privacy: the epsilon each round's model has spent and the norm its updates "
     "were clipped to (NULL for runs without it)",
     R"sql(
ALTER TABLE rounds ADD COLUMN dp_epsilon REAL;
ALTER TABLE rounds ADD COLUMN dp_clip REAL;
)sql"},
    {9, 10,
     "decentralised runs: each peer's iterations (times, bytes, exchanges, staleness) and the "
     "evaluations of the peers' averaged model",
     R"sql(
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
)sql"},
};

// The steps go from version 1 to this build's, one version at a time.
constexpr bool isLadder(std::span<const SchemaUpgrade> steps) {
  for (size_t i = 0; i < steps.size(); ++i) {
    if (steps[i].to_version != steps[i].from_version + 1) return false;
    if (i > 0 && steps[i].from_version != steps[i - 1].to_version) return false;
  }
  return !steps.empty() && steps.front().from_version == 1 &&
         steps.back().to_version == kSqliteSchemaVersion;
}
static_assert(isLadder(kSchemaUpgrades),
              "kSchemaUpgrades must lead from version 1 to kSqliteSchemaVersion step by step");

// The step that upgrades a file of `version`, or nullptr.
const SchemaUpgrade* upgradeFrom(int64_t version) {
  for (const SchemaUpgrade& step : kSchemaUpgrades) {
    if (step.from_version == version) return &step;
  }
  return nullptr;
}

Status newerVersion(int64_t version, const std::string& ctx) {
  return failedPrecondition(ctx + ": the file has schema version " + std::to_string(version) +
                            ", but this fedfleet knows up to schema version " +
                            std::to_string(kSqliteSchemaVersion) +
                            " (a newer fedfleet wrote the file): upgrade fedfleet to open it");
}

Status unknownVersion(int64_t version, const std::string& ctx) {
  return failedPrecondition(ctx + ": the file has schema version " + std::to_string(version) +
                            ", which no fedfleet writes (versions 1 to " +
                            std::to_string(kSqliteSchemaVersion) +
                            "): the file is damaged or not a fedfleet history");
}

// Runs `step` on a file of step.from_version inside the caller's transaction and records
// step.to_version.
Status applyUpgrade(sqlite3* db, const SchemaUpgrade& step, const std::string& step_ctx) {
  FEDFLEET_RETURN_IF_ERROR(execSql(db, step.sql, step_ctx));
  FEDFLEET_ASSIGN_OR_RETURN(StatementPtr record,
                            prepare(db, "UPDATE schema_version SET version = :version"));
  Query q(db, record.get(), step_ctx);
  q.parameter(":version").integer(step.to_version);
  return q.run();
}

}  // namespace

const Table<RunRecord> kRunsTable{"runs", kRunColumns, {}, {}};
const Table<RoundRecord> kRoundsTable{"rounds", kRoundColumns, kRoundConstraints, {}};
const Table<UpdateRecord> kUpdatesTable{"updates", kUpdateColumns, kUpdateConstraints,
                                        kUpdateIndexes};
const Table<ClientRecord> kClientsTable{"clients", kClientColumns, {}, {}};
const Table<CheckpointRecord> kCheckpointsTable{
    "checkpoints", kCheckpointColumns, kCheckpointConstraints, {}};
const Table<EventRecord> kEventsTable{"events", kEventColumns, {}, kEventIndexes};
const Table<BlockMetricRecord> kBlockMetricsTable{
    "block_metrics", kBlockMetricColumns, kBlockMetricConstraints, {}};
const Table<PeerIterationRecord> kPeerIterationsTable{
    "peer_iterations", kPeerIterationColumns, kPeerIterationConstraints, {}};
const Table<PeerEvalRecord> kPeerEvalsTable{"peer_evals", kPeerEvalColumns, {}, kPeerEvalIndexes};

namespace {

std::string show(double v) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}
std::string show(const std::optional<double>& v) { return v ? show(*v) : "null"; }
std::string show(const Metrics& m) {
  std::string out = "{";
  for (const auto& [name, v] : m) out += (out.size() > 1 ? ", " : "") + name + "=" + show(v);
  return out + "}";
}
bool same(double a, double b) { return std::bit_cast<uint64_t>(a) == std::bit_cast<uint64_t>(b); }
bool same(const std::optional<double>& a, const std::optional<double>& b) {
  return a.has_value() == b.has_value() && (!a || same(*a, *b));
}
template <typename T>
std::string differs(const T& recorded, const T& replayed) {
  return show(recorded) + " recorded, " + show(replayed) + " replayed";
}

template <typename Record>
std::string firstDifferenceIn(const Table<Record>& table, const Record& a, const Record& b) {
  for (const Column<Record>& c : table.columns) {
    if (!c.differ) continue;
    std::string d = c.differ(a, b);
    if (!d.empty()) return std::string(c.name) + ": " + d;
  }
  return {};
}

}  // namespace

std::string differenceOf(double recorded, double replayed) {
  return same(recorded, replayed) ? std::string() : differs(recorded, replayed);
}
std::string differenceOf(const std::optional<double>& recorded,
                         const std::optional<double>& replayed) {
  return same(recorded, replayed) ? std::string() : differs(recorded, replayed);
}
std::string differenceOf(const std::string& recorded, const std::string& replayed) {
  if (recorded == replayed) return {};
  return "'" + recorded + "' recorded, '" + replayed + "' replayed";
}
std::string differenceOf(const Metrics& recorded, const Metrics& replayed) {
  bool equal = recorded.size() == replayed.size();
  for (size_t i = 0; equal && i < recorded.size(); ++i) {
    equal = recorded[i].first == replayed[i].first && same(recorded[i].second, replayed[i].second);
  }
  return equal ? std::string() : differs(recorded, replayed);
}

std::string firstDifference(const RoundRecord& a, const RoundRecord& b) {
  return firstDifferenceIn(kRoundsTable, a, b);
}
std::string firstDifference(const UpdateRecord& a, const UpdateRecord& b) {
  return firstDifferenceIn(kUpdatesTable, a, b);
}
std::string firstDifference(const EventRecord& a, const EventRecord& b) {
  return firstDifferenceIn(kEventsTable, a, b);
}
std::string firstDifference(const BlockMetricRecord& a, const BlockMetricRecord& b) {
  return firstDifferenceIn(kBlockMetricsTable, a, b);
}

std::string sqlName(std::string_view name) {
  if (sqlite3_keyword_check(name.data(), static_cast<int>(name.size())) == 0) {
    return std::string(name);
  }
  return "\"" + std::string(name) + "\"";
}

std::span<const SchemaUpgrade> schemaUpgrades() { return kSchemaUpgrades; }

std::string createSchemaSql() {
  std::string sql = "CREATE TABLE schema_version (version INTEGER NOT NULL);\n";
  forEachTable([&sql](const auto& table) { sql += createTableSql(table); });
  return sql + "INSERT INTO schema_version (version) VALUES (" +
         std::to_string(kSqliteSchemaVersion) + ");\n";
}

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
      if (q.column("name").text() == "schema_version") has_version_table = true;
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
  const int64_t version = q.column("version").integer();
  FEDFLEET_ASSIGN_OR_RETURN(bool extra, q.step());
  if (extra) return failedPrecondition(ctx + ": the schema_version table has several rows");
  return std::optional<int64_t>(version);
}

Status createOrUpgradeSchema(sqlite3* db, const std::string& ctx) {
  while (true) {
    FEDFLEET_RETURN_IF_ERROR(execSql(db, "BEGIN IMMEDIATE", ctx));
    // Read under the write lock: another process may have created or upgraded the file since.
    Result<std::optional<int64_t>> found = readSchemaVersion(db, ctx);
    if (!found.isOk()) return rollback(db, found.status());
    const std::optional<int64_t> version = *found;
    const SchemaUpgrade* step = nullptr;
    Status st;
    if (!version) {
      st = execSql(db, createSchemaSql(), ctx + ": create schema");
      if (st.isOk()) st = execSql(db, "COMMIT", ctx + ": commit schema");
    } else if (*version > kSqliteSchemaVersion) {
      st = newerVersion(*version, ctx);
    } else if (*version < kSqliteSchemaVersion) {
      step = upgradeFrom(*version);
      if (step == nullptr) {
        st = unknownVersion(*version, ctx);
      } else {
        const std::string step_ctx =
            ctx + ": upgrading schema version " + std::to_string(step->from_version) + " to " +
            std::to_string(step->to_version) + " (" + std::string(step->description) + ") failed";
        st = applyUpgrade(db, *step, step_ctx);
        if (st.isOk()) st = execSql(db, "COMMIT", step_ctx);
        if (!st.isOk()) {
          st = Status(st.code(), st.message() + "; the step was rolled back and the file stays " +
                                     "at schema version " + std::to_string(*version) +
                                     ": remove the cause and open it again");
        }
      }
    } else {
      st = execSql(db, "COMMIT", ctx + ": commit schema");
    }
    if (!st.isOk()) return rollback(db, st);
    if (step == nullptr) return Status::ok();  // created, or already at this build's version
  }
}

Status checkReadOnlyVersion(int64_t version, const std::string& ctx) {
  if (version == kSqliteSchemaVersion) return Status::ok();
  if (version > kSqliteSchemaVersion) return newerVersion(version, ctx);
  if (upgradeFrom(version) == nullptr) return unknownVersion(version, ctx);
  return failedPrecondition(ctx + ": the file has schema version " + std::to_string(version) +
                            ", older than this fedfleet's " + std::to_string(kSqliteSchemaVersion) +
                            "; a read-only open never upgrades a file: opening it for writing "
                            "(as the coordinator does) upgrades it in place");
}

}  // namespace fedfleet::history
