// The sqlite3 C API as the SQLite history uses it: result codes as Status, owned connections and
// prepared statements, and Query, one use of a prepared statement whose parameters are bound by
// name and whose result columns are read by name. Internal to common/history/ (the folder whose
// sources alone include sqlite3.h) and its tests.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "common/status.h"

namespace fedfleet::history {

// Maps a SQLite result code (extended codes are on) to a Status carrying `context` and
// SQLite's own message. Must be called before anything else runs on `db` (errmsg is per call).
Status sqliteStatus(sqlite3* db, int rc, const std::string& context);

struct StatementDeleter {
  void operator()(sqlite3_stmt* stmt) const { sqlite3_finalize(stmt); }
};
using StatementPtr = std::unique_ptr<sqlite3_stmt, StatementDeleter>;

struct DbDeleter {
  void operator()(sqlite3* db) const { sqlite3_close_v2(db); }
};
using DbPtr = std::unique_ptr<sqlite3, DbDeleter>;

// Runs SQL text that carries no values (pragmas, BEGIN/COMMIT, the schema).
Status execSql(sqlite3* db, std::string_view sql, const std::string& context);

// Prepares `sql` to be run many times (SQLITE_PREPARE_PERSISTENT); the error names the SQL.
Result<StatementPtr> prepare(sqlite3* db, const std::string& sql);

// Rolls back the open transaction, if SQLite has not already done so (it does on some errors,
// SQLITE_FULL among them). Adds a failed rollback to `cause` instead of dropping it.
Status rollback(sqlite3* db, Status cause);

class Query;

// One parameter of a statement in use. A failed bind is remembered by the Query and returned by
// its step(). Texts and blobs are bound without a copy (SQLITE_STATIC): their bytes must stay
// alive until the Query ends (it clears its bindings then).
class Parameter {
 public:
  void integer(int64_t v) const;
  // Stores the bit pattern: values above INT64_MAX read back exactly through
  // Value::unsignedInteger.
  void unsignedInteger(uint64_t v) const;
  // SQLite stores NaN as NULL; Value::real reads NULL back as NaN.
  void real(double v) const;
  // nullopt is NULL.
  void optionalReal(const std::optional<double>& v) const;
  void text(std::string_view v) const;
  // As text(), for a value that does not outlive the call: SQLite keeps its own copy.
  void textCopy(std::string_view v) const;
  // An empty blob stays an empty blob (not NULL).
  void blob(std::string_view v) const;
  void null() const;

 private:
  friend class Query;
  Parameter(Query& query, int index) : query_(&query), index_(index) {}

  Query* query_;
  int index_;  // 1-based, as SQLite numbers parameters
};

// One column of a statement's current result row.
class Value {
 public:
  // Column `index` (0-based, as SQLite numbers result columns) of `stmt`.
  Value(sqlite3_stmt* stmt, int index) : stmt_(stmt), index_(index) {}

  bool isNull() const { return sqlite3_column_type(stmt_, index_) == SQLITE_NULL; }
  int64_t integer() const { return sqlite3_column_int64(stmt_, index_); }  // NULL: 0
  // The bit pattern Parameter::unsignedInteger stored.
  uint64_t unsignedInteger() const { return static_cast<uint64_t>(integer()); }
  double real() const;                         // NULL: NaN
  std::optional<double> optionalReal() const;  // NULL: nullopt
  // NULL: empty; a value of another type as SQLite converts it to text.
  std::string text() const;
  std::string blob() const;

 private:
  sqlite3_stmt* stmt_;
  int index_;
};

// One use of a prepared statement: binds parameters, steps, reads columns, and resets the
// statement and clears its bindings when it goes out of scope, so a cached statement never
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

  // The parameter named `name` (":run_id"). A name the statement does not have is a bug
  // (FEDFLEET_CHECK).
  Parameter parameter(std::string_view name);
  // Parameter number `index` (1-based), for code that found the number by name once.
  Parameter parameter(int index) { return Parameter(*this, index); }

  // true on a row, false when done; a failed bind or step is the error.
  Result<bool> step();
  // Steps a statement that returns no rows.
  Status run() { return step().status(); }

  // The result column named `name` in the current row. A name the statement does not return is
  // a bug (FEDFLEET_CHECK).
  Value column(std::string_view name) const;

  sqlite3_stmt* statement() const { return stmt_; }

 private:
  friend class Parameter;
  // Keeps the first failed bind for step() to report.
  void recordBind(int rc) {
    if (rc != SQLITE_OK && bind_rc_ == SQLITE_OK) bind_rc_ = rc;
  }

  sqlite3* db_;
  sqlite3_stmt* stmt_;
  std::string context_;
  int bind_rc_ = SQLITE_OK;
};

// The index of the result column named `name` in `stmt`, or -1.
int resultColumnIndex(sqlite3_stmt* stmt, std::string_view name);

}  // namespace fedfleet::history
