#include "common/history/format.h"

#include <gtest/gtest.h>

#include <limits>
#include <nlohmann/json.hpp>

namespace fedfleet::history {
namespace {

std::vector<RoundRecord> twoRounds() {
  RoundRecord a;
  a.run_id = 1;
  a.round = 0;
  a.start_time = 1700000000.0;
  a.end_time = 1700000012.5;
  a.selected = 10;
  a.completed = 8;
  a.late = 1;
  a.dropped = 1;
  a.rejected = 0;
  a.status = "ok";
  a.train_loss = 0.693147;
  a.test_loss = 0.5123;
  a.test_accuracy = 0.8765;
  a.bytes_up = 1048576;
  a.bytes_down = 4194304;
  a.model_version = 1;
  a.wall_start = 1700000000.0;
  a.wall_end = 1700000012.5;
  a.fed_eval_clients = 3;
  a.fed_eval_samples = 450;
  a.fed_eval_loss = 0.25;
  a.fed_eval_accuracy = 0.6;
  a.test_metrics = {{"f1", 0.5}, {"mae", 0.125}};
  a.dp_epsilon = 2.5;
  a.dp_clip = 0.75;
  RoundRecord b;
  b.run_id = 1;
  b.round = 1;
  b.start_time = 1700000012.5;
  b.end_time = 1700000020.25;
  b.selected = 10;
  b.completed = 5;
  b.late = 3;
  b.dropped = 2;
  b.rejected = 1;
  b.status = "failed";
  b.train_loss = 1.25;
  // no test_loss, no test_accuracy: the round did not evaluate
  b.bytes_up = 524288;
  b.bytes_down = 4194304;
  b.model_version = 1;
  b.wall_start = 1700000012.5;
  b.wall_end = 1700000020.0;
  return {a, b};
}

TEST(Format, ParseFormat) {
  EXPECT_EQ(*parseFormat("table"), Format::kTable);
  EXPECT_EQ(*parseFormat("csv"), Format::kCsv);
  EXPECT_EQ(*parseFormat("json"), Format::kJson);
  for (const char* bad : {"", "JSON", "tsv", "csv "}) {
    auto parsed = parseFormat(bad);
    ASSERT_FALSE(parsed.isOk()) << bad;
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find("table, csv, json"), std::string::npos)
        << parsed.status().message();
  }
}

TEST(Format, RoundsTable) {
  const std::string want =
      "round  status  selected  completed  late  dropped  rejected  train_loss  test_loss  "
      "test_acc  fed_acc  metrics               epsilon  bytes_up  bytes_down  seconds  wall_s\n"
      "    0  ok            10          8     1        1         0      0.6931     0.5123  "
      "  87.65%   60.00%  f1=0.5000 mae=0.1250    2.500   1048576     4194304    12.50   12.50\n"
      "    1  failed        10          5     3        2         1      1.2500          -  "
      "       -        -  -                           -    524288     4194304     7.75    7.50\n";
  EXPECT_EQ(formatRounds(twoRounds(), Format::kTable), want);
}

TEST(Format, RoundsCsv) {
  const std::string want =
      "run_id,round,start_time,end_time,selected,completed,late,dropped,rejected,status,"
      "train_loss,test_loss,test_accuracy,bytes_up,bytes_down,model_version,wall_start,wall_end,"
      "fed_eval_clients,fed_eval_samples,fed_eval_loss,fed_eval_accuracy,test_metrics,"
      "fed_eval_metrics,dp_epsilon,dp_clip\r\n"
      "1,0,1700000000,1700000012.5,10,8,1,1,0,ok,0.693147,0.5123,0.8765,1048576,4194304,1,"
      "1700000000,1700000012.5,3,450,0.25,0.6,\"{\"\"f1\"\":0.5,\"\"mae\"\":0.125}\",,2.5,0.75\r\n"
      "1,1,1700000012.5,1700000020.25,10,5,3,2,1,failed,1.25,,,524288,4194304,1,"
      "1700000012.5,1700000020,0,0,,,,,,\r\n";
  EXPECT_EQ(formatRounds(twoRounds(), Format::kCsv), want);
}

TEST(Format, RoundsJson) {
  const std::string want = R"([
  {
    "run_id": 1,
    "round": 0,
    "start_time": 1700000000.0,
    "end_time": 1700000012.5,
    "selected": 10,
    "completed": 8,
    "late": 1,
    "dropped": 1,
    "rejected": 0,
    "status": "ok",
    "train_loss": 0.693147,
    "test_loss": 0.5123,
    "test_accuracy": 0.8765,
    "bytes_up": 1048576,
    "bytes_down": 4194304,
    "model_version": 1,
    "wall_start": 1700000000.0,
    "wall_end": 1700000012.5,
    "fed_eval_clients": 3,
    "fed_eval_samples": 450,
    "fed_eval_loss": 0.25,
    "fed_eval_accuracy": 0.6,
    "test_metrics": "{\"f1\":0.5,\"mae\":0.125}",
    "fed_eval_metrics": null,
    "dp_epsilon": 2.5,
    "dp_clip": 0.75
  },
  {
    "run_id": 1,
    "round": 1,
    "start_time": 1700000012.5,
    "end_time": 1700000020.25,
    "selected": 10,
    "completed": 5,
    "late": 3,
    "dropped": 2,
    "rejected": 1,
    "status": "failed",
    "train_loss": 1.25,
    "test_loss": null,
    "test_accuracy": null,
    "bytes_up": 524288,
    "bytes_down": 4194304,
    "model_version": 1,
    "wall_start": 1700000012.5,
    "wall_end": 1700000020.0,
    "fed_eval_clients": 0,
    "fed_eval_samples": 0,
    "fed_eval_loss": null,
    "fed_eval_accuracy": null,
    "test_metrics": null,
    "fed_eval_metrics": null,
    "dp_epsilon": null,
    "dp_clip": null
  }
]
)";
  EXPECT_EQ(formatRounds(twoRounds(), Format::kJson), want);
}

