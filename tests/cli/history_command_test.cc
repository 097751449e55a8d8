// `fedfleet history`: its output in each format is checked against the rows in the database.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
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
      ASSERT_TRUE((*store)->commitRound(row, {}, std::nullopt).isOk());
    }
  }

  // Runs `fedfleet history` with `args`; returns (exit code, output).
  std::pair<int, std::string> run(std::vector<std::string> args) {
    args.insert(args.begin(), {kBinary, "history"});
    testing::Process p(args, dir_ + "/out.txt");
    auto rc = p.waitFor(30);
    return {rc.value_or(-1), p.log()};
  }

  std::string dir_, db_;
  int64_t run_ = 0;
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

}  // namespace
}  // namespace fedfleet
