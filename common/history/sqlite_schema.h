// The schema of a SQLite history, written down once: each table's columns in on-disk order (name,
// SQL type and constraints, and how the column maps to a field of its record in
// common/history/records.h); the SQL generated from them (the CREATE TABLE of a new file, the
// writers' INSERT, the readers' SELECT); and the ladder of steps that upgrades an older file.
// Writers bind each column to the parameter named after it (":round"), readers find each column
// in their result by its name, so no statement depends on a hand-counted position.
//
// The column lists are the file format: a released column keeps its name, position, type and
// constraints. A new column goes at the end of its table's list, with an upgrade step that adds
// it to older files (ALTER TABLE ... ADD COLUMN appends, so an upgraded file and a new one have
// the same columns in the same order). Internal to common/history/.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/history/records.h"
#include "common/history/sqlite_history.h"
#include "common/history/sqlite_statement.h"
#include "common/status.h"

namespace fedfleet::history {

// One column of a table and how it maps to a field of `Record`.
template <typename Record>
struct Column {
  // Binds `record`'s value for this column.
  using Bind = void (*)(const Record& record, const Parameter& parameter);
  // Sets `record`'s field from this column's value in a result row.
  using Read = void (*)(const Value& value, Record& record);
  // How `replayed` differs from `recorded` in this column's field ("X recorded, Y replayed"),
  // empty when it does not (differenceOf below).
  using Differ = std::string (*)(const Record& recorded, const Record& replayed);

