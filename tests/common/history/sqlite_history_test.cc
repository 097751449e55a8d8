// What only the SQLite backend has: the file (WAL, reopen, schema version, bad files), its schema
// (each table's column list, the released schema to the letter, the upgrade from every older
// version, made from that version's own CREATE statements in schemas/vN.sql), the disk running
// full, and a second connection holding the lock. The behaviour both backends share is in
// history_test.cc.
//
// The test opens its own sqlite3 connections to look at and tamper with the file. sqlite3 is on
// this executable's link line because fedfleet_history is a static library that links it.
#include "common/history/sqlite_history.h"

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "common/history/sqlite_schema.h"

namespace fedfleet::history {
namespace {

class SqliteHistoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = std::string(FEDFLEET_TEST_TMP) + "/sqlite_history_test_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name() + "_" +
            std::to_string(::getpid()) + ".db";
    removeFiles();
  }
  void TearDown() override { removeFiles(); }
  void removeFiles() {
    std::error_code ec;
    for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(path_ + suffix, ec);
  }

  std::unique_ptr<HistoryStore> open(const SqliteHistoryOptions& options = {}) {
    auto store = openSqliteHistory(path_, options);
    EXPECT_TRUE(store.isOk()) << store.status().toString();
    return store.isOk() ? std::move(store).value() : nullptr;
  }

  // Runs `sql` on a separate raw connection; returns the first column of the first row.
  std::string rawQuery(const std::string& sql) {
    sqlite3* db = nullptr;
    EXPECT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
    sqlite3_stmt* stmt = nullptr;
    std::string result;
    int rc = sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr);
    EXPECT_EQ(rc, SQLITE_OK) << sqlite3_errmsg(db);
    if (rc == SQLITE_OK) {
      rc = sqlite3_step(stmt);
      EXPECT_TRUE(rc == SQLITE_ROW || rc == SQLITE_DONE) << sqlite3_errmsg(db);
      if (rc == SQLITE_ROW && sqlite3_column_text(stmt, 0) != nullptr) {
        result = reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0));
      }
    }
    sqlite3_finalize(stmt);
    sqlite3_close(db);
    return result;
  }

  // Runs `sql` on a separate raw connection to `path`; returns its rows, each row's columns
  // joined by '|' (NULL as "NULL").
  static std::vector<std::string> rawRows(const std::string& path, const std::string& sql) {
    sqlite3* db = nullptr;
    EXPECT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
    sqlite3_stmt* stmt = nullptr;
    std::vector<std::string> rows;
    int rc = sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr);
    EXPECT_EQ(rc, SQLITE_OK) << sqlite3_errmsg(db) << " in " << sql;
    while (rc == SQLITE_OK && sqlite3_step(stmt) == SQLITE_ROW) {
      std::string row;
      for (int i = 0; i < sqlite3_column_count(stmt); ++i) {
        const unsigned char* text = sqlite3_column_text(stmt, i);
        row += (i > 0 ? "|" : "") +
               (text ? std::string(reinterpret_cast<const char*>(text)) : std::string("NULL"));
      }
      rows.push_back(row);
    }
    sqlite3_finalize(stmt);
    sqlite3_close(db);
    return rows;
  }

  // Runs a script of statements on a separate raw connection to `path`.
  static void rawExec(const std::string& path, const std::string& sql) {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
    char* err = nullptr;
    EXPECT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err), SQLITE_OK) << (err ? err : "");
    sqlite3_free(err);
    sqlite3_close(db);
  }

  // The schema of the file at `path` as SQLite describes it, table by table (sorted by name):
  // each column (name, type, NOT NULL, default, primary key), foreign key and index. Two files
  // with the same description store and constrain rows alike, whatever their CREATE text.
  static std::vector<std::string> describeSchema(const std::string& path) {
    std::vector<std::string> out;
    auto add = [&out](const std::string& heading, const std::vector<std::string>& rows) {
      for (const std::string& row : rows) out.push_back(heading + ": " + row);
    };
    for (const std::string& table :
         rawRows(path, "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")) {
      add(table + " column", rawRows(path,
                                     "SELECT cid, name, type, \"notnull\", dflt_value, pk FROM "
                                     "pragma_table_info('" +
                                         table + "') ORDER BY cid"));
      add(table + " foreign key",
          rawRows(path,
                  "SELECT id, seq, \"table\", \"from\", \"to\", on_update, on_delete, "
                  "\"match\" FROM pragma_foreign_key_list('" +
                      table + "') ORDER BY id, seq"));
      for (const std::string& index :
           rawRows(path, "SELECT name FROM pragma_index_list('" + table + "') ORDER BY name")) {
        add(table + " index", rawRows(path,
                                      "SELECT name, \"unique\", origin, partial FROM "
                                      "pragma_index_list('" +
                                          table + "') WHERE name = '" + index + "'"));
        add(table + " index " + index,
            rawRows(path, "SELECT seqno, cid, name FROM pragma_index_info('" + index +
                              "') ORDER BY seqno"));
      }
    }
    return out;
  }

  // Every row of every table of the file `columns_from` but schema_version, as the file `path`
  // holds it, in the columns the table has in `columns_from`: each value as SQL's quote() writes
  // it (so types show).
  static std::vector<std::string> dumpRows(const std::string& path,
                                           const std::string& columns_from) {
    std::vector<std::string> out;
    for (const std::string& table :
         rawRows(columns_from,
                 "SELECT name FROM sqlite_master WHERE type = 'table' AND name != "
                 "'schema_version' ORDER BY name")) {
      std::string columns;
      for (const std::string& column : rawRows(
               columns_from, "SELECT name FROM pragma_table_info('" + table + "') ORDER BY cid")) {
        columns += (columns.empty() ? "quote(\"" : " || '|' || quote(\"") + column + "\")";
      }
      for (const std::string& row :
           rawRows(path, "SELECT " + columns + " FROM " + table + " ORDER BY rowid")) {
        out.push_back(table + ": " + row);
      }
    }
    return out;
  }

  // The schema a version's fedfleet gave a new file (tests/common/history/schemas/vN.sql).
  static std::string schemaFixture(int64_t version) {
    const std::string path = std::string(FEDFLEET_SOURCE_DIR) + "/tests/common/history/schemas/v" +
                             std::to_string(version) + ".sql";
    std::ifstream in(path);
    EXPECT_TRUE(in.good()) << "no schema fixture " << path;
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  std::string readFile(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  std::string path_;
};

RoundRecord someRound(int64_t run_id, uint32_t round) {
  RoundRecord r;
  r.run_id = run_id;
  r.round = round;
  r.start_time = 100.0 * round;
  r.end_time = 100.0 * round + 42.5;
  r.selected = 5;
  r.completed = 5;
  r.train_loss = 0.7;
  r.test_accuracy = 0.9;
  r.model_version = round + 1;
  return r;
}

TEST_F(SqliteHistoryTest, UsesWalJournal) {
  auto store = open();
  ASSERT_TRUE(store);
  ASSERT_TRUE(store->beginRun({0, "r", "{}", 1.0, 7}).isOk());
  EXPECT_TRUE(std::filesystem::exists(path_ + "-wal")) << "no WAL file beside " << path_;
  EXPECT_EQ(rawQuery("PRAGMA journal_mode"), "wal");
  // Bytes 18 and 19 of the header (file format read/write versions) are 2 in WAL mode.
  const std::string header = readFile(path_).substr(0, 100);
  ASSERT_EQ(header.size(), 100u);
  EXPECT_EQ(header[18], 2);
  EXPECT_EQ(header[19], 2);
  EXPECT_EQ(rawQuery("SELECT version FROM schema_version"), std::to_string(kSqliteSchemaVersion));
  EXPECT_EQ(rawQuery("SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name IN "
                     "('updates_by_round', 'events_by_run')"),
            "2");
}

TEST_F(SqliteHistoryTest, ReopenSeesCommittedData) {
  int64_t run_id = 0;
  {
    auto store = open();
    ASSERT_TRUE(store);
    auto run = store->beginRun({0, "persisted", R"({"a": 1})", 5.5, 99});
    ASSERT_TRUE(run.isOk());
    run_id = *run;
    UpdateRecord update;
    update.run_id = run_id;
    update.round = 0;
    update.client_id = "c0";
    update.status = "completed";
    CheckpointRecord checkpoint{run_id, 0, 1, std::string(64, 'f'), std::string(4096, '\x5a')};
    ASSERT_TRUE(store->commitRound(someRound(run_id, 0), {update}, checkpoint).isOk());
    ClientRecord client;
    client.client_id = "c0";
    client.first_seen = 3.0;
    ASSERT_TRUE(store->upsertClient(client).isOk());
    ASSERT_TRUE(store->recordEvent({run_id, 4.0, "error", "c0", "boom"}).isOk());
  }
  auto store = open();
  ASSERT_TRUE(store);
  auto runs = store->runs();
  ASSERT_TRUE(runs.isOk());
  ASSERT_EQ(runs->size(), 1u);
  EXPECT_EQ((*runs)[0].name, "persisted");
  EXPECT_EQ((*runs)[0].seed, 99u);
  auto rounds = store->rounds(run_id);
  ASSERT_TRUE(rounds.isOk());
  ASSERT_EQ(rounds->size(), 1u);
  EXPECT_EQ((*rounds)[0].end_time, 42.5);
  EXPECT_EQ((*rounds)[0].test_accuracy, 0.9);
  auto updates = store->updates(run_id, std::nullopt);
  ASSERT_TRUE(updates.isOk());
  ASSERT_EQ(updates->size(), 1u);
  EXPECT_EQ((*updates)[0].client_id, "c0");
  auto checkpoint = store->latestCheckpoint(run_id);
  ASSERT_TRUE(checkpoint.isOk());
  EXPECT_EQ(checkpoint->blob, std::string(4096, '\x5a'));
  auto clients = store->clients();
  ASSERT_TRUE(clients.isOk());
  ASSERT_EQ(clients->size(), 1u);
  auto events = store->events(std::nullopt);
  ASSERT_TRUE(events.isOk());
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].detail, "boom");
  // A new run after reopening still gets a larger id.
  auto next = store->beginRun({0, "next", "{}", 6.0, 1});
  ASSERT_TRUE(next.isOk());
  EXPECT_GT(*next, run_id);
}

