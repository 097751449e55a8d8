// The trained model out of a history and into PyTorch: `fedfleet model export` after a
// simulation, the file evaluated in Debian's Python (/usr/bin/python3 with python3-torch) by
// examples/models/fedfleet_models.py, which must reproduce the history's test accuracy of that
// round; and model.init, which starts a run from such a file (or one saved in Python).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>

#include "common/history/history.h"
#include "tests/cli/blobs.h"
#include "tests/integration/process.h"

namespace fedfleet {
namespace {

using ::testing::HasSubstr;
using testing::writeBlobs;
const std::string kBinary = FEDFLEET_BINARY;
const std::string kModels =
    std::string(FEDFLEET_SOURCE_DIR) + "/examples/models/fedfleet_models.py";
const std::string kFeatures = "data.feature_columns=[\"f0\",\"f1\",\"f2\",\"f3\"]";

bool pythonHasTorch() {
  static const bool has = std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0;
  return has;
}

#define SKIP_WITHOUT_PYTHON_TORCH()                                                         \
  if (!pythonHasTorch()) {                                                                  \
    GTEST_SKIP() << "/usr/bin/python3 cannot import torch (apt-get install python3-torch)"; \
  }

struct Ran {
  int code = -1;
  std::string log;
};

Ran run(const std::vector<std::string>& args, const std::string& log, double timeout_s = 180) {
  testing::Process p(args, log);
  Ran r;
  r.code = p.waitFor(timeout_s).value_or(-1);
  r.log = p.log();
  return r;
}

// A simulation of `rounds` rounds on the blobs of `dir` (train.csv, test.csv) into dir/h.db.
Ran simulate(const std::string& dir, const std::vector<std::string>& model_args, int rounds,
             const std::vector<std::string>& sets = {}) {
  std::vector<std::string> all = {"data.format=csv",
                                  "data.path=" + dir + "/train.csv",
                                  "data.test_path=" + dir + "/test.csv",
                                  "data.label_column=class",
                                  kFeatures,
                                  "data.partition=iid",
                                  "train.lr=0.05"};
  all.insert(all.end(), sets.begin(), sets.end());
  std::vector<std::string> args = testing::smallSimArgs(kBinary, dir + "/h.db", rounds, all);
  args.insert(args.end(), model_args.begin(), model_args.end());
  return run(args, dir + "/sim.txt");
}

// The accuracy fedfleet_models.py prints for `file` on dir/test.csv.
double pythonAccuracy(const std::string& dir, const std::vector<std::string>& how) {
  std::vector<std::string> args = {"/usr/bin/python3", kModels};
  args.insert(args.end(), how.begin(), how.end());
  for (const char* a : {"--csv", "", "--features", "f0,f1,f2,f3", "--label", "class"}) {
    args.push_back(std::string(a).empty() ? dir + "/test.csv" : a);
  }
  const Ran r = run(args, dir + "/python.txt", 120);
  EXPECT_EQ(r.code, 0) << r.log;
  std::smatch m;
  if (!std::regex_search(r.log, m, std::regex("accuracy ([0-9.]+) samples 300"))) {
    ADD_FAILURE() << "no accuracy in: " << r.log;
    return -1;
  }
  return std::stod(m[1]);
}

std::vector<history::RoundRecord> roundsOf(const std::string& db) {
  auto store = history::openSqliteHistoryReadOnly(db);
  EXPECT_TRUE(store.isOk()) << store.status().toString();
  if (!store.isOk()) return {};
  return (*store)->rounds((*store)->runs().value().back().run_id).value();
}

std::string freshBlobs(const std::string& name) {
  const std::string dir = testing::freshDir(name);
  writeBlobs(dir + "/train.csv", 600, 11);
  writeBlobs(dir + "/test.csv", 300, 12);
  return dir;
}

TEST(ModelExport, ABuiltInModelComesOutAsAStateDictThatPythonEvaluatesAlike) {
  SKIP_WITHOUT_PYTHON_TORCH();
  const std::string dir = freshBlobs("model-export-builtin");
  // One checkpoint kept beside the best: --best must still find the best one.
  const Ran sim = simulate(dir, {"--model", "mlp"}, 6,
                           {"coordinator.keep_checkpoints=1", "coordinator.keep_best=true"});
  ASSERT_EQ(sim.code, 0) << sim.log;
  const auto rounds = roundsOf(dir + "/h.db");
  ASSERT_EQ(rounds.size(), 7u);
  uint32_t best = 1;
  for (const auto& r : rounds) {
    if (r.round > 0 && *r.test_accuracy > *rounds[best].test_accuracy) best = r.round;
  }
  const Ran info = run({kBinary, "model", "info", "--db", dir + "/h.db"}, dir + "/info.txt");
  ASSERT_EQ(info.code, 0) << info.log;
  EXPECT_THAT(info.log, HasSubstr("model mlp, input [4], 3 classes"));
  EXPECT_THAT(info.log, HasSubstr(std::to_string(best) + " ("));
  EXPECT_THAT(info.log, HasSubstr("fc1.weight"));
  EXPECT_THAT(info.log, HasSubstr("[200, 4]"));

  const Ran out =
      run({kBinary, "model", "export", "--db", dir + "/h.db", "--best", "-o", dir + "/best.pt"},
          dir + "/export.txt");
  ASSERT_EQ(out.code, 0) << out.log;
  EXPECT_THAT(out.log, HasSubstr("round " + std::to_string(best)));
  const double py = pythonAccuracy(dir, {dir + "/best.pt", "--format", "state_dict", "--model",
                                         "mlp", "--input", "4", "--classes", "3"});
  EXPECT_NEAR(py, *rounds[best].test_accuracy, 1e-4) << "within 0.01 points";

  // The latest round as a flat buffer and its description.
  const Ran flat = run({kBinary, "model", "export", "--db", dir + "/h.db", "--format", "flat", "-o",
                        dir + "/last.bin"},
                       dir + "/flat.txt");
  ASSERT_EQ(flat.code, 0) << flat.log;
  EXPECT_TRUE(std::filesystem::exists(dir + "/last.bin.json"));
  EXPECT_NEAR(pythonAccuracy(dir, {dir + "/last.bin", "--format", "flat", "--model", "mlp",
                                   "--input", "4", "--classes", "3"}),
              *rounds.back().test_accuracy, 1e-4);

  // A pruned round and a format the model has not: exit 2, saying what there is.
  const Ran gone =
      run({kBinary, "model", "export", "--db", dir + "/h.db", "--round", "0", "-o", dir + "/x.pt"},
          dir + "/gone.txt");
  EXPECT_EQ(gone.code, 2);
  EXPECT_THAT(gone.log, HasSubstr("no checkpoint of round 0"));
  EXPECT_THAT(gone.log, HasSubstr("kept: rounds"));
  const Ran ts = run({kBinary, "model", "export", "--db", dir + "/h.db", "--format", "torchscript",
                      "-o", dir + "/x.pt"},
                     dir + "/ts.txt");
  EXPECT_EQ(ts.code, 2);
  EXPECT_THAT(ts.log, HasSubstr("exports as a state_dict"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/x.pt"));
}

// A TorchScript MLP for the blobs (4 features, 3 classes), written by Python.
const char* kWriteModule = R"py(
import sys, torch
from torch import nn
torch.manual_seed(3)
net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3))
torch.jit.script(net).save(sys.argv[1])
)py";

TEST(ModelExport, ATorchScriptModelComesOutAsTheTrainedModule) {
  SKIP_WITHOUT_PYTHON_TORCH();
  const std::string dir = freshBlobs("model-export-torchscript");
  { std::ofstream(dir + "/write_module.py") << kWriteModule; }
  ASSERT_EQ(
      run({"/usr/bin/python3", dir + "/write_module.py", dir + "/net.pt"}, dir + "/w.txt").code, 0);
  const Ran sim = simulate(dir, {"--model", dir + "/net.pt"}, 4);
  ASSERT_EQ(sim.code, 0) << sim.log;
  const auto rounds = roundsOf(dir + "/h.db");
  ASSERT_EQ(rounds.size(), 5u);
  const Ran out = run({kBinary, "model", "export", "--db", dir + "/h.db", "-o", dir + "/out.pt"},
                      dir + "/export.txt");
  ASSERT_EQ(out.code, 0) << out.log;
  EXPECT_THAT(out.log, HasSubstr("torchscript of model torchscript"));
  EXPECT_NEAR(pythonAccuracy(dir, {dir + "/out.pt", "--format", "torchscript"}),
              *rounds.back().test_accuracy, 1e-4);
  EXPECT_GT(*rounds.back().test_accuracy, *rounds.front().test_accuracy);

  // The module moved: export says where to point it, then works with --module.
  std::filesystem::rename(dir + "/net.pt", dir + "/moved.pt");
  const Ran lost = run({kBinary, "model", "export", "--db", dir + "/h.db", "-o", dir + "/o2.pt"},
                       dir + "/lost.txt");
  EXPECT_EQ(lost.code, 1);
  EXPECT_THAT(lost.log, HasSubstr("--module"));
  const Ran found = run({kBinary, "model", "export", "--db", dir + "/h.db", "-o", dir + "/o2.pt",
                         "--module", dir + "/moved.pt"},
                        dir + "/found.txt");
  EXPECT_EQ(found.code, 0) << found.log;
  // A module of another shape is not filled with the run's weights.
  {
    std::string other = kWriteModule;
    other.replace(other.find("nn.Linear(4, 16)"), 16, "nn.Linear(4, 8)");
    other.replace(other.find("nn.Linear(16, 3)"), 16, "nn.Linear(8, 3)");
    std::ofstream(dir + "/write_other.py") << other;
  }
  ASSERT_EQ(
      run({"/usr/bin/python3", dir + "/write_other.py", dir + "/other.pt"}, dir + "/w2.txt").code,
      0);
  const Ran wrong = run({kBinary, "model", "export", "--db", dir + "/h.db", "-o", dir + "/o3.pt",
                         "--module", dir + "/other.pt"},
                        dir + "/wrong.txt");
  EXPECT_EQ(wrong.code, 1);
  EXPECT_THAT(wrong.log, HasSubstr("not the model the run trained"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/o3.pt"));
}

// model.init: a run starts from a state_dict saved in Python (the initial evaluation is that
// model's accuracy), and from its own export (the initial evaluation is the exported round's).
TEST(ModelExport, ARunStartsFromExportedOrPythonSavedWeights) {
  SKIP_WITHOUT_PYTHON_TORCH();
  const std::string dir = freshBlobs("model-init");
  const std::string save = "import sys, torch\nsys.path.insert(0, '" +
                           std::string(FEDFLEET_SOURCE_DIR) +
                           "/examples/models')\nimport fedfleet_models\ntorch.manual_seed(5)\n"
                           "net = fedfleet_models.build('mlp', (4,), 3)\n"
                           "torch.save(dict(net.state_dict()), sys.argv[1])\n"
                           "torch.save(net.state_dict(), sys.argv[1] + '.ordered')\n";
  { std::ofstream(dir + "/save.py") << save; }
  ASSERT_EQ(run({"/usr/bin/python3", dir + "/save.py", dir + "/py.pt"}, dir + "/s.txt").code, 0);
  const double py = pythonAccuracy(dir, {dir + "/py.pt", "--format", "state_dict", "--model", "mlp",
                                         "--input", "4", "--classes", "3"});
  Ran sim = simulate(dir, {"--model", "mlp"}, 1, {"model.init=" + dir + "/py.pt"});
  ASSERT_EQ(sim.code, 0) << sim.log;
  EXPECT_NEAR(*roundsOf(dir + "/h.db").front().test_accuracy, py, 1e-4);

  // Export round 1 and start a second run (another name) from it.
  ASSERT_EQ(
      run({kBinary, "model", "export", "--db", dir + "/h.db", "-o", dir + "/r1.pt"}, dir + "/e.txt")
          .code,
      0);
  const double r1 = *roundsOf(dir + "/h.db").back().test_accuracy;
  sim = simulate(dir, {"--model", "mlp"}, 1, {"model.init=" + dir + "/r1.pt", "run.name=second"});
  ASSERT_EQ(sim.code, 0) << sim.log;
  EXPECT_NEAR(*roundsOf(dir + "/h.db").front().test_accuracy, r1, 1e-4);

  // Python's OrderedDict, which LibTorch cannot read: refused, saying how to save instead.
  sim =
      simulate(dir, {"--model", "mlp"}, 1, {"model.init=" + dir + "/py.pt.ordered", "run.name=y"});
  EXPECT_NE(sim.code, 0);
  EXPECT_THAT(sim.log, HasSubstr("torch.save(dict(net.state_dict()), path)"));

  // Weights of another model: refused before anything runs, naming the tensor.
  sim = simulate(dir, {"--model", "logreg"}, 1, {"model.init=" + dir + "/r1.pt", "run.name=x"});
  EXPECT_EQ(sim.code, 2) << sim.log;
  EXPECT_THAT(sim.log, HasSubstr("has no tensor fc.weight"));
}

}  // namespace
}  // namespace fedfleet
