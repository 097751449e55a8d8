// `fedfleet history` (runs, rounds, clients, updates, tiers, events, blocks, served, peers,
// peer-evals as table, CSV or JSON) and `fedfleet report` (the HTML report, cli/report.h): the
// read side of a history database. Times in the tables are on their run's clock
// (common/history/format.h).
//
// Both return the process exit status and print their errors to stderr: 2 for bad usage (a
// database file that does not exist, an unknown format, a run id the database does not hold),
// 1 for a file that cannot be read as a fedfleet history (not SQLite, another program's
// database, another schema version) or an output that cannot be written.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fedfleet::cli {

struct HistoryArgs {
  std::string db = "fedfleet.db";
  std::string format = "table";  // table, csv, json
  std::string what = "rounds";   // runs, rounds, clients, updates, tiers, events, blocks, served,
                                 // peers, peer-evals
  // runs: only this run; rounds, updates, tiers, blocks, served, peers, peer-evals: this run
  // (default: the latest);
  // clients: the clients with an update in this run (default: all); events: this run's
  // (default: all).
  int64_t run = 0;
  std::optional<uint32_t> round;  // updates: only this round
};

int runHistoryCommand(const HistoryArgs& args);

struct ReportArgs {
  std::string db = "fedfleet.db";
  std::string output = "report.html";
  std::vector<int64_t> runs;               // empty: every run
  std::optional<uint32_t> timeline_round;  // default: the round with the worst stragglers
};

int runReportCommand(const ReportArgs& args);

}  // namespace fedfleet::cli