TEST_F(SqliteHistoryTest, SecondConnectionReadsWhileFirstWrites) {
  auto writer = open();
  auto reader = open();
  ASSERT_TRUE(writer && reader);
  auto run = writer->beginRun({0, "shared", "{}", 1.0, 1});
  ASSERT_TRUE(run.isOk());
  for (uint32_t r = 0; r < 3; ++r) {
    ASSERT_TRUE(writer->commitRound(someRound(*run, r), {}, std::nullopt).isOk());
    auto seen = reader->rounds(*run);
    ASSERT_TRUE(seen.isOk()) << seen.status().toString();
    EXPECT_EQ(seen->size(), r + 1);
  }
}

// A newer version than this build knows is refused with what to do; a version no fedfleet wrote
// (0) is refused as damage. Either way the file is left as it is.
TEST_F(SqliteHistoryTest, OtherSchemaVersionsAreRefusedAndLeftAlone) {
  struct Case {
    int version;
    std::vector<std::string> says;
  };
  const Case cases[] = {
      {99,
       {"schema version 99", "knows up to schema version " + std::to_string(kSqliteSchemaVersion),
        "newer", "upgrade fedfleet"}},
      {0, {"schema version 0, which no fedfleet writes", "damaged"}},
  };
  { ASSERT_TRUE(open()); }
  for (const Case& c : cases) {
    const std::string version = std::to_string(c.version);
    EXPECT_EQ(rawQuery("UPDATE schema_version SET version = " + version), "");
    auto store = openSqliteHistory(path_);
    ASSERT_FALSE(store.isOk());
    EXPECT_EQ(store.status().code(), StatusCode::kFailedPrecondition);
    const std::string message = store.status().message();
    EXPECT_NE(message.find(path_), std::string::npos) << message;
    for (const std::string& phrase : c.says) {
      EXPECT_NE(message.find(phrase), std::string::npos) << phrase << " not in: " << message;
    }
    EXPECT_EQ(rawQuery("SELECT version FROM schema_version"), version);
  }
}

