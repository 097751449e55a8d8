// data.normalize in `fedfleet sim`: "computed" normalises with the training file's per-feature
// mean and standard deviation (checked against the file's values computed here) and records
// them in the run's config; "fixed" with those values gives the same run, value for value.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/history/history.h"
#include "tests/cli/blobs.h"
#include "tests/integration/process.h"

namespace fedfleet {
namespace {

const std::string kBinary = FEDFLEET_BINARY;

struct SimRun {
  int rc = -1;
  std::string log;
  nlohmann::json config;
  std::string checkpoint;
};

SimRun simulate(const std::string& dir, const std::vector<std::string>& sets) {
  std::vector<std::string> all = testing::blobsSimSets(dir);
  all.insert(all.end(), sets.begin(), sets.end());
  testing::Process p(testing::smallSimArgs(kBinary, dir + "/h.db", 2, all), dir + "/sim.txt");
  SimRun r;
  r.rc = p.waitFor(120).value_or(-1);
  r.log = p.log();
  auto store = history::openSqliteHistoryReadOnly(dir + "/h.db");
  if (!store.isOk()) return r;
  const auto runs = (*store)->runs().value();
  if (runs.empty()) return r;
  r.config = nlohmann::json::parse(runs[0].config_json);
  auto cp = (*store)->latestCheckpoint(runs[0].run_id);
  if (cp.isOk()) r.checkpoint = cp->blob;
  return r;
}

// Per-column mean and population standard deviation of f0..f3 in a blobs CSV.
void fileStats(const std::string& path, std::vector<double>* mean, std::vector<double>* sd) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);  // header: id,f0,f1,f2,f3,class
  std::vector<double> sum(4, 0), sq(4, 0);
  double n = 0;
  while (std::getline(in, line)) {
    std::stringstream row(line);
    std::string cell;
    std::getline(row, cell, ',');  // id
    for (int d = 0; d < 4; ++d) {
      std::getline(row, cell, ',');
      const double v = static_cast<float>(std::stod(cell));  // as the reader stores it
      sum[d] += v;
      sq[d] += v * v;
    }
    ++n;
  }
  for (int d = 0; d < 4; ++d) {
    mean->push_back(sum[d] / n);
    sd->push_back(std::sqrt(sq[d] / n - (sum[d] / n) * (sum[d] / n)));
  }
}

TEST(SimNormalize, ComputedStatisticsAreRecordedAndFixedOnesReproduceTheRun) {
  const std::string dir = testing::freshDir("sim-normalize");
  testing::writeBlobs(dir + "/train.csv", 600, 1);
  testing::writeBlobs(dir + "/test.csv", 150, 2);
  const SimRun computed = simulate(dir, {"data.normalize=computed"});
  ASSERT_EQ(computed.rc, 0) << computed.log;
  std::vector<double> mean, sd;
  fileStats(dir + "/train.csv", &mean, &sd);
  const auto& data = computed.config.at("data");
  EXPECT_EQ(data.at("normalize"), "computed");
  ASSERT_EQ(data.at("mean").size(), 4u) << data.dump();
  ASSERT_EQ(data.at("std").size(), 4u);
  for (int d = 0; d < 4; ++d) {
    EXPECT_NEAR(data.at("mean")[d].get<double>(), mean[d], 1e-9) << "f" << d;
    EXPECT_NEAR(data.at("std")[d].get<double>(), sd[d], 1e-9) << "f" << d;
  }
  auto list = [](const nlohmann::json& a) {
    std::string s = "[";
    for (size_t i = 0; i < a.size(); ++i) {
      char buf[64];
      std::snprintf(buf, sizeof(buf), "%.17g", a[i].get<double>());
      s += (i ? "," : "") + std::string(buf);
    }
    return s + "]";
  };
  const std::string fixed_dir = testing::freshDir("sim-normalize-fixed");
  std::filesystem::copy_file(dir + "/train.csv", fixed_dir + "/train.csv");
  std::filesystem::copy_file(dir + "/test.csv", fixed_dir + "/test.csv");
  const SimRun fixed =
      simulate(fixed_dir, {"data.normalize=fixed", "data.mean=" + list(data.at("mean")),
                           "data.std=" + list(data.at("std"))});
  ASSERT_EQ(fixed.rc, 0) << fixed.log;
  ASSERT_FALSE(computed.checkpoint.empty());
  EXPECT_TRUE(fixed.checkpoint == computed.checkpoint) << "the same normalisation, the same model";
  // And it is applied: without it the same run trains another model.
  const std::string none_dir = testing::freshDir("sim-normalize-none");
  std::filesystem::copy_file(dir + "/train.csv", none_dir + "/train.csv");
  std::filesystem::copy_file(dir + "/test.csv", none_dir + "/test.csv");
  const SimRun none = simulate(none_dir, {});
  ASSERT_EQ(none.rc, 0) << none.log;
  EXPECT_FALSE(none.checkpoint == computed.checkpoint);
  EXPECT_FALSE(none.config.at("data").at("mean").size() > 0);
}

}  // namespace
}  // namespace fedfleet
