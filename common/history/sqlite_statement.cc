#include "common/history/sqlite_statement.h"

#include <limits>
#include <utility>

#include "common/check.h"

namespace fedfleet::history {

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

Status rollback(sqlite3* db, Status cause) {
  if (sqlite3_get_autocommit(db)) return cause;
  int rc = sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr);
  if (rc == SQLITE_OK) return cause;
  return Status(cause.code(), cause.message() + "; ROLLBACK also failed: " + sqlite3_errmsg(db));
}

void Parameter::integer(int64_t v) const {
  query_->recordBind(sqlite3_bind_int64(query_->stmt_, index_, v));
}

void Parameter::unsignedInteger(uint64_t v) const { integer(static_cast<int64_t>(v)); }

void Parameter::real(double v) const {
  query_->recordBind(sqlite3_bind_double(query_->stmt_, index_, v));
}

void Parameter::optionalReal(const std::optional<double>& v) const {
  if (v) {
    real(*v);
  } else {
    null();
  }
}

void Parameter::text(std::string_view v) const {
  query_->recordBind(
      sqlite3_bind_text64(query_->stmt_, index_, v.data(), v.size(), SQLITE_STATIC, SQLITE_UTF8));
}

void Parameter::textCopy(std::string_view v) const {
  query_->recordBind(sqlite3_bind_text64(query_->stmt_, index_, v.data(), v.size(),
                                         SQLITE_TRANSIENT, SQLITE_UTF8));
}

void Parameter::blob(std::string_view v) const {
  // A null pointer would store NULL, not an empty blob.
  static const char kEmpty = 0;
  query_->recordBind(sqlite3_bind_blob64(query_->stmt_, index_, v.empty() ? &kEmpty : v.data(),
                                         v.size(), SQLITE_STATIC));
}

void Parameter::null() const { query_->recordBind(sqlite3_bind_null(query_->stmt_, index_)); }

double Value::real() const {
  return isNull() ? std::numeric_limits<double>::quiet_NaN() : sqlite3_column_double(stmt_, index_);
}

std::optional<double> Value::optionalReal() const {
  if (isNull()) return std::nullopt;
  return sqlite3_column_double(stmt_, index_);
}

std::string Value::text() const {
  const unsigned char* p = sqlite3_column_text(stmt_, index_);
  int n = sqlite3_column_bytes(stmt_, index_);
  return p ? std::string(reinterpret_cast<const char*>(p), static_cast<size_t>(n)) : std::string();
}

std::string Value::blob() const {
  const void* p = sqlite3_column_blob(stmt_, index_);
  int n = sqlite3_column_bytes(stmt_, index_);
  return p ? std::string(static_cast<const char*>(p), static_cast<size_t>(n)) : std::string();
}

Parameter Query::parameter(std::string_view name) {
  const int index = sqlite3_bind_parameter_index(stmt_, std::string(name).c_str());
  FEDFLEET_CHECK_MSG(index > 0, sqlite3_sql(stmt_));
  return Parameter(*this, index);
}

Result<bool> Query::step() {
  if (bind_rc_ != SQLITE_OK) return sqliteStatus(db_, bind_rc_, context_);
  int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  return sqliteStatus(db_, rc, context_);
}

Value Query::column(std::string_view name) const {
  const int index = resultColumnIndex(stmt_, name);
  FEDFLEET_CHECK_MSG(index >= 0, sqlite3_sql(stmt_));
  return Value(stmt_, index);
}

int resultColumnIndex(sqlite3_stmt* stmt, std::string_view name) {
  const int count = sqlite3_column_count(stmt);
  for (int i = 0; i < count; ++i) {
    const char* column = sqlite3_column_name(stmt, i);
    if (column != nullptr && name == column) return i;
  }
  return -1;
}

}  // namespace fedfleet::history
