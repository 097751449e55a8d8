// History digests for tests: each history table of a run reduced to a row count and a SHA-256
// of its values, leaving out the columns that measure the host (wall-clock times) and row ids.
// Reals are hashed by their exact bits (printf %a), so "equal" means bit for bit. Used by the
// golden histories (tests/sim/golden_history_test.cc) and the MPI test, which compares a run
// over several processes with a one-process run.
#pragma once

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/crypto/sha256.h"

namespace fedfleet::testing {

// Columns that measure the host, not the run.
inline const std::map<std::string, std::set<std::string>>& excludedColumns() {
  static const std::map<std::string, std::set<std::string>> excluded = {
      {"rounds", {"wall_start", "wall_end"}},
      {"updates", {"id", "wall_compute_s", "encode_s", "decode_s"}},
      {"events", {"id"}},
      {"block_metrics", {}},
      {"checkpoints", {}},
  };
  return excluded;
}

// Row order of each table: its primary key (ids follow insertion order).
inline const std::map<std::string, std::string>& rowOrder() {
  static const std::map<std::string, std::string> order = {
      {"rounds", "round"},      {"updates", "id"},
      {"events", "id"},         {"block_metrics", "round, block, model"},
      {"checkpoints", "round"},
  };
  return order;
}

struct TableDigest {
  uint64_t rows = 0;
  std::string sha256;  // hex, of the values in row order
};

class Db {
 public:
  explicit Db(const std::string& path) {
    if (sqlite3_open_v2(path.c_str(), &db_, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
      ADD_FAILURE() << "cannot open " << path << ": " << sqlite3_errmsg(db_);
    }
  }
  ~Db() { sqlite3_close(db_); }
  sqlite3* get() const { return db_; }

 private:
  sqlite3* db_ = nullptr;
};

inline std::vector<std::string> columns(sqlite3* db, const std::string& table) {
  std::vector<std::string> out;
  sqlite3_stmt* st = nullptr;
  const std::string sql = "PRAGMA table_info(" + table + ")";
  if (sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr) != SQLITE_OK) return out;
  while (sqlite3_step(st) == SQLITE_ROW) {
    const std::string name = reinterpret_cast<const char*>(sqlite3_column_text(st, 1));
    if (!excludedColumns().at(table).count(name)) out.push_back(name);
  }
  sqlite3_finalize(st);
  return out;
}

// Each value as type tag, length and content, so that no two different rows hash alike.
inline void appendValue(sqlite3_stmt* st, int i, std::string& out) {
  char buf[64];
  switch (sqlite3_column_type(st, i)) {
    case SQLITE_NULL:
      out += "N;";
      return;
    case SQLITE_INTEGER:
      std::snprintf(buf, sizeof buf, "I%lld;", static_cast<long long>(sqlite3_column_int64(st, i)));
      out += buf;
      return;
    case SQLITE_FLOAT:
      std::snprintf(buf, sizeof buf, "R%a;", sqlite3_column_double(st, i));
      out += buf;
      return;
    default: {  // TEXT and BLOB: their bytes
      const int n = sqlite3_column_bytes(st, i);
      const auto* p = static_cast<const char*>(sqlite3_column_blob(st, i));
      out += (sqlite3_column_type(st, i) == SQLITE_TEXT ? "T" : "B") + std::to_string(n) + ":";
      if (n > 0) out.append(p, static_cast<size_t>(n));
      out += ";";
    }
  }
}

inline TableDigest digestTable(sqlite3* db, const std::string& table, int64_t run_id) {
  TableDigest d;
  const std::vector<std::string> cols = columns(db, table);
  EXPECT_FALSE(cols.empty()) << table;
  std::string select;
  for (const auto& c : cols) select += (select.empty() ? "\"" : ", \"") + c + "\"";
  const std::string sql =
      "SELECT " + select + " FROM " + table + " WHERE run_id = ? ORDER BY " + rowOrder().at(table);
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr) != SQLITE_OK) {
    ADD_FAILURE() << sql << ": " << sqlite3_errmsg(db);
    return d;
  }
  sqlite3_bind_int64(st, 1, run_id);
  std::string bytes;
  for (const auto& c : cols) bytes += c + ",";  // the column set is part of the digest
  bytes += "\n";
  while (sqlite3_step(st) == SQLITE_ROW) {
    ++d.rows;
    for (int i = 0; i < static_cast<int>(cols.size()); ++i) appendValue(st, i, bytes);
    bytes += "\n";
  }
  sqlite3_finalize(st);
  d.sha256 = crypto::toHex(crypto::sha256(bytes));
  return d;
}

// Every table's digest for run `run_id` of the history at `path`, by table name.
inline std::map<std::string, TableDigest> digestHistory(const std::string& path, int64_t run_id) {
  std::map<std::string, TableDigest> out;
  Db handle(path);
  for (const auto& [table, order] : rowOrder())
    out[table] = digestTable(handle.get(), table, run_id);
  return out;
}

}  // namespace fedfleet::testing
