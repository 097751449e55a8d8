#include "common/config/config.h"

#include <gtest/gtest.h>

#include <fstream>

namespace fedfleet::config {
namespace {

TEST(Config, DefaultsValidate) {
  Config c;
  EXPECT_TRUE(c.validate().isOk()) << c.validate().toString();
  EXPECT_EQ(c.minClients(), 2u);
  EXPECT_EQ(c.quorum(), 1u);  // ceil(2 / 2)
  EXPECT_EQ(c.partitions(), 2u);
  EXPECT_EQ(c.allowDir(), "keys/clients");
}

TEST(Config, LoadsEverySectionFromToml) {
  Config c;
  Status st = c.loadString(R"(
[run]
name = "exp"
seed = 9
rounds = 12
[coordinator]
clients_per_round = 5
quorum = 3
deadline_s = 2.5
insecure = true
[model]
name = "cnn"
[data]
partition = "labels"
labels_per_client = 3
partitions = 20
[train]
lr = 0.1
batch = 64
momentum = 0.9
[client]
threads = 2
partition = 4
[history]
db = "x.db"
)",
                           "test.toml");
  ASSERT_TRUE(st.isOk()) << st.toString();
  EXPECT_EQ(c.run.name, "exp");
  EXPECT_EQ(c.run.seed, 9u);
  EXPECT_EQ(c.run.rounds, 12u);
  EXPECT_EQ(c.coordinator.clients_per_round, 5u);
  EXPECT_EQ(c.quorum(), 3u);
  EXPECT_DOUBLE_EQ(c.coordinator.deadline_s, 2.5);
  EXPECT_TRUE(c.coordinator.insecure);
  EXPECT_EQ(c.model.name, "cnn");
  EXPECT_EQ(c.data.labels_per_client, 3u);
  EXPECT_EQ(c.partitions(), 20u);
  EXPECT_DOUBLE_EQ(c.train.lr, 0.1);
  EXPECT_EQ(c.train.batch, 64u);
  EXPECT_EQ(c.client.partition, 4);
  EXPECT_EQ(c.history.db, "x.db");
  EXPECT_TRUE(c.validate().isOk()) << c.validate().toString();
}

TEST(Config, UnknownKeysAndSectionsAreErrorsNamingThem) {
  Config c;
  Status st = c.loadString("[train]\nlearning_rate = 0.1\n", "f.toml");
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("train.learning_rate"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("f.toml:2"), std::string::npos) << st.message();
  st = c.loadString("[trian]\nlr = 0.1\n", "f.toml");
  EXPECT_NE(st.message().find("unknown section 'trian'"), std::string::npos) << st.message();
}

TEST(Config, WrongTypesAndRangesAreErrors) {
  Config c;
  EXPECT_FALSE(c.loadString("[train]\nlr = \"fast\"\n", "t").isOk());
  EXPECT_FALSE(c.loadString("[run]\nrounds = -3\n", "t").isOk());
  EXPECT_FALSE(c.loadString("[run]\nrounds = 1.5\n", "t").isOk());
  EXPECT_FALSE(c.loadString("[run]\nrounds = 99999999999\n", "t").isOk());
  EXPECT_FALSE(c.loadString("[run\n", "t").isOk());  // syntax error
  Config d;
  ASSERT_TRUE(d.loadString("[coordinator]\nclients_per_round = 2\nquorum = 3\n", "t").isOk());
  Status v = d.validate();
  EXPECT_FALSE(v.isOk());
  EXPECT_NE(v.message().find("coordinator.quorum"), std::string::npos) << v.message();
  Config e;
  ASSERT_TRUE(e.set("model.name=resnet").isOk());
  EXPECT_NE(e.validate().message().find("model.name"), std::string::npos);
  Config g;
  ASSERT_TRUE(g.set("train.lr=0").isOk());
  EXPECT_FALSE(g.validate().isOk());
}

// sim.batch_clients: off by default (the golden histories are per-client training's), a boolean
// from [sim] or --set, anything else an error naming the key.
TEST(Config, BatchClientsIsOffByDefaultAndABoolean) {
  Config c;
  EXPECT_FALSE(c.sim.batch_clients);
  ASSERT_TRUE(c.loadString("[sim]\nbatch_clients = true\n", "t").isOk());
  EXPECT_TRUE(c.sim.batch_clients);
  EXPECT_TRUE(c.validate().isOk());
  ASSERT_TRUE(c.set("sim.batch_clients=false").isOk());
  EXPECT_FALSE(c.sim.batch_clients);
  Config d;
  Status st = d.loadString("[sim]\nbatch_clients = \"yes\"\n", "t");
  ASSERT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("sim.batch_clients"), std::string::npos) << st.message();
}

