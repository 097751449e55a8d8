// Start-up checks of `fedfleet sim`: a TorchScript model that does not fit the user's data is
// one clear error before any round (exit 2, the model, the data and the shapes named), and a
// run in which every round failed exits non-zero saying so.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/script.h>
#include <torch/torch.h>

#include "common/history/history.h"
#include "tests/cli/blobs.h"
#include "tests/integration/process.h"

namespace fedfleet {
namespace {

using ::testing::HasSubstr;
const std::string kBinary = FEDFLEET_BINARY;

// Writes a TorchScript module with one parameter w of `w_shape` and the given forward body.
std::string writeModule(const std::string& path, std::vector<int64_t> w_shape,
                        const std::string& forward_body) {
  torch::jit::Module m("StartupCheck");
  m.register_parameter("w", torch::full(w_shape, 0.1).requires_grad_(true), /*is_buffer=*/false);
  m.define("def forward(self, x):\n    " + forward_body + "\n");
  m.save(path);
  return path;
}

struct Ran {
  int rc;
  std::string out;
};

// The blobs (4 features, labels 0..2) as CSV training and test files, trained by `module`.
Ran simulate(const std::string& dir, const std::string& module) {
  testing::writeBlobs(dir + "/train.csv", 300, 1);
  testing::writeBlobs(dir + "/test.csv", 90, 2);
  std::vector<std::string> args = testing::smallSimArgs(
      kBinary, dir + "/h.db", 2,
      {"data.format=csv", "data.path=" + dir + "/train.csv", "data.test_path=" + dir + "/test.csv",
       "data.label_column=class", "data.feature_columns=[\"f0\",\"f1\",\"f2\",\"f3\"]",
       "data.partition=iid", "model.name=torchscript", "model.path=" + module});
  testing::Process p(args, dir + "/sim.txt");
  return {p.waitFor(120).value_or(-1), p.log()};
}

TEST(StartupCheck, TooFewOutputsForTheLabelsIsOneErrorBeforeAnyRound) {
  const std::string dir = testing::freshDir("startup-classes");
  const std::string module = writeModule(dir + "/two.pt", {4, 2}, "return x.matmul(self.w)");
  const Ran r = simulate(dir, module);
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("model 'torchscript' (" + module + ") and data 'csv' (" + dir +
                               "/train.csv), training set do not fit: the data has label 2 but "
                               "the model has 2 outputs (labels 0..1)"));
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("round   1")));
}

TEST(StartupCheck, AnInputShapeTheModelRejectsIsOneErrorNamingTheShape) {
  const std::string dir = testing::freshDir("startup-input");
  const std::string module = writeModule(dir + "/five.pt", {5, 3}, "return x.matmul(self.w)");
  const Ran r = simulate(dir, module);
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("do not fit: the model rejects a batch of shape [8, 4]"));
}

TEST(StartupCheck, ARunInWhichEveryRoundFailedExitsNonZero) {
  const std::string dir = testing::freshDir("startup-all-failed");
  // The right shapes, but every output is NaN: every update is refused, every round fails.
  const std::string module =
      writeModule(dir + "/nan.pt", {4, 3}, "return x.matmul(self.w) * float('nan')");
  const Ran r = simulate(dir, module);
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_THAT(r.out, HasSubstr("every one of the 2 training rounds failed, so the model never "
                               "changed"));
  EXPECT_THAT(r.out, HasSubstr("payload holds NaN or infinity"));
  EXPECT_THAT(r.out, HasSubstr("fedfleet history --db " + dir + "/h.db events"));
  // The history keeps what happened.
  auto store = history::openSqliteHistoryReadOnly(dir + "/h.db");
  ASSERT_TRUE(store.isOk()) << store.status().toString();
  const auto runs = (*store)->runs().value();
  ASSERT_EQ(runs.size(), 1u);
  const auto rounds = (*store)->rounds(runs[0].run_id).value();
  ASSERT_EQ(rounds.size(), 3u);
  EXPECT_EQ(rounds[1].status, "failed");
  EXPECT_EQ(rounds[2].status, "failed");
}

}  // namespace
}  // namespace fedfleet
