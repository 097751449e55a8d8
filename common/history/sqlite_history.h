// The SQLite backend of HistoryStore (common/history/history.h), with its options.
//
// One file holds the whole history: WAL journal (readers never block the writer), synchronous
// NORMAL (a power cut may lose the last committed round but never corrupts the file; the
// coordinator then resumes one round earlier), foreign keys on, and a schema_version table
// checked at open. Only this folder includes sqlite3.h.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/history/history.h"
#include "common/status.h"

namespace fedfleet::history {

// The schema version this build reads and writes.
inline constexpr int kSqliteSchemaVersion = 10;

struct SqliteHistoryOptions {
  // How long a statement waits for another connection's lock before failing with kTimeout.
  int busy_timeout_ms = 5000;
  // When > 0, caps the database at this many pages (PRAGMA max_page_count; a page is 4 KiB).
  // Past the cap writes fail exactly as on a full disk (kIoError, "disk is full"), which is how
  // tests reach that path and how a deployment can bound the file.
  int64_t max_page_count = 0;
};

// Opens (creating if needed) a SQLite history at `path`; see openSqliteHistory(path) in
// history.h for the errors. The returned store is not thread-safe (one thread at a time).
Result<std::unique_ptr<HistoryStore>> openSqliteHistory(const std::string& path,
                                                        const SqliteHistoryOptions& options);

// Opens an existing SQLite history at `path` for reading only; see openSqliteHistoryReadOnly(path)
// in history.h for what it promises and its errors (max_page_count is not used).
Result<std::unique_ptr<HistoryStore>> openSqliteHistoryReadOnly(
    const std::string& path, const SqliteHistoryOptions& options);

}  // namespace fedfleet::history