// [decentralized]: read from TOML, every range an error naming its key, and a decentralised run
// cannot be resumed (the peers hold the models; nothing would be continued).
TEST(Config, DecentralizedSectionIsReadAndChecked) {
  Config c;
  ASSERT_TRUE(c.loadString("[policy]\nmode = \"decentralized\"\n[decentralized]\n"
                           "algorithm = \"prague\"\npeers = 6\ngroup_size = 3\npipeline = 2\n",
                           "t")
                  .isOk());
  EXPECT_EQ(c.decentralized.algorithm, "prague");
  EXPECT_EQ(c.decentralized.peers, 6u);
  EXPECT_EQ(c.decentralized.group_size, 3u);
  EXPECT_TRUE(c.validate().isOk());
  auto refused = [](const std::string& assignment, const std::string& key) {
    Config d;
    ASSERT_TRUE(d.set("policy.mode=decentralized").isOk());
    ASSERT_TRUE(d.set(assignment).isOk()) << assignment;
    Status st = d.validate();
    ASSERT_FALSE(st.isOk()) << assignment;
    EXPECT_NE(st.message().find(key), std::string::npos) << st.message();
  };
  refused("decentralized.algorithm=gossip", "decentralized.algorithm");
  refused("decentralized.peers=1", "decentralized.peers");
  refused("decentralized.pipeline=3", "decentralized.pipeline");
  refused("decentralized.codec=zip", "decentralized.codec");
  refused("decentralized.codec=lowrank:4", "decentralized.codec");
  {
    Config r;  // the degree of a random regular graph is below the peer count
    ASSERT_TRUE(r.set("policy.mode=decentralized").isOk());
    ASSERT_TRUE(r.set("decentralized.topology=random").isOk());
    ASSERT_TRUE(r.set("decentralized.degree=16").isOk());
    EXPECT_NE(r.validate().message().find("decentralized.degree"), std::string::npos);
  }
  Config few;  // a ring of 4 peers: the default degree (4) is the random topology's only
  ASSERT_TRUE(few.set("policy.mode=decentralized").isOk());
  ASSERT_TRUE(few.set("decentralized.peers=4").isOk());
  EXPECT_TRUE(few.validate().isOk()) << few.validate().message();
  refused("decentralized.outer_momentum=1", "decentralized.outer_momentum");
  refused("coordinator.resume=true", "coordinator.resume");
  Config star;  // a star run resumes as before
  ASSERT_TRUE(star.set("coordinator.resume=true").isOk());
  EXPECT_TRUE(star.validate().isOk());
}

// client.local_dp_min_noise: off by default, read from [client], and a negative floor is an
// error naming the key.
TEST(Config, TheLocalDpFloorIsOffByDefaultAndChecked) {
  Config c;
  EXPECT_EQ(c.client.local_dp_min_noise, 0.0);
  ASSERT_TRUE(c.loadString("[client]\nlocal_dp_min_noise = 1.5\n", "t").isOk());
  EXPECT_EQ(c.client.local_dp_min_noise, 1.5);
  EXPECT_TRUE(c.validate().isOk()) << c.validate().toString();
  Config d;
  ASSERT_TRUE(d.set("client.local_dp_min_noise=-0.5").isOk());
  EXPECT_NE(d.validate().message().find("client.local_dp_min_noise"), std::string::npos)
      << d.validate().toString();
}

// train.optimizer and model.local: names, and the combinations that cannot work, are start-up
// errors naming the key.
TEST(Config, OptimizerAndLocalPartCombinationsAreChecked) {
  const auto invalid = [](std::vector<std::string> sets) {
    Config c;
    for (const auto& s : sets) EXPECT_TRUE(c.set(s).isOk()) << s;
    return c.validate();
  };
  EXPECT_TRUE(invalid({"train.optimizer=adamw", "train.weight_decay=0.01"}).isOk());
  EXPECT_NE(invalid({"train.optimizer=rmsprop"}).message().find("train.optimizer"),
            std::string::npos);
  EXPECT_NE(
      invalid({"train.optimizer=adam", "train.momentum=0.9"}).message().find("train.momentum"),
      std::string::npos);
  EXPECT_NE(invalid({"train.optimizer=adam", "aggregation.method=fednova"})
                .message()
                .find("FedNova normalises SGD steps"),
            std::string::npos);
  EXPECT_TRUE(invalid({"model.local=[\"fc3.*\"]"}).isOk());
  EXPECT_NE(invalid({"model.local=[\"\"]"}).message().find("empty pattern"), std::string::npos);
  EXPECT_NE(invalid({"model.local=[\"fc3.*\"]", "aggregation.method=scaffold"})
                .message()
                .find("model.local"),
            std::string::npos);
}

