// `fedfleet history` and its views (runs, rounds, clients, updates, events): the output in each
// format is checked against the rows in the database.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "common/history/history.h"
#include "tests/integration/process.h"

namespace fedfleet {
namespace {

const std::string kBinary = FEDFLEET_BINARY;

class HistoryCommand : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::freshDir("history-cli");
    db_ = dir_ + "/h.db";
    auto store = history::openSqliteHistory(db_);
    ASSERT_TRUE(store.isOk()) << store.status().toString();
    // An older run first (run 1), so the latest run (the default) is the "cli" one.
    {
      history::RunRecord other;
      other.name = "other";
      other.config_json = R"({"run":{"name":"other","seed":9}})";
      other.seed = 9;
      other.clock = "virtual";
      auto id = (*store)->beginRun(other);
      ASSERT_TRUE(id.isOk());
      other_run_ = *id;
      history::RoundRecord row;
      row.run_id = other_run_;
      row.round = 1;
      row.selected = 1;
      row.completed = 1;
      ASSERT_TRUE(
          (*store)
              ->commitRound(row, {update(other_run_, 1, "client-9", "completed", 0)}, std::nullopt)
              .isOk());
      ASSERT_TRUE(
          (*store)->recordEvent({other_run_, 50, "client_dropped", "client-9", "x"}).isOk());
    }
    for (int i : {1, 2, 3, 9}) {
      history::ClientRecord c;
      c.client_id = "client-" + std::to_string(i);
      c.public_key = "key" + std::to_string(i);
      c.device_kind = i == 2 ? "cuda" : "cpu";
      c.device_name = "dev, \"" + std::to_string(i) + "\"";  // CSV must quote it
      c.cores = i;
      c.memory_bytes = 1000000ull * i;
      c.data_size = 100 * i;
      c.first_seen = 1000 + i;
      c.last_seen = 2000 + i;
      ASSERT_TRUE((*store)->upsertClient(c).isOk());
    }
    history::RunRecord run;
    run.name = "cli";
    run.config_json = "{}";
    auto id = (*store)->beginRun(run);
    ASSERT_TRUE(id.isOk());
    run_ = *id;
    for (uint32_t r = 0; r <= 2; ++r) {
      history::RoundRecord row;
      row.run_id = run_;
      row.round = r;
      row.status = r == 0 ? "initial" : "ok";
      row.start_time = 1000 + 10 * r;
      row.end_time = 1004.5 + 10 * r;
      row.selected = r == 0 ? 0 : 3;
      row.completed = r == 0 ? 0 : 3 - (r == 2);
      row.dropped = r == 2;
      row.train_loss = 0.5 / (r + 1);
      row.test_loss = 2.0 - 0.5 * r;
      row.test_accuracy = 0.1 + 0.25 * r;  // 10%, 35%, 60%
      row.bytes_up = 1000 * r;
      row.model_version = r;
      std::vector<history::UpdateRecord> updates;
      if (r > 0) {
        for (int c = 1; c <= 3; ++c) {
          const bool dropped = r == 2 && c == 3;
          updates.push_back(update(run_, r, "client-" + std::to_string(c),
                                   dropped ? "dropped" : "completed", 0.25 * c + r));
        }
      }
      ASSERT_TRUE((*store)->commitRound(row, updates, std::nullopt).isOk());
    }
    ASSERT_TRUE(
        (*store)->recordEvent({run_, 1001, "auth_rejected", "", "key K, line\nbreak"}).isOk());
    ASSERT_TRUE((*store)->recordEvent({run_, 1002, "update_rejected", "client-2", "NaN"}).isOk());
    ASSERT_TRUE((*store)->recordEvent({0, 999, "unknown_client", "", "before any run"}).isOk());
  }

  static history::UpdateRecord update(int64_t run, uint32_t round, const std::string& client,
                                      const std::string& status, double loss) {
    history::UpdateRecord u;
    u.run_id = run;
    u.round = round;
    u.client_id = client;
    u.partition = static_cast<int32_t>(client.back() - '0');
    u.n_samples = 100 + round;
    u.steps = 4;
    u.loss = loss;
    u.compute_s = 1.5 * round;
    u.upload_s = 0.5;
    u.start_time = 1000 + 10 * round;
    u.end_time = 1003 + 10 * round;
    u.bytes_up = 4000 + round;
    u.bytes_down = 8000;
    u.weight = 1;
    u.status = status;
    return u;
  }