TEST_F(SqliteHistoryTest, ForeignDatabaseIsRefusedAndLeftAlone) {
  EXPECT_EQ(rawQuery("CREATE TABLE inventory (item TEXT)"), "");
  auto store = openSqliteHistory(path_);
  ASSERT_FALSE(store.isOk());
  EXPECT_EQ(store.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(store.status().message().find("not a fedfleet history"), std::string::npos)
      << store.status().message();
  EXPECT_EQ(rawQuery("SELECT count(*) FROM sqlite_master WHERE name = 'runs'"), "0");
}

TEST_F(SqliteHistoryTest, MissingDirectoryIsIoError) {
  const std::string path =
      std::string(FEDFLEET_TEST_TMP) + "/no-such-dir-" + std::to_string(::getpid()) + "/history.db";
  auto store = openSqliteHistory(path);
  ASSERT_FALSE(store.isOk());
  EXPECT_EQ(store.status().code(), StatusCode::kIoError) << store.status().toString();
  EXPECT_NE(store.status().message().find(path), std::string::npos) << store.status().message();
}

TEST_F(SqliteHistoryTest, GarbageFileIsCorruptAndUntouched) {
  std::string garbage;
  for (int i = 0; i < 8192; ++i) garbage += static_cast<char>((i * 131 + 7) % 251);
  {
    std::ofstream out(path_, std::ios::binary);
    out << garbage;
  }
  auto store = openSqliteHistory(path_);
  ASSERT_FALSE(store.isOk());
  EXPECT_EQ(store.status().code(), StatusCode::kCorrupt) << store.status().toString();
  EXPECT_EQ(readFile(path_), garbage);
}

// Whether `dir` holds `file` and nothing else.
bool holdsOnly(const std::string& dir, const std::string& file) {
  auto it = std::filesystem::directory_iterator(dir);
  return it != std::filesystem::directory_iterator() && it->path().filename() == file &&
         ++it == std::filesystem::directory_iterator();
}

TEST_F(SqliteHistoryTest, ReadOnlyOpenInAReadOnlyDirectoryWritesNothing) {
  {
    auto store = open();
    ASSERT_TRUE(store);
    auto run = store->beginRun({0, "r", "{}", 1.0, 7});
    ASSERT_TRUE(run.isOk());
    for (uint32_t r = 0; r < 3; ++r) {
      ASSERT_TRUE(store->commitRound(someRound(*run, r), {}, std::nullopt).isOk());
    }
  }  // the last connection closes: SQLite checkpoints and removes -wal and -shm
  const std::string dir = path_ + ".ro";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string copy = dir + "/h.db";
  std::filesystem::copy_file(path_, copy);
  const std::string before = readFile(copy);
  std::filesystem::permissions(dir, std::filesystem::perms(0555));
  {
    auto store = openSqliteHistoryReadOnly(copy);
    ASSERT_TRUE(store.isOk()) << store.status().toString();
    auto runs = (*store)->runs();
    ASSERT_TRUE(runs.isOk()) << runs.status().toString();
    ASSERT_EQ(runs->size(), 1u);
    auto rounds = (*store)->rounds(runs->front().run_id);
    ASSERT_TRUE(rounds.isOk()) << rounds.status().toString();
    EXPECT_EQ(rounds->size(), 3u);
    // Writes fail, and fail as I/O errors (root included: the connection itself is read-only).
    Result<int64_t> write = (*store)->beginRun({0, "w", "{}", 1.0, 1});
    EXPECT_EQ(write.status().code(), StatusCode::kIoError) << write.status().toString();
    EXPECT_TRUE(holdsOnly(dir, "h.db")) << "while open";
  }
  EXPECT_TRUE(holdsOnly(dir, "h.db"));
  EXPECT_EQ(readFile(copy), before);
  std::filesystem::permissions(dir, std::filesystem::perms(0755));
  std::filesystem::remove_all(dir);
}

TEST_F(SqliteHistoryTest, ReadOnlyOpenFollowsARunningWriter) {
  auto writer = open();
  ASSERT_TRUE(writer);
  auto run = writer->beginRun({0, "r", "{}", 1.0, 7});
  ASSERT_TRUE(run.isOk());
  ASSERT_TRUE(writer->commitRound(someRound(*run, 0), {}, std::nullopt).isOk());
  auto reader = openSqliteHistoryReadOnly(path_);
  ASSERT_TRUE(reader.isOk()) << reader.status().toString();
  for (uint32_t r = 1; r < 3; ++r) {
    ASSERT_TRUE(writer->commitRound(someRound(*run, r), {}, std::nullopt).isOk());
    auto seen = (*reader)->rounds(*run);
    ASSERT_TRUE(seen.isOk()) << seen.status().toString();
    EXPECT_EQ(seen->size(), r + 1);  // rounds still only in the WAL are read too
  }
}

TEST_F(SqliteHistoryTest, ReadOnlyOpenRefusesWhatItCannotReadAndChangesNothing) {
  // A file that does not exist is not created.
  auto missing = openSqliteHistoryReadOnly(path_);
  EXPECT_EQ(missing.status().code(), StatusCode::kIoError) << missing.status().toString();
  EXPECT_FALSE(std::filesystem::exists(path_));
  // An empty file stays empty: no schema is created in it.
  std::ofstream(path_).flush();
  auto empty = openSqliteHistoryReadOnly(path_);
  EXPECT_EQ(empty.status().code(), StatusCode::kFailedPrecondition) << empty.status().toString();
  EXPECT_NE(empty.status().message().find("not a fedfleet history"), std::string::npos);
  EXPECT_EQ(std::filesystem::file_size(path_), 0u);
  removeFiles();
  // Another program's database.
  EXPECT_EQ(rawQuery("CREATE TABLE inventory (item TEXT)"), "");
  auto foreign = openSqliteHistoryReadOnly(path_);
  EXPECT_EQ(foreign.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(foreign.status().message().find("not a fedfleet history"), std::string::npos)
      << foreign.status().message();
  EXPECT_EQ(rawQuery("SELECT count(*) FROM sqlite_master WHERE name = 'runs'"), "0");
  removeFiles();
  // Other schema versions: a newer one, and an older one, which is not upgraded.
  { ASSERT_TRUE(open()); }
  for (int version : {99, 4}) {
    EXPECT_EQ(rawQuery("UPDATE schema_version SET version = " + std::to_string(version)), "");
    const std::string before = readFile(path_);
    auto store = openSqliteHistoryReadOnly(path_);
    ASSERT_FALSE(store.isOk());
    EXPECT_EQ(store.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(store.status().message().find("schema version " + std::to_string(version)),
              std::string::npos)
        << store.status().message();
    EXPECT_EQ(readFile(path_), before);
    EXPECT_FALSE(std::filesystem::exists(path_ + "-wal"));
  }
  EXPECT_EQ(rawQuery("SELECT version FROM schema_version"), "4");
  // Not a database at all.
  removeFiles();
  std::ofstream(path_, std::ios::binary) << std::string(4096, 'x');
  auto garbage = openSqliteHistoryReadOnly(path_);
  EXPECT_EQ(garbage.status().code(), StatusCode::kCorrupt) << garbage.status().toString();
}

TEST_F(SqliteHistoryTest, FullDiskIsIoErrorAndRollsBack) {
  SqliteHistoryOptions options;
  options.max_page_count = 64;  // 256 KiB at the default 4 KiB page size
  auto store = open(options);
  ASSERT_TRUE(store);
  auto run = store->beginRun({0, "full", "{}", 1.0, 1});
  ASSERT_TRUE(run.isOk());
  UpdateRecord update;
  update.run_id = *run;
  update.round = 0;
  update.client_id = "c0";
  update.status = "completed";
  CheckpointRecord big{*run, 0, 1, std::string(64, '0'), std::string(1 << 20, 'x')};
  Status st = store->commitRound(someRound(*run, 0), {update}, big);
  EXPECT_EQ(st.code(), StatusCode::kIoError) << st.toString();
  EXPECT_NE(st.message().find("disk is full"), std::string::npos) << st.message();

  auto rounds = store->rounds(*run);
  ASSERT_TRUE(rounds.isOk());
  EXPECT_TRUE(rounds->empty());
  auto updates = store->updates(*run, std::nullopt);
  ASSERT_TRUE(updates.isOk());
  EXPECT_TRUE(updates->empty());
  // The store stays usable: a round that fits commits.
  CheckpointRecord small{*run, 0, 1, std::string(64, '0'), std::string(1024, 'x')};
  EXPECT_TRUE(store->commitRound(someRound(*run, 0), {update}, small).isOk());
}

TEST_F(SqliteHistoryTest, LockHeldPastBusyTimeoutIsTimeout) {
  SqliteHistoryOptions options;
  options.busy_timeout_ms = 50;
  auto store = open(options);
  ASSERT_TRUE(store);
  auto run = store->beginRun({0, "locked", "{}", 1.0, 1});
  ASSERT_TRUE(run.isOk());

  sqlite3* other = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &other), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(other, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr), SQLITE_OK);
  Status st = store->commitRound(someRound(*run, 0), {}, std::nullopt);
  EXPECT_EQ(st.code(), StatusCode::kTimeout) << st.toString();
  ASSERT_EQ(sqlite3_exec(other, "ROLLBACK", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(other);

  EXPECT_TRUE(store->commitRound(someRound(*run, 0), {}, std::nullopt).isOk());
}

// A version-3 file that a tool gave a block_metrics table of its own (the report's readers
// accept any column types) keeps the table and its rows when upgraded to version 4 (and on to
// the latest); a fresh file has the table, and the writer adds to it.
TEST_F(SqliteHistoryTest, UpgradesAVersion3FileKeepingItsBlockMetrics) {
  {
    auto store = open();
    ASSERT_TRUE(store);
    ASSERT_TRUE(store->beginRun({0, "r", "{}", 1.0, 7}).isOk());
  }
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
    char* err = nullptr;
    EXPECT_EQ(sqlite3_exec(
                  db,
                  "ALTER TABLE updates DROP COLUMN served_block; "
                  "ALTER TABLE updates DROP COLUMN served_model; "
                  "ALTER TABLE updates DROP COLUMN served_version; "
                  "ALTER TABLE updates DROP COLUMN served_sha256; "
                  "ALTER TABLE updates DROP COLUMN served_bytes; "
                  "ALTER TABLE updates DROP COLUMN served_samples; "
                  "ALTER TABLE updates DROP COLUMN served_loss; "
                  "ALTER TABLE updates DROP COLUMN served_accuracy; "
                  "DROP TABLE block_metrics; CREATE TABLE block_metrics (run_id INTEGER, "
                  "round INTEGER, block INTEGER, model TEXT, accuracy REAL, loss REAL); "
                  "INSERT INTO block_metrics VALUES (1, 4, 2, 'm', 0.5, 1.0); "
                  "ALTER TABLE updates DROP COLUMN grant_wait_s; "
                  "ALTER TABLE runs DROP COLUMN model_json; "
                  "ALTER TABLE rounds DROP COLUMN fed_eval_clients; ALTER TABLE rounds DROP COLUMN "
                  "fed_eval_samples; ALTER TABLE rounds DROP COLUMN fed_eval_loss; "
                  "ALTER TABLE rounds DROP COLUMN fed_eval_accuracy; ALTER TABLE "
                  "updates DROP COLUMN eval_samples; ALTER TABLE updates DROP COLUMN "
                  "eval_loss; ALTER TABLE updates DROP COLUMN eval_accuracy; "
                  "ALTER TABLE rounds DROP COLUMN test_metrics; ALTER TABLE rounds DROP COLUMN "
                  "fed_eval_metrics; ALTER TABLE updates DROP COLUMN eval_metrics; "
                  "ALTER TABLE rounds DROP COLUMN dp_epsilon; ALTER TABLE rounds DROP COLUMN "
                  "dp_clip; DROP TABLE peer_iterations; DROP TABLE peer_evals; "
                  "UPDATE schema_version SET version = 3",
                  nullptr, nullptr, &err),
              SQLITE_OK)
        << (err ? err : "");
    sqlite3_free(err);
    sqlite3_close(db);
  }
  auto store = open();
  ASSERT_TRUE(store);
  EXPECT_EQ(rawQuery("SELECT version FROM schema_version"), std::to_string(kSqliteSchemaVersion));
  auto rows = store->blockMetrics(1);
  ASSERT_TRUE(rows.isOk()) << rows.status().toString();
  ASSERT_EQ(rows->size(), 1u);
  EXPECT_EQ((*rows)[0].block, "2");
  EXPECT_EQ((*rows)[0].round, 4u);
  BlockMetricRecord b;
  b.run_id = 1;
  b.round = 5;
  b.block = "0";
  b.model = "served";
  b.accuracy = 0.75;
  ASSERT_TRUE(store->recordBlockMetrics({b}).isOk());
  rows = store->blockMetrics(1);
  ASSERT_TRUE(rows.isOk());
  EXPECT_EQ(rows->size(), 2u);
}

// A version-4 file gets the served-model and grant-wait columns on `updates`; its rows read as
// "no served model" and no wait.
TEST_F(SqliteHistoryTest, UpgradesAVersion4FileWithServedModelColumns) {
  auto completed = [](uint32_t round, const std::string& client) {
    UpdateRecord u;
    u.run_id = 1;
    u.round = round;
    u.client_id = client;
    u.status = "completed";
    return u;
  };
  {
    auto store = open();
    ASSERT_TRUE(store);
    ASSERT_TRUE(store->beginRun({0, "r", "{}", 1.0, 7}).isOk());
    ASSERT_TRUE(store->commitRound(someRound(1, 0), {completed(0, "c0")}, std::nullopt).isOk());
  }
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
    char* err = nullptr;
    std::string sql;
    for (const char* c :
         {"served_block", "served_model", "served_version", "served_sha256", "served_bytes",
          "served_samples", "served_loss", "served_accuracy", "grant_wait_s"}) {
      sql += std::string("ALTER TABLE updates DROP COLUMN ") + c + "; ";
    }
    for (const char* c :
         {"fed_eval_clients", "fed_eval_samples", "fed_eval_loss", "fed_eval_accuracy"}) {
      sql += std::string("ALTER TABLE rounds DROP COLUMN ") + c + "; ";
    }
    for (const char* c : {"eval_samples", "eval_loss", "eval_accuracy", "eval_metrics"}) {
      sql += std::string("ALTER TABLE updates DROP COLUMN ") + c + "; ";
    }
    for (const char* c : {"test_metrics", "fed_eval_metrics", "dp_epsilon", "dp_clip"}) {
      sql += std::string("ALTER TABLE rounds DROP COLUMN ") + c + "; ";
    }
    sql += "DROP TABLE peer_iterations; DROP TABLE peer_evals; ";
    sql += "ALTER TABLE runs DROP COLUMN model_json; UPDATE schema_version SET version = 4";
    EXPECT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err), SQLITE_OK) << (err ? err : "");
    sqlite3_free(err);
    sqlite3_close(db);
  }
  auto store = open();
  ASSERT_TRUE(store);
  EXPECT_EQ(rawQuery("SELECT version FROM schema_version"), std::to_string(kSqliteSchemaVersion));
  UpdateRecord u = completed(1, "c1");
  u.served_block = 1;
  u.served_model = "chain";
  u.served_version = 9;
  u.served_sha256_hex = std::string(64, 'a');
  u.served_samples = 40;
  u.served_accuracy = 0.5;
  u.grant_wait_s = 1.25;
  ASSERT_TRUE(store->commitRound(someRound(1, 1), {u}, std::nullopt).isOk());
  auto updates = store->updates(1, std::nullopt);
  ASSERT_TRUE(updates.isOk()) << updates.status().toString();
  ASSERT_EQ(updates->size(), 2u);
  EXPECT_EQ((*updates)[0].served_block, -1);
  EXPECT_FALSE((*updates)[0].served_accuracy.has_value());
  EXPECT_TRUE(std::isnan((*updates)[0].grant_wait_s));  // NULL in the upgraded row
  EXPECT_EQ((*updates)[1].grant_wait_s, 1.25);
  EXPECT_EQ((*updates)[1].served_block, 1);
  EXPECT_EQ((*updates)[1].served_model, "chain");
  EXPECT_EQ((*updates)[1].served_samples, 40u);
  EXPECT_EQ((*updates)[1].served_accuracy, 0.5);
  EXPECT_FALSE((*updates)[1].served_loss.has_value());
}