// train.loss against data.task, and what a regression can read and how it can be split.
TEST(Config, LossAndTaskCombinationsAreChecked) {
  const auto invalid = [](std::vector<std::string> sets) {
    Config c;
    for (const auto& s : sets) EXPECT_TRUE(c.set(s).isOk()) << s;
    return c.validate().message();
  };
  const std::vector<std::string> csv = {"data.format=csv", "data.path=a.csv",
                                        "data.test_path=b.csv"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), csv.begin(), csv.end());
    return more;
  };
  EXPECT_EQ(invalid(with({"data.task=regression", "train.loss=mse", "data.partition=iid"})), "");
  EXPECT_EQ(invalid(with({"train.loss=bce"})), "");
  EXPECT_NE(invalid({"train.loss=hinge"}).find("train.loss"), std::string::npos);
  Config ranking;
  EXPECT_NE(ranking.set("data.task=ranking").message().find("'data.task' must be one of"),
            std::string::npos);
  EXPECT_NE(invalid(with({"train.loss=mse"})).find("set data.task = \"regression\""),
            std::string::npos);
  EXPECT_NE(invalid(with({"data.task=regression", "data.partition=iid"}))
                .find("\"cross_entropy\" needs class labels"),
            std::string::npos)
      << "the default loss with a regression";
  EXPECT_NE(invalid(with({"data.task=regression", "train.loss=mse"})).find("splits by class label"),
            std::string::npos)
      << "the default dirichlet partition needs labels";
  EXPECT_NE(invalid({"data.task=regression", "train.loss=mse", "data.partition=iid"})
                .find("reads float targets from csv"),
            std::string::npos)
      << "Fashion-MNIST holds class labels";
  EXPECT_NE(invalid({"train.loss=module"}).find("is built in"), std::string::npos);
  EXPECT_EQ(invalid({"model.name=torchscript", "model.path=m.pt", "train.loss=module"}), "");
  EXPECT_EQ(invalid(with({"data.num_classes=70000"})), "") << "many classes";
  EXPECT_NE(invalid(with({"data.num_classes=2000000"})).find("data.num_classes"),
            std::string::npos);
}

TEST(Config, MetricsSectionIsOffAndLoopbackByDefaultAndChecked) {
  Config c;
  EXPECT_EQ(c.metrics.port, 0u);
  EXPECT_EQ(c.metrics.bind, "127.0.0.1");
  ASSERT_TRUE(c.loadString("[metrics]\nport = 9464\nbind = \"0.0.0.0\"\n", "m").isOk());
  EXPECT_EQ(c.metrics.port, 9464u);
  EXPECT_EQ(c.metrics.bind, "0.0.0.0");
  EXPECT_TRUE(c.validate().isOk());
  Status unknown = c.loadString("[metrics]\npath = \"/m\"\n", "m");
  EXPECT_NE(unknown.message().find("unknown key 'metrics.path'"), std::string::npos)
      << unknown.message();
  ASSERT_TRUE(c.set("metrics.port=70000").isOk());
  Status v = c.validate();
  EXPECT_FALSE(v.isOk());
  EXPECT_NE(v.message().find("metrics.port"), std::string::npos) << v.message();
  EXPECT_FALSE(c.set("metrics.port=-1").isOk());
}

TEST(Config, BlocksSectionIsOffByDefaultAndChecked) {
  Config c;
  EXPECT_EQ(c.blocks.count, 0u);
  ASSERT_TRUE(c.set("blocks.count=4").isOk());
  Status v = c.validate();  // neither a block length in rounds nor in seconds
  EXPECT_NE(v.message().find("blocks.rounds_per_block"), std::string::npos) << v.toString();
  ASSERT_TRUE(c.set("blocks.rounds_per_block=5").isOk());
  ASSERT_TRUE(c.set("blocks.mode=multichain").isOk());
  EXPECT_TRUE(c.validate().isOk()) << c.validate().toString();
  ASSERT_TRUE(c.set("blocks.block_s=60").isOk());  // both lengths: which one?
  EXPECT_FALSE(c.validate().isOk());
  ASSERT_TRUE(c.set("blocks.block_s=0").isOk());
  v = c.set("blocks.mode=plural");
  EXPECT_NE(v.message().find("'blocks.mode' must be one of single, pluralistic, multichain"),
            std::string::npos)
      << v.toString();
  EXPECT_EQ(c.blocks.mode, BlocksMode::kMultichain);  // the refused value changed nothing
  ASSERT_TRUE(c.set("blocks.mode=multichain").isOk());
  ASSERT_TRUE(c.set("aggregation.server_optimizer=fedadam").isOk());
  EXPECT_NE(c.validate().message().find("multichain"), std::string::npos);
  ASSERT_TRUE(c.set("aggregation.server_optimizer=fedavg").isOk());
  ASSERT_TRUE(c.set("policy.mode=async").isOk());
  EXPECT_NE(c.validate().message().find("policy.mode"), std::string::npos);
  ASSERT_TRUE(c.set("policy.mode=sync").isOk());
  ASSERT_TRUE(c.set("blocks.skew=1.2").isOk());
  EXPECT_NE(c.validate().message().find("blocks.skew"), std::string::npos);
  ASSERT_TRUE(c.set("blocks.skew=0.8").isOk());
  ASSERT_TRUE(c.set("blocks.count=11").isOk());  // more blocks than Fashion-MNIST classes
  EXPECT_NE(c.validate().message().find("blocks.count"), std::string::npos);
}