  // Runs `fedfleet history` with `args`; returns (exit code, output).
  std::pair<int, std::string> run(std::vector<std::string> args) {
    args.insert(args.begin(), {kBinary, "history"});
    testing::Process p(args, dir_ + "/out.txt");
    auto rc = p.waitFor(30);
    return {rc.value_or(-1), p.log()};
  }

  std::string dir_, db_;
  int64_t run_ = 0, other_run_ = 0;
};

TEST_F(HistoryCommand, CsvRowsMatchTheDatabase) {
  auto [rc, out] = run({"--db", db_, "--format", "csv"});
  ASSERT_EQ(rc, 0) << out;
  std::istringstream in(out);
  std::string header, line;
  std::getline(in, header);
  ASSERT_NE(header.find("round"), std::string::npos);
  ASSERT_NE(header.find("test_accuracy"), std::string::npos);
  // Column positions from the header.
  auto split = [](std::string s) {
    if (!s.empty() && s.back() == '\r') s.pop_back();
    std::vector<std::string> f;
    std::stringstream ss(s);
    std::string x;
    while (std::getline(ss, x, ',')) f.push_back(x);
    if (!s.empty() && s.back() == ',') f.push_back("");
    return f;
  };
  auto cols = split(header);
  auto col = [&](const std::string& name) {
    return std::find(cols.begin(), cols.end(), name) - cols.begin();
  };
  int rows = 0;
  while (std::getline(in, line)) {
    auto f = split(line);
    ASSERT_EQ(f.size(), cols.size()) << line;
    const int r = std::stoi(f[col("round")]);
    EXPECT_EQ(r, rows);
    EXPECT_DOUBLE_EQ(std::stod(f[col("test_accuracy")]), 0.1 + 0.25 * r);
    EXPECT_EQ(std::stoi(f[col("dropped")]), r == 2 ? 1 : 0);
    EXPECT_EQ(f[col("status")], r == 0 ? "initial" : "ok");
    ++rows;
  }
  EXPECT_EQ(rows, 3);
}

TEST_F(HistoryCommand, JsonMatchesTheDatabase) {
  auto [rc, out] = run({"--db", db_, "--format", "json", "--run", std::to_string(run_)});
  ASSERT_EQ(rc, 0) << out;
  auto j = nlohmann::json::parse(out);
  ASSERT_EQ(j.size(), 3u);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(j[r]["round"], r);
    EXPECT_DOUBLE_EQ(j[r]["test_accuracy"].get<double>(), 0.1 + 0.25 * r);
    EXPECT_DOUBLE_EQ(j[r]["end_time"].get<double>() - j[r]["start_time"].get<double>(), 4.5);
    EXPECT_EQ(j[r]["completed"], r == 0 ? 0 : 3 - (r == 2));
  }
}

TEST_F(HistoryCommand, TableShowsAccuracyAsPercent) {
  auto [rc, out] = run({"--db", db_});
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("test_acc"), std::string::npos) << out;
  EXPECT_NE(out.find("10.00%"), std::string::npos) << out;
  EXPECT_NE(out.find("35.00%"), std::string::npos) << out;
  EXPECT_NE(out.find("60.00%"), std::string::npos) << out;
  EXPECT_NE(out.find("4.50"), std::string::npos) << out;  // seconds column
}

TEST_F(HistoryCommand, BadInputIsAClearErrorWithStatus2) {
  auto [rc1, out1] = run({"--db", dir_ + "/missing.db"});
  EXPECT_EQ(rc1, 2);
  EXPECT_NE(out1.find("missing.db"), std::string::npos) << out1;
  auto [rc2, out2] = run({"--db", db_, "--format", "xml"});
  EXPECT_EQ(rc2, 2);
  EXPECT_NE(out2.find("csv"), std::string::npos) << out2;  // names the valid formats
  auto [rc3, out3] = run({"--db", db_, "--run", "99"});
  EXPECT_NE(rc3, 0);
}

// RFC 4180 records of a CSV text: quoted fields may hold commas, quotes and line breaks.
std::vector<std::vector<std::string>> parseCsv(const std::string& text) {
  std::vector<std::vector<std::string>> rows(1);
  std::string field;
  bool quoted = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted) {
      if (c == '"' && i + 1 < text.size() && text[i + 1] == '"') {
        field += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        field += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      rows.back().push_back(std::move(field));
      field.clear();
    } else if (c == '\r' && i + 1 < text.size() && text[i + 1] == '\n') {
      rows.back().push_back(std::move(field));
      field.clear();
      rows.emplace_back();
      ++i;
    } else {
      field += c;
    }
  }
  if (rows.back().empty()) rows.pop_back();
  return rows;
}

