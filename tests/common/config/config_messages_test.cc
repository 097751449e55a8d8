// What the config says when it refuses something, and where it looks for files: an unknown key
// gets the nearest known one, a value of the wrong type names the type the key takes, a
// config file's own files are found next to it, and a stored run's JSON config reads back into
// the same Config.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/config/config.h"

namespace fedfleet::config {
namespace {

std::string messageOf(const Status& st) { return st.isOk() ? "(ok)" : st.message(); }

TEST(ConfigMessages, AnUnknownKeySuggestsTheNearestOne) {
  Config c;
  EXPECT_NE(messageOf(c.set("train.lrr=0.1"))
                .find("unknown key 'train.lrr' (did you mean "
                      "'train.lr'?)"),
            std::string::npos)
      << messageOf(c.set("train.lrr=0.1"));
  // A key put in the wrong section: the section that has it.
  EXPECT_NE(messageOf(c.set("coordinator.rounds=3")).find("did you mean 'run.rounds'?"),
            std::string::npos)
      << messageOf(c.set("coordinator.rounds=3"));
  EXPECT_NE(messageOf(c.loadString("[coordinator]\nclient_per_round = 3\n", "f.toml"))
                .find("did you mean 'coordinator.clients_per_round'?"),
            std::string::npos);
  // A section misspelt.
  EXPECT_NE(messageOf(c.loadString("[trian]\nlr = 0.1\n", "f.toml"))
                .find("unknown section 'trian' (did you mean 'train'?)"),
            std::string::npos)
      << messageOf(c.loadString("[trian]\nlr = 0.1\n", "f.toml"));
  // Nothing near: no guess, the key named all the same.
  const std::string far = messageOf(c.set("train.completely_unrelated=1"));
  EXPECT_NE(far.find("unknown key 'train.completely_unrelated'"), std::string::npos) << far;
  EXPECT_EQ(far.find("did you mean"), std::string::npos) << far;
}

TEST(ConfigMessages, AValueOfTheWrongTypeNamesTheTypeTheKeyTakes) {
  Config c;
  const std::string rounds = messageOf(c.set("run.rounds=five"));
  EXPECT_NE(rounds.find("'run.rounds' must be a non-negative integer; got five"), std::string::npos)
      << rounds;
  EXPECT_EQ(rounds.find("boolean"), std::string::npos) << rounds;  // not the TOML parser's guess
  const std::string lr = messageOf(c.set("train.lr=fast"));
  EXPECT_NE(lr.find("'train.lr' must be a number; got fast"), std::string::npos) << lr;
  const std::string flag = messageOf(c.set("sim.batch_clients=yes"));
  EXPECT_NE(flag.find("'sim.batch_clients' must be a boolean; got yes"), std::string::npos) << flag;
  // A bare word where a string goes is still a string.
  ASSERT_TRUE(c.set("model.name=cnn").isOk());
  EXPECT_EQ(c.model.name, "cnn");
}

TEST(ConfigMessages, AConfigFileFindsItsFilesNextToIt) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(FEDFLEET_TEST_TMP) / "config-relative" / "job";
  fs::create_directories(dir);
  std::ofstream(dir / "job.toml") << "[model]\nname = \"torchscript\"\npath = \"net.pt\"\n"
                                     "init = \"/abs/w.pt\"\n"
                                     "[data]\nformat = \"csv\"\npath = \"data/train.csv\"\n"
                                     "test_path = \"../shared/test.csv\"\n"
                                     "[sim]\nfleet = \"fleets/phones.csv\"\n"
                                     "[history]\ndb = \"run.db\"\n";
  Config c;
  ASSERT_TRUE(c.loadFile((dir / "job.toml").string()).isOk());
  EXPECT_EQ(c.model.path, (dir / "net.pt").string());
  EXPECT_EQ(c.model.init, "/abs/w.pt");  // absolute: as it is
  EXPECT_EQ(c.data.path, (dir / "data/train.csv").string());
  EXPECT_EQ(c.data.test_path, (dir.parent_path() / "shared/test.csv").string());
  EXPECT_EQ(c.sim.fleet, (dir / "fleets/phones.csv").string());
  EXPECT_EQ(c.history.db, "run.db");  // where the run writes: the working directory
  // A built-in fleet name is not a file; an override is relative to the working directory.
  std::ofstream(dir / "named.toml") << "[sim]\nfleet = \"mobile-mix\"\n";
  Config d;
  ASSERT_TRUE(d.loadFile((dir / "named.toml").string()).isOk());
  EXPECT_EQ(d.sim.fleet, "mobile-mix");
  ASSERT_TRUE(d.set("model.path=here.pt").isOk());
  EXPECT_EQ(d.model.path, "here.pt");
}

TEST(ConfigMessages, AStoredJsonConfigReadsBackTheSame) {
  Config c;
  ASSERT_TRUE(c.set("run.rounds=17").isOk());
  ASSERT_TRUE(c.set("train.lr=0.0123").isOk());
  ASSERT_TRUE(c.set("model.local=[\"bn.*\", \"head.*\"]").isOk());
  ASSERT_TRUE(c.set("data.image_size=[28, 30]").isOk());
  ASSERT_TRUE(c.set("data.mean=[0.5, 1e-07]").isOk());
  ASSERT_TRUE(c.set("run.name=\"a \\\"quoted\\\" name\"").isOk());
  ASSERT_TRUE(c.set("coordinator.max_samples_per_update=18446744073709").isOk());
  Config d;
  ASSERT_TRUE(d.loadJson(c.toJson(), "stored").isOk());
  EXPECT_EQ(d.toJson(), c.toJson());
  EXPECT_EQ(d.run.name, "a \"quoted\" name");
  // A key an older build wrote and this one no longer has is passed over; a bad value is not.
  nlohmann::json old = c.toJson();
  old["train"]["retired_key"] = 3;
  EXPECT_TRUE(Config().loadJson(old, "stored").isOk());
  old["train"]["lr"] = "fast";
  const Status bad = Config().loadJson(old, "stored");
  EXPECT_NE(messageOf(bad).find("train.lr"), std::string::npos) << messageOf(bad);
}

}  // namespace
}  // namespace fedfleet::config