TEST(Config, SetOverridesAcceptTomlAndBareWords) {
  Config c;
  ASSERT_TRUE(c.set("train.lr=0.25").isOk());
  ASSERT_TRUE(c.set("model.name=cnn").isOk());
  ASSERT_TRUE(c.set("coordinator.bind=tcp://0.0.0.0:9000").isOk());
  ASSERT_TRUE(c.set("coordinator.insecure=true").isOk());
  EXPECT_DOUBLE_EQ(c.train.lr, 0.25);
  EXPECT_EQ(c.model.name, "cnn");
  EXPECT_EQ(c.coordinator.bind, "tcp://0.0.0.0:9000");
  EXPECT_TRUE(c.coordinator.insecure);
  EXPECT_FALSE(c.set("nodot=1").isOk());
  EXPECT_FALSE(c.set("train.nope=1").isOk());
  EXPECT_FALSE(c.set("run.rounds=many").isOk());  // a string where a number belongs
}

TEST(Config, BindAddressesAreZeroMqEndpointsWithAPortInRange) {
  for (const char* good :
       {"tcp://127.0.0.1:7700", "tcp://0.0.0.0:1", "tcp://*:65535", "tcp://127.0.0.1:*",
        "tcp://coordinator:7700", "tcp://[::1]:7700", "ipc:///tmp/fedfleet.sock"}) {
    Config c;
    c.coordinator.bind = good;
    EXPECT_TRUE(c.validate().isOk()) << good << ": " << c.validate().toString();
  }
  Config c;
  c.coordinator.bind = "tcp://127.0.0.1:99999";
  Status st = c.validate();
  ASSERT_FALSE(st.isOk());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("coordinator.bind"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("1-65535"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("99999"), std::string::npos) << st.message();
  for (const char* bad : {"tcp://127.0.0.1:0", "tcp://127.0.0.1:", "tcp://127.0.0.1", "tcp://:7700",
                          "tcp://127.0.0.1:77x", "tcp://::1:7700", "udp://127.0.0.1:7700",
                          "127.0.0.1:7700", "ipc://", ""}) {
    c.coordinator.bind = bad;
    st = c.validate();
    EXPECT_FALSE(st.isOk()) << bad;
    EXPECT_NE(st.message().find("coordinator.bind"), std::string::npos)
        << bad << ": " << st.message();
  }
  c.coordinator.bind = "tcp://127.0.0.1:7700";
  for (const char* good : {"127.0.0.1", "0.0.0.0", "::1", "localhost"}) {
    c.metrics.bind = good;
    EXPECT_TRUE(c.validate().isOk()) << good << ": " << c.validate().toString();
  }
  for (const char* bad : {"127.0.0.1:9100", "http://127.0.0.1", "tcp://0.0.0.0:9100"}) {
    c.metrics.bind = bad;
    st = c.validate();
    EXPECT_FALSE(st.isOk()) << bad;
    EXPECT_NE(st.message().find("metrics.bind"), std::string::npos) << bad << ": " << st.message();
  }
}

TEST(Config, FileThenOverride) {
  std::string path = std::string(FEDFLEET_TEST_TMP) + "/config_test.toml";
  std::ofstream(path) << "[run]\nrounds = 7\n[train]\nlr = 0.3\n";
  Config c;
  ASSERT_TRUE(c.loadFile(path).isOk());
  ASSERT_TRUE(c.set("run.rounds=9").isOk());
  EXPECT_EQ(c.run.rounds, 9u);
  EXPECT_DOUBLE_EQ(c.train.lr, 0.3);
  Status missing = c.loadFile(path + ".missing");
  EXPECT_FALSE(missing.isOk());
}

TEST(Config, JsonHoldsEveryKey) {
  Config c;
  auto j = c.toJson();
  for (const auto& key : Config::keys()) {
    auto dot = key.find('.');
    EXPECT_TRUE(j[key.substr(0, dot)].contains(key.substr(dot + 1))) << key;
  }
  EXPECT_EQ(j["train"]["batch"], 32);
}

// Policies, aggregators and selectors by name; bad names and values fail at start-up
// with the key in the message.
TEST(Config, PolicyAggregationAndSelectionAreChosenByName) {
  Config c;
  ASSERT_TRUE(c.loadString(R"(
[policy]
mode = "async"
async_concurrency = 20
async_buffer = 10
max_staleness = 4
[aggregation]
server_optimizer = "fedyogi"
beta2 = 0.999
[selection]
selector = "oort"
explore_min = 0.1
[train]
prox_mu = 0.5
)",
                           "t.toml")
                  .isOk());
  ASSERT_TRUE(c.validate().isOk()) << c.validate().toString();
  EXPECT_EQ(c.policy.mode.name(), "async");
  EXPECT_EQ(c.policy.async_buffer, 10u);
  EXPECT_EQ(c.aggregation.server_optimizer.name(), "fedyogi");
  EXPECT_DOUBLE_EQ(c.aggregation.beta2, 0.999);
  EXPECT_EQ(c.selection.selector.name(), "oort");
  EXPECT_DOUBLE_EQ(c.train.prox_mu, 0.5);

  struct Bad {
    const char* set;
    const char* key;
  };
  for (const Bad& b :
       {Bad{"policy.mode=\"sometimes\"", "policy.mode"},
        Bad{"policy.deadline=\"soon\"", "policy.deadline"},
        Bad{"policy.deadline_percentile=1.5", "policy.deadline_percentile"},
        Bad{"policy.async_buffer=0", "policy.async_buffer"},
        Bad{"aggregation.method=\"fedsomething\"", "aggregation.method"},
        Bad{"aggregation.server_optimizer=\"sgd\"", "aggregation.server_optimizer"},
        Bad{"aggregation.trim_fraction=0.5", "aggregation.trim_fraction"},
        Bad{"selection.selector=\"random\"", "selection.selector"},
        Bad{"train.prox_mu=-1", "train.prox_mu"}, Bad{"sim.stragglers=1.5", "sim.stragglers"},
        Bad{"sim.straggler_mode=\"late\"", "sim.straggler_mode"},
        Bad{"run.target_accuracy=80", "run.target_accuracy"}}) {
    // Refused when read (a name no choice has) or when checked (a value out of range).
    Config d;
    Status st = d.set(b.set);
    if (st.isOk()) st = d.validate();
    ASSERT_FALSE(st.isOk()) << b.set;
    EXPECT_NE(st.message().find(b.key), std::string::npos) << st.message();
  }
  // Combinations that cannot work are refused too.
  Config async_nova;
  ASSERT_TRUE(async_nova.set("policy.mode=\"async\"").isOk());
  ASSERT_TRUE(async_nova.set("aggregation.method=\"fednova\"").isOk());
  EXPECT_NE(async_nova.validate().message().find("aggregation.method"), std::string::npos);
  Config scaffold_topk;
  ASSERT_TRUE(scaffold_topk.set("aggregation.method=\"scaffold\"").isOk());
  ASSERT_TRUE(scaffold_topk.set("coordinator.codec=\"topk:0.01\"").isOk());
  EXPECT_NE(scaffold_topk.validate().message().find("coordinator.codec"), std::string::npos);
}