// A version-1 file (as the first release wrote it) is upgraded in place: its rows stay, the new
// columns take the values a version-1 run implies (wall clock: wall times = round times).
TEST_F(SqliteHistoryTest, UpgradesASchemaVersion1File) {
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
    const char* v1 = R"sql(
CREATE TABLE schema_version (version INTEGER NOT NULL);
CREATE TABLE runs (run_id INTEGER PRIMARY KEY, name TEXT NOT NULL, config_json TEXT NOT NULL,
  started_at REAL, seed INTEGER NOT NULL);
CREATE TABLE rounds (run_id INTEGER NOT NULL REFERENCES runs (run_id), round INTEGER NOT NULL,
  start_time REAL, end_time REAL, selected INTEGER NOT NULL, completed INTEGER NOT NULL,
  late INTEGER NOT NULL, dropped INTEGER NOT NULL, rejected INTEGER NOT NULL,
  status TEXT NOT NULL CHECK (status IN ('initial', 'ok', 'failed')), train_loss REAL,
  test_loss REAL, test_accuracy REAL, bytes_up INTEGER NOT NULL, bytes_down INTEGER NOT NULL,
  model_version INTEGER NOT NULL, PRIMARY KEY (run_id, round));
CREATE TABLE updates (id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL, round INTEGER NOT NULL,
  client_id TEXT NOT NULL, "partition" INTEGER NOT NULL, n_samples INTEGER NOT NULL,
  steps INTEGER NOT NULL, loss REAL, compute_s REAL, upload_s REAL, bytes_up INTEGER NOT NULL,
  bytes_down INTEGER NOT NULL, weight REAL,
  status TEXT NOT NULL CHECK (status IN ('completed', 'late', 'dropped', 'rejected')),
  FOREIGN KEY (run_id, round) REFERENCES rounds (run_id, round));
CREATE INDEX updates_by_round ON updates (run_id, round);
CREATE TABLE clients (client_id TEXT PRIMARY KEY NOT NULL, public_key TEXT NOT NULL,
  device_kind TEXT NOT NULL, device_name TEXT NOT NULL, cores INTEGER NOT NULL,
  memory_bytes INTEGER NOT NULL, data_size INTEGER NOT NULL, first_seen REAL, last_seen REAL);
CREATE TABLE checkpoints (run_id INTEGER NOT NULL, round INTEGER NOT NULL,
  model_version INTEGER NOT NULL, sha256 TEXT NOT NULL, blob BLOB NOT NULL,
  PRIMARY KEY (run_id, round), FOREIGN KEY (run_id, round) REFERENCES rounds (run_id, round));
CREATE TABLE events (id INTEGER PRIMARY KEY, run_id INTEGER REFERENCES runs (run_id), time REAL,
  kind TEXT NOT NULL, client_id TEXT NOT NULL, detail TEXT NOT NULL);
CREATE INDEX events_by_run ON events (run_id);
INSERT INTO schema_version (version) VALUES (1);
INSERT INTO runs VALUES (1, 'old', '{}', 100.0, 7);
INSERT INTO rounds VALUES (1, 1, 100.0, 112.5, 2, 2, 0, 0, 0, 'ok', 0.5, 0.4, 0.8, 10, 20, 1);
INSERT INTO updates VALUES (1, 1, 1, 'c1', 0, 60, 2, 0.5, 3.25, 0.5, 10, 20, 1.0, 'completed');
)sql";
    char* err = nullptr;
    ASSERT_EQ(sqlite3_exec(db, v1, nullptr, nullptr, &err), SQLITE_OK) << (err ? err : "");
    sqlite3_close(db);
  }
  auto store = open();
  ASSERT_TRUE(store);
  EXPECT_EQ(rawQuery("SELECT version FROM schema_version"), std::to_string(kSqliteSchemaVersion));
  auto runs = store->runs();
  ASSERT_TRUE(runs.isOk());
  ASSERT_EQ(runs->size(), 1u);
  EXPECT_EQ((*runs)[0].clock, "wall");
  auto rounds = store->rounds(1);
  ASSERT_TRUE(rounds.isOk());
  ASSERT_EQ(rounds->size(), 1u);
  EXPECT_EQ((*rounds)[0].wall_start, 100.0);
  EXPECT_EQ((*rounds)[0].wall_end, 112.5);
  EXPECT_EQ((*rounds)[0].test_accuracy, 0.8);
  auto updates = store->updates(1, std::nullopt);
  ASSERT_TRUE(updates.isOk());
  ASSERT_EQ(updates->size(), 1u);
  EXPECT_EQ((*updates)[0].wall_compute_s, 3.25);
  EXPECT_EQ((*updates)[0].codec, "");
  // New rows carry the new fields.
  RunRecord sim{0, "sim", "{}", 1.0, 3, "virtual"};
  auto id = store->beginRun(sim);
  ASSERT_TRUE(id.isOk());
  RoundRecord r;
  r.run_id = *id;
  r.round = 1;
  r.start_time = 5;
  r.end_time = 9;
  r.wall_start = 1000;
  r.wall_end = 1000.25;
  UpdateRecord u;
  u.run_id = *id;
  u.round = 1;
  u.client_id = "v7";
  u.status = "completed";
  u.start_time = 5;
  u.end_time = 8.5;
  u.wall_compute_s = 0.125;
  u.codec = "topk";
  u.encode_s = 0.5;
  u.decode_s = 0.25;
  u.grant_wait_s = 0.75;
  ASSERT_TRUE(store->commitRound(r, {u}, std::nullopt).isOk());
  auto back = store->rounds(*id);
  ASSERT_TRUE(back.isOk());
  EXPECT_EQ((*back)[0].wall_end, 1000.25);
  auto back_updates = store->updates(*id, 1);
  ASSERT_TRUE(back_updates.isOk());
  EXPECT_EQ((*back_updates)[0].end_time, 8.5);
  EXPECT_EQ((*back_updates)[0].wall_compute_s, 0.125);
  EXPECT_EQ((*back_updates)[0].codec, "topk");
  EXPECT_EQ((*back_updates)[0].encode_s, 0.5);
  EXPECT_EQ((*back_updates)[0].decode_s, 0.25);
  EXPECT_EQ((*back_updates)[0].grant_wait_s, 0.75);
  auto back_runs = store->runs();
  EXPECT_EQ(back_runs->back().clock, "virtual");
}

