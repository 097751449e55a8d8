// What --resume compares: the stored config (with changes accepted before) against the new one.
#include "coordinator/resume.h"

#include <gtest/gtest.h>

#include "common/config/config.h"

namespace fedfleet::coordinator {
namespace {

history::EventRecord changesEvent(const std::vector<ConfigChange>& changes) {
  history::EventRecord e;
  e.kind = "resume_changes";
  e.detail = changesDetail(changes);
  return e;
}

TEST(Resume, TheSameConfigHasNoChangesWhateverTheOperationalKeysSay) {
  config::Config a;
  config::Config b = a;
  b.coordinator.bind = "tcp://127.0.0.1:7800";
  b.coordinator.resume = true;
  b.coordinator.keys_dir = "/etc/fedfleet/keys";
  b.coordinator.threads = 4;
  b.coordinator.wait_clients_s = 30;
  b.history.db = "/var/lib/fedfleet/h.db";
  b.metrics.port = 9100;
  b.client.id = "someone";
  EXPECT_TRUE(configChanges(a.toJson(), b.toJson()).empty());
}

TEST(Resume, ChangesThatAlterTheRunAreListedInKeyOrder) {
  config::Config a;
  config::Config b = a;
  b.run.rounds = 8;
  b.coordinator.clients_per_round = 3;
  b.train.lr = 0.1;
  b.model.name = "cnn";
  auto changes = configChanges(a.toJson(), b.toJson());
  ASSERT_EQ(changes.size(), 4u);
  EXPECT_EQ(changes[0].key, "coordinator.clients_per_round");
  EXPECT_EQ(changes[1].key, "model.name");
  EXPECT_EQ(changes[2].key, "run.rounds");
  EXPECT_EQ(changes[3].key, "train.lr");
  EXPECT_EQ(changes[2].from, 5);
  EXPECT_EQ(changes[2].to, 8);
  EXPECT_EQ(describeChanges({changes[2], changes[1]}),
            "run.rounds 5 -> 8, model.name \"mlp\" -> \"cnn\"");
}

TEST(Resume, NumbersCompareByValueAndKeysAnOlderBuildLackedAreNoChange) {
  nlohmann::json stored = {{"run", {{"rounds", 5}}}, {"train", {{"lr", 0.05}}}};
  nlohmann::json now = {{"run", {{"rounds", 5.0}, {"target_accuracy", 0.9}}},
                        {"train", {{"lr", 0.05}}},
                        {"limits", {{"max_loss", 10}}}};
  EXPECT_TRUE(configChanges(stored, now).empty());
}

TEST(Resume, AcceptedChangesAreTheBaselineOfTheNextResume) {
  config::Config a;
  history::RunRecord run;
  run.run_id = 3;
  run.config_json = a.toJson().dump();
  config::Config b = a;
  b.run.rounds = 8;
  b.coordinator.clients_per_round = 4;
  const auto first = configChanges(a.toJson(), b.toJson());
  ASSERT_EQ(first.size(), 2u);
  // Events of other kinds are ignored; the recorded changes are applied in order.
  history::EventRecord other;
  other.kind = "client_joined";
  other.detail = "not json";
  config::Config c = b;
  c.run.rounds = 12;
  const auto second = configChanges(b.toJson(), c.toJson());
  auto effective = effectiveRunConfig(run, {changesEvent(first), other, changesEvent(second)});
  ASSERT_TRUE(effective.isOk()) << effective.status().toString();
  EXPECT_TRUE(configChanges(*effective, c.toJson()).empty());
  EXPECT_EQ((*effective)["run"]["rounds"], 12);
  EXPECT_EQ((*effective)["coordinator"]["clients_per_round"], 4);
  // Against the original config the run changed in both.
  EXPECT_EQ(configChanges(a.toJson(), c.toJson()).size(), 2u);
}

TEST(Resume, AStoredConfigOrChangeThatIsNotOursIsCorrupt) {
  history::RunRecord run;
  run.run_id = 1;
  run.config_json = "[1, 2";
  EXPECT_EQ(effectiveRunConfig(run, {}).status().code(), StatusCode::kCorrupt);
  run.config_json = "{}";
  history::EventRecord e;
  e.kind = "resume_changes";
  e.detail = R"({"run.rounds": 8})";
  auto r = effectiveRunConfig(run, {e});
  EXPECT_EQ(r.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(r.status().message().find("run.rounds"), std::string::npos);
}

}  // namespace
}  // namespace fedfleet::coordinator