TEST(Format, EmptyInput) {
  EXPECT_EQ(formatRounds({}, Format::kJson), "[]\n");
  EXPECT_EQ(formatEvents({}, Format::kCsv), "run_id,time,kind,client_id,detail\r\n");
  EXPECT_EQ(formatRuns({}, Format::kTable), "run_id  name  started_at  seed  clock\n");
}

TEST(Format, CsvNumbersKeepFullPrecision) {
  RoundRecord r;
  r.train_loss = 0.1 + 0.2;  // 0.30000000000000004
  r.test_loss = 1e-300;
  r.test_accuracy = std::numeric_limits<double>::quiet_NaN();
  r.bytes_up = std::numeric_limits<uint64_t>::max();
  const std::string csv = formatRounds({r}, Format::kCsv);
  EXPECT_NE(csv.find(",0.30000000000000004,1e-300,nan,18446744073709551615,"), std::string::npos)
      << csv;
}

TEST(Format, CsvQuotesCommasQuotesAndNewlines) {
  const std::vector<EventRecord> events = {
      {3, 1700000000.0, "malformed_frame", "edge,7", "size \"12\" > limit"},
      {0, 1700000001.5, "error", "plain", "first line\nsecond line"},
      {3, 1700000002.0, "auth_rejected", "c\r", "no quoting needed"},
  };
  const std::string want =
      "run_id,time,kind,client_id,detail\r\n"
      "3,1700000000,malformed_frame,\"edge,7\",\"size \"\"12\"\" > limit\"\r\n"
      ",1700000001.5,error,plain,\"first line\nsecond line\"\r\n"
      "3,1700000002,auth_rejected,\"c\r\",no quoting needed\r\n";
  EXPECT_EQ(formatEvents(events, Format::kCsv), want);
}