// CSV rows as maps from the header's names.
std::vector<std::map<std::string, std::string>> csvObjects(const std::string& text) {
  auto rows = parseCsv(text);
  std::vector<std::map<std::string, std::string>> out;
  for (size_t r = 1; r < rows.size(); ++r) {
    EXPECT_EQ(rows[r].size(), rows[0].size()) << "row " << r;
    std::map<std::string, std::string> m;
    for (size_t i = 0; i < rows[r].size() && i < rows[0].size(); ++i) m[rows[0][i]] = rows[r][i];
    out.push_back(std::move(m));
  }
  return out;
}

std::vector<history::UpdateRecord> dbUpdates(const std::string& db, int64_t run,
                                             std::optional<uint32_t> round) {
  auto store = history::openSqliteHistory(db);
  EXPECT_TRUE(store.isOk());
  auto rows = (*store)->updates(run, round);
  EXPECT_TRUE(rows.isOk());
  return *rows;
}

TEST_F(HistoryCommand, RunsInEachFormatMatchTheDatabase) {
  auto [rc, out] = run({"runs", "--db", db_, "--format", "json"});
  ASSERT_EQ(rc, 0) << out;
  auto j = nlohmann::json::parse(out);
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[0]["run_id"], other_run_);
  EXPECT_EQ(j[0]["name"], "other");
  EXPECT_EQ(j[0]["clock"], "virtual");
  EXPECT_EQ(j[0]["seed"], 9);
  EXPECT_EQ(j[0]["config_json"], R"({"run":{"name":"other","seed":9}})");
  EXPECT_EQ(j[1]["run_id"], run_);
  EXPECT_EQ(j[1]["name"], "cli");

  auto [rc2, csv] = run({"runs", "--db", db_, "--format", "csv", "--run", std::to_string(run_)});
  ASSERT_EQ(rc2, 0) << csv;
  auto rows = csvObjects(csv);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0]["run_id"], std::to_string(run_));
  EXPECT_EQ(rows[0]["name"], "cli");
  EXPECT_EQ(rows[0]["config_json"], "{}");

  // Options may also come before the view's name.
  auto [rc3, table] = run({"--db", db_, "runs"});
  ASSERT_EQ(rc3, 0) << table;
  EXPECT_NE(table.find("other"), std::string::npos) << table;
  EXPECT_NE(table.find("virtual"), std::string::npos) << table;
  EXPECT_NE(table.find("cli"), std::string::npos) << table;
}

TEST_F(HistoryCommand, RoundsViewIsTheDefault) {
  auto [rc1, plain] = run({"--db", db_, "--format", "csv"});
  auto [rc2, view] = run({"rounds", "--db", db_, "--format", "csv"});
  ASSERT_EQ(rc1, 0);
  ASSERT_EQ(rc2, 0);
  EXPECT_EQ(plain, view);
  auto [rc3, other] = run({"rounds", "--db", db_, "--format", "json", "--run", "1"});
  ASSERT_EQ(rc3, 0) << other;
  auto j = nlohmann::json::parse(other);
  ASSERT_EQ(j.size(), 1u);
  EXPECT_EQ(j[0]["run_id"], other_run_);
}