// Every table of a new file has its column list (common/history/sqlite_schema.h) as its columns,
// in order, with the declared type and NOT NULL; the file has those tables and schema_version.
TEST_F(SqliteHistoryTest, ANewFileHasEachTablesColumnListInOrder) {
  { ASSERT_TRUE(open()); }
  std::vector<std::string> tables = {"schema_version"};
  forEachTable([&](const auto& table) {
    const std::string name(table.name);
    tables.push_back(name);
    std::vector<std::string> want;
    for (const auto& column : table.columns) {
      const bool not_null = column.constraints.find("NOT NULL") != std::string_view::npos;
      want.push_back(std::string(column.name) + "|" + std::string(column.type) + "|" +
                     (not_null ? "1" : "0"));
    }
    EXPECT_EQ(rawRows(path_, "SELECT name, type, \"notnull\" FROM pragma_table_info('" + name +
                                 "') ORDER BY cid"),
              want)
        << "table " << name;
  });
  std::sort(tables.begin(), tables.end());
  EXPECT_EQ(rawRows(path_, "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"),
            tables);
}

// A new file's schema is version 5's as it was first released, to the letter: the same CREATE
// statements (tables, columns, order, types, constraints, indexes) as the fixture.
TEST_F(SqliteHistoryTest, ANewFileHasTheReleasedSchemaToTheLetter) {
  { ASSERT_TRUE(open()); }
  const std::string fixture = path_ + ".fixture";
  std::filesystem::remove(fixture);
  rawExec(fixture, schemaFixture(kSqliteSchemaVersion));
  const std::string master = "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY name";
  EXPECT_EQ(rawRows(path_, master), rawRows(fixture, master));
  EXPECT_EQ(describeSchema(path_), describeSchema(fixture));
  EXPECT_EQ(rawQuery("SELECT version FROM schema_version"), std::to_string(kSqliteSchemaVersion));
  std::filesystem::remove(fixture);
}