TEST(Format, EventsTableEscapesControlCharacters) {
  const std::vector<EventRecord> events = {
      {3, 1700000000.0, "stale_update", "c1", "tab\there"},
      {0, 1700000061.9, "error", "", "two\nlines"},
  };
  const std::string want =
      "run_id  time                 kind          client_id  detail\n"
      "     3  2023-11-14 22:13:20  stale_update  c1         tab\\there\n"
      "     -  2023-11-14 22:14:21  error                    two\\nlines\n";
  EXPECT_EQ(formatEvents(events, Format::kTable), want);
}

// A simulated run's event times are seconds of its virtual clock: the table shows them so, not
// as dates in 1970; the wall-clock run's and the run-less event's stay dates. CSV keeps the
// stored numbers.
TEST(Format, EventsTableShowsEachTimeOnItsRunsClock) {
  const std::vector<EventRecord> events = {
      {2, 64.0, "run_finished", "", "all rounds done"},
      {3, 1700000000.0, "stale_update", "c1", "v2"},
      {0, 12.5, "unknown_client", "", "no run"},
  };
  const std::string want =
      "run_id  time                 kind            client_id  detail\n"
      "     2  t=64.00 s            run_finished               all rounds done\n"
      "     3  2023-11-14 22:13:20  stale_update    c1         v2\n"
      "     -  1970-01-01 00:00:12  unknown_client             no run\n";
  EXPECT_EQ(formatEvents(events, Format::kTable, {2}), want);
  // Without the set every run is on the wall clock.
  EXPECT_NE(formatEvents(events, Format::kTable).find("1970-01-01 00:01:04"), std::string::npos);
  EXPECT_EQ(formatEvents(events, Format::kCsv, {2}),
            "run_id,time,kind,client_id,detail\r\n"
            "2,64,run_finished,,all rounds done\r\n"
            "3,1700000000,stale_update,c1,v2\r\n"
            ",12.5,unknown_client,,no run\r\n");
}

// The clients table is shared by all runs: a time before kEarliestWallClockTime is a simulated
// run's, one after it a date.
TEST(Format, ClientsTableJudgesEachTimeByItsValue) {
  ClientRecord sim;
  sim.client_id = "v07";
  sim.first_seen = 3.25;
  sim.last_seen = 1234.5;
  ClientRecord real;
  real.client_id = "edge-1";
  real.first_seen = 1700000000.0;
  real.last_seen = kEarliestWallClockTime;
  const std::string table = formatClients({sim, real}, Format::kTable);
  EXPECT_NE(table.find("t=3.25 s"), std::string::npos) << table;
  EXPECT_NE(table.find("t=1234.50 s"), std::string::npos) << table;
  EXPECT_NE(table.find("2023-11-14 22:13:20"), std::string::npos) << table;
  EXPECT_NE(table.find("2001-09-09 01:46:40"), std::string::npos) << table;
  EXPECT_EQ(table.find("1970"), std::string::npos) << table;
  auto json = nlohmann::json::parse(formatClients({sim}, Format::kJson));
  EXPECT_EQ(json[0]["first_seen"], 3.25);  // the stored number
}

TEST(Format, TiersInEachFormat) {
  TierSummary slow;
  slow.tier = "embedded-board";
  slow.device_kind = "cpu";
  slow.clients = 3;
  slow.updates = 4;
  slow.completed = 1;
  slow.late = 2;
  slow.dropped = 1;
  slow.mean_completed_s = 12.345;
  TierSummary none;
  none.tier = "-";
  EXPECT_EQ(formatTiers(5, {slow, none}, Format::kTable),
            "tier            device_kind  clients  updates  completed  late  dropped  rejected  "
            "late_or_dropped  mean_completed_s\n"
            "embedded-board  cpu                3        4          1     2        1         0  "
            "         75.00%             12.35\n"
            "-               -                  0        0          0     0        0         0  "
            "              -                 -\n");
  auto json = nlohmann::json::parse(formatTiers(5, {slow, none}, Format::kJson));
  ASSERT_EQ(json.size(), 2u);
  EXPECT_EQ(json[0]["run_id"], 5);
  EXPECT_EQ(json[0]["tier"], "embedded-board");
  EXPECT_EQ(json[0]["late"], 2);
  EXPECT_EQ(json[0]["late_or_dropped"], 0.75);
  EXPECT_TRUE(json[1]["late_or_dropped"].is_null());
  EXPECT_EQ(formatTiers(5, {}, Format::kCsv),
            "run_id,tier,device_kind,clients,updates,completed,late,dropped,rejected,"
            "late_or_dropped,mean_completed_s\r\n");
}