TEST_F(HistoryCommand, UpdatesOfARoundInEachFormatMatchTheDatabase) {
  const auto expected = dbUpdates(db_, run_, 2);
  ASSERT_EQ(expected.size(), 3u);
  auto [rc, out] = run({"updates", "--db", db_, "--round", "2", "--format", "json"});
  ASSERT_EQ(rc, 0) << out;
  auto j = nlohmann::json::parse(out);
  ASSERT_EQ(j.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(j[i]["run_id"], run_);
    EXPECT_EQ(j[i]["round"], 2);
    EXPECT_EQ(j[i]["client_id"], expected[i].client_id);
    EXPECT_EQ(j[i]["status"], expected[i].status);
    EXPECT_DOUBLE_EQ(j[i]["loss"].get<double>(), expected[i].loss);
    EXPECT_DOUBLE_EQ(j[i]["compute_s"].get<double>(), expected[i].compute_s);
    EXPECT_EQ(j[i]["bytes_up"], expected[i].bytes_up);
  }
  EXPECT_EQ(j[2]["status"], "dropped");

  // CSV without --round: every update of the latest run, in insertion order.
  const auto all = dbUpdates(db_, run_, std::nullopt);
  auto [rc2, csv] = run({"updates", "--db", db_, "--format", "csv"});
  ASSERT_EQ(rc2, 0) << csv;
  auto rows = csvObjects(csv);
  ASSERT_EQ(rows.size(), all.size());
  ASSERT_EQ(rows.size(), 6u);
  for (size_t i = 0; i < all.size(); ++i) {
    EXPECT_EQ(rows[i]["round"], std::to_string(all[i].round));
    EXPECT_EQ(rows[i]["client_id"], all[i].client_id);
    EXPECT_DOUBLE_EQ(std::stod(rows[i]["loss"]), all[i].loss);
    EXPECT_EQ(rows[i]["n_samples"], std::to_string(all[i].n_samples));
  }

  auto [rc3, table] = run({"updates", "--db", db_, "--round", "2"});
  ASSERT_EQ(rc3, 0) << table;
  EXPECT_NE(table.find("client-3"), std::string::npos) << table;
  EXPECT_NE(table.find("dropped"), std::string::npos) << table;
  EXPECT_EQ(table.find("client-9"), std::string::npos) << table;  // another run's
  // Header plus one line per update.
  EXPECT_EQ(std::count(table.begin(), table.end(), '\n'), 4) << table;

  auto [rc4, other] = run({"updates", "--db", db_, "--run", "1", "--format", "json"});
  ASSERT_EQ(rc4, 0) << other;
  auto jo = nlohmann::json::parse(other);
  ASSERT_EQ(jo.size(), 1u);
  EXPECT_EQ(jo[0]["client_id"], "client-9");
}

TEST_F(HistoryCommand, ClientsInEachFormatMatchTheDatabase) {
  auto [rc, out] = run({"clients", "--db", db_, "--format", "json"});
  ASSERT_EQ(rc, 0) << out;
  auto j = nlohmann::json::parse(out);
  ASSERT_EQ(j.size(), 4u);  // every client, by id
  EXPECT_EQ(j[0]["client_id"], "client-1");
  EXPECT_EQ(j[1]["device_kind"], "cuda");
  EXPECT_EQ(j[1]["memory_bytes"], 2000000);
  EXPECT_EQ(j[3]["client_id"], "client-9");

  // --run: only the clients with an update in that run.
  auto [rc2, csv] = run({"clients", "--db", db_, "--format", "csv", "--run", std::to_string(run_)});
  ASSERT_EQ(rc2, 0) << csv;
  auto rows = csvObjects(csv);
  ASSERT_EQ(rows.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(rows[i]["client_id"], "client-" + std::to_string(i + 1));
    EXPECT_EQ(rows[i]["device_name"], "dev, \"" + std::to_string(i + 1) + "\"");
    EXPECT_EQ(rows[i]["cores"], std::to_string(i + 1));
    EXPECT_EQ(rows[i]["data_size"], std::to_string(100 * (i + 1)));
  }

  auto [rc3, table] = run({"clients", "--db", db_, "--run", "1"});
  ASSERT_EQ(rc3, 0) << table;
  EXPECT_NE(table.find("client-9"), std::string::npos) << table;
  EXPECT_EQ(table.find("client-1"), std::string::npos) << table;
}

TEST_F(HistoryCommand, EventsInEachFormatMatchTheDatabase) {
  auto [rc, out] = run({"events", "--db", db_, "--format", "json"});
  ASSERT_EQ(rc, 0) << out;
  auto j = nlohmann::json::parse(out);
  ASSERT_EQ(j.size(), 4u);  // all events, in insertion order
  EXPECT_EQ(j[0]["kind"], "client_dropped");
  EXPECT_EQ(j[1]["kind"], "auth_rejected");
  EXPECT_EQ(j[1]["detail"], "key K, line\nbreak");
  EXPECT_TRUE(j[3]["run_id"].is_null());  // not tied to a run

  auto [rc2, csv] = run({"events", "--db", db_, "--format", "csv", "--run", std::to_string(run_)});
  ASSERT_EQ(rc2, 0) << csv;
  auto rows = csvObjects(csv);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0]["kind"], "auth_rejected");
  EXPECT_EQ(rows[0]["detail"], "key K, line\nbreak");  // quoted, line break kept
  EXPECT_DOUBLE_EQ(std::stod(rows[0]["time"]), 1001);
  EXPECT_EQ(rows[1]["client_id"], "client-2");

  auto [rc3, table] = run({"events", "--db", db_, "--run", std::to_string(run_)});
  ASSERT_EQ(rc3, 0) << table;
  EXPECT_NE(table.find("update_rejected"), std::string::npos) << table;
  EXPECT_NE(table.find("line\\nbreak"), std::string::npos) << table;  // escaped on one line
  EXPECT_EQ(table.find("client_dropped"), std::string::npos) << table;
}