// A file of each older version, made with that version's own schema and holding a row in each
// table, is upgraded to exactly the schema of a new file and keeps every row, value for value;
// the store then reads the rows.
TEST_F(SqliteHistoryTest, EachOlderVersionUpgradesToTheSchemaOfANewFile) {
  { ASSERT_TRUE(open()); }
  const std::vector<std::string> fresh = describeSchema(path_);
  ASSERT_FALSE(fresh.empty());
  for (const SchemaUpgrade& step : schemaUpgrades()) {
    const int64_t version = step.from_version;
    SCOPED_TRACE("schema version " + std::to_string(version));
    const std::string old = path_ + ".v" + std::to_string(version);
    for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(old + suffix);
    // Columns every version has.
    std::string rows = R"sql(
INSERT INTO runs (run_id, name, config_json, started_at, seed) VALUES (1, 'old', '{"a": 1}', 100.0, 7);
INSERT INTO rounds (run_id, round, start_time, end_time, selected, completed, late, dropped,
  rejected, status, train_loss, test_loss, test_accuracy, bytes_up, bytes_down, model_version)
  VALUES (1, 1, 100.0, 112.5, 2, 1, 0, 1, 0, 'ok', 0.5, NULL, 0.8, -1, 20, 1);
INSERT INTO updates (run_id, round, client_id, "partition", n_samples, steps, loss, compute_s,
  upload_s, bytes_up, bytes_down, weight, status)
  VALUES (1, 1, 'c1', 3, 60, 2, 0.5, 3.25, 0.5, 10, 20, 1.0, 'completed');
INSERT INTO clients VALUES ('c1', 'key', 'cpu', 'x86', 4, 1024, 60, 90.0, 110.0);
INSERT INTO checkpoints (run_id, round, model_version, sha256, blob)
  VALUES (1, 1, 1, 'abc', x'00ff');
INSERT INTO events (run_id, time, kind, client_id, detail) VALUES (1, 101.0, 'error', 'c1', 'boom');
INSERT INTO events (run_id, time, kind, client_id, detail) VALUES (NULL, 102.0, 'auth', '', '');
)sql";
    if (version >= 4) {
      rows += "INSERT INTO block_metrics VALUES (1, 1, '0', 'shared', 0.75, NULL);\n";
    }
    rawExec(old, schemaFixture(version) + rows);
    ASSERT_EQ(rawRows(old, "SELECT version FROM schema_version"),
              std::vector<std::string>{std::to_string(version)});
    const std::string before = old + ".before";
    std::filesystem::remove(before);
    std::filesystem::copy_file(old, before);
    ASSERT_EQ(dumpRows(before, before).size(), version >= 4 ? 8u : 7u);

    auto store = openSqliteHistory(old);
    ASSERT_TRUE(store.isOk()) << store.status().toString();
    EXPECT_EQ(rawRows(old, "SELECT version FROM schema_version"),
              std::vector<std::string>{std::to_string(kSqliteSchemaVersion)});
    EXPECT_EQ(describeSchema(old), fresh);
    // Every row keeps its values in the columns it had.
    EXPECT_EQ(dumpRows(old, before), dumpRows(before, before));

    auto runs = (*store)->runs();
    ASSERT_TRUE(runs.isOk()) << runs.status().toString();
    ASSERT_EQ(runs->size(), 1u);
    EXPECT_EQ((*runs)[0].name, "old");
    EXPECT_EQ((*runs)[0].clock, "wall");
    auto rounds = (*store)->rounds(1);
    ASSERT_TRUE(rounds.isOk()) << rounds.status().toString();
    ASSERT_EQ(rounds->size(), 1u);
    EXPECT_EQ((*rounds)[0].bytes_up, std::numeric_limits<uint64_t>::max());
    EXPECT_FALSE((*rounds)[0].test_loss.has_value());
    EXPECT_EQ((*rounds)[0].test_accuracy, 0.8);
    auto updates = (*store)->updates(1, std::nullopt);
    ASSERT_TRUE(updates.isOk()) << updates.status().toString();
    ASSERT_EQ(updates->size(), 1u);
    EXPECT_EQ((*updates)[0].partition, 3);
    EXPECT_EQ((*updates)[0].compute_s, 3.25);
    EXPECT_EQ((*updates)[0].served_block, -1);
    auto checkpoint = (*store)->latestCheckpoint(1);
    ASSERT_TRUE(checkpoint.isOk()) << checkpoint.status().toString();
    EXPECT_EQ(checkpoint->blob, std::string("\0\xff", 2));
    EXPECT_EQ(checkpoint->engine_state, "");
    auto clients = (*store)->clients();
    ASSERT_TRUE(clients.isOk());
    ASSERT_EQ(clients->size(), 1u);
    EXPECT_EQ((*clients)[0].memory_bytes, 1024u);
    auto events = (*store)->events(std::nullopt);
    ASSERT_TRUE(events.isOk());
    ASSERT_EQ(events->size(), 2u);
    EXPECT_EQ((*events)[0].detail, "boom");
    EXPECT_EQ((*events)[1].run_id, 0);
    auto blocks = (*store)->blockMetrics(1);
    ASSERT_TRUE(blocks.isOk());
    EXPECT_EQ(blocks->size(), version >= 4 ? 1u : 0u);
    store->reset();
    for (const char* suffix : {"", "-wal", "-shm", ".before"}) {
      std::filesystem::remove(old + suffix);
    }
  }
}