TEST(Format, PeersInEachFormat) {
  PeerSummary p;
  p.peer = 7;
  p.iterations = 12;
  p.skipped = 1;
  p.exchanges = 24;
  p.bytes_sent = 123456789012ULL;
  p.bytes_received = 42;
  p.compute_s = 6.5;
  p.comm_s = 1.255;
  p.wait_s = 0.1;
  p.mean_staleness = 2.0 / 3;
  p.max_staleness = 2;
  p.first_start = 0.25;
  p.last_end = 9.875;
  EXPECT_EQ(
      formatPeers(3, {p}, Format::kTable),
      "peer  iterations  skipped  exchanges    bytes_sent  bytes_received  compute_s  comm_s  "
      "wait_s  mean_staleness  max_staleness  first_start  last_end\n"
      "   7          12        1         24  123456789012              42       6.50    1.25  "
      "  0.10            0.67              2         0.25      9.88\n");
  EXPECT_EQ(formatPeers(3, {p}, Format::kCsv),
            "run_id,peer,iterations,skipped,exchanges,bytes_sent,bytes_received,compute_s,comm_s,"
            "wait_s,mean_staleness,max_staleness,first_start,last_end\r\n"
            "3,7,12,1,24,123456789012,42,6.5,1.255,0.1,0.6666666666666666,2,0.25,9.875\r\n");
}

TEST(Format, PeerEvalsInEachFormat) {
  const std::vector<PeerEvalRecord> rows = {
      {2, 10.5, 160, 16, 0.8125, 0.5},
      {2, 20.0, 320, 16, std::numeric_limits<double>::quiet_NaN(), 0.25}};
  EXPECT_EQ(formatPeerEvals(rows, Format::kTable),
            " time  iterations  peers_averaged  accuracy    loss\n"
            "10.50         160              16    81.25%  0.5000\n"
            "20.00         320              16         -  0.2500\n");
  auto json = nlohmann::json::parse(formatPeerEvals(rows, Format::kJson));
  ASSERT_EQ(json.size(), 2u);
  EXPECT_EQ(json[0]["run_id"], 2);
  EXPECT_EQ(json[0]["time_s"], 10.5);
  EXPECT_EQ(json[0]["iterations"], 160);
  EXPECT_EQ(json[0]["accuracy"], 0.8125);
  EXPECT_TRUE(json[1]["accuracy"].is_null());
  EXPECT_EQ(json[1]["loss"], 0.25);
}

TEST(Format, JsonOfOtherRecordsParsesBack) {
  RunRecord run{7, "demo \xc3\xa9", R"({"lr": 0.1})", 1700000000.25, 18446744073709551615ull};
  auto runs = nlohmann::json::parse(formatRuns({run}, Format::kJson));
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0]["run_id"], 7);
  EXPECT_EQ(runs[0]["name"], "demo \xc3\xa9");
  EXPECT_EQ(runs[0]["config_json"], R"({"lr": 0.1})");
  EXPECT_EQ(runs[0]["seed"].get<uint64_t>(), 18446744073709551615ull);

  UpdateRecord u;
  u.run_id = 7;
  u.round = 2;
  u.client_id = "c9";
  u.partition = -1;
  u.loss = 0.5;
  u.status = "late";
  auto updates = nlohmann::json::parse(formatUpdates({u, u}, Format::kJson));
  ASSERT_EQ(updates.size(), 2u);
  EXPECT_EQ(updates[1]["partition"], -1);
  EXPECT_EQ(updates[1]["status"], "late");

  ClientRecord c;
  c.client_id = "c9";
  c.public_key = std::string("\xff\xfe", 2);  // not UTF-8: replaced, not thrown
  auto clients = nlohmann::json::parse(formatClients({c}, Format::kJson));
  ASSERT_EQ(clients.size(), 1u);
  EXPECT_EQ(clients[0]["public_key"], "\xef\xbf\xbd\xef\xbf\xbd");

  EventRecord unattached{0, 1.0, "error", "", ""};
  auto events = nlohmann::json::parse(formatEvents({unattached}, Format::kJson));
  EXPECT_TRUE(events[0]["run_id"].is_null());
}