TEST(Config, SimPrecisionIsFp32UnlessAskedAndOnlyKnownValuesPass) {
  Config c;
  EXPECT_EQ(c.sim.precision, "fp32");
  EXPECT_EQ(c.toJson()["sim"]["precision"], "fp32");
  ASSERT_TRUE(c.set("sim.precision=\"bf16\"").isOk());
  EXPECT_EQ(c.sim.precision, "bf16");
  EXPECT_TRUE(c.validate().isOk()) << c.validate().toString();
  for (const char* bad :
       {"sim.precision=\"fp16\"", "sim.precision=\"BF16\"", "sim.precision=\"\""}) {
    Config d;
    ASSERT_TRUE(d.set(bad).isOk()) << bad;
    const Status st = d.validate();
    ASSERT_FALSE(st.isOk()) << bad;
    EXPECT_NE(st.message().find("sim.precision"), std::string::npos) << st.message();
  }
}

TEST(Config, ClaimAndRobustnessBoundsHaveDefaultsAndAreChecked) {
  Config c;
  EXPECT_EQ(c.coordinator.max_samples_per_update, 1000000u);
  EXPECT_DOUBLE_EQ(c.aggregation.norm_bound, 5);
  EXPECT_EQ(c.aggregation.norm_bound_action.name(), "clip");
  EXPECT_DOUBLE_EQ(c.aggregation.weight_cap, 10);
  EXPECT_EQ(c.limits.events_per_client_round, 20u);
  EXPECT_DOUBLE_EQ(c.limits.max_loss, 1e6);
  EXPECT_EQ(c.aggregation.norm_window, 5u);
  EXPECT_DOUBLE_EQ(c.aggregation.norm_growth, 2);
  EXPECT_EQ(c.aggregation.quarantine_after, 2u);
  EXPECT_EQ(c.aggregation.quarantine_rounds, 10u);
  EXPECT_DOUBLE_EQ(c.limits.events_burst, 30);
  EXPECT_DOUBLE_EQ(c.limits.events_every_s, 10);
  EXPECT_DOUBLE_EQ(c.sim.attackers, 0);
  const nlohmann::json j = c.toJson();
  EXPECT_EQ(j["aggregation"]["quarantine_rounds"], 10);
  EXPECT_EQ(j["limits"]["events_every_s"], 10.0);
  EXPECT_EQ(j["aggregation"]["norm_bound_action"], "clip");
  EXPECT_EQ(j["limits"]["events_per_client_round"], 20);
  EXPECT_EQ(j["coordinator"]["max_samples_per_update"], 1000000);
  EXPECT_EQ(c.dp.mode.name(), "none");
  EXPECT_EQ(j["dp"]["delta"], 1e-5);

  ASSERT_TRUE(c.loadString("[aggregation]\nnorm_bound = 3.5\nnorm_bound_action = \"reject\"\n"
                           "weight_cap = 0\n[limits]\nevents_per_client_round = 4\n"
                           "max_loss = 50.0\n[coordinator]\nmax_samples_per_update = 0\n",
                           "test")
                  .isOk());
  EXPECT_TRUE(c.validate().isOk());  // 0 samples bound: checked against partition sizes later
  EXPECT_DOUBLE_EQ(c.aggregation.norm_bound, 3.5);
  EXPECT_EQ(c.aggregation.norm_bound_action.name(), "reject");
  EXPECT_DOUBLE_EQ(c.aggregation.weight_cap, 0);
  EXPECT_EQ(c.limits.events_per_client_round, 4u);
  EXPECT_DOUBLE_EQ(c.limits.max_loss, 50);
  EXPECT_EQ(c.coordinator.max_samples_per_update, 0u);

  struct Bad {
    const char* set;
    const char* key;
  };
  for (const Bad& b :
       {Bad{"aggregation.norm_bound=0.5", "aggregation.norm_bound"},
        Bad{"aggregation.norm_bound=-1", "aggregation.norm_bound"},
        Bad{"aggregation.norm_bound_action=\"scale\"", "aggregation.norm_bound_action"},
        Bad{"aggregation.weight_cap=0.9", "aggregation.weight_cap"},
        Bad{"limits.events_per_client_round=0", "limits.events_per_client_round"},
        Bad{"limits.max_loss=0", "limits.max_loss"}, Bad{"dp.mode=\"shuffled\"", "dp.mode"},
        Bad{"aggregation.norm_window=0", "aggregation.norm_window"},
        Bad{"aggregation.norm_growth=0.5", "aggregation.norm_growth"},
        Bad{"limits.events_burst=-1", "limits.events_burst"},
        Bad{"limits.events_every_s=-1", "limits.events_every_s"},
        Bad{"sim.attackers=1.5", "sim.attackers"}}) {
    // Refused when read (a name no choice has) or when checked (a value out of range).
    Config d;
    Status st = d.set(b.set);
    if (st.isOk()) st = d.validate();
    ASSERT_FALSE(st.isOk()) << b.set;
    EXPECT_NE(st.message().find(b.key), std::string::npos) << st.message();
  }
  Config unknown;
  EXPECT_FALSE(unknown.set("limits.events_per_round=3").isOk());
}

}  // namespace
}  // namespace fedfleet::config