// The line of `table` that contains `needle` ("" when none).
std::string lineWith(const std::string& table, const std::string& needle) {
  std::istringstream in(table);
  for (std::string line; std::getline(in, line);) {
    if (line.find(needle) != std::string::npos) return line;
  }
  return "";
}

// Run 1 is on the virtual clock: its event's time is seconds from its start, not a 1970 date.
// The wall-clock run's events and the one tied to no run are dates; CSV keeps the numbers.
TEST_F(HistoryCommand, EventsTableShowsEachTimeOnItsRunsClock) {
  auto [rc, table] = run({"events", "--db", db_});
  ASSERT_EQ(rc, 0) << table;
  const std::string simulated = lineWith(table, "client_dropped");
  EXPECT_NE(simulated.find("t=50.00 s"), std::string::npos) << table;
  EXPECT_EQ(simulated.find("1970"), std::string::npos) << table;
  EXPECT_NE(lineWith(table, "auth_rejected").find("1970-01-01 00:16:41"), std::string::npos)
      << table;
  EXPECT_NE(lineWith(table, "unknown_client").find("1970-01-01 00:16:39"), std::string::npos)
      << table;
  auto [rc2, csv] = run({"events", "--db", db_, "--format", "csv", "--run", "1"});
  ASSERT_EQ(rc2, 0) << csv;
  auto rows = csvObjects(csv);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0]["time"], "50");
}

// `history tiers` of a real coordinator's run: no fleet tiers, so the clients group by the
// device name they reported, with the counts of their update rows.
TEST_F(HistoryCommand, TiersOfARealRunGroupByDeviceName) {
  auto [rc, out] = run({"tiers", "--db", db_, "--format", "json"});
  ASSERT_EQ(rc, 0) << out;
  auto j = nlohmann::json::parse(out);
  ASSERT_EQ(j.size(), 3u) << out;
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(j[i]["run_id"], run_);
    EXPECT_EQ(j[i]["tier"], "dev, \"" + std::to_string(i + 1) + "\"");
    EXPECT_EQ(j[i]["device_kind"], i == 1 ? "cuda" : "cpu");
    EXPECT_EQ(j[i]["clients"], 1);
    EXPECT_EQ(j[i]["updates"], 2);
    EXPECT_EQ(j[i]["completed"], i == 2 ? 1 : 2);  // client-3 dropped out of round 2
    EXPECT_EQ(j[i]["dropped"], i == 2 ? 1 : 0);
    EXPECT_EQ(j[i]["late"], 0);
    EXPECT_EQ(j[i]["mean_completed_s"], 3.0);  // every update took 3 s
  }
  auto [rc2, table] = run({"tiers", "--db", db_, "--run", "1"});
  ASSERT_EQ(rc2, 0) << table;
  EXPECT_NE(lineWith(table, "dev, \"9\"").find("cpu"), std::string::npos) << table;
  auto [rc3, bad] = run({"tiers", "--db", db_, "--run", "42"});
  EXPECT_EQ(rc3, 2) << bad;
}