TEST(Format, OtherTablesHaveHeaderAndOneLinePerRecord) {
  ClientRecord c;
  c.client_id = "edge-1";
  c.device_kind = "cuda";
  c.device_name = "H200";
  c.cores = 16;
  c.first_seen = 1700000000.0;
  c.last_seen = 1700000100.0;
  EXPECT_EQ(formatClients({c}, Format::kTable),
            "client_id  device_kind  device_name  cores  memory_bytes  data_size  "
            "first_seen           last_seen\n"
            "edge-1     cuda         H200            16             0          0  "
            "2023-11-14 22:13:20  2023-11-14 22:15:00\n");
  UpdateRecord u;
  u.round = 3;
  u.client_id = "edge-1";
  u.status = "completed";
  u.partition = 2;
  u.n_samples = 600;
  u.steps = 10;
  u.loss = 0.25;
  u.compute_s = 1.5;
  u.upload_s = 0.25;
  u.weight = 0.5;
  u.codec = "qsgd";
  u.eval_samples = 40;
  u.eval_accuracy = 0.75;
  u.eval_metrics = {{"r2", 0.9}};
  EXPECT_EQ(formatUpdates({u}, Format::kTable),
            "round  client_id  status     partition  n_samples  steps    loss  compute_s  "
            "upload_s  bytes_up  bytes_down  codec  weight  served  served_acc  eval_acc  "
            "eval_metrics\n"
            "    3  edge-1     completed          2        600     10  0.2500       1.50  "
            "    0.25         0           0  qsgd   0.5000  -                -    75.00%  "
            "r2=0.9000\n");
}

TEST(Format, ServedShowsEachClientsLastServedModel) {
  UpdateRecord first;
  first.run_id = 4;
  first.round = 1;
  first.client_id = "b";
  first.status = "completed";
  first.served_block = 0;
  first.served_model = "shared";
  first.served_version = 1;
  first.served_sha256_hex = std::string(64, 'a');
  UpdateRecord none = first;
  none.client_id = "a";
  none.round = 2;
  none.served_block = -1;  // no served model: not listed
  UpdateRecord last = first;
  last.round = 3;
  last.served_model = "pluralistic";
  last.served_version = 2;
  std::string sha;
  for (int i = 0; i < 32; ++i) sha += "cd";
  last.served_sha256_hex = sha;
  last.served_samples = 100;
  last.served_accuracy = 0.8125;
  last.served_loss = 0.5;
  EXPECT_EQ(formatServed({first, none, last}, Format::kTable),
            "client_id  round  block  model        version  sha256        samples  "
            "accuracy    loss\n"
            "b              3      0  pluralistic        2  cdcdcdcdcdcd      100  "
            "  81.25%  0.5000\n");
  auto json = nlohmann::json::parse(formatServed({first, none, last}, Format::kJson));
  ASSERT_EQ(json.size(), 1u);
  EXPECT_EQ(json[0]["sha256"], sha);
  EXPECT_EQ(json[0]["accuracy"], 0.8125);
  // In `updates`, the served fields are null where the task named no served model.
  auto updates = nlohmann::json::parse(formatUpdates({none, last}, Format::kJson));
  EXPECT_TRUE(updates[0]["served_block"].is_null());
  EXPECT_TRUE(updates[0]["served_accuracy"].is_null());
  EXPECT_EQ(updates[1]["served_block"], 0);
  EXPECT_EQ(updates[1]["served_model"], "pluralistic");
  EXPECT_NE(formatUpdates({last}, Format::kTable).find("b0 pluralistic v2"), std::string::npos);
}

}  // namespace
}  // namespace fedfleet::history
