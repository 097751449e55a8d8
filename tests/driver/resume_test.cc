// What --resume compares: the stored config (with changes accepted before) against the new one.
#include "driver/resume.h"

#include <gtest/gtest.h>

#include "common/config/config.h"
#include "common/history/history.h"

namespace fedfleet::driver {
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

// A history holding one run of `config`, with rounds 0..`rounds` ("ok" after round 0) and a
// checkpoint of `params` values after round `checkpoint_round` (none when 0).
std::unique_ptr<history::HistoryStore> recordedRun(const config::Config& config, uint32_t rounds,
                                                   uint32_t checkpoint_round, size_t params,
                                                   int64_t* run_id) {
  auto store = history::createMemoryHistory();
  history::RunRecord run;
  run.name = config.run.name;
  run.config_json = config.toJson().dump();
  *run_id = store->beginRun(run).value();
  for (uint32_t r = 0; r <= rounds; ++r) {
    history::RoundRecord rec;
    rec.run_id = *run_id;
    rec.round = r;
    rec.status = r == 0 ? "initial" : "ok";
    std::optional<history::CheckpointRecord> cp;
    if (r > 0 && r == checkpoint_round) {
      cp.emplace();
      cp->run_id = *run_id;
      cp->round = r;
      cp->model_version = 40 + r;
      cp->blob.assign(params * sizeof(float), '\0');
      cp->engine_state = "state-" + std::to_string(r);
    }
    EXPECT_TRUE(store->commitRound(rec, {}, cp).isOk());
  }
  return store;
}

config::Config namedRun(uint32_t rounds) {
  config::Config c;
  c.run.name = "resumable";
  c.run.rounds = rounds;
  return c;
}

TEST(ResumePoint, ContinuesAfterTheLastRoundFromTheLatestCheckpoint) {
  const config::Config c = namedRun(10);
  int64_t id = 0;
  auto store = recordedRun(c, /*rounds=*/4, /*checkpoint_round=*/3, 5, &id);
  auto point = findResumePoint(*store, c, 5);
  ASSERT_TRUE(point.isOk()) << point.status().toString();
  EXPECT_EQ(point->run_id, id);
  EXPECT_TRUE(point->already_finished.empty());
  EXPECT_TRUE(point->changes.empty());
  EXPECT_EQ(point->last_round, 4u);
  EXPECT_EQ(point->first_round, 5u);
  EXPECT_EQ(point->lost_rounds, 1u);  // round 4 changed the model after the last checkpoint
  ASSERT_TRUE(point->checkpoint.has_value());
  EXPECT_EQ(point->checkpoint->round, 3u);
  EXPECT_EQ(point->checkpoint->model_version, 43u);
  EXPECT_EQ(point->checkpoint->engine_state, "state-3");
}

TEST(ResumePoint, OnlyRoundZeroRecordedContinuesFromTheInitialModel) {
  const config::Config c = namedRun(10);
  int64_t id = 0;
  auto store = recordedRun(c, /*rounds=*/0, 0, 5, &id);
  auto point = findResumePoint(*store, c, 5);
  ASSERT_TRUE(point.isOk()) << point.status().toString();
  EXPECT_FALSE(point->checkpoint.has_value());
  EXPECT_EQ(point->first_round, 1u);
  EXPECT_FALSE(point->evaluate_initial);  // round 0 is recorded once
}

TEST(ResumePoint, WhatCannotBeResumedSaysWhatToDo) {
  const config::Config c = namedRun(4);
  int64_t id = 0;
  {
    auto store = recordedRun(c, 4, 4, 5, &id);
    auto point = findResumePoint(*store, c, 5);
    ASSERT_TRUE(point.isOk());
    EXPECT_NE(point->already_finished.find("already finished"), std::string::npos);
    EXPECT_NE(point->already_finished.find("raise run.rounds"), std::string::npos);
  }
  {
    auto store = recordedRun(c, 2, 2, 5, &id);
    config::Config other = c;
    other.run.name = "another";
    EXPECT_EQ(findResumePoint(*store, other, 5).status().code(), StatusCode::kNotFound);
    config::Config changed = c;
    changed.train.lr = c.train.lr * 2;
    auto refused = findResumePoint(*store, changed, 5);
    EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(refused.status().message().find("--resume-changes"), std::string::npos);
    changed.coordinator.resume_changes = true;
    auto accepted = findResumePoint(*store, changed, 5);
    ASSERT_TRUE(accepted.isOk());
    ASSERT_EQ(accepted->changes.size(), 1u);
    EXPECT_EQ(accepted->changes[0].key, "train.lr");
    auto other_model = findResumePoint(*store, c, 6);
    EXPECT_EQ(other_model.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(other_model.status().message().find("holds 5 values"), std::string::npos);
  }
  {
    auto store = recordedRun(c, 2, /*no checkpoint*/ 0, 5, &id);
    auto point = findResumePoint(*store, c, 5);
    EXPECT_EQ(point.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(point.status().message().find("no checkpoint"), std::string::npos);
  }
}

}  // namespace
}  // namespace fedfleet::driver