// A version-9 file (before decentralised runs) is upgraded to hold them: a run it already had
// takes iteration rows and evaluations, which read back through a read-write and a read-only
// store, while the file's rounds stay as they were.
TEST_F(SqliteHistoryTest, UpgradesAVersion9FileToRecordPeerRuns) {
  rawExec(path_, schemaFixture(9) + R"sql(
INSERT INTO runs (run_id, name, config_json, started_at, seed) VALUES (1, 'fed', '{}', 1.0, 7);
INSERT INTO rounds (run_id, round, start_time, end_time, selected, completed, late, dropped,
  rejected, status, train_loss, bytes_up, bytes_down, model_version)
  VALUES (1, 1, 0.0, 5.0, 2, 2, 0, 0, 0, 'ok', 0.5, 10, 20, 1);
)sql");
  ASSERT_EQ(rawQuery("SELECT count(*) FROM sqlite_master WHERE name LIKE 'peer_%'"), "0");
  {
    auto store = open();
    ASSERT_TRUE(store);
    EXPECT_EQ(rawQuery("SELECT version FROM schema_version"), "10");
    PeerIterationRecord it;
    it.run_id = 1;
    it.peer = 3;
    it.iteration = 9;
    it.t_start = 1.5;
    it.t_end = 2.75;
    it.compute_s = 1.0;
    it.comm_s = 0.25;
    it.bytes_sent = 4096;
    it.exchanges = 2;
    it.staleness = 1;
    it.skipped = true;
    ASSERT_TRUE(store->recordPeerIterations({it}).isOk());
    ASSERT_TRUE(store->recordPeerEval(PeerEvalRecord{1, 2.75, 10, 4, 0.5, 1.25}).isOk());
    EXPECT_EQ(store->recordPeerEval(PeerEvalRecord{2, 1.0, 1, 1, 0.5, 1.0}).code(),
              StatusCode::kNotFound);
  }
  // How the row is stored: booleans as 0/1, times as REAL.
  EXPECT_EQ(rawRows(path_,
                    "SELECT peer, iteration, t_start, t_end, wait_s, skipped FROM "
                    "peer_iterations"),
            std::vector<std::string>{"3|9|1.5|2.75|0.0|1"});
  auto reader = openSqliteHistoryReadOnly(path_);
  ASSERT_TRUE(reader.isOk()) << reader.status().toString();
  auto rows = (*reader)->peerIterations(1);
  ASSERT_TRUE(rows.isOk()) << rows.status().toString();
  ASSERT_EQ(rows->size(), 1u);
  EXPECT_EQ((*rows)[0].peer, 3u);
  EXPECT_EQ((*rows)[0].t_end, 2.75);
  EXPECT_EQ((*rows)[0].bytes_sent, 4096u);
  EXPECT_TRUE((*rows)[0].skipped);
  auto evals = (*reader)->peerEvals(1);
  ASSERT_TRUE(evals.isOk());
  ASSERT_EQ(evals->size(), 1u);
  EXPECT_EQ((*evals)[0].accuracy, 0.5);
  EXPECT_EQ((*evals)[0].peers_averaged, 4u);
  EXPECT_EQ((*reader)->recordPeerEval(PeerEvalRecord{1, 3.0, 11, 4, 0.5, 1.0}).code(),
            StatusCode::kIoError);
  auto rounds = (*reader)->rounds(1);
  ASSERT_TRUE(rounds.isOk());
  ASSERT_EQ(rounds->size(), 1u);
  EXPECT_EQ((*rounds)[0].end_time, 5.0);
}