  std::string_view name;         // as SQLite reports it; SQL text quotes it if it is reserved
  std::string_view type;         // the declared type: INTEGER, REAL, TEXT or BLOB
  std::string_view constraints;  // the rest of the declaration (NOT NULL, DEFAULT, keys) or ""
  Bind bind = nullptr;  // nullptr: SQLite assigns the value (a rowid); INSERTs leave it out
  Read read = nullptr;  // nullptr: the record has no such field; SELECTs leave it out
  // nullptr: not compared by firstDifference (no field, or measured on the wall clock).
  Differ differ = nullptr;
};

struct Index {
  std::string_view name;
  std::string_view columns;  // "run_id, round"
};

// A table: its columns in on-disk order, then its table constraints and its indexes.
template <typename Record>
struct Table {
  std::string_view name;
  std::span<const Column<Record>> columns;
  std::span<const std::string_view> constraints;  // "PRIMARY KEY (run_id, round)", ...
  std::span<const Index> indexes;
};

// How a field's C++ type is stored: integers and bools (0 or 1) as INTEGER (uint64_t by its bit
// pattern, so values above INT64_MAX read back exactly), doubles as REAL (NaN becomes NULL and
// reads back as NaN), optional doubles as REAL or NULL, strings as TEXT.
inline void bindValue(const Parameter& p, bool v) { p.integer(v ? 1 : 0); }
inline void bindValue(const Parameter& p, int64_t v) { p.integer(v); }
inline void bindValue(const Parameter& p, int32_t v) { p.integer(v); }
inline void bindValue(const Parameter& p, uint32_t v) { p.integer(v); }
inline void bindValue(const Parameter& p, uint64_t v) { p.unsignedInteger(v); }
inline void bindValue(const Parameter& p, double v) { p.real(v); }
inline void bindValue(const Parameter& p, const std::optional<double>& v) { p.optionalReal(v); }
inline void bindValue(const Parameter& p, const std::string& v) { p.text(v); }

inline void readValue(const Value& v, bool& out) { out = v.integer() != 0; }
inline void readValue(const Value& v, int64_t& out) { out = v.integer(); }
inline void readValue(const Value& v, int32_t& out) { out = static_cast<int32_t>(v.integer()); }
inline void readValue(const Value& v, uint32_t& out) { out = static_cast<uint32_t>(v.integer()); }
inline void readValue(const Value& v, uint64_t& out) { out = v.unsignedInteger(); }
inline void readValue(const Value& v, double& out) { out = v.real(); }
inline void readValue(const Value& v, std::optional<double>& out) { out = v.optionalReal(); }
inline void readValue(const Value& v, std::string& out) { out = v.text(); }

// A replayed field against the recorded one (firstDifference, common/history/record_diff.h):
// numbers bit for bit, since a replay computes the same numbers, not nearly the same ones.
std::string differenceOf(double recorded, double replayed);
std::string differenceOf(const std::optional<double>& recorded,
                         const std::optional<double>& replayed);
std::string differenceOf(const std::string& recorded, const std::string& replayed);
std::string differenceOf(const Metrics& recorded, const Metrics& replayed);
template <typename Integer>
std::string differenceOf(Integer recorded, Integer replayed) {
  if (recorded == replayed) return {};
  return std::to_string(recorded) + " recorded, " + std::to_string(replayed) + " replayed";
}

// The record type a pointer to one of its fields belongs to.
template <typename MemberPointer>
struct RecordOf;
template <typename Record, typename Field>
struct RecordOf<Field Record::*> {
  using type = Record;
};

// The column of field `Member`, stored as its C++ type says (bindValue, readValue).
template <auto Member, typename Record = typename RecordOf<decltype(Member)>::type>
constexpr Column<Record> field(std::string_view name, std::string_view type,
                               std::string_view constraints = {}) {
  return {name,
          type,
          constraints,
          [](const Record& record, const Parameter& p) { bindValue(p, record.*Member); },
          [](const Value& value, Record& record) { readValue(value, record.*Member); },
          [](const Record& a, const Record& b) { return differenceOf(a.*Member, b.*Member); }};
}

// `column`, measured on the wall clock: a replay does not reproduce it, so firstDifference
// passes it over.
template <typename Record>
constexpr Column<Record> wallClock(Column<Record> column) {
  column.differ = nullptr;
  return column;
}

// The column of a std::string field holding bytes, stored as a BLOB.
template <auto Member, typename Record = typename RecordOf<decltype(Member)>::type>
constexpr Column<Record> blobField(std::string_view name, std::string_view constraints = {}) {
  return {name,
          "BLOB",
          constraints,
          [](const Record& record, const Parameter& p) { p.blob(record.*Member); },
          [](const Value& value, Record& record) { record.*Member = value.blob(); },
          [](const Record& a, const Record& b) {
            if (a.*Member == b.*Member) return std::string();
            return std::to_string((a.*Member).size()) + " bytes recorded, " +
                   std::to_string((b.*Member).size()) + " other bytes replayed";
          }};
}

// The tables of schema version kSqliteSchemaVersion.
extern const Table<RunRecord> kRunsTable;
extern const Table<RoundRecord> kRoundsTable;
extern const Table<UpdateRecord> kUpdatesTable;
extern const Table<ClientRecord> kClientsTable;
extern const Table<CheckpointRecord> kCheckpointsTable;
extern const Table<EventRecord> kEventsTable;
extern const Table<BlockMetricRecord> kBlockMetricsTable;
extern const Table<PeerIterationRecord> kPeerIterationsTable;
extern const Table<PeerEvalRecord> kPeerEvalsTable;

// Calls visit(table) for every table, in the order a new file creates them.
template <typename Visit>
void forEachTable(Visit&& visit) {
  visit(kRunsTable);
  visit(kRoundsTable);
  visit(kUpdatesTable);
  visit(kClientsTable);
  visit(kCheckpointsTable);
  visit(kEventsTable);
  visit(kBlockMetricsTable);
  visit(kPeerIterationsTable);
  visit(kPeerEvalsTable);
}

// `name` as SQL text: double-quoted when SQLite reserves the word ("partition").
std::string sqlName(std::string_view name);

// CREATE TABLE for `table`, one column a line in list order, then its table constraints; then
// its CREATE INDEX statements.
template <typename Record>
std::string createTableSql(const Table<Record>& table) {
  std::string sql = "CREATE TABLE " + sqlName(table.name) + " (";
  const char* separator = "\n  ";
  for (const Column<Record>& c : table.columns) {
    sql += separator + sqlName(c.name) + " " + std::string(c.type);
    if (!c.constraints.empty()) sql += " " + std::string(c.constraints);
    separator = ",\n  ";
  }
  for (std::string_view constraint : table.constraints) sql += separator + std::string(constraint);
  sql += "\n);\n";
  for (const Index& index : table.indexes) {
    sql += "CREATE INDEX " + std::string(index.name) + " ON " + sqlName(table.name) + " (" +
           std::string(index.columns) + ");\n";
  }
  return sql;
}

// INSERT INTO table (c, ...) VALUES (:c, ...) over the columns the writer binds.
template <typename Record>
std::string insertSql(const Table<Record>& table) {
  std::string names;
  std::string parameters;
  for (const Column<Record>& c : table.columns) {
    if (c.bind == nullptr) continue;
    const char* separator = names.empty() ? "" : ", ";
    names += separator + sqlName(c.name);
    parameters += separator + (":" + std::string(c.name));
  }
  return "INSERT INTO " + sqlName(table.name) + " (" + names + ") VALUES (" + parameters + ")";
}

// SELECT c, ... FROM table over the columns the reader reads, followed by `rest` (WHERE, ORDER
// BY, ...).
template <typename Record>
std::string selectSql(const Table<Record>& table, std::string_view rest) {
  std::string names;
  for (const Column<Record>& c : table.columns) {
    if (c.read == nullptr) continue;
    names += (names.empty() ? "" : ", ") + sqlName(c.name);
  }
  return "SELECT " + names + " FROM " + sqlName(table.name) + " " + std::string(rest);
}

// A statement prepared from one table's columns, with the place of each column in it, looked up
// by the column's name once, when prepared. Base of RecordInsert and RecordSelect.
template <typename Record>
class ColumnPlaces {
 public:
  sqlite3_stmt* statement() const { return stmt_.get(); }

  // A column the statement should have but lacks, or "" when it has them all.
  std::string_view missingColumn() const {
    for (size_t i = 0; i < places_.size(); ++i) {
      if (places_[i] == kMissing) return table_->columns[i].name;
    }
    return {};
  }

 protected:
  static constexpr int kUnused = -1;   // the statement has no use for the column
  static constexpr int kMissing = -2;  // it should have the column but does not