namespace fedfleet::config {
namespace {

Status dataConfig(const std::string& toml, Config* out = nullptr) {
  Config c;
  Status st = c.loadString("[data]\n" + toml, "d.toml");
  if (st.isOk()) st = c.validate();
  if (out) *out = c;
  return st;
}

TEST(ConfigData, FileFormatsNeedTheirFilesAndATestSet) {
  Config c;
  ASSERT_TRUE(dataConfig("format = \"csv\"\npath = \"t.csv\"\ntest_path = \"e.csv\"\n"
                         "label_column = \"y\"\nfeature_columns = [\"a\", \"b\"]\n",
                         &c)
                  .isOk());
  EXPECT_EQ(c.dataFormatName(), "csv");
  EXPECT_EQ(c.data.feature_columns, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(c.toJson()["data"]["feature_columns"], nlohmann::json::array({"a", "b"}));
  EXPECT_TRUE(dataConfig("format = \"csv\"\npath = \"t.csv\"\nholdout_fraction = 0.2\n").isOk());
  EXPECT_TRUE(dataConfig("format = \"idx\"\npath = \"i\"\nlabels_path = \"l\"\n"
                         "test_path = \"ti\"\ntest_labels_path = \"tl\"\n")
                  .isOk());
  // The older key still names the format.
  ASSERT_TRUE(dataConfig("dataset = \"synthetic\"\n", &c).isOk());
  EXPECT_EQ(c.dataFormatName(), "synthetic");

  struct Case {
    const char* toml;
    const char* expected;
  };
  const Case cases[] = {
      {"format = \"parquet\"\n", "'data.format' must be one of fashion-mnist, idx, csv"},
      {"format = \"csv\"\n", "'data.path' is required"},
      {"format = \"csv\"\npath = \"t.csv\"\n", "data.test_path' or data.holdout_fraction"},
      {"format = \"csv\"\npath = \"t\"\nholdout_fraction = 1\n", "must be in [0, 1)"},
      {"format = \"csv\"\npath = \"t\"\ntest_path = \"e\"\nholdout_fraction = 0.1\n",
       "must be 0 when data.test_path"},
      {"format = \"idx\"\npath = \"i\"\ntest_path = \"t\"\n", "'data.labels_path' is required"},
      {"format = \"idx\"\npath = \"i\"\nlabels_path = \"l\"\ntest_path = \"t\"\n",
       "'data.test_labels_path' is required"},
      {"format = \"idx\"\npath = \"i\"\nlabels_path = \"l\"\nholdout_fraction = 0.1\n"
       "feature_columns = [\"a\"]\n",
       "'data.feature_columns' is not read with data.format = \"idx\""},
      {"path = \"t.csv\"\n", "'data.path' is not read with data.format = \"fashion-mnist\""},
      {"format = \"csv\"\ndataset = \"synthetic\"\n", "disagree"},
      {"format = \"csv\"\npath = \"t\"\nholdout_fraction = 0.1\nfeature_columns = [1]\n",
       "must be an array of strings"},
      {"format = \"csv\"\npath = \"t\"\nholdout_fraction = 0.1\nfeature_columns = \"a\"\n",
       "must be an array of strings, got a string"},
      {"format = \"csv\"\npath = \"dir\"\nholdout_fraction = 0.1\npartition = \"files\"\n",
       "'data.test_path' is required with data.partition = \"files\""},
      {"format = \"idx\"\npath = \"i\"\nlabels_path = \"l\"\ntest_path = \"t\"\n"
       "test_labels_path = \"u\"\npartition = \"files\"\n",
       "needs data.format csv, tensors or image-folder"},
      {"format = \"csv\"\npath = \"t\"\nholdout_fraction = 0.1\nnormalize = \"zscore\"\n",
       "'data.normalize' must be one of none, fixed, computed; got \"zscore\""},
      {"format = \"csv\"\npath = \"t\"\nholdout_fraction = 0.1\nnormalize = \"fixed\"\n",
       "needs data.mean and data.std of the same length"},
      {"format = \"csv\"\npath = \"t\"\nholdout_fraction = 0.1\nnormalize = \"fixed\"\n"
       "mean = [0.5]\nstd = [0]\n",
       "'data.std' every value must be > 0"},
      {"format = \"csv\"\npath = \"t\"\nholdout_fraction = 0.1\nmean = [0.5]\n",
       "are read only with data.normalize = \"fixed\""},
      {"format = \"csv\"\npath = \"t\"\nholdout_fraction = 0.1\nnormalize = \"fixed\"\n"
       "mean = [\"a\"]\nstd = [1]\n",
       "'data.mean' must be a number"},
      {"normalize = \"fixed\"\nmean = [0.5]\nstd = [1]\n",
       "applies to csv, tensors and image-folder"},
  };
  for (const Case& k : cases) {
    Status st = dataConfig(k.toml);
    EXPECT_FALSE(st.isOk()) << k.toml;
    EXPECT_NE(st.message().find(k.expected), std::string::npos) << k.toml << "\n" << st.message();
  }
}

// data.image_size is one integer (a square) or [rows, cols]; the image keys belong to
// image-folder alone.
TEST(ConfigData, AnImageFolderTakesChannelsAndASize) {
  Config c;
  ASSERT_TRUE(dataConfig("format = \"image-folder\"\npath = \"train\"\ntest_path = \"test\"\n"
                         "image_channels = 3\nimage_size = [24, 32]\n",
                         &c)
                  .isOk());
  EXPECT_EQ(c.data.image_channels, 3u);
  EXPECT_EQ(c.data.image_size, (std::vector<uint32_t>{24, 32}));
  EXPECT_EQ(c.toJson()["data"]["image_size"], nlohmann::json::array({24, 32}));
  EXPECT_TRUE(c.readsDataFiles());
  ASSERT_TRUE(c.set("data.image_size=28").isOk());
  EXPECT_EQ(c.data.image_size, (std::vector<uint32_t>{28, 28}));
  ASSERT_TRUE(
      dataConfig("format = \"image-folder\"\npath = \"all\"\nholdout_fraction = 0.2\n", &c).isOk());
  EXPECT_EQ(c.data.image_channels, 1u);
  EXPECT_TRUE(c.data.image_size.empty());

  const std::string folder = "format = \"image-folder\"\npath = \"p\"\ntest_path = \"t\"\n";
  const std::pair<std::string, const char*> cases[] = {
      {folder + "image_channels = 2\n", "'data.image_channels' must be 1 (grey) or 3 (RGB), got 2"},
      {folder + "image_size = [1, 2, 3]\n", "'data.image_size' must be [rows, cols] or one"},
      {folder + "image_size = 0\n", "each 1 to 16384"},
      {folder + "image_size = [32, 20000]\n", "each 1 to 16384"},
      {folder + "image_size = [32, -1]\n", "must not be negative"},
      {folder + "image_size = [32, \"a\"]\n", "got an element that is a string"},
      {folder + "image_size = \"big\"\n", "must be a non-negative integer or an array of them"},
      {"format = \"image-folder\"\npath = \"p\"\n", "data.test_path' or data.holdout_fraction"},
      {"format = \"csv\"\npath = \"t\"\nholdout_fraction = 0.1\nimage_size = 8\n",
       "'data.image_size' is not read with data.format = \"csv\""},
      {"image_channels = 3\n", "'data.image_channels' is not read with data.format"},
  };
  for (const auto& [toml, expected] : cases) {
    Status st = dataConfig(toml);
    EXPECT_FALSE(st.isOk()) << toml;
    EXPECT_NE(st.message().find(expected), std::string::npos) << toml << "\n" << st.message();
  }
}

TEST(ConfigData, BlocksAreRefusedWithTheUsersFiles) {
  Config c;
  Status st = c.loadString(
      "[data]\nformat = \"csv\"\npath = \"t\"\nholdout_fraction = 0.1\n"
      "[blocks]\ncount = 2\nrounds_per_block = 1\n",
      "b.toml");
  ASSERT_TRUE(st.isOk()) << st.toString();
  st = c.validate();
  EXPECT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("block-cyclic runs use fashion-mnist or synthetic"),
            std::string::npos)
      << st.message();
}

// toToml writes every key; reading it back gives the same configuration, lists, choices,
// awkward strings and doubles that need all 17 digits included.
TEST(Config, TomlWrittenByToTomlReadsBackEqual) {
  Config c;
  ASSERT_TRUE(c.set("train.lr=0.0123456789012345").isOk());
  ASSERT_TRUE(c.set("run.name=\"quote \\\" and \\\\ back\"").isOk());
  ASSERT_TRUE(c.set("model.local=[\"fc3.*\", \"bn?\"]").isOk());
  ASSERT_TRUE(c.set("data.mean=[0.1, 0.2]").isOk());
  ASSERT_TRUE(c.set("data.image_size=[24, 32]").isOk());
  ASSERT_TRUE(c.set("aggregation.method=\"trimmed_mean\"").isOk());
  ASSERT_TRUE(c.set("run.seed=9007199254740993").isOk());  // 2^53 + 1: not a double
  const std::string text = c.toToml();
  EXPECT_NE(text.find("[train]"), std::string::npos);
  Config again;
  ASSERT_TRUE(again.loadString(text, "written").isOk()) << text;
  EXPECT_EQ(again.toJson(), c.toJson());
  EXPECT_EQ(again.run.seed, 9007199254740993ull);
  EXPECT_EQ(again.train.lr, 0.0123456789012345);
  EXPECT_EQ(again.run.name, "quote \" and \\ back");
  // Every key is written: a default config reads back equal to the defaults as well.
  Config defaults;
  ASSERT_TRUE(again.loadString(Config().toToml(), "defaults").isOk());
  EXPECT_EQ(again.toJson(), defaults.toJson());
}

}  // namespace
}  // namespace fedfleet::config