// Each upgrade step is its own transaction: when one fails, the steps before it stay committed,
// the failed one leaves nothing behind, and the error names the step and the version the file
// stays at.
TEST_F(SqliteHistoryTest, AFailedUpgradeStepIsRolledBackAndNamed) {
  // A version-3 file that already has one of the columns step 4 -> 5 adds: that step fails.
  rawExec(path_, schemaFixture(3) + "ALTER TABLE updates ADD COLUMN served_block INTEGER;");
  auto store = openSqliteHistory(path_);
  ASSERT_FALSE(store.isOk());
  const std::string message = store.status().message();
  EXPECT_NE(message.find(path_), std::string::npos) << message;
  EXPECT_NE(message.find("upgrading schema version 4 to 5"), std::string::npos) << message;
  EXPECT_NE(message.find("duplicate column name: served_block"), std::string::npos) << message;
  EXPECT_NE(message.find("stays at schema version 4"), std::string::npos) << message;
  EXPECT_EQ(rawQuery("SELECT version FROM schema_version"), "4");
  EXPECT_EQ(rawQuery("SELECT count(*) FROM sqlite_master WHERE name = 'block_metrics'"), "1");
  EXPECT_EQ(rawQuery("SELECT count(*) FROM pragma_table_info('updates') WHERE name = "
                     "'served_model'"),
            "0");
}

}  // namespace
}  // namespace fedfleet::history