  ColumnPlaces() = default;
  // place(column) is the column's place in the statement, kUnused or kMissing.
  template <typename Place>
  ColumnPlaces(const Table<Record>& table, StatementPtr stmt, Place place)
      : table_(&table), stmt_(std::move(stmt)) {
    for (const Column<Record>& c : table.columns) places_.push_back(place(stmt_.get(), c));
  }

  const Table<Record>* table_ = nullptr;
  StatementPtr stmt_;
  std::vector<int> places_;  // per column of *table_
};

// A prepared statement that writes whole records of one table (insertSql, possibly with more
// after it): a column's place is the number of its parameter ":name".
template <typename Record>
class RecordInsert : public ColumnPlaces<Record> {
 public:
  RecordInsert() = default;
  RecordInsert(const Table<Record>& table, StatementPtr stmt)
      : ColumnPlaces<Record>(table, std::move(stmt), [](sqlite3_stmt* s, const Column<Record>& c) {
          if (c.bind == nullptr) return Base::kUnused;
          const int index = sqlite3_bind_parameter_index(s, (":" + std::string(c.name)).c_str());
          return index > 0 ? index : Base::kMissing;
        }) {}

  // Binds every column of `record`. Texts and blobs are not copied: `record` must outlive
  // `query`.
  void bind(Query& query, const Record& record) const {
    for (size_t i = 0; i < this->places_.size(); ++i) {
      const int parameter = this->places_[i];
      if (parameter > 0) this->table_->columns[i].bind(record, query.parameter(parameter));
    }
  }

 private:
  using Base = ColumnPlaces<Record>;
};

// A prepared statement that reads whole records of one table (selectSql): a column's place is
// the result column of that name (sqlite3_column_name).
template <typename Record>
class RecordSelect : public ColumnPlaces<Record> {
 public:
  RecordSelect() = default;
  RecordSelect(const Table<Record>& table, StatementPtr stmt)
      : ColumnPlaces<Record>(table, std::move(stmt), [](sqlite3_stmt* s, const Column<Record>& c) {
          if (c.read == nullptr) return Base::kUnused;
          const int index = resultColumnIndex(s, c.name);
          return index >= 0 ? index : Base::kMissing;
        }) {}

  // The record in `query`'s current row; fields without a column keep their defaults.
  Record read(const Query& query) const {
    Record record;
    for (size_t i = 0; i < this->places_.size(); ++i) {
      const int result = this->places_[i];
      if (result >= 0) this->table_->columns[i].read(Value(query.statement(), result), record);
    }
    return record;
  }

 private:
  using Base = ColumnPlaces<Record>;
};

// Prepares `sql` as a RecordInsert or RecordSelect of `table`: kInternal when the statement
// lacks a column the table binds or reads (a bug in the SQL), else SQLite's error.
template <typename RecordStatement, typename Record>
Result<RecordStatement> prepareRecordStatement(sqlite3* db, const Table<Record>& table,
                                               const std::string& sql) {
  FEDFLEET_ASSIGN_OR_RETURN(StatementPtr stmt, prepare(db, sql));
  RecordStatement statement(table, std::move(stmt));
  if (std::string_view missing = statement.missingColumn(); !missing.empty()) {
    return internalError("'" + sql + "' has no place for column " + std::string(missing) +
                         " of table " + std::string(table.name));
  }
  return statement;
}

// One step of the schema's history: the SQL that turns a file of schema version from_version
// into one of to_version. A released step never changes; a file of any older version goes
// through each later step in turn.
struct SchemaUpgrade {
  int64_t from_version;
  int64_t to_version;
  std::string_view description;
  std::string_view sql;  // run as one script; the ladder then records to_version
};

// The steps from version 1 to kSqliteSchemaVersion, in order.
std::span<const SchemaUpgrade> schemaUpgrades();

// The whole schema of a new file: every table, its indexes, and the schema_version row.
std::string createSchemaSql();

// The schema version of the database, std::nullopt for an empty one (no tables). A database
// with tables but no schema_version table is another program's: kFailedPrecondition, as is an
// empty or multi-row schema_version table. Reads only. `ctx` prefixes every message.
Result<std::optional<int64_t>> readSchemaVersion(sqlite3* db, const std::string& ctx);

// Creates the schema in an empty database, or brings an older one up to kSqliteSchemaVersion
// through schemaUpgrades(), one IMMEDIATE transaction a step (two processes opening the same
// file cannot both create or upgrade it; a step that fails is rolled back and leaves the file at
// the version it had, with the error saying which step failed). kFailedPrecondition for a newer
// version than this build knows ("upgrade fedfleet"), a version no fedfleet wrote, or not a
// fedfleet history; the failed step's error otherwise.
Status createOrUpgradeSchema(sqlite3* db, const std::string& ctx);

// OK when a read-only open can read a file of schema `version` (kSqliteSchemaVersion only: it
// never upgrades a file); else kFailedPrecondition saying what to do.
Status checkReadOnlyVersion(int64_t version, const std::string& ctx);

}  // namespace fedfleet::history