TEST_F(HistoryCommand, RoundsShowRejectedUpdatesInEachFormat) {
  {
    auto store = history::openSqliteHistory(db_);
    ASSERT_TRUE(store.isOk()) << store.status().toString();
    auto id = (*store)->beginRun(history::RunRecord{});
    ASSERT_TRUE(id.isOk());
    history::RoundRecord row;
    row.run_id = *id;
    row.round = 1;
    row.selected = 5;
    row.completed = 2;
    row.rejected = 3;
    std::vector<history::UpdateRecord> updates;
    for (int c = 1; c <= 5; ++c) {
      updates.push_back(
          update(*id, 1, "client-" + std::to_string(c), c <= 3 ? "rejected" : "completed", 0.5));
    }
    ASSERT_TRUE((*store)->commitRound(row, updates, std::nullopt).isOk());
  }
  auto [rc, table] = run({"--db", db_});
  ASSERT_EQ(rc, 0) << table;
  // The header's "rejected" column holds 3 in the round's line.
  std::istringstream lines(table);
  std::string header, line;
  std::getline(lines, header);
  std::getline(lines, line);
  std::vector<std::string> names, values;
  for (std::istringstream in(header); in >> header;) names.push_back(header);
  for (std::istringstream in(line); in >> line;) values.push_back(line);
  const auto at = std::find(names.begin(), names.end(), "rejected") - names.begin();
  ASSERT_LT(at, static_cast<long>(names.size())) << table;
  ASSERT_EQ(values.size(), names.size()) << table;
  EXPECT_EQ(values[at], "3") << table;
  EXPECT_EQ(values[std::find(names.begin(), names.end(), "completed") - names.begin()], "2");

  auto [rc2, csv] = run({"--db", db_, "--format", "csv"});
  ASSERT_EQ(rc2, 0) << csv;
  auto rows = csvObjects(csv);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0]["rejected"], "3");
  auto [rc3, json] = run({"--db", db_, "--format", "json"});
  ASSERT_EQ(rc3, 0) << json;
  EXPECT_EQ(nlohmann::json::parse(json)[0]["rejected"], 3);
}

// The file names in `dir`.
std::vector<std::string> filesIn(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string fileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A copy of the history in a directory made read-only: every view and the report read it, and
// neither the directory nor the file changes. Tests run as root, which the permission bits do
// not stop, so the assertions are on what is left behind: no -wal, no -shm, the same bytes.
TEST_F(HistoryCommand, ViewsAndReportReadAHistoryInAReadOnlyDirectory) {
  const std::string ro = dir_ + "/ro";
  std::filesystem::create_directories(ro);
  const std::string copy = ro + "/h.db";
  std::filesystem::copy_file(db_, copy);
  const std::string before = fileBytes(copy);
  std::filesystem::permissions(ro, std::filesystem::perms(0555));
  for (const char* view : {"runs", "rounds", "clients", "updates", "events", "blocks", "served"}) {
    for (const char* format : {"table", "json"}) {
      auto [rc, out] = run({view, "--db", copy, "--format", format});
      EXPECT_EQ(rc, 0) << view << " " << format << ": " << out;
      EXPECT_EQ(out.find("readonly"), std::string::npos) << out;
    }
  }
  auto [rc, rounds] = run({"rounds", "--db", copy, "--format", "csv"});
  ASSERT_EQ(rc, 0) << rounds;
  EXPECT_EQ(csvObjects(rounds).size(), 3u);
  const std::string report = dir_ + "/r.html";
  testing::Process p({kBinary, "report", "--db", copy, "-o", report}, dir_ + "/report.txt");
  EXPECT_EQ(p.waitFor(30).value_or(-1), 0) << p.log();
  EXPECT_TRUE(std::filesystem::exists(report));
  EXPECT_EQ(filesIn(ro), std::vector<std::string>{"h.db"});
  EXPECT_EQ(fileBytes(copy), before);
  std::filesystem::permissions(ro, std::filesystem::perms(0755));
}

TEST_F(HistoryCommand, BadViewsAndFilesAreClearErrors) {
  auto [rc1, out1] = run({"updates", "--db", db_, "--round", "x"});
  EXPECT_EQ(rc1, 2) << out1;
  auto [rc2, out2] = run({"checkpoints", "--db", db_});
  EXPECT_EQ(rc2, 2) << out2;
  auto [rc3, out3] = run({"events", "--db", db_, "--run", "42"});
  EXPECT_EQ(rc3, 2) << out3;
  EXPECT_NE(out3.find("no run 42"), std::string::npos) << out3;
  // A file that is not a fedfleet history: status 1, a message, and the file left as it was.
  const std::string text = dir_ + "/notes.txt";
  std::ofstream(text) << "not a database at all, just some text that is long enough\n";
  auto [rc4, out4] = run({"runs", "--db", text});
  EXPECT_EQ(rc4, 1) << out4;
  EXPECT_NE(out4.find("notes.txt"), std::string::npos) << out4;
  const std::string empty = dir_ + "/empty.db";
  std::ofstream(empty).flush();
  auto [rc5, out5] = run({"runs", "--db", empty});
  EXPECT_EQ(rc5, 1) << out5;
  EXPECT_NE(out5.find("not a fedfleet history"), std::string::npos) << out5;
  EXPECT_EQ(std::filesystem::file_size(empty), 0u);
}

}  // namespace
}  // namespace fedfleet
